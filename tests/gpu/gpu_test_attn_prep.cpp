// attn_prep on the GPU against its CPU reference on random data: Q/K norm, V-norm, NeoX RoPE incl.
// proportional, KV append into the ring, k_eq_v, KV-shared Q-only, for head dims 32/64/256/512,
// f16, bf16 and q8_0 caches, T = 1 and T > 1 at mixed positions up to 131071.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <tuple>

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

struct PrepCase {
    int hd, heads, kv_heads, pairs;
    bool has_kv, has_v;
    KvType kv;
    int slots;
    float base;
    std::vector<int> positions;
};

void PrintTo(const PrepCase& c, std::ostream* os) {
    *os << "hd" << c.hd << " h" << c.heads << " kv" << c.kv_heads << " rp" << c.pairs
        << (c.has_kv ? (c.has_v ? "" : " keqv") : " shared") << " "
        << gj::gemma4::kv_type_name(c.kv) << " slots" << c.slots << " T" << c.positions.size();
}

class AttnPrepTest : public ::testing::TestWithParam<PrepCase> {};

TEST_P(AttnPrepTest, MatchesCpu) {
    GJ_REQUIRE_GPU();
    const PrepCase& c = GetParam();
    const KernelSpec spec =
        gj::gemma4::attn_prep_spec(c.hd, c.heads, c.kv_heads, c.pairs, c.has_kv, c.has_v, c.kv);
    SCOPED_TRACE(spec.name);
    const auto& g = kernels_for(spec);
    const int T = int(c.positions.size());
    std::mt19937 rng(c.hd * 7 + c.heads * 131 + T);
    const size_t qn = size_t(T) * c.heads * c.hd, kn = size_t(T) * c.kv_heads * c.hd;
    const auto q = random_normal(qn, 2.0f, rng);
    const auto k_raw = random_normal(kn, 3.0f, rng);
    const auto v_raw = random_normal(kn, 0.5f, rng);
    const auto qw = norm_weights(c.hd, rng), kw = norm_weights(c.hd, rng);

    // Caches start as a sentinel pattern: slots no token maps to must keep it bit for bit.
    const size_t cache_elems = size_t(c.slots) * c.kv_heads * c.hd;
    std::vector<uint8_t> sentinel(plane_bytes(c.kv, cache_elems));
    for (size_t i = 0; i < sentinel.size(); ++i) sentinel[i] = i % 2 ? 0x3a : 0x5c;
    auto dq = to_device(q);
    auto dk = to_device(k_raw);
    auto dv = to_device(v_raw);
    auto dqw = to_device(qw);
    auto dkw = to_device(kw);
    auto dpos = to_device(c.positions);
    auto dkc = to_device(sentinel);
    auto dvc = to_device(sentinel);
    const int warps = int(spec_constant(spec, "WARPS"));
    const int rows = c.heads + (c.has_kv ? 2 * c.kv_heads : 0);
    // One spare token row in the grid: blocks past T must leave everything alone.
    const DeviceBuffer table = kv_table({{dkc.ptr(), dvc.ptr()}});
    launch(g.get(spec.name, "attn_prep"), {ceil_div(rows, warps), unsigned(T + 1)},
           {unsigned(32 * warps)}, dq.ptr(), dk.ptr(), c.has_v ? dv.ptr() : kNull, dqw.ptr(),
           dkw.ptr(), c.has_kv ? table.ptr() : kNull, kNull, dpos.ptr(), T, c.slots, c.base, kEps,
           kNull, 0);

    const auto want =
        attn_prep(q, k_raw, c.has_v ? &v_raw : nullptr, qw.data(), kw.data(), c.positions, c.heads,
                  c.kv_heads, c.hd, c.pairs, c.base, kEps, c.has_kv);
    const auto got_q = from_device<float>(dq, qn);
    ASSERT_TRUE(all_finite(got_q)) << "NaN/inf in q";
    // q: fp32 norm scale vs double (~1e-6 relative) and sincosf vs the CPU's sinf/cosf of the
    // same fp32 angle (a few ulp each); 1e-5 of the pair's magnitude bounds both.
    const int half = c.hd / 2;
    int failures = 0;
    for (size_t row = 0; row < size_t(T) * c.heads && failures < 8; ++row)
        for (int j = 0; j < half && failures < 8; ++j) {
            const size_t a = row * c.hd + j, b = a + half;
            const double tol = 1e-5 * (std::fabs(want.q[a]) + std::fabs(want.q[b])) + 1e-7;
            for (size_t i : {a, b})
                if (!(std::fabs(got_q[i] - want.q[i]) <= tol)) {
                    ++failures;
                    ADD_FAILURE() << "q row " << row << " dim " << i - row * c.hd << ": "
                                  << got_q[i] << " want " << want.q[i] << " (tol " << tol << ")";
                }
        }

    const auto kc = from_device<uint8_t>(dkc, sentinel.size());
    const auto vc = from_device<uint8_t>(dvc, sentinel.size());

    // The same rows read from one merged product ([T][Q | K | V], the prefill's single cuBLAS
    // product over adjacent copies; V absent on k_eq_v layers): the same queries, written to q,
    // and the same cache bytes, bit for bit.
    if (c.has_kv) {
        const size_t q_width = size_t(c.heads) * c.hd, kv_width = size_t(c.kv_heads) * c.hd;
        const size_t stride = q_width + kv_width * (c.has_v ? 2 : 1);
        std::vector<float> merged(size_t(T) * stride);
        for (int t = 0; t < T; ++t) {
            float* row = merged.data() + t * stride;
            std::copy_n(q.begin() + t * q_width, q_width, row);
            std::copy_n(k_raw.begin() + t * kv_width, kv_width, row + q_width);
            if (c.has_v)
                std::copy_n(v_raw.begin() + t * kv_width, kv_width, row + q_width + kv_width);
        }
        auto dm = to_device(merged);
        auto dq_out = to_device(std::vector<float>(qn, std::nanf("")));
        auto dkc2 = to_device(sentinel), dvc2 = to_device(sentinel);
        const DeviceBuffer table2 = kv_table({{dkc2.ptr(), dvc2.ptr()}});
        launch(g.get(spec.name, "attn_prep"), {ceil_div(rows, warps), unsigned(T + 1)},
               {unsigned(32 * warps)}, dq_out.ptr(), kNull, kNull, dqw.ptr(), dkw.ptr(),
               table2.ptr(), kNull, dpos.ptr(), T, c.slots, c.base, kEps, dm.ptr(), int(stride));
        EXPECT_EQ(from_device<float>(dq_out, qn), got_q) << "queries from the merged rows";
        EXPECT_EQ(from_device<uint8_t>(dkc2, sentinel.size()), kc) << "K cache from merged rows";
        EXPECT_EQ(from_device<uint8_t>(dvc2, sentinel.size()), vc) << "V cache from merged rows";
        EXPECT_EQ(from_device<float>(dm, merged.size()), merged) << "the merged rows were written";
    }
    if (!c.has_kv) {
        EXPECT_EQ(kc, sentinel) << "a KV-shared layer wrote the K cache";
        EXPECT_EQ(vc, sentinel) << "a KV-shared layer wrote the V cache";
        return;
    }
    const bool q8 = c.kv == KvType::Q8_0;
    const auto kvals = decode_plane(kc, c.kv), vvals = decode_plane(vc, c.kv);
    std::vector<bool> written(c.slots, false);
    const size_t row_elems = size_t(c.kv_heads) * c.hd;
    // f16 / bf16: stored value = round(gpu fp32); gpu fp32 = cpu fp32 within 1e-5 of the pair's
    // magnitude (as for q), so |stored - cpu| <= half an ulp of the storage type (2^-11 f16, 2^-8
    // bf16, relative) plus that, plus the f16 subnormal step.
    // q8_0: stored value = fp16(d) * round(x / d) with d = amax / 127 of the 32-block, so
    // |stored - x| <= d / 2 + 127 d 2^-11 (the scale's fp16 rounding) < 0.57 d, plus the same
    // 1e-5 for the GPU's fp32 x, where d is the reference block's. The quantizer must also be
    // ggml's: the GPU's int8 payload equals the CPU quantization of the reference rows except
    // where the 1e-5 moves x / d across a rounding boundary (<= 0.3% of elements; >= 98% must
    // match), and its fp16 scales are within one ulp of the reference's.
    const double ulp = c.kv == KvType::BF16 ? 0x1p-8 : 0x1p-11;
    size_t q8_elems = 0, q8_equal = 0;
    for (int t = 0; t < T; ++t) {
        const int slot = c.positions[t] % c.slots;
        written[slot] = true;
        for (const auto& [name, cache, vals, ref] :
             {std::tuple{"K", &kc, &kvals, &want.k}, std::tuple{"V", &vc, &vvals, &want.v}}) {
            const std::vector<float> ref_row(ref->begin() + size_t(t) * row_elems,
                                             ref->begin() + size_t(t + 1) * row_elems);
            const auto ref_plane = q8 ? kv_q8_encode(ref_row) : std::vector<uint8_t>{};
            const auto ref_scales = q8 ? kv_q8_scales(ref_plane) : std::vector<float>{};
            for (size_t e = 0; e < row_elems && failures < 8; ++e) {
                const size_t src = size_t(t) * row_elems + e;
                const size_t pair = e % c.hd < size_t(half) ? src + half : src - half;
                const size_t at = size_t(slot) * row_elems + e;
                const float got = (*vals)[at];
                const double drift =
                    1e-5 * (std::fabs((*ref)[src]) + std::fabs((*ref)[pair])) + 0x1p-24;
                const double tol = q8 ? 0.57 * ref_scales[e / 32] + drift
                                      : ulp * 1.001 * std::fabs((*ref)[src]) + drift;
                if (!(std::fabs(got - (*ref)[src]) <= tol)) {
                    ++failures;
                    ADD_FAILURE() << name << " token " << t << " (pos " << c.positions[t]
                                  << ", slot " << slot << ") elem " << e << ": " << got << " want "
                                  << (*ref)[src] << " (tol " << tol << ")";
                }
                if (!q8) continue;
                ++q8_elems;
                q8_equal += (*cache)[at] == ref_plane[e];
                if (e % 32 == 0) {
                    const size_t sb = cache_elems + at / 16, rb = row_elems + e / 16;
                    const int got_bits = (*cache)[sb] | (*cache)[sb + 1] << 8;
                    const int want_bits = ref_plane[rb] | ref_plane[rb + 1] << 8;
                    EXPECT_LE(std::abs(got_bits - want_bits), 1)
                        << name << " token " << t << " block " << e / 32 << " scale";
                }
            }
        }
    }
    if (q8) {
        EXPECT_GE(double(q8_equal), 0.98 * double(q8_elems))
            << q8_equal << " of " << q8_elems << " int8 values equal the CPU quantization";
    }
    // Unwritten slots keep the sentinel: their elements (payload) and, for q8_0, their scales.
    const size_t row_bytes = q8 ? row_elems : 2 * row_elems;
    for (int s = 0; s < c.slots; ++s) {
        if (written[s]) continue;
        for (size_t b = 0; b < row_bytes; ++b) {
            ASSERT_EQ(kc[s * row_bytes + b], sentinel[s * row_bytes + b]) << "K slot " << s;
            ASSERT_EQ(vc[s * row_bytes + b], sentinel[s * row_bytes + b]) << "V slot " << s;
        }
        if (!q8) continue;
        for (size_t b = cache_elems + s * row_elems / 16;
             b < cache_elems + (s + 1) * row_elems / 16; ++b) {
            ASSERT_EQ(kc[b], sentinel[b]) << "K scales of slot " << s;
            ASSERT_EQ(vc[b], sentinel[b]) << "V scales of slot " << s;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttnPrepTest,
    ::testing::Values(
        // E4B sliding (full RoPE over 256) and global (proportional: 64 of 256 pairs), decode.
        PrepCase{256, 8, 2, 128, true, true, KvType::F16, 515, 1e4f, {0}},
        PrepCase{256, 8, 2, 128, true, true, KvType::F16, 515, 1e4f, {4095}},
        PrepCase{512, 8, 2, 64, true, true, KvType::F16, 131072, 1e6f, {131071}},
        PrepCase{512, 8, 2, 64, true, true, KvType::F16, 8192, 1e6f, {1}},
        // Prefill batch at mixed positions (ring slots distinct), bf16 cache.
        PrepCase{256, 8, 2, 128, true, true, KvType::BF16, 515, 1e4f, {5, 0, 514, 517, 77, 1033}},
        PrepCase{512, 8, 2, 64, true, true, KvType::BF16, 8192, 1e6f, {3, 4096, 8191, 100}},
        // 31B/12B global: k_eq_v (V from the raw K projection), MQA and 4 KV heads.
        PrepCase{512, 32, 4, 64, true, false, KvType::F16, 4096, 1e6f, {17, 18, 4000}},
        PrepCase{512, 16, 1, 64, true, false, KvType::BF16, 4096, 1e6f, {2047}},
        // KV-shared layers: Q only, caches untouched.
        PrepCase{256, 8, 2, 128, false, false, KvType::F16, 64, 1e4f, {9, 10}},
        PrepCase{512, 8, 2, 64, false, false, KvType::F16, 64, 1e6f, {63}},
        // Tiny presets: head dims 32 (sliding, window-sized ring) and 64 (8 of 32 pairs).
        PrepCase{32, 4, 2, 16, true, true, KvType::F16, 11, 1e4f, {0, 1, 2, 3, 15, 21, 30}},
        PrepCase{64, 8, 1, 8, true, false, KvType::F16, 4096, 1e6f, {4095, 0, 31}},
        PrepCase{64, 4, 1, 8, false, false, KvType::F16, 16, 1e6f, {12}},
        // q8_0 caches: E4B sliding and global (prefill batch, ring wrap), k_eq_v MQA, the tiny
        // head dims (32: one block per row; 64), and a Q-only layer.
        PrepCase{256, 8, 2, 128, true, true, KvType::Q8_0, 515, 1e4f, {5, 0, 514, 517, 77, 1033}},
        PrepCase{512, 8, 2, 64, true, true, KvType::Q8_0, 131072, 1e6f, {131071}},
        PrepCase{512, 16, 1, 64, true, false, KvType::Q8_0, 4096, 1e6f, {2047, 3, 4000}},
        PrepCase{32, 4, 2, 16, true, true, KvType::Q8_0, 11, 1e4f, {0, 1, 2, 3, 15, 21, 30}},
        PrepCase{64, 8, 1, 8, true, false, KvType::Q8_0, 4096, 1e6f, {4095, 0, 31}},
        PrepCase{256, 8, 2, 128, false, false, KvType::Q8_0, 64, 1e4f, {9, 10}}));

// Batched decode: one launch appends the tokens of several sequences, each into the planes its
// seqs[] entry names through the table; the result equals appending each sequence's tokens
// alone, byte for byte, and no other sequence's planes change.
TEST(AttnPrep, TokensAppendToTheirOwnSequence) {
    GJ_REQUIRE_GPU();
    for (KvType kv : {KvType::F16, KvType::Q8_0}) {
        const KernelSpec spec = gj::gemma4::attn_prep_spec(256, 8, 2, 128, true, true, kv);
        SCOPED_TRACE(spec.name);
        const auto& g = kernels_for(spec);
        const int hd = 256, H = 8, Hkv = 2, slots = 515, S = 3;
        const std::vector<int> seqs = {2, 0, 1, 0}, positions = {7, 3, 514, 4};
        const int T = int(seqs.size());
        std::mt19937 rng(11);
        const auto q = random_normal(size_t(T) * H * hd, 2.0f, rng);
        const auto k_raw = random_normal(size_t(T) * Hkv * hd, 3.0f, rng);
        const auto v_raw = random_normal(size_t(T) * Hkv * hd, 0.5f, rng);
        auto dqw = to_device(norm_weights(hd, rng));
        auto dkw = to_device(norm_weights(hd, rng));
        std::vector<uint8_t> sentinel(plane_bytes(kv, size_t(slots) * Hkv * hd));
        for (size_t i = 0; i < sentinel.size(); ++i) sentinel[i] = i % 2 ? 0x3a : 0x5c;
        const int warps = int(spec_constant(spec, "WARPS"));
        const unsigned blocks = ceil_div(H + 2 * Hkv, warps);

        // All tokens in one launch over S sequences' planes.
        std::vector<DeviceBuffer> kc, vc;
        std::vector<std::pair<CUdeviceptr, CUdeviceptr>> planes;
        for (int s = 0; s < S; ++s) {
            kc.push_back(to_device(sentinel)), vc.push_back(to_device(sentinel));
            planes.push_back({kc.back().ptr(), vc.back().ptr()});
        }
        const DeviceBuffer table = kv_table(planes);
        auto dq = to_device(q), dk = to_device(k_raw), dv = to_device(v_raw);
        auto dpos = to_device(positions), dseq = to_device(seqs);
        launch(g.get(spec.name, "attn_prep"), {blocks, unsigned(T)}, {unsigned(32 * warps)},
               dq.ptr(), dk.ptr(), dv.ptr(), dqw.ptr(), dkw.ptr(), table.ptr(), dseq.ptr(),
               dpos.ptr(), T, slots, 1e4f, kEps, kNull, 0);
        const auto q_batched = from_device<float>(dq, q.size());

        // Each token alone (seqs null) into a fresh pair of planes for its sequence.
        std::vector<DeviceBuffer> kw, vw;
        for (int s = 0; s < S; ++s)
            kw.push_back(to_device(sentinel)), vw.push_back(to_device(sentinel));
        std::vector<float> q_alone;
        for (int t = 0; t < T; ++t) {
            const size_t qs = size_t(H) * hd, ks = size_t(Hkv) * hd;
            auto dq1 = to_device(std::vector<float>(q.begin() + t * qs, q.begin() + (t + 1) * qs));
            auto dk1 =
                to_device(std::vector<float>(k_raw.begin() + t * ks, k_raw.begin() + (t + 1) * ks));
            auto dv1 =
                to_device(std::vector<float>(v_raw.begin() + t * ks, v_raw.begin() + (t + 1) * ks));
            auto dp1 = to_device(std::vector<int>{positions[t]});
            const DeviceBuffer one = kv_table({{kw[seqs[t]].ptr(), vw[seqs[t]].ptr()}});
            launch(g.get(spec.name, "attn_prep"), {blocks, 1u}, {unsigned(32 * warps)}, dq1.ptr(),
                   dk1.ptr(), dv1.ptr(), dqw.ptr(), dkw.ptr(), one.ptr(), kNull, dp1.ptr(), 1,
                   slots, 1e4f, kEps, kNull, 0);
            const auto r = from_device<float>(dq1, qs);
            q_alone.insert(q_alone.end(), r.begin(), r.end());
        }
        EXPECT_EQ(q_batched, q_alone) << "queries";
        for (int s = 0; s < S; ++s) {
            EXPECT_EQ(from_device<uint8_t>(kc[s], sentinel.size()),
                      from_device<uint8_t>(kw[s], sentinel.size()))
                << "K planes of sequence " << s;
            EXPECT_EQ(from_device<uint8_t>(vc[s], sentinel.size()),
                      from_device<uint8_t>(vw[s], sentinel.size()))
                << "V planes of sequence " << s;
        }
    }
}

}  // namespace
