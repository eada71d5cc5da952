// gemm_wgmma family: the spec of kernel_templates/gemm_wgmma.cu, the prompt-batch product on
// Hopper's warpgroup tensor cores (sm_90a only: the spec is arch_specific 90, compiled for sm_90a
// and refused for any other target), and the tile the plan picks per matrix shape.
//
// Spec name: "gemm_wgmma.<type>.k<k>.m<BM>n<BN>.s<stages>[.k<splits>][.p]", type q8_0 or q4_0,
// ".p" the warp-specialized form (a producer warpgroup issues the copies).
// Launch (from the spec constants): grid (ceil(n_rows / R), ceil(T / BM)) with R = BN for
// gemm_wgmma and BN / 2 for the GeGLU entries, block THREADS, dynamic smem SMEM (opt in above
// 48 KiB).
#pragma once

#include "engine/gguf/ggml_types.h"
#include "jit/kernel_spec.h"

namespace gj::gemma4 {

// Prompt-batch product Y = X W^T on Hopper's warpgroup tensor cores (kernel_templates/
// gemm_wgmma.cu, sm_90a only): Q8_0 / Q4_0 weights in the split layout dequantized to bf16 in
// registers, bf16 activations X [T][k]; entries gemm_wgmma (fp32 Y), gemm_wgmma_geglu (fp32),
// gemm_wgmma_geglu_bf16 (bf16, the down projection's input). The tile: BM tokens (64, 128 or 256:
// the wgmma N), BN weight rows (64 or 128: one warpgroup per 64), `stages` copy steps of 64
// elements of K, and the K split of the plain entry (1 or kMmqSplits, whose partial planes the
// post-norms read; else entry gemm_wgmma_reduce sums them), and whether a producer warpgroup
// issues the copies (GEMMAJIT_WGMMA_PRODUCER; BN 64 only, THREADS 256) or every thread does
// (THREADS 2 BN).
struct GemmWgmmaTile {
    int bm = 128, bn = 128, stages = 4, splits = 1;
    bool producer = false;
    bool operator==(const GemmWgmmaTile&) const = default;
};
// The tile the plan uses for a k-wide matrix of n_rows rows (measured with 512-token chunks;
// gemm_wgmma.cpp lists the numbers).
GemmWgmmaTile gemm_wgmma_tile(ggml::Type weight_type, int k, int n_rows, bool producer);
// "gemm_wgmma.<type>.k<k>.m<BM>n<BN>.s<stages>[.k<splits>][.p]" (arch_specific 90). Throws
// ConfigError for a weight type other than q8_0 / q4_0, std::invalid_argument for k not a positive
// multiple of 32, n_rows < 1 or an impossible tile (BM 64/128/256, BN 64/128, 3..6 stages, 1..8
// splits, a producer with BN 128, shared memory within 227 KiB).
jit::KernelSpec gemm_wgmma_spec(ggml::Type weight_type, int k, int n_rows, bool producer);
jit::KernelSpec gemm_wgmma_spec(ggml::Type weight_type, int k, const GemmWgmmaTile& tile);

}  // namespace gj::gemma4
