#include "tests/support/attention_gpu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "tests/support/kernel_ref.h"
#include "tests/support/kernel_ref_gpu.h"

namespace gj::test::kref {

using gemma4::KvType;
using gemma4::spec_constant;
using jit::DeviceBuffer;
using jit::KernelSpec;

size_t plane_bytes(KvType kv, size_t elems) {
    return kv == KvType::Q8_0 ? elems + elems / 16 : 2 * elems;
}

std::vector<uint8_t> encode_plane(const std::vector<float>& x, KvType kv) {
    if (kv == KvType::Q8_0) return kv_q8_encode(x);
    std::vector<uint8_t> b(2 * x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        const uint16_t h = kv_encode(x[i], kv == KvType::BF16);
        b[2 * i] = uint8_t(h), b[2 * i + 1] = uint8_t(h >> 8);
    }
    return b;
}

std::vector<float> decode_plane(const std::vector<uint8_t>& b, KvType kv) {
    if (kv == KvType::Q8_0) return kv_q8_decode(b);
    std::vector<float> x(b.size() / 2);
    for (size_t i = 0; i < x.size(); ++i)
        x[i] = kv_decode(uint16_t(b[2 * i] | b[2 * i + 1] << 8), kv == KvType::BF16);
    return x;
}

std::vector<float> norm_weights(int n, std::mt19937& rng) {
    auto w = random_normal(n, 0.6f, rng);
    for (auto& e : w) e = 1.0f + e;
    return w;
}

std::vector<int> range(int first, int n) {
    std::vector<int> v(n);
    for (int i = 0; i < n; ++i) v[i] = first + i;
    return v;
}

DeviceBuffer kv_table(const std::vector<std::pair<CUdeviceptr, CUdeviceptr>>& planes) {
    std::vector<uint64_t> t;
    for (const auto& [k, v] : planes) t.push_back(k), t.push_back(v);
    DeviceBuffer d(t.size() * 8);
    d.upload(t.data(), t.size() * 8);
    return d;
}

FlashRun run_flash(const KernelSpec& spec, const std::vector<float>& q, const DeviceBuffer& kc,
                   const DeviceBuffer& vc, const DeviceBuffer& dpos, int T, int slots,
                   int max_splits, const DeviceBuffer* table, const DeviceBuffer* seqs) {
    const auto& g = kernels_for(spec);
    const int hd = int(spec_constant(spec, "HEAD_DIM"));
    const int kvh = int(spec_constant(spec, "N_KV_HEADS"));
    const int H = int(spec_constant(spec, "GROUP")) * kvh;
    auto dq = to_device(q);
    const size_t parts = size_t(T) * H * max_splits;
    DeviceBuffer part_o(parts * hd * 4 + 16), part_ml(parts * 8 + 16),
        out(size_t(T) * H * hd * 4 + 16);
    const std::vector<uint8_t> nan_bytes(part_o.size(), 0xff);
    part_o.upload(nan_bytes.data(), part_o.size());
    part_ml.upload(nan_bytes.data(), part_ml.size());
    const DeviceBuffer one = kv_table({{kc.ptr(), vc.ptr()}});
    const CUdeviceptr planes = table ? table->ptr() : one.ptr(), rows = seqs ? seqs->ptr() : 0;
    // One spare token row in both grids: blocks past T exit.
    launch_smem_async(
        g.get(spec.name, "flash_decode"), {unsigned(max_splits), unsigned(kvh), unsigned(T + 1)},
        {unsigned(spec_constant(spec, "THREADS"))}, unsigned(spec_constant(spec, "SMEM")), dq.ptr(),
        planes, rows, dpos.ptr(), T, slots, max_splits, part_o.ptr(), part_ml.ptr());
    // The combine's Q8_1 output too (the output projection's int8 input), which must be exactly
    // quantize_q8_1 of its fp32 output.
    const size_t n_out = size_t(T) * H * hd;
    DeviceBuffer outq(n_out + 16), outds(n_out / 32 * 8 + 16);
    launch(g.get(spec.name, "flash_combine"), {unsigned(H * hd / 32), unsigned(T + 1)},
           {unsigned(spec_constant(spec, "COMBINE_THREADS"))}, part_o.ptr(), part_ml.ptr(),
           out.ptr(), outq.ptr(), outds.ptr(), T, max_splits);
    FlashRun r;
    r.out = from_device<float>(out, n_out);
    // Blocks holding a non-finite output (the tests of poisoned caches, where the fp32 output is
    // what must show the NaN) are left out.
    const Q81 want = quantize_q8_1(r.out.data(), n_out);
    const auto got_q = from_device<int8_t>(outq, n_out);
    const auto ds = from_device<float>(outds, n_out / 16);
    int bad = 0;
    for (size_t b = 0; b < n_out / 32 && bad < 5; ++b) {
        if (!std::all_of(r.out.begin() + b * 32, r.out.begin() + (b + 1) * 32,
                         [](float v) { return std::isfinite(v); }))
            continue;
        const bool same = std::equal(got_q.begin() + b * 32, got_q.begin() + (b + 1) * 32,
                                     want.q.begin() + b * 32) &&
                          ds[2 * b] == want.d[b] && ds[2 * b + 1] == want.s[b];
        if (!same) ++bad;
        EXPECT_TRUE(same) << "flash_combine's Q8_1 block " << b
                          << " differs from quantize_q8_1 of its output";
    }
    r.part_ml = from_device<float>(part_ml, parts * 2);
    r.max_splits = max_splits;
    return r;
}

}  // namespace gj::test::kref
