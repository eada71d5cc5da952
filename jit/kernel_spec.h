// KernelSpec: one specialization of one kernel template. The engine builds these from the model's
// metadata; jit renders, compiles, caches and loads them without knowing anything about Gemma.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gj::jit {

struct KernelSpec {
    // Template family: the file kernel_templates/<family>.cu (embedded, or from
    // GEMMAJIT_TEMPLATE_DIR when set).
    std::string family;
    // Readable unique name used in logs, cache paths and the CLI, e.g.
    // "flash_decode.hd512.g4.win0.kv_f16". Characters: [a-z0-9_.-].
    std::string name;
    // Specialization values, emitted in this order as `#define NAME value` in the generated
    // prologue, so loops unroll and divisions by them are constant.
    std::vector<std::pair<std::string, int64_t>> constants;
    // extern "C" __global__ entry points the template defines (checked after compilation).
    std::vector<std::string> entries;
    // Compile order: lower first. 0 = decode path (blocks the first token), 1 = prefill, 2 = rare.
    int priority = 0;
    // 0: portable across the targets the engine supports. N (e.g. 90): the template uses
    // instructions of sm_N's architecture-specific feature set (wgmma on sm_90), so it is compiled
    // for sm_<N>a and for no other target (Jit::compile refuses another arch with an error naming
    // the spec).
    int arch_specific = 0;
    // Non-empty: the template includes NCCL's device headers from this folder (those of the NCCL
    // library the process loaded; jit/nccl_device.h), which then enter the cache key.
    std::string nccl_include{};

    bool operator==(const KernelSpec&) const = default;
};

}  // namespace gj::jit
