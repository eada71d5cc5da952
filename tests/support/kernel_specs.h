// The kernel specs the kernel-plan and NVRTC compile tests share (tests/gpu/test_kernel_plan.cpp,
// tests/gpu/test_compile_*.cpp): every spec of every preset's plan plus the forms no plan uses by
// default, and the harness that compiles them on the CPU and reads their PTX.
#pragma once

#include <cstddef>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "engine/gguf/ggml_types.h"
#include "jit/jit.h"
#include "jit/kernel_spec.h"

namespace gj::test {

// The weight types a plan can store every matrix in: f32, f16, bf16, q8_0, q4_0.
const std::vector<ggml::Type>& plan_weight_types();

std::set<std::string> names_of(const std::vector<jit::KernelSpec>& plan);

// Every distinct spec of every preset's plan (the five released models and the tiny test presets)
// for every weight type, the K-quant mixes (q4_k_m, q5_k_m) of the models whose widths are whole
// super-blocks, plus the selftest and the forms no plan uses by default (ggml layout,
// odd column counts, other KV types, the tensor-core decode attention, other GEMM tiles and
// attention tilings).
std::vector<jit::KernelSpec> all_specs();
// The chain probe's one spec (kernel_templates/chain_probe.cu, tests/gpu/gpu_test_chain_probe.cpp).
jit::KernelSpec chain_probe_spec();
// The stream probe's spec for input width k (kernel_templates/stream_probe.cu,
// tests/gpu/gpu_test_stream_probe.cpp); its blocks take SMEM bytes of dynamic shared memory.
jit::KernelSpec stream_probe_spec(int k, int threads, int stages);
// The PLE cluster probe's spec for model width d and `cluster` blocks
// (kernel_templates/ple_cluster_probe.cu, tests/gpu/gpu_test_ple_cluster_probe.cpp): a PLE
// projection of 256 inputs and its post-norm.
jit::KernelSpec ple_cluster_probe_spec(int d, int cluster);
// The FFN probe's spec for model width k, c intermediate rows per block, and either `depth` gate|up
// rows in flight per warp in registers or (gu_smem) the block's gate|up rows in shared memory
// (kernel_templates/ffn_probe.cu, tests/gpu/gpu_test_ffn_probe.cpp), its blocks in clusters of
// `cluster` (1 or 8) that sum their partial products before adding them into y; its blocks take
// SMEM bytes of dynamic shared memory.
jit::KernelSpec ffn_probe_spec(int k, int c, int depth, bool gu_smem, int cluster);
// The fused decode attention probe (kernel_templates/attn_fused_probe.cu): a sliding layer of
// model width k, GROUP query heads per KV head, head dim 256, one cluster of `cluster` blocks
// per KV head; raw_in: the two-launch form reading the Q|K|V matvec's outputs.
jit::KernelSpec attn_fused_probe_spec(int k, int group, int n_kv_heads, int window, int cluster,
                                      bool raw_in);
// The specs of all_specs() whose family is one of `families`.
std::vector<jit::KernelSpec> all_specs_of(const std::set<std::string>& families);

// The PTX text of one entry: from its ".entry name(" to the next ".entry" (or the end).
std::string entry_ptx(const std::string& ptx, const std::string& entry);
// How many times `what` occurs in `text`.
size_t occurrences(const std::string& text, const std::string& what);

// The specs a compile test compiles: all of them, or with GJ_COMPILE_SAMPLE=N (tools/test.sh sets
// it for the sanitizer pass) every N-th one plus the last. NVRTC is not instrumented and the
// Release pass compiles the whole grid; the sanitizer pass needs a cross-section of it for the host
// code it runs (rendering, the JIT, the checks). A value that is not a positive integer throws
// (env_positive_int), failing the calling test.
std::vector<jit::KernelSpec> compile_sample(const std::vector<jit::KernelSpec>& specs);

// NVRTC for every spec (of compile_sample), for sm_80 and sm_90, on 2 threads without a cache, with
// the checks every kernel shares: a CUBIN, every entry in the PTX, and no spills and no stack for
// the model's hot kernels (attn_prep may keep a stack frame; the selftest is not a model kernel).
// `check` adds the family's own checks per compiled kernel and arch (run under a trace naming
// both).
void compile_and_check(
    const std::vector<jit::KernelSpec>& specs,
    const std::function<void(const jit::CompiledKernel&, const std::string& arch)>& check);

// NVRTC for the specs (of compile_sample) of an sm_90a-only family (arch_specific 90) planned for
// sm_90, on 2 threads without a cache. Checks that each became sm_90a code and that ptxas
// serialized none of its wgmmas (a "Potential Performance Loss" note: the overlap the kernels are
// built around would vanish), and that the first spec is refused for sm_80 by name. Returns the
// compiled kernels for the family's own checks.
std::vector<jit::CompiledKernel> compile_sm90a_only(const std::vector<jit::KernelSpec>& specs);

}  // namespace gj::test
