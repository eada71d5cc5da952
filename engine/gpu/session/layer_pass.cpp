// The launch sequence of one forward pass over T rows (reference/gemma4-spec.md section 2):
// embedding and PLE inputs, then per layer attention, FFN and PLE, then the readout. The same
// sequence serves a decode step (recorded into its graph, or eager) and a prefill chunk.
#include "engine/gpu/session/session_internal.h"

#include <algorithm>
#include <cmath>

namespace gj::gemma4 {

void GpuSession::record_embedding(int T) {
    const Work& w = *w_;
    auto gather = [&](const GpuTable& t, CUdeviceptr out, float scale) {
        const jit::KernelSpec& spec = model_.kernels().spec(t.spec);
        const unsigned threads = constant(spec, "THREADS");
        CUdeviceptr rows = w.tokens(), table = t.ptr;
        void* args[] = {&rows, &T, &table, &out, &scale};
        launch(model_.kernels().get(t.spec, "embed_rows"),
               {ceil_div(uint64_t(t.cols) / 4, threads), unsigned(T)}, {threads}, 0, args,
               t.spec + " " + t.name, LaunchCost{uint64_t(T) * (t.bytes / t.rows)});
    };
    gather(model_.token_embd(), w.x.ptr(), cfg_.embed_scale());
    if (!cfg_.has_ple()) return;
    // PLE inputs of every layer: ((RMSNorm(W_proj e / sqrt(d)) * g) + table[tok] * sqrt(P)) /
    // sqrt(2), with e the scaled embedding.
    gather(model_.ple_table(), w.ple_tok.ptr(), std::sqrt(float(cfg_.ple_dim)));
    matvec(model_.ple_model_proj(), nullptr, Input{w.x.ptr()}, w.ple_ctx.ptr(), T,
           "per_layer_model_proj");
    const std::string& name = model_.spec_ple_finish();
    CUdeviceptr ctx = w.ple_ctx.ptr(), tok = w.ple_tok.ptr(), norm = model_.ple_proj_norm(),
                out = w.ple.ptr();
    float inv_sqrt_d = float(1.0 / std::sqrt(double(cfg_.d_model)));
    float eps = cfg_.rms_eps;
    void* args[] = {&ctx, &tok, &norm, &out, &T, &inv_sqrt_d, &eps};
    launch(model_.kernels().get(name, "ple_finish"), {ceil_div(uint64_t(T) * cfg_.n_layers, 4)},
           {128}, 0, args, name);
}

double GpuSession::attention_flops(int l, int row0, int T) const {
    const LayerConfig& lc = cfg_.layers[l];
    const int window = lc.sliding ? cfg_.sliding_window : 0;
    double pairs = 0;  // visible (query, key) pairs
    for (int r = row0; r < row0 + T; ++r) {
        const int p = row_pos_[size_t(r)];
        pairs += window ? std::min(p + 1, window) : p + 1;
    }
    return 4.0 * lc.head_dim * cfg_.n_heads * pairs;  // Q K^T and P V
}

GpuSession::Input GpuSession::record_attention(int l, int T) {
    const Work& w = *w_;
    const LayerConfig& lc = cfg_.layers[l];
    const GpuLayer& gl = model_.layers()[l];
    const uint64_t q_dim = uint64_t(cfg_.q_dim(l));
    if (!decoding_ && !gl.flash_prefill_spec.empty()) {
        // The whole chunk in one launch on tensor cores; K/V of this chunk are already cached.
        // SPLITS blocks (a cluster) per row block share its key range.
        const KvCache::Layer& kv = kv_.layer(l, seq_);
        std::vector<const jit::KernelSpec*> forms;
        for (const std::string& n : gl.flash_prefill_wgmma_specs)
            forms.push_back(&model_.kernels().spec(n));
        const jit::KernelSpec* chosen = flash_prefill_wgmma_choice(forms, T, gl.flash_wgmma_always);
        const bool wgmma = chosen != nullptr;
        const std::string& name = wgmma ? chosen->name : gl.flash_prefill_spec;
        const jit::KernelSpec& spec = model_.kernels().spec(name);
        const unsigned rows_per_block = constant(spec, "BLOCK_ROWS");
        // An F16 cuBLAS output projection takes the output in f16 as well, from the same stores.
        const bool f16 = f16_product(gl.o, T);
        CUdeviceptr q = w.q.ptr(), kc = kv.k, vc = kv.v, positions = w.positions(),
                    out = w.attn.ptr(), out_h = f16 ? w.xhalf.ptr() : 0;
        if (f16) normed_f16_ = false;  // the half buffer now holds the attention output
        int slots = kv.slots;
        void* args[] = {&q, &kc, &vc, &positions, &T, &slots, &out, &out_h};
        launch(model_.kernels().get(name, "flash_prefill"),
               {ceil_div(uint64_t(T) * constant(spec, "GROUP"), rows_per_block) *
                    constant(spec, "SPLITS"),
                unsigned(lc.n_kv_heads)},
               {constant(spec, "THREADS")}, constant(spec, "SMEM"), args, name,
               LaunchCost{0, attention_flops(l, 0, T), WorkKind::Attention});
        ++paths_.flash_prefill;
        paths_.flash_wgmma += wgmma;
        paths_.attn_f16 += f16;
        return f16 ? Input{.f = w.attn.ptr(), .h = w.xhalf.ptr()} : Input{w.attn.ptr()};
    }
    const jit::KernelSpec& spec = model_.kernels().spec(gl.flash_spec);
    // A decode graph's split count is fixed for the whole context (any count is correct; the
    // kernel lengthens the splits as the context grows). Eager prefill sizes it for its chunk.
    const int keys = decoding_ ? context() : pos_[size_t(seq_)] + T;
    int splits = flash_decode_splits(spec, keys, T, jit::Device::get().sm_count());
    const uint64_t per_query_o = uint64_t(cfg_.n_heads) * splits * lc.head_dim;
    const uint64_t per_query_ml = uint64_t(cfg_.n_heads) * splits;
    const int batch = int(std::min<uint64_t>({uint64_t(T), w.layout.part_o_floats / per_query_o,
                                              w.layout.part_ml_pairs / per_query_ml}));
    const jit::Kernel& flash = model_.kernels().get(gl.flash_spec, "flash_decode");
    const jit::Kernel& combine = model_.kernels().get(gl.flash_spec, "flash_combine");
    const unsigned threads = constant(spec, "THREADS"), smem = constant(spec, "SMEM");
    const unsigned combine_threads = constant(spec, "COMBINE_THREADS");
    const unsigned combine_blocks =
        constant(spec, "GROUP") * constant(spec, "N_KV_HEADS") * constant(spec, "HEAD_DIM") / 32;
    // An int8 output projection reads the output's Q8_1 form, made by the combine.
    const bool quantized = gl.o.quantized();
    CUdeviceptr table = kv_.table(l), part_o = w.part_o.ptr(), part_ml = w.part_ml.ptr();
    int slots = kv_.layer(l).slots;
    for (int t0 = 0; t0 < T; t0 += batch) {
        int n = std::min(batch, T - t0);
        const LaunchCost cost{0, attention_flops(l, t0, n), WorkKind::Attention};
        CUdeviceptr q = w.q.ptr() + t0 * q_dim * 4, out = w.attn.ptr() + t0 * q_dim * 4;
        CUdeviceptr positions = w.positions() + uint64_t(t0) * 4;
        CUdeviceptr seqs = w.seqs() + uint64_t(t0) * 4;
        void* fargs[] = {&q, &table, &seqs, &positions, &n, &slots, &splits, &part_o, &part_ml};
        launch(flash, {unsigned(splits), unsigned(lc.n_kv_heads), unsigned(n)}, {threads}, smem,
               fargs, gl.flash_spec + " flash_decode", cost);
        CUdeviceptr outq = quantized ? w.xq.ptr() + t0 * q_dim : 0,
                    outds = quantized ? w.xds.ptr() + t0 * (q_dim / 32) * 8 : 0;
        void* cargs[] = {&part_o, &part_ml, &out, &outq, &outds, &n, &splits};
        launch(combine, {combine_blocks, unsigned(n)}, {combine_threads}, 0, cargs,
               gl.flash_spec + " flash_combine", LaunchCost{0, 0, WorkKind::Attention});
    }
    if (!quantized) return Input{w.attn.ptr()};
    ++paths_.attn_q8;
    return Input{w.attn.ptr(), w.xq.ptr(), w.xds.ptr()};
}

void GpuSession::record_layer(int l, int T) {
    const Work& w = *w_;
    const LayerConfig& lc = cfg_.layers[l];
    const GpuLayer& g = model_.layers()[l];
    // The next pre-norm, chained to this layer's last residual update.
    const CUdeviceptr next_norm =
        l + 1 < cfg_.n_layers ? model_.layers()[l + 1].attn_norm : model_.output_norm();

    // Attention: h = attn_norm(x) is ready (chained); x += post_attention_norm(Wo . attention).
    // The K and V projections (same input, own outputs) run beside Q on side streams: small
    // matvecs that alone leave most of the GPU idle (in a graph: parallel branches). Not while
    // profiling, whose per-launch events time one kernel at a time.
    // Or all three as one launch of the matvec's multi entry (fused: chunks of at most 8 rows),
    // or as one cuBLAS product over their adjacent F16 copies (merged: wherever the layer's
    // copies are made; three products of 512 rows ran 1-5% slower end to end than one).
    const bool fused = fused_qkv(g, lc, T);
    const bool merged = !fused && merged_qkv(g, T);
    const int branches = !fused && !merged && lc.has_kv ? (lc.has_v_proj ? 2 : 1) : 0;
    // Split-K products share one partial-plane workspace: those run one at a time.
    bool split_qkv = false;
    for (const GpuMatrix* m : {&g.q, &g.k, &g.v})
        split_qkv = split_qkv || (chunk_products(T) && splits_k(*m) && !blas_for(*m, T));
    const bool concurrent = streams_ && branches > 0 && !profiler_ && !split_qkv;
    // The bf16 form of h for the wgmma GEMMs, made once for Q, K and V (before the fork).
    bool bf16_qkv = false;
    for (const GpuMatrix* m : {&g.q, &g.k, &g.v})
        bf16_qkv = bf16_qkv || (m->gemm_bf16 && !blas_for(*m, T));
    Input h = chunk_products(T) && bf16_qkv ? with_bf16(normed(), T * cfg_.d_model, "attn_norm")
                                            : normed();
    // Likewise its f16 form for F16 cuBLAS products (K and V share Q's input; a layer whose K is
    // an F16 product has an F16 Q too: one type per file's attention matrices).
    h = with_f16(h, T * cfg_.d_model, T, g.q, lc.has_kv ? &g.k : nullptr, "attn_norm");
    if (concurrent) fork(branches);
    if (fused) {
        matvec_qkv(g, lc, h, T);
    } else if (merged) {
        blas_qkv(g, h, T);
    } else if (lc.has_kv) {
        if (concurrent) stream_ = side_[0];
        matvec(g.k, nullptr, h, w.kraw.ptr(), T, "attn_k");
        if (lc.has_v_proj) {
            if (concurrent) stream_ = side_[1];
            matvec(g.v, nullptr, h, w.vraw.ptr(), T, "attn_v");
        }
        stream_ = jit::Device::get().stream();
    }
    if (!fused && !merged) matvec(g.q, nullptr, h, w.q.ptr(), T, "attn_q");
    if (concurrent) join(branches);
    {
        const jit::KernelSpec& spec = model_.kernels().spec(g.attn_prep_spec);
        const unsigned warps = constant(spec, "WARPS");
        const int rows = cfg_.n_heads + (lc.has_kv ? 2 * lc.n_kv_heads : 0);
        CUdeviceptr q = w.q.ptr(), kraw = w.kraw.ptr(), vraw = w.vraw.ptr(), qn = g.q_norm,
                    kn = g.k_norm, table = kv_.table(l), seqs = w.seqs(), positions = w.positions();
        int slots = kv_.layer(l).slots;
        float base = lc.rope_base, eps = cfg_.rms_eps;
        CUdeviceptr qkv = merged ? w.qkv.ptr() : 0;
        int qkv_stride = g.qkv_rows();
        void* args[] = {&q,         &kraw, &vraw,  &qn,   &kn,  &table, &seqs,
                        &positions, &T,    &slots, &base, &eps, &qkv,   &qkv_stride};
        launch(model_.kernels().get(g.attn_prep_spec, "attn_prep"),
               {ceil_div(rows, warps), unsigned(T)}, {32 * warps}, 0, args, g.attn_prep_spec);
    }
    const Input attn_out = record_attention(l, T);
    // Split-K products leave their partial planes for the post-norm to sum (one GPU).
    // Tensor parallelism: this rank's heads gave a partial sum of the projection (the sum may
    // come back as bf16, which the post-norm reads as such; the MoE norms have no bf16 form, and
    // a MoE model is never split).
    // Or (a single-sequence decode step, GEMMAJIT_TP_PUSH) the product is stored into every
    // rank's window by the matvec, and the post-norm sums this rank's slots after the barrier.
    const bool attn_push = pushes(T) && !g.moe && !ffn_input_f16(g, T);
    if (attn_push) push_product(g.o, attn_out, 0, "attn_output");
    const Product o =
        attn_push ? Product{} : row_parallel_product(g.o, attn_out, T, 0, !g.moe, "attn_output");
    const CUdeviceptr attn_sum = o.ptr;
    int parts = o.parts;
    // A decode step's post-norm may sum the ranks' products itself (its fp32, Q8_1 form).
    const bool attn_f16 = !g.moe && parts == 1 && ffn_input_f16(g, T);
    const Reduced attn = attn_push ? Reduced{}
                                   : all_reduce(attn_sum, uint64_t(T) * cfg_.d_model, "attn_output",
                                                0, !g.moe, !g.moe && !attn_f16);
    if (g.moe)  // also the router's input and the experts' pre-norm
        moe_post_attention_norms(l, attn_sum, parts, T);
    else if (attn_push)
        post_norm_push(model_.spec_push_post_prenorm(), 0, g.post_attention_norm, 0, g.ffn_norm,
                       "post_attention_norm+ffn_norm");
    else if (attn.lsa)
        post_norm_lsa(model_.spec_lsa_post_prenorm(), attn.ptr, g.post_attention_norm, 0,
                      g.ffn_norm, T, "post_attention_norm+ffn_norm");
    else
        post_norm(model_.spec_post_prenorm(parts, attn_f16, attn.bf16_in()), attn.ptr,
                  g.post_attention_norm, 0, g.ffn_norm, T, "post_attention_norm+ffn_norm",
                  attn_f16);

    // FFN: x += post_ffw_norm(down(gelu(gate h) * up h)), h = ffn_norm(x); on a MoE layer the
    // FFN output is the dense MLP's and the experts' normed sum instead.
    // The next pre-norm in f16 when the next layer's attention reads it so (never the output
    // norm: the LM head's products are int8 or float).
    const bool next_f16 = l + 1 < cfg_.n_layers && attention_input_f16(l + 1, T);
    CUdeviceptr ffn_out = w.moe_y1.ptr();
    int ffn_bf16 = 0;      // ffn_out holds a bf16 all-reduce sum (1) or the ranks' bf16 products
    bool ffn_lsa = false;  // ... the ranks' products, for the post-norm to sum
    // (The push form as the attention's: not where the PLE gate or an f16 pre-norm follows.)
    const bool ffn_push = pushes(T) && !g.moe && !cfg_.has_ple() && !next_f16;
    if (g.moe) {
        record_moe_ffn(l, T);
        parts = 1;
    } else if (ffn_push) {
        push_product(g.down, ffn_gate_up(g, T), 1, "ffn_down");
        parts = 1;
    } else {
        const Product down =
            row_parallel_product(g.down, ffn_gate_up(g, T), T, 1, true, "ffn_down");
        parts = down.parts;
        // (A PLE model's FFN sum goes to the PLE gate's input, which has no such form.)
        const bool lsa_ok = !cfg_.has_ple() && !(parts == 1 && next_f16);
        const Reduced sum =
            all_reduce(down.ptr, uint64_t(T) * cfg_.d_model, "ffn_down", 1, true, lsa_ok);
        ffn_out = sum.ptr;
        ffn_bf16 = sum.bf16_in();
        ffn_lsa = sum.lsa;
    }
    if (!cfg_.has_ple()) {
        const bool f16 = parts == 1 && next_f16;
        if (ffn_push)
            post_norm_push(model_.spec_push_post_scale_prenorm(), 1, g.post_ffw_norm,
                           g.output_scale, next_norm, "post_ffw_norm*scale+next_norm");
        else if (ffn_lsa)
            post_norm_lsa(model_.spec_lsa_post_scale_prenorm(), ffn_out, g.post_ffw_norm,
                          g.output_scale, next_norm, T, "post_ffw_norm*scale+next_norm");
        else
            post_norm(model_.spec_post_scale_prenorm(parts, f16, ffn_bf16), ffn_out,
                      g.post_ffw_norm, g.output_scale, next_norm, T,
                      "post_ffw_norm*scale+next_norm", f16);
        return;
    }
    // PLE: x = (x + post_norm(proj(gelu(inp_gate x) * ple[l]))) * layer_output_scale.
    // The product goes straight to Q8_1 for an int8 consumer (the wgmma GEMM and cuBLAS read
    // fp32).
    const bool q8 =
        g.proj.quantized() && !(chunk_products(T) && g.proj.gemm_bf16) && !blas_for(g.proj, T);
    CUdeviceptr gate = w.ple_gate.ptr(), other = w.ple.ptr() + uint64_t(l) * cfg_.ple_dim * 4,
                out = w.ple_mul.ptr(), yq = w.xq.ptr(), yds = w.xds.ptr();
    int stride = cfg_.n_layers * cfg_.ple_dim;
    const uint64_t n = uint64_t(T) * cfg_.ple_dim;
    // A float gate: its product and gelu(gate) * ple[l] in one launch (GEMMAJIT_FUSE_PLE).
    const bool gelu_epilogue = !q8 && fused_ple_gate(g.inp_gate, T);
    // The updated stream is the gate's input (quantized by the same launch). Or, in a decode
    // step, every block of the gate makes it from the FFN output (GEMMAJIT_PLE_INPUT): one
    // launch less. The updated stream then goes to h (free until the next pre-norm; the gate's
    // other blocks still read x), where the PLE post-norm reads it.
    const char* gate_entry = gelu_epilogue ? "_gelu_mul_norm_in" : "_norm_in";
    // (Not from a bf16 sum: the gate's norm prologue reads fp32.)
    const bool gate_in = parts == 1 && ffn_bf16 == 0 && ple_input(g.inp_gate, gate_entry, T);
    const CUdeviceptr stream = gate_in ? w.h.ptr() : w.x.ptr();
    if (gate_in)
        matvec_ple_input(g.inp_gate, gate_entry, ffn_out, g.post_ffw_norm, w.x.ptr(), stream, other,
                         gelu_epilogue ? out : gate);
    else
        post_norm(model_.spec_post_quant(parts, ffn_bf16), ffn_out, g.post_ffw_norm, 0, 0, T,
                  "post_ffw_norm");
    // A decode step's quantized projection makes q8(gelu(gate) * ple[l]) in each block.
    const bool proj_in = q8 && ple_input(g.proj, "_gelu_in", T);
    if (gelu_epilogue) {
        if (!gate_in) matvec_gelu_mul(g.inp_gate, w.x.ptr(), other, stride, out, T);
    } else {
        if (!gate_in)
            matvec(g.inp_gate, nullptr, Input{w.x.ptr(), w.xq.ptr(), w.xds.ptr()}, gate, T,
                   "inp_gate");
        const std::string& name = model_.spec_gelu_mul();
        if (q8 && !proj_in) {
            void* args[] = {&gate, &other, &stride, &yq, &yds, &T};
            launch(model_.kernels().get(name, "gelu_mul_q8"), {ceil_div(n, 512)}, {128}, 0, args,
                   name + " q8");
        } else if (!q8) {
            void* args[] = {&gate, &other, &stride, &out, &T};
            launch(model_.kernels().get(name, "gelu_mul"), {ceil_div(n, 128)}, {128}, 0, args,
                   name);
        }
    }
    if (proj_in)
        matvec_ple_input(g.proj, "_gelu_in", gate, other, 0, 0, 0, w.tmp.ptr());
    else
        matvec(g.proj, nullptr, q8 ? Input{0, yq, yds} : Input{out}, w.tmp.ptr(), T, "ple_proj");
    post_norm(model_.spec_post_scale_prenorm(1, next_f16), w.tmp.ptr(), g.post_norm, g.output_scale,
              next_norm, T, "ple_post_norm*scale+next_norm", next_f16, stream);
}

void GpuSession::record_forward(int T, bool decode) {
    decoding_ = decode;
    record_embedding(T);
    pre_norm(w_->x.ptr(), model_.layers()[0].attn_norm, T, "attn_norm", attention_input_f16(0, T));
    // Quantized matrices in cuBLAS products: each layer's F16 copies are made while the layer
    // before computes.
    bool ahead = false;  // some layer matrix takes its F16 copy at this chunk length
    for (const GpuLayer& g : model_.layers())
        for (const GpuMatrix* m :
             {&g.q, &g.k, &g.v, &g.o, &g.gate, &g.up, &g.down, &g.inp_gate, &g.proj})
            ahead = ahead || (m->present() && !m->spec_dequant.empty() && blas_for(*m, T));
    deq_layer_ = -1;
    if (ahead) dequantize_layer(0, T);
    for (int l = 0; l < cfg_.n_layers; ++l) {
        if (ahead) {
            wait_dequantized(l);
            if (l + 1 < cfg_.n_layers) dequantize_layer(l + 1, T);
            deq_layer_ = l;
            // A profile makes the copies in order, yet plans the products for the SMs a timed
            // run leaves them: it then times the cuBLAS kernels that run (their first calls, which
            // load each kernel lazily, are in the warm-up runs, not in the profile).
            copies_beside_ = l + 1 < cfg_.n_layers && streams_;
        }
        record_layer(l, T);
    }
    deq_layer_ = -1;
    copies_beside_ = false;
    // h (and its Q8_1 form) now hold output_norm(x) of every row.
}

void GpuSession::record_readout(int row0, std::span<const Readout> readouts) {
    const Work& w = *w_;
    const int n_rows = int(readouts.size());
    // One LM-head product for every row (the batched matvec reads the head once per
    // kPrefillCols rows), then each row's own reduction into its result slot.
    matvec(model_.lm_head(), nullptr, normed(row0), w.logits.ptr(), n_rows, "lm_head");
    const std::string& name = model_.spec_logits();
    const jit::KernelSpec& spec = model_.kernels().spec(name);
    const unsigned threads = constant(spec, "THREADS");
    CUdeviceptr work = w.logits_work();
    float cap = cfg_.final_softcap;
    const int lm_rows = model_.lm_head().rows;
    // A tensor-parallel rank holds a slice of the vocabulary: its top candidates (not only its
    // largest) are gathered, and the host picks the token from all ranks' (gather_readouts).
    const bool tp = model_.tensor_parallel().active();
    for (int i = 0; i < n_rows; ++i) {
        CUdeviceptr logits = w.logits_row(i, lm_rows);
        if (readouts[size_t(i)] == Readout::Argmax && !tp) {
            CUdeviceptr token = w.readout.ptr() + w.token_offset(i);
            void* args[] = {&logits, &cap, &work, &token};
            launch(model_.kernels().get(name, "softcap_argmax"), {constant(spec, "ARGMAX_BLOCKS")},
                   {threads}, 0, args, name + " softcap_argmax");
        } else if (readouts[size_t(i)] != Readout::Logits) {
            CUdeviceptr ids = w.readout.ptr() + w.ids_offset(i),
                        values = w.readout.ptr() + w.values_offset(i);
            void* args[] = {&logits, &cap, &work, &ids, &values};
            launch(model_.kernels().get(name, "softcap_topk"), {constant(spec, "TOPK_BLOCKS")},
                   {threads}, 0, args, name + " softcap_topk");
        } else {
            int n = lm_rows;
            void* args[] = {&logits, &cap, &n};
            launch(model_.kernels().get(name, "softcap"), {ceil_div(n, threads)}, {threads}, 0,
                   args, name + " softcap");
        }
    }
    if (tp)
        gather_readouts(
            n_rows, std::find(readouts.begin(), readouts.end(), Readout::Logits) != readouts.end());
}

void GpuSession::record_all_logits(int T) {
    const Work& w = *w_;
    matvec(model_.lm_head(), nullptr, normed(), w.all_logits.ptr(), T, "lm_head");
    const std::string& name = model_.spec_logits();
    const unsigned threads = constant(model_.kernels().spec(name), "THREADS");
    CUdeviceptr logits = w.all_logits.ptr();
    float cap = cfg_.final_softcap;
    int n = T * model_.lm_head().rows;
    void* args[] = {&logits, &cap, &n};
    launch(model_.kernels().get(name, "softcap"), {ceil_div(n, threads)}, {threads}, 0, args,
           name + " softcap");
}

}  // namespace gj::gemma4
