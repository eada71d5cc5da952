// The cache key: SHA-256 over a canonical, length-prefixed record of everything that determines a
// kernel's binary. Neutral flags never enter it; specialization values are in the source.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

namespace gj::jit {

// Bump by hand when the entry format, meta.json schema or the kernel-parameter conventions the
// launchers assume change: it partitions the cache (<root>/v<ABI>/...) and enters every key.
inline constexpr int kEngineAbi = 1;

struct KeyRecord {
    std::string source;  // fully rendered source
    std::vector<std::string> entries;
    std::vector<std::string> options;  // canonical NVRTC options
    std::string nvrtc;                 // NvrtcIdentity::full()
    std::string arch;                  // with suffix: "sm_90a"
    int abi = kEngineAbi;
    std::vector<std::pair<std::string, std::string>> flags;  // output-changing flags, canonical

    // The bytes that are hashed: "gemmajit-key-v1\n" then "<field> <length>\n<bytes>\n" per item.
    std::string serialize() const;
    std::string hash() const;  // 64 hex characters
    // Readable form for meta.json (the source as its sha256 and length; kernel.cu holds the text).
    nlohmann::json to_json() const;
};

}  // namespace gj::jit
