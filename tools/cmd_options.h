// Option checks and option effects that several tools/cmd_*.cpp commands share (commands.h
// declares the commands and their common options).
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "engine/base/thread_pool.h"
#include "engine/model/gemma4_config.h"

namespace gj::tools {

// --seed S: a decimal unsigned 64-bit integer. CLI11 converts with strtoull, which silently
// turns "-1" into 2^64 - 1, saturates numbers past 2^64 - 1 and reads hexadecimal.
inline CLI::Validator seed_check() {
    return CLI::Validator(
        [](std::string& s) -> std::string {
            uint64_t v = 0;
            const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
            if (s.empty() || ec != std::errc() || end != s.data() + s.size())
                return "'" + s + "' is not a seed: give a whole number from 0 to " +
                       std::to_string(UINT64_MAX);
            return {};
        },
        "UINT64");
}

// --threads N: 0 (one per hardware thread) up to the thread pool's limit, which is also
// GEMMAJIT_THREADS's: each thread is a process-table entry, and a typo such as 100000 would
// otherwise exhaust the system's process limit.
inline CLI::Validator threads_check() {
    return CLI::Range(0, kMaxThreads);
}

// --ctx N (0: the model's) of run and chat: more positions than the model was trained for is an
// error on the CPU as on the GPU (where GpuModel refuses it at load).
inline void check_context_option(int context, const gemma4::Config& cfg) {
    if (context > cfg.context_length)
        throw std::invalid_argument("--ctx " + std::to_string(context) + " exceeds the " +
                                    std::to_string(cfg.context_length) + " positions " + cfg.name +
                                    " was trained for");
}

}  // namespace gj::tools
