// The FFN of a MoE layer (26B-A4B, reference/gemma4-spec.md section 2.5) over T rows, all on the
// GPU with no host round trip: the norms of the post-attention residual in one launch (the dense
// MLP's, the router's input: weightless norm times scale / sqrt(d), the experts' pre-norm), the
// router (logits, top-K weights: moe_route), the dense MLP (in a decode step on a side stream,
// beside the router and the experts), the slots grouped by expert
// (moe_group), the grouped gate|up GeGLU and down products (each expert's weights read once per
// group: the grouped int8 tensor-core GEMM over groups of BM slots in prefill chunks of the
// expert types it reads (mmq_moe_reads: every quantized type of our files), else the
// grouped matvecs over groups of up to kPrefillCols slots, one slot per
// group for a single token), then in one pass the dense output's post-norm plus the experts'
// weighted combine and post-norm (moe_ffn_out).
#include "engine/gpu/kernels/moe.h"
#include "engine/gpu/session/session_internal.h"

#include <algorithm>

namespace gj::gemma4 {

namespace {

// Profiling cost of a grouped expert product over T tokens: the experts a step can touch, each
// read once per group, and the multiply-adds of its T * K slots.
LaunchCost expert_cost(const GpuExperts& m, bool geglu, int T, int K, int E, int n_rows) {
    const uint64_t touched = uint64_t(std::min(E, T * K));
    return LaunchCost{touched * m.expert_bytes * (geglu ? 2 : 1),
                      2.0 * double(T) * K * n_rows * m.all.cols * (geglu ? 2 : 1), WorkKind::Gemm};
}

}  // namespace

void GpuSession::experts(const GpuExperts& m, CUdeviceptr up, Input in, int in_div, CUdeviceptr y,
                         int n_rows, int T, int cols, const char* what) {
    const Work& w = *w_;
    const int E = cfg_.n_experts, K = cfg_.n_experts_used;
    const std::string& name = cols == 1 ? m.spec_one : m.spec_batch;
    const jit::KernelSpec& spec = model_.kernels().spec(name);
    const bool quant = m.all.quantized();
    CUdeviceptr wt = m.all.ptr, x = quant ? in.q : in.f, xds = quant ? in.ds : 0,
                groups = w.moe_groups.ptr(), n_groups = w.moe_n_groups.ptr(),
                slots = w.moe_slots.ptr();
    long long expert_bytes = (long long)m.expert_bytes;
    const int bound = moe_group_bound(T, K, E, cols);
    const LaunchCost cost = expert_cost(m, up != 0, T, K, E, n_rows);
    void* args[] = {&wt,       &up,    &expert_bytes, &x, &xds,   &groups,
                    &n_groups, &slots, &in_div,       &y, &n_rows};
    launch(model_.kernels().get(name, spec.family + (up ? "_moe_geglu" : "_moe")),
           {ceil_div(n_rows, constant(spec, "ROWS")), unsigned(bound)}, {constant(spec, "THREADS")},
           0, args, name + " experts " + what, cost);
    ++paths_.moe_grouped;
}

void GpuSession::experts_gemm(const GpuExperts& m, CUdeviceptr up, CUdeviceptr xq, CUdeviceptr xds,
                              int in_div, CUdeviceptr y, CUdeviceptr yds, int T, const char* what) {
    const Work& w = *w_;
    const int E = cfg_.n_experts, K = cfg_.n_experts_used;
    const jit::KernelSpec& spec = model_.kernels().spec(m.spec_gemm);
    CUdeviceptr wt = m.all.ptr, groups = w.moe_groups.ptr(), n_groups = w.moe_n_groups.ptr(),
                slots = w.moe_slots.ptr();
    long long expert_bytes = (long long)m.expert_bytes;
    int n_rows = m.piece_rows;
    const int bound = moe_group_bound(T, K, E, constant(spec, "BM"));
    const LaunchCost cost = expert_cost(m, up != 0, T, K, E, n_rows);
    const char* entry = up ? "mmq_moe_geglu_q8" : "mmq_moe";
    void* args[] = {&wt,       &up,    &expert_bytes, &xq, &xds, &groups,
                    &n_groups, &slots, &in_div,       &y,  &yds, &n_rows};
    launch(model_.kernels().get(m.spec_gemm, entry),
           {ceil_div(n_rows, constant(spec, "BN")), unsigned(bound)}, {constant(spec, "THREADS")},
           constant(spec, "SMEM"), args, m.spec_gemm + " " + entry + " experts " + what, cost);
    ++paths_.moe_gemm;
}

void GpuSession::moe_post_attention_norms(int l, CUdeviceptr u, int parts, int T) {
    const Work& w = *w_;
    normed_f16_ = false;  // h and its Q8_1 form, as every consumer here reads them
    const GpuLayer& g = model_.layers()[l];
    const std::string& name = model_.spec_moe_norms(parts);
    const jit::KernelSpec& spec = model_.kernels().spec(name);
    const unsigned tpr = constant(spec, "TPR"), rpb = constant(spec, "RPB");
    // x += post_attention_norm(u); h = ffn_norm(x) (and Q8_1) for the dense MLP, y1 =
    // norm(x) * router scale / sqrt(d) for the router, z = pre_ffw_norm_2(x) (and Q8_1) for
    // the experts.
    // The experts read z as fp32 (float weights) or as Q8_1 (int8 weights), not both.
    const bool quant = g.gate_up.all.quantized();
    CUdeviceptr x = w.x.ptr(), wn = g.post_attention_norm, w2 = g.ffn_norm, y2 = w.h.ptr(),
                yq = w.xq.ptr(), yds = w.xds.ptr(), w3 = g.router_norm, y3 = w.moe_y1.ptr(),
                w4 = g.pre_ffw_norm_2, y4 = quant ? 0 : w.moe_z.ptr(),
                yq4 = quant ? w.moe_zq.ptr() : 0, yds4 = quant ? w.moe_zds.ptr() : 0;
    float eps = cfg_.rms_eps;
    void* args[] = {&u,  &wn, &x,  &x,  &w2,  &y2,   &yq, &yds,
                    &w3, &y3, &w4, &y4, &yq4, &yds4, &T,  &eps};
    launch(model_.kernels().get(name, "rmsnorm_moe"), {ceil_div(T, rpb)}, {tpr * rpb}, 0, args,
           name + " post_attention_norm+ffn_norm+pre_ffw_norm_2+gate_inp_norm");
}

void GpuSession::record_moe_ffn(int l, int T) {
    const Work& w = *w_;
    const GpuLayer& g = model_.layers()[l];
    const int K = cfg_.n_experts_used, F = cfg_.expert_ffn_dim, d = cfg_.d_model;
    const std::string& moe = model_.spec_moe();
    const jit::KernelSpec& moe_k = model_.kernels().spec(moe);
    CUdeviceptr y1 = w.moe_y1.ptr(), logits = w.moe_logits.ptr(), ids = w.moe_ids.ptr(),
                wts = w.moe_wts.ptr();

    // Dense MLP on h = ffn_norm(x) (made by the post-attention norms), its output in tmp. It
    // reads nothing the router and the experts write: in a decode step it runs on a side stream
    // (a branch of the step's graph) beside them, joined before moe_ffn_out, so its three
    // launches leave the chain. Not with a quantized router, whose Q8_1 input would take xq from
    // the dense gate|up; not in prefill chunks (split-K workspaces) or while profiling (one
    // kernel at a time).
    const bool beside = streams_ && !profiler_ && !chunk_products(T) && !g.router.quantized();
    if (beside) {
        fork(1);
        stream_ = side_[0];
    }
    matvec(g.down, nullptr, ffn_gate_up(g, T), w.tmp.ptr(), T, "ffn_down");
    stream_ = jit::Device::get().stream();
    paths_.moe_dense_beside += beside;

    // Experts: z2 = pre_ffw_norm_2(x) (and Q8_1, from moe_post_attention_norms), the slots
    // grouped by expert, gate|up GeGLU per slot, down per slot, the weighted sum per row.
    const Input z2{w.moe_z.ptr(), w.moe_zq.ptr(), w.moe_zds.ptr()};
    // Prefill chunks of experts mmq_moe_reads: the grouped tensor-core GEMMs, one tile of BM slots
    // of one expert per block. Else groups of one slot, or as many as both expert matvecs take.
    const bool gemm = !g.gate_up.spec_gemm.empty() && chunk_products(T);
    // A few slots per expert (a decode batch: T * K <= 2E) take groups of one slot on the
    // single-column matvec: 8-column groups mostly held one live slot and paid for eight (26B-A4B,
    // H200, tg x8: 718 t/s with 8-column groups, 1431 with one-slot groups).
    const bool one = T * K <= 2 * cfg_.n_experts;
    int cols = gemm  ? constant(model_.kernels().spec(g.gate_up.spec_gemm), "BM")
               : one ? 1
                     : std::min(g.gate_up.batch_cols, g.down_exps.batch_cols);
    // Router on the post-attention residual: r = norm(x) * scale / sqrt(d) (made by
    // moe_post_attention_norms in y1, until the dense branch's output replaces it), logits = W r,
    // then the K weights per row and the slots grouped by expert: one launch for a decode step's
    // few tokens.
    matvec(g.router, nullptr, Input{y1}, logits, T, "router");
    {
        CUdeviceptr scale = g.expert_scale, n_groups = w.moe_n_groups.ptr(),
                    groups = w.moe_groups.ptr(), slots = w.moe_slots.ptr();
        if (T <= moe_route_group_max_tokens(K)) {
            void* args[] = {&logits, &scale, &ids, &wts, &T, &cols, &n_groups, &groups, &slots};
            launch(model_.kernels().get(moe, "moe_route_group"), {1}, {128}, 0, args,
                   moe + " moe_route_group router");
            ++paths_.moe_route_group;
        } else {
            void* rargs[] = {&logits, &scale, &ids, &wts, &T};
            launch(model_.kernels().get(moe, "moe_route"), {ceil_div(T, 4)}, {128}, 0, rargs,
                   moe + " moe_route router");
            void* gargs[] = {&ids, &T, &cols, &n_groups, &groups, &slots};
            launch(model_.kernels().get(moe, "moe_group"), {1}, {constant(moe_k, "THREADS")}, 0,
                   gargs, moe + " moe_group experts");
        }
    }
    if (gemm) {
        // gate|up writes each slot's GeGLU row as Q8_1, the input of down.
        experts_gemm(g.gate_up, g.up_ptr, z2.q, z2.ds, K, w.moe_ehq.ptr(), w.moe_ehds.ptr(), T,
                     "gate|up");
        experts_gemm(g.down_exps, 0, w.moe_ehq.ptr(), w.moe_ehds.ptr(), 1, w.moe_ed.ptr(), 0, T,
                     "down");
    } else {
        experts(g.gate_up, g.up_ptr, z2, K, w.moe_eh.ptr(), F, T, cols, "gate|up");
        Input eh{w.moe_eh.ptr()};
        if (g.down_exps.all.quantized()) {
            quantize(eh.f, T * K * F, w.moe_ehq.ptr(), w.moe_ehds.ptr());
            eh.q = w.moe_ehq.ptr();
            eh.ds = w.moe_ehds.ptr();
        }
        experts(g.down_exps, 0, eh, 1, w.moe_ed.ptr(), d, T, cols, "down");
    }
    if (beside) join(1);
    // y1 = post_ffw_norm_1(dense) + post_ffw_norm_2(sum_k w_k expert_k): the FFN output the
    // layer's post_ffw_norm takes.
    {
        CUdeviceptr dense = w.tmp.ptr(), ed = w.moe_ed.ptr(), w1 = g.post_ffw_norm_1,
                    w2 = g.post_ffw_norm_2;
        float eps = cfg_.rms_eps;
        void* args[] = {&dense, &ed, &wts, &w1, &w2, &y1, &T, &eps};
        launch(model_.kernels().get(moe, "moe_ffn_out"), {unsigned(T)}, {256}, 0, args,
               moe + " moe_ffn_out post_ffw_norm_1+experts+post_ffw_norm_2");
    }
}

}  // namespace gj::gemma4
