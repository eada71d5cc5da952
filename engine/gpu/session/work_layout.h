// The device buffers of one GpuSession: their sizes (WorkLayout, shared by the allocation and the
// model's memory plan through session_work_bytes) and the buffers themselves (GpuSession::Work).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/gpu/gpu_model.h"
#include "engine/gpu/pinned_host.h"
#include "engine/gpu/session.h"
#include "jit/device.h"

namespace gj::gemma4 {

// Step-state layout (int32 words): [0] rows in this step, [1] position of the first, then
// positions[rows], token ids[rows] and the sequence of each row[rows].
constexpr int kStateHeader = 4;

// Sizes of one session's buffers, shared by the allocation and the model's memory plan.
struct WorkLayout {
    int rows = 0;       // activation rows: the prefill chunk or the sequences (the largest decode
                        // batch), whichever is more, rounded up to kPrefillCols
    int sequences = 1;  // rows of a decode step at most: readout slots
    // Logits rows: one, or for a batch the sequences rounded up to whole kPrefillCols groups
    // (the batched LM-head matvec writes every column of its group).
    int logit_rows = 1;
    // vocab: the logits row stride, the LM head's rows (a tensor-parallel rank's vocabulary
    // slice; padded to the largest rank's, the unit of the logits all-gather).
    int d = 0, q_max = 0, kv_max = 0, ffn_max = 0, in_max = 0, ple = 0, ple_all = 0, vocab = 0;
    int ranks = 1;  // tensor-parallel ranks: the gathered readouts hold one block per rank
    // A prefill chunk's bf16 products: one [rows][d] buffer for NCCL's all-reduce, or, where they
    // are pushed into every rank's window (GpuModel::tp_prefill_push), [2][rows][ranks][d]: a
    // half for each product of a layer (attention output, FFN down), each row's ranks side by
    // side. Two halves, because a rank pushes the next layer's attention product into its
    // peers' windows only after the FFN push's barrier, which its peers reach only once done
    // reading the last attention product (and the other way around).
    int tp_bf16_planes = 1;
    // The LSA barriers of the device communicator: one per decode post-norm block (a row each)
    // and one per block of a prefill chunk's push (GEMMAJIT_TP_PUSH_BLOCKS).
    int lsa_barriers = 1, push_blocks = 0;
    uint64_t part_o_floats = 0, part_ml_pairs = 0;  // attention partials
    uint64_t logits_work = 0;                       // workspace of the logits kernels
    bool half_acts = false;   // cuBLAS products of f16/bf16 weights: converted activations
    bool bf16_acts = false;   // wgmma GEMMs: bf16 activations (their own buffer: a model may
                              // mix them with cuBLAS products of f16 weights)
    bool float_gate = false;  // cuBLAS GeGLU: the gate product's own fp32 buffer, twice as
                              // wide where one product makes gate|up (GpuMatrix::up_follows)
    bool gate_up_pair = false;
    bool gemm_q8_ffn = false;    // int8 GEMM GeGLU: its Q8_1 output, the down projection's input
    bool gemm_bf16_ffn = false;  // wgmma GEMM GeGLU: its bf16 output, the same role
    uint64_t gemm_split_floats = 0;  // split-K GEMM partial planes
    uint64_t dequant_bytes = 0;      // F16 copies of quantized matrices for cuBLAS products
    int qkv_width = 0;  // widest Q|K|V row of a layer's one-product projections (qkv_one_product)
    // MoE: experts E, K per token, expert width F; groups: the most a chunk can form.
    int moe_e = 0, moe_k = 0, moe_f = 0, moe_groups = 0;

    explicit WorkLayout(const GpuModel& m);

