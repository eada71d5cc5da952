// matvec family: the specs of the decode matvecs (and their small-batch forms for prefill) over
// the weights in each storage type:
//   kernel_templates/matvec_q8_0.cu, matvec_q4_0.cu: Q8_0 / Q4_0 weights against Q8_1 (int8)
//     activations, dp4a; "matvec_<q8_0|q4_0>.k<k>[.b<ncols>][.split]"
//   kernel_templates/matvec_q4_1.cu, matvec_q5_0.cu, matvec_q5_1.cu: the 32-block fallbacks of
//     K-quant files, in their GGUF blocks or split (matvec_q32.cuh), dp4a;
//     "matvec_<q4_1|q5_0|q5_1>.k<k>[.b<ncols>][.split]"
//   kernel_templates/matvec_q4_k.cu, matvec_q5_k.cu, matvec_q6_k.cu: the K-quants in their GGUF
//     super-blocks or split (all three) against Q8_1 activations, dp4a;
//     "matvec_<q4_k|q5_k|q6_k>.k<k>[.b<ncols>][.split]"
//   kernel_templates/matvec_f.cu: f32 / f16 / bf16 weights against fp32 activations;
//     "matvec_f.<type>.k<k>[.b<ncols>]"
// (matvec_common.cuh holds their shared machinery, kquant.cuh the K-quant block reading).
// Launch (from the spec constants): block THREADS, grid ceil(n_rows / ROWS).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/gguf/ggml_types.h"
#include "jit/kernel_spec.h"

