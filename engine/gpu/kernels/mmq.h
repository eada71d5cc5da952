// mmq family: the spec of kernel_templates/mmq.cu, the prompt-batch GEMM on int8 tensor cores
// (mma.sync m16n8k32) for block-quantized weights against Q8_1 activations, and the tile the plan
// picks per matrix shape. Layer matrices: Q8_0 / Q4_0 in the split layout. Grouped experts (the
// ".moe" specs): every block type of our files, Q4_1 / Q5_0 / Q5_1 and the K-quants too, in the
// split layout (mmq_moe_reads).
//
// Spec name: "mmq.<type>.k<k>.<tile>", type q8_0, q4_0 (.moe also q4_1, q5_0, q5_1, q4_k, q5_k,
// q6_k), tile
//   "m<BM>n<BN>.w<WARPS_M>x<WARPS_N>.s<STAGES>b<KBS>.o<MIN_BLOCKS>p<GEGLU_PASSES>[.k<SPLITS>]".
// Entries mmq, mmq_geglu, mmq_geglu_q8 and mmq_reduce (the sum of the split-K partial planes);
// the ".moe" specs hold the grouped expert entries instead (see mmq_moe_spec).
// Launch (from the spec constants): grid (ceil(n_rows / BN), ceil(T / BM)), block THREADS,
// dynamic smem SMEM.
#pragma once

#include "engine/gguf/ggml_types.h"
#include "engine/gpu/kernels/matvec.h"
#include "jit/kernel_spec.h"

namespace gj::gemma4 {

// The tile: BM tokens x BN weight rows, a WARPS_M x WARPS_N warp grid, KBS 32-blocks of K per
// pipeline stage, STAGES stages, registers for MIN_BLOCKS resident blocks per SM, and the GeGLU
// entries' passes over the BM tokens (1 or 2; two halve their registers and shared memory).
struct MmqTile {
    int bm = 64, bn = 128, warps_m = 2, warps_n = 4, kbs = 2, stages = 4, min_blocks = 1,
        geglu_passes = 1, splits = 1;  // splits: K split of the plain entry (mmq_reduce)
};
// The tile the plan uses for a k-wide matrix of n_rows rows (measured on the H200 with 512-token
// chunks; mmq.cpp lists the numbers). Deep products with few tiles split K in kMmqSplits
// (spec_util.h).
MmqTile mmq_tile(ggml::Type weight_type, int k, int n_rows);
// The spec of a k-wide matrix of n_rows rows with mmq_tile's tile, or with `tile`. Throws
// ConfigError for a weight type other than q8_0 / q4_0, std::invalid_argument for k % 32 != 0,
// n_rows < 1 or an impossible tile (BM a multiple of 16 * WARPS_M, BN of 32 * WARPS_N, at most 16
// warps; KBS 1, 2, 4, 8; 2..8 stages; shared memory within 227 KiB per block and 228 KiB per SM).
jit::KernelSpec mmq_spec(ggml::Type weight_type, int k, int n_rows);
jit::KernelSpec mmq_spec(ggml::Type weight_type, int k, const MmqTile& tile);

// The grouped expert GEMM of a MoE layer's prefill (the MOE entries mmq_moe, mmq_moe_geglu,
// mmq_moe_geglu_q8): "mmq.<type>.k<k>.<tile>.moe". Every tile takes kMoeGemmSlots slots of one
// expert (the grouping, moe_group, is shared by the gate|up and down products); the tile's weight
// rows follow the matrix (n_rows: one expert's rows of one matrix, F for gate|up, d for down).
constexpr int kMoeGemmSlots = 32;
// Whether the grouped expert GEMM reads experts of type t stored in `layout` with input width k:
// every block type of our files (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) in the split
// layout, the K-quants with k % 256 == 0.
bool mmq_moe_reads(ggml::Type t, MatvecLayout layout, int k);
// The tile and spec (ConfigError for a type mmq_moe_reads never takes; std::invalid_argument as
// mmq_spec, and for a K-quant k % 256 != 0).
MmqTile mmq_moe_tile(ggml::Type weight_type, int k, int n_rows);
jit::KernelSpec mmq_moe_spec(ggml::Type weight_type, int k, int n_rows);
jit::KernelSpec mmq_moe_spec(ggml::Type weight_type, int k, const MmqTile& tile);

}  // namespace gj::gemma4
