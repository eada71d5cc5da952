#pragma once
#include "engine/kernel_plan.h"
namespace gj::gemma4 {
jit::KernelSpec matvec_f_spec(ggml::Type t, int k, int ncols);
jit::KernelSpec embed_rows_spec(int n, ggml::Type t);
jit::KernelSpec attn_prep_spec(const Config& c, int layer, int kv_type);
jit::KernelSpec flash_decode_spec(const Config& c, int layer, int kv_type);
jit::KernelSpec ple_finish_spec(int n_layers, int p);
jit::KernelSpec gelu_mul_spec(int p);
jit::KernelSpec softcap_argmax_spec(int vocab, float cap);
jit::KernelSpec topk_spec(int vocab, float cap);
jit::KernelSpec rmsnorm_spec(int n, bool weight, bool quant, bool add, bool scale);
}