namespace gj::gemma4 {

// How a quantized matrix sits in GPU memory for the matvec kernels.
enum class MatvecLayout {
    Ggml,   // the GGUF's blocks as-is
    Split,  // payload plane + scale plane(s), made once by the spec's repack_<type> entry
            // (every block type: spec_util::has_split; matrix_bytes gives the size)
};

// Which PLE matrix a matvec spec is for (matvec_spec's `ple`).
enum class PleInput { None, Gate, Proj };

// The entry of a split matvec spec that repacks a GGUF matrix of type t into the split layout
// ("repack_<type>"; one thread per 32 elements, any grid covering them).
std::string repack_entry(ggml::Type t);

// Bytes of a rows x k matrix of `type` in `layout`: the GGUF bytes, except a split Q4_K (148
// bytes per 256 elements instead of 144: its scales and mins unpacked to a byte each) and a
// split Q5_K (180 instead of 176, for the same reason).
uint64_t matrix_bytes(ggml::Type type, MatvecLayout layout, uint64_t rows, uint64_t k);

// matvec of input width k. Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1: "matvec_q8_0.k<k>[.b<ncols>][.split]"
// (int8 activations); Q4_K / Q5_K / Q6_K: "matvec_q4_k.k<k>[.b<ncols>][.split]" (k a multiple of
// 256); F32 / F16 / BF16: the matvec_f_spec below (layout must be Ggml). Throws ConfigError for
// another weight type, std::invalid_argument for k % 32 != 0 (% 256 for K-quants), a split layout
// of a float type or ncols outside 1..8.
// n_rows (0: not known) is the matrix's output rows: single-column launch shapes depend on it
// for a few types (a vocabulary-sized LM head, float matrices of few rows), and a spec whose
// shape it changed carries ".wide" (>= 65536 rows), ".tall" (> 4096), ".short" (1024-2048) or
// ".few" (< 1024) in its name.
// ple: a PLE model's gate or projection, whose single-column spec also gets the entry that
// makes its input in each block (matvec_common.cuh): the gate's _norm_in (matvec_f:
// _gelu_mul_norm_in; name suffix ".ple_gate"), a quantized projection's _gelu_in (".ple_proj").
jit::KernelSpec matvec_spec(ggml::Type weight_type, int k, int ncols = 1,
                            MatvecLayout layout = MatvecLayout::Ggml, int n_rows = 0,
                            PleInput ple = PleInput::None);

// A single-column (decode) spec `s` of matvec_spec / matvec_f_spec whose blocks ask L2 for the
// leading `sixteenths` of each of their weight rows between their first weight loads and their
// grid dependency wait (constant L2_PREFETCH; GEMMAJIT_MATVEC_PREFETCH, on sm_90). On sm_90 the
// bulk prefetch also keeps those loads ahead of the wait in ptxas' schedule. `s` unchanged for 0
// and for specs of several columns or of MoE experts. Throws std::invalid_argument outside 0..16.
jit::KernelSpec with_decode_prefetch(jit::KernelSpec s, int sixteenths);

// Launch shapes set by hand (GEMMAJIT_MATVEC_SHAPE): "<type>.k<K>[.geglu]=<T>x<R>x<U>", comma
// separated. <type> a weight type with a matvec (q8_0, q4_0, ..., q6_k, f32, f16, bf16), K the
// input width; T threads per block (a multiple of 32, up to 1024), R rows per block (1..8), U
// loop iterations per load batch (1..8). Plain: THREADS / ROWS / UNROLL of every single-column
// decode spec of that type and width (the GeGLU entry too, unless the spec has its own shape;
// not the batched specs, nor a Q6_K V that a mixed multi launch reads in Q's shape);
// ".geglu" (block types only): the _geglu entry's own (GEGLU_*). A PLE gate's spec keeps its
// threads when its input norm needs more than the override gives (NORM_TPR).
struct MatvecShape {
    int threads = 0, rows = 0, unroll = 0;
};
struct MatvecShapeOverride {
    ggml::Type type;
    int k = 0;
    bool geglu = false;
    MatvecShape shape;
};
using MatvecShapes = std::vector<MatvecShapeOverride>;
// Throws ConfigError naming the entry that is malformed, out of range, of a type without a
// matvec, or given twice. Empty text: none.
MatvecShapes parse_matvec_shapes(std::string_view text);
// A single-column decode spec `s` (matvec_spec / matvec_f_spec, after with_decode_prefetch) with
// the overrides naming its type and width, its name extended by ".t<T>x<R>x<U>" (plain) and
// ".g<T>x<R>x<U>" (GeGLU) so that `kernels` and profiles show them; any other spec unchanged.
// `applied` (optional, one flag per override): set for each override `s` took.
jit::KernelSpec with_matvec_shapes(jit::KernelSpec s, const MatvecShapes& shapes,
                                   std::vector<bool>* applied = nullptr);

// The push form of a single-column decode spec `s` (a tensor-parallel rank's row-parallel
// product: attention output, FFN down): ".push<ranks>", constant PUSH, the one entry
// "<family>_push", which stores the product into all `ranks` ranks' window slots itself
// (matvec_common.cuh); the launch shape is `s`'s. Throws std::invalid_argument for a MoE, PLE or
// several-column spec, or ranks outside 2..8.
jit::KernelSpec matvec_push_spec(jit::KernelSpec s, int ranks);

// Whether a layer whose Q and K are `qk` and whose V is `v` (another type) runs its three
// products in one launch through matvec_multi_v_spec: the _M mixes' Q4_K / Q5_K layers that keep
// V in Q6_K (llama.cpp's use-more-bits attn_v tensors, engine/model/quant_mix.h).
bool has_multi_v(ggml::Type qk, ggml::Type v);
// The mixed multi form of Q's single-column decode spec `s` (matvec_spec of a type has_multi_v
// takes, with its _multi entry): ".v_<v type>", constant MULTI_V, the one entry "<family>_multi",
// whose third matrix is read as `v` (same K and layout) in `s`'s launch shape. Throws
// std::invalid_argument for another spec or type.
jit::KernelSpec matvec_multi_v_spec(jit::KernelSpec s, ggml::Type v);
// The one decision for a layer whose Q (and K) decode spec `q_spec` reads type `q` and whose V is
// `v`: its mixed multi spec where has_multi_v takes the pair and the spec has the multi entry,
// else nullopt. GpuModel asks it per layer, the plans per weight type.
std::optional<jit::KernelSpec> qkv_multi_v_spec(const jit::KernelSpec& q_spec, ggml::Type q,
                                                ggml::Type v);

// The launch shape of a matvec spec's entry: block `threads`, grid ceil(n_rows / rows); the
// _geglu entry may take its own (the GEGLU_* constants), the others the spec's.
struct MatvecLaunch {
    unsigned threads, rows;
};
MatvecLaunch matvec_launch(const jit::KernelSpec& spec, bool geglu);

// matvec for float weights (f32, f16, bf16) against fp32 activations:
// "matvec_f.<type>.k<k>[.b<ncols>][.few]". Throws like matvec_spec.
jit::KernelSpec matvec_f_spec(ggml::Type weight_type, int k, int ncols = 1, int n_rows = 0,
                              PleInput ple = PleInput::None);

// The grouped expert matvecs of a MoE layer (entries <base>_moe, <base>_moe_geglu; see
// matvec_common.cuh) over stacked experts, in their GGUF layout or (block types, `layout` Split)
// each expert's matrix repacked on its own (the spec then also holds the repack entry): the name of
// matvec_spec / matvec_f_spec with ".moe". ncols: the most slots of one group (1 for single-token
// decode); float weights take at most 4 (the spec's NCOLS says how many it took).
jit::KernelSpec matvec_moe_spec(ggml::Type weight_type, int k, int ncols = 1,
                                MatvecLayout layout = MatvecLayout::Ggml);

}  // namespace gj::gemma4
