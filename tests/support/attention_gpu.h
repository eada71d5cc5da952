// What the attention kernel tests (tests/gpu/gpu_test_attn_prep.cpp, gpu_test_flash_decode.cpp,
// gpu_test_attn_chain.cpp) share: KV cache planes as storage bytes, Gemma-like norm weights, and
// one flash_decode + flash_combine run on the device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "engine/gpu/kernels/attn_prep.h"
#include "engine/gpu/kernels/flash_decode.h"
#include "engine/gpu/kernels/flash_prefill.h"
#include "engine/gpu/kernels/spec_util.h"
#include "engine/gpu/kv_type.h"
#include "jit/device.h"
#include "tests/support/kernel_ref.h"  // all_finite

namespace gj::test::kref {

// Bytes of a cache plane of `elems` elements (q8_0: int8 payload + an fp16 scale per 32).
size_t plane_bytes(gemma4::KvType kv, size_t elems);

// A cache plane holding x (rounded to the KV type), as bytes, and the values it holds.
std::vector<uint8_t> encode_plane(const std::vector<float>& x, gemma4::KvType kv);
std::vector<float> decode_plane(const std::vector<uint8_t>& b, gemma4::KvType kv);

// Norm weights as Gemma stores them: gains around 1, some well above it.
std::vector<float> norm_weights(int n, std::mt19937& rng);

// first, first + 1, ..., first + n - 1 (token positions).
std::vector<int> range(int first, int n);

// The plane table attn_prep and flash_decode read: [sequences][2] addresses (K plane, V plane).
jit::DeviceBuffer kv_table(const std::vector<std::pair<CUdeviceptr, CUdeviceptr>>& planes);

struct FlashRun {
    std::vector<float> out;
    std::vector<float> part_ml;  // [T][H][max_splits] {m, l}
    int max_splits = 0;
};

// Runs flash_decode + flash_combine on caches held as storage bits, with partial buffers
// poisoned with NaN: the combine must read only the live splits. With `seqs` ([T] sequence of
// each query) the queries read the planes of `table` (kv_table) instead of kc / vc.
FlashRun run_flash(const jit::KernelSpec& spec, const std::vector<float>& q,
                   const jit::DeviceBuffer& kc, const jit::DeviceBuffer& vc,
                   const jit::DeviceBuffer& dpos, int T, int slots, int max_splits,
                   const jit::DeviceBuffer* table = nullptr,
                   const jit::DeviceBuffer* seqs = nullptr);

}  // namespace gj::test::kref
