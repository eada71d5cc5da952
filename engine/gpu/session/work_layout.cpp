#include "engine/gpu/session/work_layout.h"

#include <algorithm>

#include "engine/gpu/kernels/flash_decode.h"
#include "engine/gpu/kernels/moe.h"
#include "engine/gpu/kernels/spec_util.h"
#include "jit/device.h"

namespace gj::gemma4 {

namespace {

int round_up(int v, int m) {
    return (v + m - 1) / m * m;
}

}  // namespace

WorkLayout::WorkLayout(const GpuModel& m) {
    const Config& c = m.config();
    const KvGeometry& g = m.kv_geometry();
    const int sms = jit::Device::get().sm_count();
    sequences = g.sequences;
    logit_rows = sequences > 1 ? round_up(sequences, kPrefillCols) : 1;
    rows = round_up(std::max({1, g.max_chunk, g.sequences}), kPrefillCols);
    d = c.d_model;
    ple = c.ple_dim;
    ple_all = c.n_layers * c.ple_dim;
    const TensorParallel& tp = m.tensor_parallel();
    ranks = tp.ranks;
    tp_bf16_planes = m.tp_prefill_push() ? 2 * tp.ranks : 1;
    push_blocks = m.tp_push_blocks();
    lsa_barriers = std::max(sequences, push_blocks);
    vocab = tp.active() ? (c.vocab_size + tp.ranks - 1) / tp.ranks : c.vocab_size;
    for (int l = 0; l < c.n_layers; ++l) {
        const LayerConfig& lc = c.layers[l];
        q_max = std::max(q_max, c.q_dim(l));
        kv_max = std::max(kv_max, c.kv_dim(l));
        ffn_max = std::max(ffn_max, lc.ffn_dim);
        const jit::KernelSpec& spec = m.kernels().spec(m.layers()[l].flash_spec);
        // Splits of every decode batch (1 .. sequences queries that may see the whole context)
        // and of the largest prefill chunk; the partials hold whichever needs most.
        const uint64_t heads = uint64_t(c.n_heads);
        auto hold = [&](int queries) {
            const uint64_t splits = uint64_t(flash_decode_splits(spec, g.context, queries, sms));
            part_o_floats = std::max(part_o_floats, queries * heads * splits * lc.head_dim);
            part_ml_pairs = std::max(part_ml_pairs, queries * heads * splits);
        };
        for (int b = 1; b <= g.sequences; ++b) hold(b);
        hold(rows);
    }
    in_max = std::max({d, q_max, ffn_max, ple});
    logits_work = spec_constant(m.kernels().spec(m.spec_logits()), "WORK_BYTES");
    half_acts = !m.spec_convert().empty();
    for (const GpuMatrix* mat : m.matrices()) bf16_acts = bf16_acts || mat->gemm_bf16;
    float_gate = m.blas_ffn();
    for (const GpuLayer& g : m.layers()) {
        gemm_q8_ffn = gemm_q8_ffn || (!g.gate.spec_gemm.empty() && !g.gate.gemm_bf16);
        gemm_bf16_ffn = gemm_bf16_ffn || g.gate.gemm_bf16;
    }
    dequant_bytes = m.dequant_scratch_bytes();
    // (Not for layers whose copies this session's chunks never make.)
    for (const GpuLayer& l : m.layers()) {
        if (l.qkv_one_product && (l.q.spec_gemm.empty() || m.gemm_copies_made()))
            qkv_width = std::max(qkv_width, l.qkv_rows());
        if (l.gate.up_follows && (l.gate.spec_gemm.empty() || m.gemm_copies_made()))
            gate_up_pair = true;
    }
    if (c.is_moe()) {
        moe_e = c.n_experts;
        moe_k = c.n_experts_used;
        moe_f = c.expert_ffn_dim;
        moe_groups = moe_group_bound(rows, moe_k, moe_e, 1);  // one-slot groups: the most
    }
    for (const GpuMatrix* mat : m.matrices()) {  // the largest split-K partial planes
        if (mat->spec_gemm.empty()) continue;
        const uint64_t s = uint64_t(spec_constant(m.kernels().spec(mat->spec_gemm), "SPLITS"));
        if (s > 1) gemm_split_floats = std::max(gemm_split_floats, s * rows * mat->rows);
    }
}

uint64_t WorkLayout::bytes() const {
    const uint64_t R = uint64_t(rows);
    const uint64_t floats = 3 * R * d                        // x, h, tmp
                            + 2 * R * q_max                  // q, attn
                            + 2 * R * kv_max                 // k_raw, v_raw
                            + R * ffn_max                    // gate|up product
                            + 3 * R * ple_all + 2 * R * ple  // PLE inputs; gate, product
                            + uint64_t(logit_rows) * vocab   // logits of a decode batch
                            + (ranks > 1 ? uint64_t(ranks) * logit_rows * vocab : 0)  // gathered
                            + part_o_floats + 2 * part_ml_pairs +
                            (float_gate ? (gate_up_pair ? 2 : 1) * R * ffn_max : 0) +
                            gemm_split_floats + R * qkv_width;
    const uint64_t RK = R * uint64_t(moe_k);
    const uint64_t moe = moe_e == 0 ? 0
                                    : (R * moe_e + 3 * RK + RK * moe_f + RK * d + 2 * R * d) * 4 +
                                          uint64_t(moe_groups) * 16 + 16 + RK * moe_f +
                                          RK * (moe_f / 32) * 8 + R * d + R * (d / 32) * 8;
    return moe + floats * sizeof(float) + R * in_max + R * (in_max / 32) * 8  // Q8_1 activations
           + (half_acts ? R * in_max * 2 : 0) + (bf16_acts ? R * in_max * 2 : 0) +
           (gemm_q8_ffn ? R * ffn_max + R * (ffn_max / 32) * 8 : 0) +
           (gemm_bf16_ffn ? R * ffn_max * 2 : 0) + dequant_bytes + state_bytes() + readout_bytes() +
           (ranks > 1 ? uint64_t(ranks) * result_bytes() + tp_bf16_planes * R * d * 2 : 0);
}

uint64_t session_work_bytes(const GpuModel& model) {
    return WorkLayout(model).bytes();
}

GpuSession::Work::Work(const GpuModel& m) : layout(m) {
    const WorkLayout& L = layout;
    const uint64_t R = uint64_t(L.rows);
    // Zeroed: padded rows and never-written partials read as zeros, not NaN garbage.
    auto zeroed = [](uint64_t bytes) {
        jit::DeviceBuffer b(std::max<uint64_t>(bytes, 16));
        b.zero();
        return b;
    };
    x = zeroed(R * L.d * 4);
    h = zeroed(R * L.d * 4);
    tmp = zeroed(R * L.d * 4);
    q = zeroed(R * L.q_max * 4);
    attn = zeroed(R * L.q_max * 4);
    kraw = zeroed(R * L.kv_max * 4);
    vraw = zeroed(R * L.kv_max * 4);
    g = zeroed(R * L.ffn_max * 4);
    ple_tok = zeroed(R * L.ple_all * 4);
    ple_ctx = zeroed(R * L.ple_all * 4);
    ple = zeroed(R * L.ple_all * 4);
    ple_gate = zeroed(R * L.ple * 4);
    ple_mul = zeroed(R * L.ple * 4);
    logits = zeroed(uint64_t(L.logit_rows) * L.vocab * 4);
    part_o = zeroed(L.part_o_floats * 4);
    part_ml = zeroed(L.part_ml_pairs * 8);
    xq = zeroed(R * L.in_max);
    xds = zeroed(R * (L.in_max / 32) * 8);
    state = zeroed(L.state_bytes());
    readout = zeroed(L.readout_bytes());  // the logits workspace must start zeroed
    if (L.half_acts) xhalf = jit::DeviceBuffer(R * L.in_max * 2);
    if (L.bf16_acts) xbf = jit::DeviceBuffer(R * L.in_max * 2);
    if (L.float_gate) fgate = jit::DeviceBuffer((L.gate_up_pair ? 2 : 1) * R * L.ffn_max * 4);
    if (L.gemm_split_floats) gemm_split = jit::DeviceBuffer(L.gemm_split_floats * 4);
    if (L.gemm_q8_ffn) {
        gq = jit::DeviceBuffer(R * L.ffn_max);
        gds = jit::DeviceBuffer(R * (L.ffn_max / 32) * 8);
    }
    if (L.gemm_bf16_ffn) gbf = jit::DeviceBuffer(R * L.ffn_max * 2);
    if (L.dequant_bytes) wdeq = jit::DeviceBuffer(L.dequant_bytes);
    if (L.qkv_width) qkv = jit::DeviceBuffer(R * L.qkv_width * 4);
    if (L.moe_e) {
        const uint64_t RK = R * uint64_t(L.moe_k);
        moe_logits = zeroed(R * L.moe_e * 4);
        moe_ids = zeroed(RK * 4);
        moe_wts = zeroed(RK * 4);
        moe_slots = zeroed(RK * 4);
        moe_groups = zeroed(uint64_t(L.moe_groups) * 16);
        moe_n_groups = zeroed(16);
        moe_eh = zeroed(RK * L.moe_f * 4);
        moe_ehq = zeroed(RK * L.moe_f);
        moe_ehds = zeroed(RK * (L.moe_f / 32) * 8);
        moe_ed = zeroed(RK * L.d * 4);
        moe_y1 = zeroed(R * L.d * 4);
        moe_z = zeroed(R * L.d * 4);
        moe_zq = zeroed(R * L.d);
        moe_zds = zeroed(R * (L.d / 32) * 8);
    }
    if (L.ranks > 1) {
        tp_results = zeroed(uint64_t(L.ranks) * L.result_bytes());
        tp_logits = zeroed(uint64_t(L.ranks) * L.logit_rows * L.vocab * 4);
        // In NCCL symmetric memory where the library has it, else in ordinary buffers.
        if (m.flags().get_bool("GEMMAJIT_TP_SYMMETRIC")) {
            // (Push slots past the two halves: a slot of d floats per rank and half.)
            const uint64_t push = m.tp_push() ? 2 * uint64_t(L.ranks) * L.d * 4 : 0;
            tp_sym = SymmetricBuffer(m.tensor_parallel(), 2 * L.sym_rows() * L.d * 4 + push);
            tp_bf16_sym = SymmetricBuffer(m.tensor_parallel(), L.tp_bf16_planes * R * L.d * 2);
            // One LSA barrier per post-norm block of a decode step (a row each, or fewer), and
            // per block of a prefill chunk's push. NCCL refuses it (on every rank alike, before
            // any exchange) where the communicator has no symmetric support (its window
            // registration then returned a local one); the all-reduces stay then.
            if (tp_sym.ptr() && m.tp_fused_norm()) {
                try {
                    tp_dev_comm = DeviceComm(m.tensor_parallel(), L.lsa_barriers);
                } catch (const jit::DeviceError&) {
                }
            }
        }
        // (Without the window no chunk pushes: one plane, NCCL's all-reduce buffer.)
        if (!tp_bf16_sym.ptr()) tp_bf16 = jit::DeviceBuffer(R * L.d * 2);
    }
    state_host = PinnedHost(L.state_bytes());
    result_host = PinnedHost(uint64_t(L.ranks) * L.result_bytes());
}

}  // namespace gj::gemma4