    uint64_t bytes() const;
    // One readout slot per sequence: argmax tokens (rounded up to 16 bytes), top-k ids, top-k
    // values; then the logits kernels' workspace.
    uint64_t token_bytes() const { return (uint64_t(sequences) * 4 + 15) / 16 * 16; }
    uint64_t result_bytes() const { return token_bytes() + 2 * uint64_t(sequences) * kMaxTopK * 4; }
    uint64_t readout_bytes() const { return result_bytes() + logits_work; }
    uint64_t state_bytes() const { return (kStateHeader + 3 * uint64_t(rows)) * 4; }
    // Rows of each product in the symmetric window (GpuSession::row_parallel_out): a decode
    // step's, whole groups of kPrefillCols columns for a batch (its matvecs write whole groups).
    uint64_t sym_rows() const { return uint64_t(logit_rows); }
};

struct GpuSession::Work {
    WorkLayout layout;
    jit::DeviceBuffer x, h, tmp, q, attn, kraw, vraw, g, ple_tok, ple_ctx, ple, ple_gate, ple_mul,
        logits, part_o, part_ml, xq, xds, state, readout, all_logits, xhalf, xbf, fgate, gq, gds,
        gbf, gemm_split, wdeq, qkv;
    // Tensor parallelism: every rank's readout results and logits rows, gathered ([rank][...]).
    jit::DeviceBuffer tp_results, tp_logits;
    // A prefill chunk's partial product in bf16, the form it is all-reduced in, and then its sum,
    // which the post-norm reads as bf16 (rmsnorm X_BF16): in NCCL symmetric memory
    // (GEMMAJIT_TP_SYMMETRIC), else in an ordinary buffer.
    SymmetricBuffer tp_bf16_sym;
    jit::DeviceBuffer tp_bf16;
    CUdeviceptr tp_bf16_ptr() const {
        return tp_bf16_sym.ptr() ? tp_bf16_sym.ptr() : tp_bf16.ptr();
    }
    // The pushed form (layout.tp_bf16_planes): half `which`'s [rows][ranks][d] bf16 in this rank's
    // window, and prefill_push_to[which][p], the same in rank p's (tp_push.cu's destinations;
    // GpuSession::find_push_targets; 0: no push).
    uint64_t tp_bf16_half_bytes() const {
        return uint64_t(layout.rows) * layout.ranks * layout.d * 2;
    }
    CUdeviceptr tp_bf16_slots(int which) const {
        return tp_bf16_ptr() + uint64_t(which) * tp_bf16_half_bytes();
    }
    CUdeviceptr prefill_push_to[2][8] = {};
    // A decode step's partial products, the attention's then the FFN's (layout.sym_rows() rows of
    // d floats each), in NCCL symmetric memory (GEMMAJIT_TP_SYMMETRIC; ptr() 0 where unavailable).
    SymmetricBuffer tp_sym;
    // NCCL's device communicator for the decode post-norms that sum the ranks' products from
    // tp_sym themselves (GpuModel::tp_fused_norm); not made() otherwise.
    DeviceComm tp_dev_comm;
    // The push form (GpuModel::tp_push): past the two halves above, tp_sym holds each half's
    // slots, one of d floats per rank (push_slot; rmsnorm LSA_PUSH). push_to[h]: what this rank's
    // push matvec of half h takes by value (matvec_common.cuh gj_push_to): its slot in each
    // rank's window (GpuSession::find_push_targets). 0: no push.
    CUdeviceptr push_to[2][8] = {};
    CUdeviceptr push_slot(int half, int rank) const {
        const uint64_t d = uint64_t(layout.d) * 4;
        return tp_sym.ptr() + 2 * layout.sym_rows() * d + uint64_t(half * layout.ranks + rank) * d;
    }

    // MoE: router logits [rows][E]; expert ids, weights and grouped slots [rows][K]; the group
    // table (+ its count); expert GeGLU outputs [rows * K][F] (fp32 and Q8_1); expert outputs
    // [rows * K][d]; the dense branch's normed output (first the router's input) [rows][d]; the
    // experts' pre-normed input [rows][d] (fp32 and Q8_1).
    jit::DeviceBuffer moe_logits, moe_ids, moe_wts, moe_slots, moe_groups, moe_n_groups, moe_eh,
        moe_ehq, moe_ehds, moe_ed, moe_y1, moe_z, moe_zq, moe_zds;
    PinnedHost state_host, result_host;

    explicit Work(const GpuModel& m);
    CUdeviceptr positions() const { return state.ptr() + kStateHeader * 4; }
    CUdeviceptr tokens() const { return state.ptr() + (kStateHeader + layout.rows) * 4; }
    CUdeviceptr seqs() const {
        return state.ptr() + (kStateHeader + 2 * uint64_t(layout.rows)) * 4;
    }
    // Readout slot i (decode row i; a prefill's readout uses slot 0), on the device and in the
    // pinned host copy of the results.
    uint64_t token_offset(int i) const { return uint64_t(i) * 4; }
    uint64_t ids_offset(int i) const { return layout.token_bytes() + uint64_t(i) * kMaxTopK * 4; }
    uint64_t values_offset(int i) const {
        return layout.token_bytes() + (uint64_t(layout.sequences) + i) * kMaxTopK * 4;
    }
    CUdeviceptr logits_work() const { return readout.ptr() + layout.result_bytes(); }
    // The LM head's output of row i: rows of its own row count (a rank's vocabulary slice).
    CUdeviceptr logits_row(int i, int lm_rows) const {
        return logits.ptr() + uint64_t(i) * lm_rows * 4;
    }
};

}  // namespace gj::gemma4
