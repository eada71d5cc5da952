#include "jit/env_flags.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <mutex>
#include <regex>

extern char** environ;

namespace gj::jit {

namespace {

constexpr std::string_view kPrefix = "GEMMAJIT_";

using T = FlagType;
using C = FlagClass;

}  // namespace

const std::vector<FlagDef>& flag_table() {
    static const std::vector<FlagDef> table = {
        // cache
        {.name = "GEMMAJIT_CACHE_DIR",
         .family = "cache",
         .type = T::Path,
         .cls = C::Neutral,
         .default_value = "",
         .help = "kernel cache root (empty: ${XDG_CACHE_HOME:-~/.cache}/gemmajit)"},
        {.name = "GEMMAJIT_CACHE",
         .family = "cache",
         .type = T::Enum,
         .cls = C::Neutral,
         .default_value = "1",
         .help = "kernel cache: 1 read+write, ro read only, 0 off (compile every run)",
         .choices = {"1", "0", "ro"}},
        {.name = "GEMMAJIT_CACHE_MAX_SIZE",
         .family = "cache",
         .type = T::Size,
         .cls = C::Neutral,
         .default_value = "2G",
         .help = "cache size cap; least recently used entries are pruned beyond it (0: no cap)"},
        {.name = "GEMMAJIT_REQUIRE_CACHED",
         .family = "cache",
         .type = T::Bool,
         .cls = C::Neutral,
         .default_value = "0",
         .help = "1: a kernel missing from the cache is an error instead of a compile"},
        {.name = "GEMMAJIT_CACHE_LOCK_TIMEOUT",
         .family = "cache",
         .type = T::Int,
         .cls = C::Neutral,
         .default_value = "120",
         .help = "seconds a process waits for another one compiling the same missing kernel "
                 "before compiling it itself (0: never wait, every process compiles its misses)",
         .min = 0,
         .max = 86400},
        // compile: these change the cubin, so they are part of every cache key
        {.name = "GEMMAJIT_ARCH",
         .family = "compile",
         .type = T::String,
         .cls = C::OutputChanging,
         .default_value = "",
         .help = "target architecture, e.g. sm_90a (empty: the GPU's own, else sm_90)",
         .pattern = "(sm_[0-9]{2,3}[af]?)?",
         .pattern_help = "sm_<digits> with optional a/f suffix"},
        {.name = "GEMMAJIT_LINEINFO",
         .family = "compile",
         .type = T::Bool,
         .cls = C::OutputChanging,
         .default_value = "0",
         .help = "1: compile with -lineinfo (source lines in profilers)"},
        {.name = "GEMMAJIT_MAXRREG",
         .family = "compile",
         .type = T::Int,
         .cls = C::OutputChanging,
         .default_value = "0",
         .help = "register cap per thread passed as --maxrregcount (0: compiler's choice)",
         .min = 0,
         .max = 255},
        {.name = "GEMMAJIT_NVRTC_FLAGS",
         .family = "compile",
         .type = T::String,
         .cls = C::OutputChanging,
         .default_value = "",
         .help = "extra NVRTC options, space separated, appended to the canonical list"},
        // debug / dump: never change a kernel
        {.name = "GEMMAJIT_DEBUG",
         .family = "debug",
         .type = T::Int,
         .cls = C::Neutral,
         .default_value = "0",
         .help = "log level: 1 compile events, timings, hit/miss; 2 + registers/spills/smem; "
                 "3 + rendered source; 4 + PTX; 5 + cache entry paths and key records",
         .min = 0,
         .max = 5},
        {.name = "GEMMAJIT_DUMP_DIR",
         .family = "debug",
         .type = T::Path,
         .cls = C::Neutral,
         .default_value = "",
         .help = "write every compiled kernel (.cu/.ptx/.cubin/log) and failed compiles here"},
        {.name = "GEMMAJIT_TEMPLATE_DIR",
         .family = "debug",
         .type = T::Path,
         .cls = C::Neutral,
         .default_value = "",
         .help = "read kernel templates from this directory before the embedded ones (the "
                 "file's text enters the rendered source, so the cache key follows it)"},
        // throughput
        {.name = "GEMMAJIT_THREADS",
         .family = "throughput",
         .type = T::Int,
         .cls = C::Neutral,
         .default_value = "0",
         .help = "parallel NVRTC compiles (0: available CPUs)",
         .min = 0,
         .max = 1024},
        // device
        {.name = "GEMMAJIT_DEVICE",
         .family = "device",
         .type = T::Int,
         .cls = C::Neutral,
         .default_value = "0",
         .help = "CUDA device ordinal",
         .min = 0,
         .max = 255},
        {.name = "GEMMAJIT_TP",
         .family = "device",
         .type = T::Int,
         .cls = C::Neutral,
         .default_value = "1",
         .help = "GPUs a model is split over (tensor parallelism, one process per GPU on devices "
                 "0..N-1); the default of --tp",
         .min = 1,
         .max = 8},
        {.name = "GEMMAJIT_TP_BF16_ROWS",
         .family = "device",
         .type = T::Int,
         .cls = C::Neutral,
         .default_value = "64",
         .help = "tensor parallelism: prefill chunks of at least this many rows all-reduce their "
                 "partial products in bf16 (half the bytes; the residual stream stays fp32); 0: "
                 "fp32 always (decode steps always all-reduce fp32)",
         .min = 0,
         .max = 1 << 20},
        {.name = "GEMMAJIT_TP_SYMMETRIC",
         .family = "device",
         .type = T::Bool,
         .cls = C::Neutral,
         .default_value = "1",
         .help = "tensor parallelism: a decode step's all-reduces, and a prefill chunk's bf16 "
                 "ones, run in NCCL symmetric memory (windows every rank registers; NCCL 2.27+ "
                 "with peer access), which takes NCCL's symmetric kernels; 0: ordinary buffers"},
        {.name = "GEMMAJIT_TP_FUSED_NORM",
         .family = "device",
         .type = T::Bool,
         .cls = C::Neutral,
         .default_value = "1",
         .help = "tensor parallelism: a decode step's post-norms sum the ranks' partial products "
                 "themselves, through NCCL's device API (an LSA barrier, then the peers' "
                 "symmetric windows read directly), instead of an NCCL all-reduce before them; "
                 "needs NCCL 2.28.3/2.28.7/2.28.9 with its nccl_device.h headers and the CUDA "
                 "headers (else the all-reduce); 0: NCCL's all-reduce always "
                 "(docs/TENSOR_PARALLEL.md)"},
        {.name = "GEMMAJIT_TP_PUSH",
         .family = "device",
         .type = T::Bool,
         .cls = C::Neutral,
         .default_value = "1",
         .help = "tensor parallelism, with GEMMAJIT_TP_FUSED_NORM: a single-sequence decode "
                 "step's attention-output and FFN-down matvecs store their products into every "
                 "rank's symmetric window themselves (one slot per rank), so the post-norm after "
                 "the barrier reads local memory only; 0: the post-norm reads the peers' windows "
                 "(docs/TENSOR_PARALLEL.md)"},
        {.name = "GEMMAJIT_TP_PREFILL_PUSH",
         .family = "device",
         .type = T::Int,
         .cls = C::Neutral,
         .default_value = "2",
         .help = "tensor parallelism, with GEMMAJIT_TP_FUSED_NORM, on splits of up to this many "
                 "GPUs: a prefill chunk's bf16 partial products (GEMMAJIT_TP_BF16_ROWS) are "
                 "stored by one kernel into every rank's symmetric window, which then meets the "
                 "other ranks at an LSA barrier, and the post-norm sums the ranks' products in "
                 "fp32 (a rank sends its whole product to each other rank: from 4 GPUs on more "
                 "bytes than NCCL's all-reduce); 0: a conversion to bf16 and NCCL's bf16 "
                 "all-reduce always (docs/TENSOR_PARALLEL.md)",
         .min = 0,
         .max = 8},
        {.name = "GEMMAJIT_TP_PUSH_BLOCKS",
         .family = "device",
         .type = T::Int,
         .cls = C::Neutral,
         .default_value = "0",
         .help = "tensor parallelism: the blocks of a prefill chunk's push of its products "
                 "(GEMMAJIT_TP_PREFILL_PUSH), at most the SMs of the GPU with the fewest (each "
                 "block waits for the other ranks' same block, so all must run at once); 0: one "
                 "per SM (on 2x H200 the 31B's pp512 measured best there: 16 blocks -3%, 32 "
                 "-1.5%, 264 and 528 -0.5%)",
         .min = 0,
         .max = 1024},
        {.name = "GEMMAJIT_NCCL_INCLUDE",
         .family = "device",
         .type = T::Path,
         .cls = C::Neutral,
         .default_value = "",
         .help = "folder holding nccl.h and nccl_device/ of the NCCL library loaded (empty: next "
                 "to the library, /usr/include, /usr/local/include or the CUDA install)"},
        {.name = "GEMMAJIT_NCCL_LIB",
         .family = "device",
         .type = T::Path,
         .cls = C::Neutral,
         .default_value = "",
         .help = "NCCL library file (or its folder) for tensor parallelism (empty: libnccl.so.2 "
                 "on the library path, in the CUDA install or a Python nvidia-nccl wheel)"},
        // paths (kill switches) and tuning
        {.name = "GEMMAJIT_GRAPHS",
         .family = "path",
         .type = T::Bool,
         .cls = C::Neutral,
         .default_value = "1",
         .help = "0: launch the decode step eagerly instead of as a CUDA graph"},
        {.name = "GEMMAJIT_PDL",
         .family = "path",
         .type = T::Bool,
         .cls = C::Neutral,
         .default_value = "1",
         .help = "0: launch every kernel only after the one before it has finished, instead of "
                 "as a programmatic dependent (sm_90+: its blocks start and load their first "
                 "weights while the kernel before finishes)"},
        {.name = "GEMMAJIT_KV_TYPE",
         .family = "tuning",
         .type = T::Enum,
         .cls = C::OutputChanging,
         .default_value = "f16",
         .help = "KV cache element type (changes attention results): f16, bf16, or q8_0 (int8 "
                 "with an fp16 scale per 32 values, about half the bytes; not with "
                 "GEMMAJIT_FLASH_MMA=1)",
         .choices = {"f16", "bf16", "q8_0"}},
        {.name = "GEMMAJIT_PREFILL_CHUNK",
         .family = "tuning",
         .type = T::Int,
         .cls = C::Neutral,
         .default_value = "2048",
         .help = "prompt tokens per prefill chunk (each chunk runs layer by layer as one batch, "
                 "making each layer's F16 weight copies once; sliding-window KV rings grow by "
                 "chunk - 1 slots); when unset, a load short of memory halves it down to 512 "
                 "before reducing the context",
         .min = 1,
         .max = 4096},
        {.name = "GEMMAJIT_MATVEC_PREFETCH",
         .family = "tuning",
         .type = T::Int,
         .cls = C::Neutral,
         .default_value = "2",
         .help = "sixteenths of each weight row a decode matvec block asks L2 for between its "
                 "first weight loads and its wait on the kernel before (sm_90); the prefetch "
                 "also keeps those loads ahead of the wait in ptxas' schedule. 0: none",
         .min = 0,
         .max = 16},
        {.name = "GEMMAJIT_MATVEC_SHAPE",
         .family = "tuning",
         .type = T::String,
         .cls = C::Neutral,
         .default_value = "",
         .help = "decode matvec launch shapes set by hand, comma separated: "
                 "<type>.k<K>=<threads>x<rows>x<unroll> (threads a multiple of 32 up to 1024, "
                 "rows 1-8, unroll 1-8) for every single-sequence decode matvec of that weight "
                 "type and input width, <type>.k<K>.geglu=... for its FFN gate|up entry alone "
                 "(block types); e.g. q4_k.k2560.geglu=96x2x1. Not the batched matvecs (prefill, "
                 "several sequences), not a PLE gate whose input norm needs more threads, not a "
                 "Q6_K V read in the Q|K|V launch of a Q4_K_M / Q5_K_M layer (Q's shape); a load "
                 "names entries nothing took. The kernels carry the shape in their names "
                 "(.t96x2x1, .g96x2x1); their sums run in another order, so the last bits differ, "
                 "also between a sequence decoded alone and in a batch",
         .pattern = "([a-z0-9_]+\\.k[0-9]+(\\.geglu)?=[0-9]+x[0-9]+x[0-9]+"
                    "(,[a-z0-9_]+\\.k[0-9]+(\\.geglu)?=[0-9]+x[0-9]+x[0-9]+)*)?",
         .pattern_help = "<type>.k<K>[.geglu]=<threads>x<rows>x<unroll>[,...]"},
        {.name = "GEMMAJIT_COPY_SMS",
         .family = "tuning",
         .type = T::Int,
         .cls = C::Neutral,
         .default_value = "-1",
         .help = "SMs a prefill chunk's cuBLAS products leave to the F16 copies of the next "
                 "layer's quantized weights made beside them (cuBLAS's SM-count target); -1: "
                 "1/11 of the GPU's SMs for chunks under 1024 rows and none for longer ones, "
                 "0: none (the copies run only in the products' gaps)",
         .min = -1,
         .max = 1024},
        {.name = "GEMMAJIT_STREAMS",
         .family = "path",
         .type = T::Bool,
         .cls = C::Neutral,
         .default_value = "1",
         .help = "0: run a layer's K and V projections after Q, and a MoE layer's dense MLP "
                 "in a decode step before its router and experts, on the compute stream instead "
                 "of concurrently on side streams"},
        {.name = "GEMMAJIT_FUSE_QKV",
         .family = "path",
         .type = T::Bool,
         .cls = C::Neutral,
         .default_value = "1",
         .help = "0: launch a layer's Q, K and V decode matvecs one by one (K and V on the side "
                 "streams) instead of as one launch over the three matrices (same results; a "
                 "Q4_K_M / Q5_K_M layer's Q6_K V is read in Q's launch shape, so its last bits "
                 "may differ)"},
        {.name = "GEMMAJIT_MERGE_QKV",
         .family = "path",
         .type = T::Bool,
         .cls = C::Neutral,
         .default_value = "1",
         .help = "0: a prefill chunk's Q, K and V products on F16 weight copies as three cuBLAS "
                 "products (K and V on the side streams) instead of one product over the three "
                 "copies, which lie side by side (same math; cuBLAS may pick other kernels)"},
        {.name = "GEMMAJIT_MERGE_GATE_UP",
         .family = "path",
         .type = T::Bool,
         .cls = C::Neutral,
         .default_value = "1",
         .help = "0: a prefill chunk's FFN gate and up products on F16 weight copies as two "
                 "cuBLAS products instead of one product over the two copies, which lie side by "
                 "side, where that product is at most 24576 rows (same math; cuBLAS may pick "
                 "other kernels)"},
        {.name = "GEMMAJIT_FUSE_PLE",
         .family = "path",
         .type = T::Bool,
         .cls = C::Neutral,
         .default_value = "1",
         .help = "0: a float PLE gate's matvec and its GeLU product with the token's PLE input "
                 "as two launches instead of one (same results)"},
        {.name = "GEMMAJIT_PLE_INPUT",
         .family = "path",
         .type = T::Bool,
         .cls = C::Neutral,
         .default_value = "1",
         .help = "0: a decode step's post-FFW residual update and a quantized PLE projection's "
                 "Q8_1 input in launches of their own instead of in each block of the PLE gate "
                 "and projection that read them (same results)"},
        {.name = "GEMMAJIT_PARALLEL_UPLOAD",
         .family = "path",
         .type = T::Bool,
         .cls = C::Neutral,
         .default_value = "1",
         .help = "0: upload weights with one pageable cuMemcpyHtoDAsync per tensor instead of "
                 "parallel reads into pinned staging buffers overlapped with the copies"},
        {.name = "GEMMAJIT_REPACK",
         .family = "path",
         .type = T::Bool,
         .cls = C::Neutral,
         .default_value = "1",
         .help = "0: keep Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K weights in their GGUF "
                 "block layout instead of repacking them into the aligned split layout at load"},
        {.name = "GEMMAJIT_GPU_SAMPLING",
         .family = "path",
         .type = T::Bool,
         .cls = C::Neutral,
         .default_value = "1",
         .help = "0: download every step's whole logits row and sample on the host instead of "
                 "reducing to the argmax / top-k candidates on the GPU"},
        {.name = "GEMMAJIT_PLE_TABLE",
         .family = "path",
         .type = T::Enum,
         .cls = C::Neutral,
         .default_value = "auto",
         .help = "where the per-layer embedding table lives: on the GPU when it fits (auto), "
                 "always on the GPU (gpu), or in pinned host memory read by the GPU (host)",
         .choices = {"auto", "gpu", "host"}},
        {.name = "GEMMAJIT_GPU_MEMORY_LIMIT",
         .family = "device",
         .type = T::Size,
         .cls = C::Neutral,
         .default_value = "0",
         .help = "plan model placement as if at most this much GPU memory were free (0: what the "
                 "driver reports)"},
        {.name = "GEMMAJIT_FLASH_MMA",
         .family = "path",
         .type = T::Bool,
         .cls = C::OutputChanging,
         .default_value = "0",
         .help = "1: decode attention on tensor cores (q and P rounded to the KV type) instead "
                 "of fp32 CUDA cores; slower at E4B decode shapes so far"},
        {.name = "GEMMAJIT_MMQ_VARIANT",
         .family = "path",
         .type = T::Enum,
         .cls = C::OutputChanging,
         .default_value = "auto",
         .help = "prefill products of Q8_0/Q4_0 weights: auto (on sm_90 wgmma for chunks "
                 "under 256 rows, 512 from d_model 4096, blas from there; wgmma alone without "
                 "cuBLAS; else mma), blas (cuBLAS on F16 copies of each layer "
                 "dequantized ahead, as for K-quants; needs cuBLAS and GEMMAJIT_BLAS=1), wgmma "
                 "(bf16 warpgroup GEMM of weights dequantized in shared memory, sm_90 only), mma "
                 "(int8 mma.sync GEMM), none (the batched dp4a matvecs, the exact path)",
         .choices = {"auto", "wgmma", "mma", "blas", "none"}},
        {.name = "GEMMAJIT_WGMMA_PRODUCER",
         .family = "path",
         .type = T::Bool,
         .cls = C::Neutral,
         .default_value = "1",
         .help = "0: every thread of a wgmma GEMM block of 64 weight rows issues its copies and "
                 "meets the others at a barrier every 64 elements of K, instead of a producer "
                 "warpgroup streaming them behind mbarriers while the consumer warpgroup only "
                 "converts and multiplies (same results; blocks of 128 rows always take the "
                 "first form, which measured faster there)"},
        {.name = "GEMMAJIT_MOE_GEMM",
         .family = "path",
         .type = T::Bool,
         .cls = C::OutputChanging,
         .default_value = "1",
         .help = "0: a MoE layer's routed experts in prefill on the grouped dp4a matvecs (groups "
                 "of 8 slots) instead of the grouped int8 tensor-core GEMM (experts of every "
                 "block type in the split layout, i.e. not with GEMMAJIT_REPACK=0; with "
                 "GEMMAJIT_MMQ_VARIANT other than none)"},
        {.name = "GEMMAJIT_BLAS",
         .family = "path",
         .type = T::Bool,
         .cls = C::OutputChanging,
         .default_value = "1",
         .help = "0: prefill products of F32/F16/BF16 weights on the batched fp32 matvecs, and "
                 "of K-quant/fallback weights on the batched dp4a matvecs, instead of cuBLAS "
                 "(which rounds activations to the weight type, F32 to TF32, and multiplies "
                 "quantized weights as per-layer F16 copies); with it GEMMAJIT_MMQ_VARIANT=auto "
                 "takes wgmma alone on sm_90"},
        {.name = "GEMMAJIT_FLASH_WGMMA",
         .family = "path",
         .type = T::Enum,
         .cls = C::OutputChanging,
         .default_value = "auto",
         .help = "prefill attention on Hopper's warpgroup tensor cores (sm_90 only; f16/bf16 "
                 "caches): auto (for chunks whose row blocks fill the GPU, e.g. every 31B chunk, "
                 "12B/26B-A4B chunks from 512 tokens and E2B/E4B chunks from about 1024; the "
                 "mma.sync kernel for shorter ones), on (every chunk), off (never)",
         .choices = {"auto", "on", "off"}},
        {.name = "GEMMAJIT_FLASH_PREFILL",
         .family = "path",
         .type = T::Bool,
         .cls = C::OutputChanging,
         .default_value = "1",
         .help = "0: prefill attention on the split-K decode kernel (one query at a time) instead "
                 "of the tensor-core flash attention (q and P rounded to the KV type)"},
    };
    return table;
}

const FlagDef* find_flag(std::string_view name) {
    for (const auto& f : flag_table())
        if (f.name == name) return &f;
    return nullptr;
}

EnvMap process_environment() {
    EnvMap env;
    for (char** e = environ; e && *e; ++e) {
        std::string_view kv(*e);
        if (!kv.starts_with(kPrefix)) continue;
        size_t eq = kv.find('=');
        if (eq == std::string_view::npos) continue;
        env.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
    }
    return env;
}

uint64_t parse_size(std::string_view text) {
    std::string s(text);
    s.erase(std::remove_if(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); }),
            s.end());
    uint64_t number = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), number);
    if (ec != std::errc() || end == s.data())
        throw std::invalid_argument("not a size (expected e.g. 512M, 2G or a byte count)");
    std::string unit(end, static_cast<const char*>(s.data() + s.size()));
    std::transform(unit.begin(), unit.end(), unit.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    if (unit.ends_with("ib"))
        unit.resize(unit.size() - 2);
    else if (unit.size() > 1 && unit.ends_with("b"))
        unit.resize(unit.size() - 1);
    int shift = 0;
    if (unit.empty() || unit == "b")
        shift = 0;
    else if (unit == "k")
        shift = 10;
    else if (unit == "m")
        shift = 20;
    else if (unit == "g")
        shift = 30;
    else if (unit == "t")
        shift = 40;
    else
        throw std::invalid_argument("unknown size unit '" + unit + "' (use K, M, G or T)");
    if (shift && number > (UINT64_MAX >> shift)) throw std::invalid_argument("size too large");
    return number << shift;
}

