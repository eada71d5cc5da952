// GpuModel's norms over the residual stream: which rmsnorm specializations a load registers for
// the pre-norms and the post-norms chained around each residual update (kernel_templates/
// rmsnorm.cu), by the products that consume their output and the all-reduces before them.
#include <fmt/format.h>

#include <algorithm>

#include "engine/gpu/gpu_model.h"
#include "engine/gpu/kernels/matvec.h"
#include "engine/gpu/kernels/mmq.h"
#include "engine/gpu/kernels/rmsnorm.h"
#include "engine/gpu/kernels/spec_util.h"
#include "engine/gpu/kernels/tp_push.h"

namespace gj::gemma4 {

void GpuModel::plan_residual_norms() {
    const Config& c = cfg_;
    // Norms over the residual stream (all also write Q8_1 activations: d is a multiple of 32,
    // and a float-weight consumer reads the fp32 copy instead; the ".h16" forms below write f16
    // instead, for prefill chunks whose consumers are all F16 cuBLAS products). The pre-norm of the
    // first layer stands alone; every later pre-norm (and the output norm) is chained to the
    // residual update before it: post_attention_norm + ffn_norm, and the layer's last post-norm +
    // layer scale + the next layer's attn_norm. With PLE the post_ffw_norm update also quantizes
    // the updated stream, the PLE gate's input.
    const int d = c.d_model;
    spec_prenorm_ = kernels_.add(rmsnorm_spec(d, true, true)).name;
    spec_post_prenorm_ = kernels_.add(rmsnorm_spec(d, true, true, true, false, true)).name;
    spec_post_scale_prenorm_ = kernels_.add(rmsnorm_spec(d, true, true, true, true, true)).name;
    if (c.has_ple()) spec_post_quant_ = kernels_.add(rmsnorm_spec(d, true, true, true)).name;
    // Prefill chunks whose next products are all F16 cuBLAS ones take these norms' output in f16
    // (no conversion pass): the norms feeding attention and the FFN.
    bool f16_products = false;
    for (const GpuLayer& g : layers_)
        for (const GpuMatrix* m : {&g.q, &g.k, &g.v, &g.o, &g.gate, &g.up, &g.down})
            f16_products = f16_products ||
                           (m->blas && (!m->spec_dequant.empty() || m->type == ggml::Type::F16));
    if (f16_products) {
        spec_h16_[0] =
            kernels_.add(rmsnorm_spec(d, true, true, false, false, false, 1, false, true)).name;
        spec_h16_[1] =
            kernels_.add(rmsnorm_spec(d, true, true, true, false, true, 1, false, true)).name;
        spec_h16_[2] =
            kernels_.add(rmsnorm_spec(d, true, true, true, true, true, 1, false, true)).name;
    }
    bool split_gemms = false;  // some attention-output / FFN-down GEMM splits K
    for (const GpuLayer& g : layers_)
        for (const GpuMatrix* m : {&g.o, &g.down})
            if (!m->spec_gemm.empty())
                split_gemms =
                    split_gemms || spec_constant(kernels_.spec(m->spec_gemm), "SPLITS") > 1;
    if (split_gemms) {
        const int p = kMmqSplits;
        spec_parts_[0] = kernels_.add(rmsnorm_spec(d, true, true, true, false, true, p)).name;
        spec_parts_[1] = kernels_.add(rmsnorm_spec(d, true, true, true, true, true, p)).name;
        if (c.is_moe())
            spec_moe_norms_[1] =
                kernels_.add(rmsnorm_spec(d, true, true, true, false, true, p, true)).name;
        if (c.has_ple())
            spec_parts_[2] = kernels_.add(rmsnorm_spec(d, true, true, true, false, false, p)).name;
    }
    if (c.is_moe())
        spec_moe_norms_[0] =
            kernels_.add(rmsnorm_spec(d, true, true, true, false, true, 1, true)).name;
    // Tensor parallelism: the post-norm after each of a prefill chunk's bf16 all-reduces reads
    // that bf16 sum (no conversion pass back to fp32).
    if (tp_.active()) {
        add_bf16_input_norms(0, 1);
        plan_fused_all_reduce_norms();
    }
}

void GpuModel::add_bf16_input_norms(int which, int planes) {
    const RmsnormBf16InputSpecs s = rmsnorm_bf16_input_specs(cfg_.d_model, cfg_.has_ple(), planes);
    for (int half = 0; half < 2; ++half) {
        spec_xb16_[which].post_prenorm[half] = kernels_.add(s.post_prenorm[half]).name;
        spec_xb16_[which].post_scale_prenorm[half] = kernels_.add(s.post_scale_prenorm[half]).name;
    }
    if (s.post_quant) spec_xb16_[which].post_quant = kernels_.add(*s.post_quant).name;
}

int GpuModel::tp_push_blocks() const {
    if (!tp_prefill_push()) return 0;
    const int sms = tp_min_sms_ > 0 ? tp_min_sms_ : jit::Device::get().sm_count();
    const int64_t blocks = flags_.get_int("GEMMAJIT_TP_PUSH_BLOCKS");
    return blocks > 0 ? int(std::min<int64_t>(blocks, sms)) : sms;
}

void GpuModel::plan_fused_all_reduce_norms() {
    // A decode step's two all-reduces per layer can be done by the post-norms after them: each
    // meets the other ranks at an NCCL LSA barrier and reads their products from the symmetric
    // window (GEMMAJIT_TP_FUSED_NORM; docs/TENSOR_PARALLEL.md). build_kernel_plan of a split
    // plans the same specs for `kernels --tp`.
    std::string why;
    const std::optional<FusedNormPlan> fused = fused_norm_plan(flags_, tp_.nccl, &why);
    if (!fused) {
        spec_lsa_.note = "fused all-reduce norms off: " + why;
        return;
    }
    const int ranks = tp_.ranks;
    const RmsnormLsaSpecs s = rmsnorm_lsa_specs(cfg_.d_model, ranks, fused->headers, fused->push);
    spec_lsa_.post_prenorm = kernels_.add(s.post_prenorm).name;
    spec_lsa_.post_scale_prenorm = kernels_.add(s.post_scale_prenorm).name;
    // A prefill chunk's bf16 products: pushed into every rank's window by one kernel that meets
    // the other ranks at its end, then summed by post-norms of their own
    // (GEMMAJIT_TP_PREFILL_PUSH).
    if (fused->prefill_push(ranks)) {
        spec_lsa_.prefill_push =
            kernels_.add(tp_push_spec(cfg_.d_model, ranks, fused->headers)).name;
        add_bf16_input_norms(1, ranks);
    }
    // The push form: the row-parallel decode matvecs store into every rank's window, so the
    // post-norms' sum after the barrier reads local memory (GEMMAJIT_TP_PUSH).
    if (!fused->push) return;
    spec_lsa_.push_post_prenorm = kernels_.add(*s.push_post_prenorm).name;
    spec_lsa_.push_post_scale_prenorm = kernels_.add(*s.push_post_scale_prenorm).name;
    for (GpuLayer& g : layers_) {
        if (g.moe) continue;  // (a MoE model is never split)
        for (GpuMatrix* m : {&g.o, &g.down})
            m->spec_push =
                kernels_.add(matvec_push_spec(kernels_.spec(m->spec_decode), ranks)).name;
    }
}

}  // namespace gj::gemma4
