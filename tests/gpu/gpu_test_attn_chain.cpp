// The attention chain as the forward pass runs it on the GPU: attn_prep -> flash_decode ->
// flash_combine over a prefill chunk and decode steps past the window (with a KV-shared layer
// reading the same cache), positions in device memory, against fp32 attention without cache
// rounding (the storage type's tolerance: f16 / bf16 relative rounding, q8_0 half a block step).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/gpu/kernel_plan.h"
#include "tests/support/attention_gpu.h"
#include "tests/support/kernel_ref.h"
#include "tests/support/kernel_ref_gpu.h"
#include "tests/support/test_env.h"

using namespace gj::test::kref;
using gj::gemma4::KvType;
using gj::gemma4::spec_constant;
using gj::jit::DeviceBuffer;
using gj::jit::KernelSpec;

namespace {

constexpr float kEps = 1e-6f;
constexpr CUdeviceptr kNull = 0;

struct ChainCase {
    int hd, heads, kv_heads, pairs, window, slots, prefill, steps;
    bool has_v;
    KvType kv;
    float base;
};

void PrintTo(const ChainCase& c, std::ostream* os) {
    *os << "hd" << c.hd << " w" << c.window << " slots" << c.slots << " prefill" << c.prefill
        << " steps" << c.steps << (c.has_v ? "" : " keqv") << " " << gj::gemma4::kv_type_name(c.kv);
}

class AttnChainTest : public ::testing::TestWithParam<ChainCase> {};

TEST_P(AttnChainTest, PrefillThenDecodeMatchesFp32) {
    GJ_REQUIRE_GPU();
    const ChainCase& c = GetParam();
    const bool bf16 = c.kv == KvType::BF16, q8 = c.kv == KvType::Q8_0;
    const KernelSpec prep =
        gj::gemma4::attn_prep_spec(c.hd, c.heads, c.kv_heads, c.pairs, true, c.has_v, c.kv);
    // A KV-shared layer reading this layer's cache with its own queries.
    const KernelSpec prep_shared =
        gj::gemma4::attn_prep_spec(c.hd, c.heads, c.kv_heads, c.pairs, false, false, c.kv);
    // Attention through both paths (fp32 default; tensor cores where the head dim allows, and
    // not for q8_0).
    std::vector<KernelSpec> flashes;
    for (bool mma : {false, true}) {
        if (mma && q8) continue;
        KernelSpec f = gj::gemma4::flash_decode_spec(c.hd, c.heads / c.kv_heads, c.kv_heads,
                                                     c.window, c.kv, mma);
        if (spec_constant(f, "MMA") == int(mma)) flashes.push_back(std::move(f));
    }
    const auto& gp = kernels_for(prep);
    const auto& gs = kernels_for(prep_shared);
    const int H = c.heads, Hkv = c.kv_heads, hd = c.hd;
    const size_t qdim = size_t(H) * hd, kvdim = size_t(Hkv) * hd;
    std::mt19937 rng(c.hd + c.window);
    const auto qw = norm_weights(hd, rng), kw = norm_weights(hd, rng);
    auto dqw = to_device(qw);
    auto dkw = to_device(kw);
    DeviceBuffer kc(plane_bytes(c.kv, size_t(c.slots) * kvdim)),
        vc(plane_bytes(c.kv, size_t(c.slots) * kvdim));
    kc.zero();
    vc.zero();
    const DeviceBuffer table = kv_table({{kc.ptr(), vc.ptr()}});
    const int max_t = std::max(c.prefill, 1);
    const int sms = gj::jit::Device::get().sm_count();
    DeviceBuffer dpos(size_t(max_t) * 4);
    std::vector<float> k_hist, v_hist;      // fp32 K/V of every position so far
    std::vector<float> k_scales, v_scales;  // q8_0: their blocks' scales d = amax / 127
    const int warps = int(spec_constant(prep, "WARPS"));

    int pos0 = 0, checked = 0;
    while (pos0 < c.prefill + c.steps) {
        const int T = pos0 == 0 ? c.prefill : 1;
        std::vector<int> positions = range(pos0, T);
        dpos.upload(positions.data(), positions.size() * 4);
        // Gemma-like raw projections: the norms make their scale irrelevant except for q . k,
        // which the weights shape; raw q/k of scale 1 give scores of a few units.
        const auto q = random_normal(size_t(T) * qdim, 1.0f, rng);
        const auto q2 = random_normal(size_t(T) * qdim, 1.0f, rng);
        const auto k_raw = random_normal(size_t(T) * kvdim, 1.0f, rng);
        const auto v_raw = random_normal(size_t(T) * kvdim, 1.0f, rng);
        auto dq = to_device(q);
        auto dq2 = to_device(q2);
        auto dk = to_device(k_raw);
        auto dv = to_device(v_raw);
        launch(gp.get(prep.name, "attn_prep"), {ceil_div(H + 2 * Hkv, warps), unsigned(max_t)},
               {unsigned(32 * warps)}, dq.ptr(), dk.ptr(), c.has_v ? dv.ptr() : kNull, dqw.ptr(),
               dkw.ptr(), table.ptr(), kNull, dpos.ptr(), T, c.slots, c.base, kEps, kNull, 0);
        launch(gs.get(prep_shared.name, "attn_prep"), {ceil_div(H, warps), unsigned(max_t)},
               {unsigned(32 * warps)}, dq2.ptr(), kNull, kNull, dqw.ptr(), kNull, kNull, kNull,
               dpos.ptr(), T, c.slots, c.base, kEps, kNull, 0);
        const auto ref = attn_prep(q, k_raw, c.has_v ? &v_raw : nullptr, qw.data(), kw.data(),
                                   positions, H, Hkv, hd, c.pairs, c.base, kEps, true);
        const auto ref2 = attn_prep(q2, k_raw, nullptr, qw.data(), nullptr, positions, H, Hkv, hd,
                                    c.pairs, c.base, kEps, false);
        k_hist.insert(k_hist.end(), ref.k.begin(), ref.k.end());
        v_hist.insert(v_hist.end(), ref.v.begin(), ref.v.end());
        if (q8) {
            const auto ks = kv_q8_scales(kv_q8_encode(ref.k)),
                       vs = kv_q8_scales(kv_q8_encode(ref.v));
            k_scales.insert(k_scales.end(), ks.begin(), ks.end());
            v_scales.insert(v_scales.end(), vs.begin(), vs.end());
        }
        const int hist_slots = int(k_hist.size() / kvdim);  // no ring on the CPU side

        for (const auto& flash : flashes)
            for (const auto* qs : {&dq, &dq2}) {
                SCOPED_TRACE(flash.name);
                const int max_splits =
                    gj::gemma4::flash_decode_splits(flash, c.prefill + c.steps, 1, sms);
                const auto gq = from_device<float>(*qs, size_t(T) * qdim);
                const FlashRun r = run_flash(flash, gq, kc, vc, dpos, T, c.slots, max_splits);
                ASSERT_TRUE(all_finite(r.out)) << "NaN/inf at pos " << pos0;
                const auto& rq = qs == &dq ? ref.q : ref2.q;
                std::vector<double> l2;
                const auto want = attention(rq, k_hist, v_hist, positions, H, Hkv, hd, c.window,
                                            hist_slots, nullptr, &l2);
                // Against fp32 K/V without the cache's rounding, per head, in rms over the head's
                // dims: rounding k_ji to the storage type (relative error <= u = 2^-11 f16, 2^-8
                // bf16, independent across elements) moves score j by a sum with standard deviation
                // <= u / sqrt(3) * ||q o k_j||; the output moves by about twice that (the weights'
                // relative change, against v of rms 1 after the V-norm), and rounding v adds <= u.
                // 4u (||q o k||max + 1) is about 3.5 sigma; a wrong slot, position or head is O(1).
                // The tensor-core path also rounds q (an independent error of the same size as k's:
                // sqrt(2) more) and P (<= u more): 6u.
                // q8_0 instead rounds each element to within d / 2 of its block's step d (about
                // uniformly: standard deviation d / (2 sqrt 3)), so u |k_ji| becomes d_ji / 2:
                // tol = 4 (max_j ||q o d_j / 2|| + max d_v / 2) over the visible keys j.
                const double u = bf16 ? 0x1p-8 : 0x1p-11;
                const double k_tol = spec_constant(flash, "MMA") == 1 ? 6 : 4;
                const int blocks = hd / 32;
                auto q8_tol = [&](int t, int h) {
                    const int p = positions[t], kvh = h / (H / Hkv);
                    const int lo = c.window > 0 ? std::max(0, p - c.window + 1) : 0;
                    const float* qh = &rq[(size_t(t) * H + h) * hd];
                    double k_noise = 0, v_step = 0;
                    for (int j = lo; j <= p; ++j) {
                        const size_t b0 = (size_t(j) * Hkv + kvh) * blocks;
                        double n2 = 0;
                        for (int i = 0; i < hd; ++i) {
                            const double e = double(qh[i]) * k_scales[b0 + i / 32] / 2;
                            n2 += e * e;
                        }
                        k_noise = std::max(k_noise, std::sqrt(n2));
                        for (int b = 0; b < blocks; ++b)
                            v_step = std::max(v_step, double(v_scales[b0 + b]) / 2);
                    }
                    return 4 * (k_noise + v_step);
                };
                for (int t = 0; t < T; ++t)
                    for (int h = 0; h < H; ++h) {
                        const size_t o0 = (size_t(t) * H + h) * hd;
                        double err2 = 0;
                        for (int i = 0; i < hd; ++i) {
                            const double e = double(r.out[o0 + i]) - want[o0 + i];
                            err2 += e * e;
                        }
                        const double rms = std::sqrt(err2 / hd);
                        const double tol =
                            q8 ? q8_tol(t, h) : k_tol * u * (l2[size_t(t) * H + h] + 1);
                        ASSERT_LE(rms, tol) << "pos " << positions[t] << " head " << h
                                            << (qs == &dq ? "" : " (KV-shared layer)");
                    }
                ++checked;
            }
        pos0 += T;
    }
    EXPECT_EQ(checked, 2 * int(flashes.size()) * (1 + c.steps));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttnChainTest,
    ::testing::Values(
        // Tiny sliding layer: window 8, ring of window + prefill - 1 slots, decode wraps it
        // several times.
        ChainCase{32, 4, 2, 16, 8, 8 + 4 - 1, 4, 30, true, KvType::F16, 1e4f},
        // E4B sliding shape, window 512 with a small prefill chunk, decoding past the window.
        ChainCase{256, 8, 2, 128, 512, 512 + 16 - 1, 16, 520, true, KvType::F16, 1e4f},
        // 31B-like global layer: k_eq_v, proportional RoPE, bf16 cache.
        ChainCase{512, 8, 1, 64, 0, 256, 24, 40, false, KvType::BF16, 1e6f},
        ChainCase{64, 8, 1, 8, 0, 128, 9, 30, false, KvType::F16, 1e6f},
        // q8_0 caches: the tiny sliding ring, the E4B sliding shape past the window, a 31B-like
        // k_eq_v global.
        ChainCase{32, 4, 2, 16, 8, 8 + 4 - 1, 4, 30, true, KvType::Q8_0, 1e4f},
        ChainCase{256, 8, 2, 128, 512, 512 + 16 - 1, 16, 520, true, KvType::Q8_0, 1e4f},
        ChainCase{512, 8, 1, 64, 0, 256, 24, 40, false, KvType::Q8_0, 1e6f}));

}  // namespace