std::string format_size(uint64_t bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = static_cast<double>(bytes);
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        ++u;
    }
    return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", v, units[u]);
}

namespace {

size_t edit_distance(std::string_view a, std::string_view b) {
    std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        cur[0] = i;
        for (size_t j = 1; j <= b.size(); ++j)
            cur[j] = std::min(
                {prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
        std::swap(prev, cur);
    }
    return prev[b.size()];
}

std::string allowed_text(const FlagDef& def) {
    switch (def.type) {
        case T::Bool:
            return "0 or 1 (also true/false, on/off, yes/no)";
        case T::Int:
            return fmt::format("an integer from {} to {}", def.min, def.max);
        case T::Size:
            return "a size such as 512M, 2G or a byte count";
        case T::Enum: {
            std::string s = "one of ";
            for (size_t i = 0; i < def.choices.size(); ++i) {
                if (i) s += '|';
                s += def.choices[i];
            }
            return s;
        }
        case T::String:
            return def.pattern_help.empty() ? "any text" : std::string(def.pattern_help);
        case T::Path:
            return "a directory path";
    }
    return "";
}

[[noreturn]] void bad_value(const FlagDef& def, std::string_view value, std::string_view why = {}) {
    throw FlagError(fmt::format("{}='{}' is not valid{}{}: expected {}", def.name, value,
                                why.empty() ? "" : " (", why.empty() ? "" : std::string(why) + ")",
                                allowed_text(def)));
}

std::string lower(std::string_view s) {
    std::string out(s);
    std::transform(out.begin(), out.end(), out.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    return out;
}

}  // namespace

Flags Flags::parse(const EnvMap& env, std::vector<std::string>* warnings) {
    Flags flags;
    for (const auto& def : flag_table()) {
        Value v;
        v.def = &def;
        auto it = env.find(def.name);
        v.set = it != env.end();
        std::string raw = v.set ? it->second : std::string(def.default_value);
        v.raw = raw;
        switch (def.type) {
            case T::Bool: {
                std::string l = lower(raw);
                if (l == "1" || l == "true" || l == "on" || l == "yes")
                    v.number = 1;
                else if (l == "0" || l == "false" || l == "off" || l == "no" || l.empty())
                    v.number = 0;
                else
                    bad_value(def, raw);
                break;
            }
            case T::Int: {
                int64_t n = 0;
                auto [end, ec] = std::from_chars(raw.data(), raw.data() + raw.size(), n);
                if (raw.empty())
                    n = 0;
                else if (ec != std::errc() || end != raw.data() + raw.size())
                    bad_value(def, raw);
                if (n < def.min || n > def.max) bad_value(def, raw, "out of range");
                v.number = n;
                break;
            }
            case T::Size:
                try {
                    v.number = static_cast<int64_t>(parse_size(raw));
                } catch (const std::invalid_argument& e) {
                    bad_value(def, raw, e.what());
                }
                break;
            case T::Enum:
                if (std::find(def.choices.begin(), def.choices.end(), raw) == def.choices.end())
                    bad_value(def, raw);
                v.text = raw;
                break;
            case T::String:
                if (!def.pattern.empty() &&
                    !std::regex_match(raw, std::regex(std::string(def.pattern))))
                    bad_value(def, raw);
                v.text = raw;
                break;
            case T::Path:
                v.text = raw;
                break;
        }
        flags.values_.emplace(std::string(def.name), std::move(v));
    }
    if (warnings) {
        for (const auto& [name, value] : env) {
            if (!name.starts_with(kPrefix) || find_flag(name)) continue;
            const FlagDef* best = nullptr;
            size_t best_d = SIZE_MAX;
            for (const auto& def : flag_table()) {
                size_t d = edit_distance(name, def.name);
                if (d < best_d) best_d = d, best = &def;
            }
            warnings->push_back(
                fmt::format("unknown environment variable {} (ignored){}", name,
                            best && best_d <= std::max<size_t>(3, name.size() / 4)
                                ? fmt::format("; did you mean {}?", best->name)
                                : std::string("; `gemmajit env` lists the known ones")));
        }
    }
    return flags;
}

const Flags& Flags::process() {
    static const Flags flags = [] {
        std::vector<std::string> warnings;
        Flags f = parse(process_environment(), &warnings);
        for (const auto& w : warnings) std::fprintf(stderr, "gemmajit: warning: %s\n", w.c_str());
        return f;
    }();
    return flags;
}

const Flags::Value& Flags::value(std::string_view name,
                                 std::initializer_list<FlagType> types) const {
    auto it = values_.find(name);
    if (it == values_.end())
        throw std::logic_error(fmt::format("flag {} is not declared in jit/env_flags.cpp", name));
    if (std::find(types.begin(), types.end(), it->second.def->type) == types.end())
        throw std::logic_error(fmt::format("flag {} read with the wrong type", name));
    return it->second;
}

bool Flags::get_bool(std::string_view name) const {
    return value(name, {T::Bool}).number != 0;
}
int64_t Flags::get_int(std::string_view name) const {
    return value(name, {T::Int}).number;
}
uint64_t Flags::get_size(std::string_view name) const {
    return static_cast<uint64_t>(value(name, {T::Size}).number);
}
const std::string& Flags::get_string(std::string_view name) const {
    return value(name, {T::String, T::Enum, T::Path}).text;
}
bool Flags::is_set(std::string_view name) const {
    return value(name, {T::Bool, T::Int, T::Size, T::String, T::Enum, T::Path}).set;
}

const std::string& Flags::raw(std::string_view name) const {
    return value(name, {T::Bool, T::Int, T::Size, T::String, T::Enum, T::Path}).raw;
}

std::string Flags::canonical(std::string_view name) const {
    const Value& v = value(name, {T::Bool, T::Int, T::Size, T::String, T::Enum, T::Path});
    switch (v.def->type) {
        case T::Bool:
        case T::Int:
        case T::Size:
            return std::to_string(v.number);
        default:
            return v.text;
    }
}

std::vector<std::pair<std::string, std::string>> Flags::output_changing() const {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& def : flag_table())
        if (def.cls == C::OutputChanging) out.emplace_back(def.name, canonical(def.name));
    return out;
}

}  // namespace gj::jit
