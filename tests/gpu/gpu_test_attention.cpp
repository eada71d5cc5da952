// Attention kernels on the GPU against CPU references on random data:
//  - attn_prep (Q/K norm, V-norm, NeoX RoPE incl. proportional, KV append into the ring, k_eq_v,
//    KV-shared Q-only) for head dims 32/64/256/512, f16, bf16 and q8_0 caches, T = 1 and T > 1 at
//    mixed positions up to 131071;
//  - flash_decode + flash_combine over its spec grid (head dims 32/64/256/512, groups 1..16 and
//    non-powers of two, windows 0/8/512/1024, positions across tile, split and window edges, ring
//    wrap-around, several max_splits, T = 1 and T > 1 at mixed positions, large scores; q8_0
//    caches against exact attention over the same dequantized values);
//  - the chain attn_prep -> flash_decode -> flash_combine over a prefill chunk and decode steps
//    past the window, against fp32 attention without cache rounding (the storage type's
//    tolerance: f16 / bf16 relative rounding, q8_0 half a block step).
// FlashDecodeBench.DISABLED_* time E4B's two attention shapes at depth 4096 (run with
// --gtest_also_run_disabled_tests).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>

#include "engine/gpu/kernels/attn_prep.h"
#include "engine/gpu/kernels/flash_decode.h"
#include "engine/gpu/kernels/spec_util.h"
#include "engine/gpu/kv_type.h"
#include "jit/cuda_driver.h"
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

bool all_finite(const std::vector<float>& v) {
    return std::all_of(v.begin(), v.end(), [](float f) { return std::isfinite(f); });
}

// Bytes of a cache plane of `elems` elements (q8_0: int8 payload + an fp16 scale per 32).
size_t plane_bytes(KvType kv, size_t elems) {
    return kv == KvType::Q8_0 ? elems + elems / 16 : 2 * elems;
}

// A cache plane holding x (rounded to the KV type), as bytes, and the values it holds.
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

std::vector<uint16_t> encode(const std::vector<float>& x, bool bf16) {
    std::vector<uint16_t> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) h[i] = kv_encode(x[i], bf16);
    return h;
}

// Norm weights as Gemma stores them: gains around 1, some well above it.
std::vector<float> norm_weights(int n, std::mt19937& rng) {
    auto w = random_normal(n, 0.6f, rng);
    for (auto& e : w) e = 1.0f + e;
    return w;
}

// ---------------------------------------------------------------------------------------------
// attn_prep

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
    launch(g.get(spec.name, "attn_prep"), {ceil_div(rows, warps), unsigned(T + 1)},
           {unsigned(32 * warps)}, dq.ptr(), dk.ptr(), c.has_v ? dv.ptr() : kNull, dqw.ptr(),
           dkw.ptr(), dkc.ptr(), dvc.ptr(), dpos.ptr(), T, c.slots, c.base, kEps);

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

// ---------------------------------------------------------------------------------------------
// flash_decode + flash_combine

struct FlashCase {
    int hd, group, kv_heads, window, slots;
    KvType kv;
    std::vector<int> positions;
    int max_splits;            // 0: flash_decode_splits() for this device
    float score_sigma = 4.0f;  // standard deviation of q . k
};

void PrintTo(const FlashCase& c, std::ostream* os) {
    *os << "hd" << c.hd << " g" << c.group << " kv" << c.kv_heads << " w" << c.window << " slots"
        << c.slots << " " << gj::gemma4::kv_type_name(c.kv) << " T" << c.positions.size()
        << " pos0 " << c.positions[0] << " splits " << c.max_splits;
}

// The split length the kernel uses (kernel header: max(CHUNK, round_up(ceil(n / splits), TILE))).
int split_len(const KernelSpec& spec, int n, int max_splits) {
    const int chunk = int(spec_constant(spec, "CHUNK")), tile = int(spec_constant(spec, "TILE"));
    int len = (n + max_splits - 1) / max_splits;
    len = (len + tile - 1) / tile * tile;
    return std::max(len, chunk);
}

struct FlashRun {
    std::vector<float> out;
    std::vector<float> part_ml;  // [T][H][max_splits] {m, l}
    int max_splits = 0;
};

// Runs flash_decode + flash_combine on caches held as storage bits, with partial buffers
// poisoned with NaN: the combine must read only the live splits.
FlashRun run_flash(const KernelSpec& spec, const std::vector<float>& q, const DeviceBuffer& kc,
                   const DeviceBuffer& vc, const DeviceBuffer& dpos, int T, int slots,
                   int max_splits) {
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
    // One spare token row in both grids: blocks past T exit.
    launch_smem_async(
        g.get(spec.name, "flash_decode"), {unsigned(max_splits), unsigned(kvh), unsigned(T + 1)},
        {unsigned(spec_constant(spec, "THREADS"))}, unsigned(spec_constant(spec, "SMEM")), dq.ptr(),
        kc.ptr(), vc.ptr(), dpos.ptr(), T, slots, max_splits, part_o.ptr(), part_ml.ptr());
    launch(g.get(spec.name, "flash_combine"), {unsigned(H * hd / 16), unsigned(T + 1)},
           {unsigned(spec_constant(spec, "COMBINE_THREADS"))}, part_o.ptr(), part_ml.ptr(),
           out.ptr(), T, max_splits);
    FlashRun r;
    r.out = from_device<float>(out, size_t(T) * H * hd);
    r.part_ml = from_device<float>(part_ml, parts * 2);
    r.max_splits = max_splits;
    return r;
}

class FlashDecodeTest : public ::testing::TestWithParam<FlashCase> {};

TEST_P(FlashDecodeTest, MatchesCpu) {
    GJ_REQUIRE_GPU();
    const FlashCase& c = GetParam();
    const bool bf16 = c.kv == KvType::BF16;
    const int T = int(c.positions.size()), H = c.group * c.kv_heads;
    const int max_pos = *std::max_element(c.positions.begin(), c.positions.end());
    // Both paths on the same data: tensor cores (GEMMAJIT_FLASH_MMA=1; head dims that are
    // multiples of 64; not for q8_0, which the builder rejects there) and the default fp32
    // CUDA-core path.
    struct Path {
        KernelSpec spec;
        int max_splits;
    };
    std::vector<Path> paths;
    for (bool mma : {true, false}) {
        if (mma && c.kv == KvType::Q8_0) continue;
        KernelSpec spec =
            gj::gemma4::flash_decode_spec(c.hd, c.group, c.kv_heads, c.window, c.kv, mma);
        if (spec_constant(spec, "MMA") != int(mma)) continue;  // no tensor-core form
        const int splits = c.max_splits > 0
                               ? c.max_splits
                               : gj::gemma4::flash_decode_splits(spec, max_pos + 1, T,
                                                                 gj::jit::Device::get().sm_count());
        paths.push_back({std::move(spec), splits});
    }
    std::mt19937 rng(c.hd + 17 * c.group + 1000 * T + c.positions[0]);
    // Every slot holds data (stale ring entries included), K and V ~ N(0, 1) like normed rows;
    // q scaled so scores have standard deviation score_sigma.
    const size_t cache_elems = size_t(c.slots) * c.kv_heads * c.hd;
    auto k = random_normal(cache_elems, 1.0f, rng);
    const auto q = random_normal(size_t(T) * H * c.hd, c.score_sigma / std::sqrt(float(c.hd)), rng);
    // Random scores leave single keys with tiny weights, so an off-by-one at a window, tile or
    // split edge would hide below the tolerance. Plant keys at those edges of either path (and
    // just outside them) that score 30 against the group's first query, above every random
    // score: including or dropping one of them moves that head's output by O(1 / planted).
    for (const auto& path : paths)
        for (int t = 0; t < T; ++t) {
            const int p = c.positions[t];
            const int lo = c.window > 0 ? std::max(0, p - c.window + 1) : 0;
            const int len = split_len(path.spec, p - lo + 1, path.max_splits);
            const int tile = int(spec_constant(path.spec, "TILE"));
            for (int j : {lo - 1, lo, lo + 1, p - 1, p, p + 1, lo + tile - 1, lo + tile,
                          lo + len - 1, lo + len}) {
                if (j < 0 || j > p + 1) continue;
                for (int kvh = 0; kvh < c.kv_heads; ++kvh) {
                    const float* q0 = &q[(size_t(t) * H + size_t(kvh) * c.group) * c.hd];
                    double n2 = 0;
                    for (int i = 0; i < c.hd; ++i) n2 += double(q0[i]) * q0[i];
                    float* kr = &k[(size_t(j % c.slots) * c.kv_heads + kvh) * c.hd];
                    for (int i = 0; i < c.hd; ++i) kr[i] = float(30.0 * q0[i] / n2);
                }
            }
        }
    // The reference attends over exactly the values the cache holds (q8_0: the CPU's ggml
    // quantization, dequantized; the kernel dequantizes the same bytes exactly in fp32).
    const auto kbits = encode_plane(k, c.kv);
    const auto vbits = encode_plane(random_normal(cache_elems, 1.0f, rng), c.kv);
    auto dkc = to_device(kbits);
    auto dvc = to_device(vbits);
    auto dpos = to_device(c.positions);
    std::vector<double> mag, l2;
    const auto kf = decode_plane(kbits, c.kv), vf = decode_plane(vbits, c.kv);
    const auto want =
        attention(q, kf, vf, c.positions, H, c.kv_heads, c.hd, c.window, c.slots, &mag, &l2);

    for (const auto& [spec, max_splits] : paths) {
        SCOPED_TRACE(spec.name + " max_splits " + std::to_string(max_splits));
        const bool mma = spec_constant(spec, "MMA") == 1;
        const FlashRun r = run_flash(spec, q, dkc, dvc, dpos, T, c.slots, max_splits);
        ASSERT_TRUE(all_finite(r.out)) << "NaN/inf in the output";
        int failures = 0;
        for (int t = 0; t < T; ++t) {
            const int p = c.positions[t];
            const int lo = c.window > 0 ? std::max(0, p - c.window + 1) : 0;
            const int n = p - lo + 1;
            for (int h = 0; h < H && failures < 8; ++h) {
                const size_t th = size_t(t) * H + h;
                if (mma) {
                    // Tensor cores: q and the weights P are rounded to the cache type (u = 2^-11
                    // f16, 2^-8 bf16). Rounding q moves score j by a sum of independent errors
                    // with standard deviation <= u / sqrt(3) ||q o k_j||; the output moves by
                    // about twice that against v of rms 1, and rounding P adds <= u. In rms over
                    // the head: 4u (max_j ||q o k_j|| + 1), about 3.5 sigma.
                    const double u = bf16 ? 0x1p-8 : 0x1p-11;
                    const double tol = 4 * u * (l2[th] + 1);
                    double err2 = 0;
                    for (int i = 0; i < c.hd; ++i) {
                        const double e = double(r.out[th * c.hd + i]) - want[th * c.hd + i];
                        err2 += e * e;
                    }
                    if (!(std::sqrt(err2 / c.hd) <= tol)) {
                        ++failures;
                        ADD_FAILURE()
                            << "token " << t << " (pos " << p << ") head " << h << ": rms error "
                            << std::sqrt(err2 / c.hd) << " (tol " << tol << ")";
                    }
                } else {
                    // fp32 path, same cache values on both sides: each score is an fp32 dot
                    // product (error <= ~21 roundings of the largest partial sums, bounded by
                    // 1.3e-6 * sum |q_i k_i|), which moves the softmax weights by that relatively
                    // and the output by at most twice that times max |v| (6 sigma of N(0,1));
                    // the weights (ex2.approx, 2^-22) and the fp32 P.V sums over n rows add
                    // (2^-21 + n 2^-24) max |v|. Element by element. (q8_0 values are at most
                    // the block's amax, so the same max |v| holds.)
                    const double vmax = 6.0;
                    const double tol = (2.6e-6 * mag[th] + 0x1p-21 + n * 0x1p-24) * vmax;
                    for (int i = 0; i < c.hd; ++i) {
                        const size_t o = th * c.hd + i;
                        if (!(std::fabs(r.out[o] - want[o]) <= tol)) {
                            ++failures;
                            ADD_FAILURE() << "token " << t << " (pos " << p << ") head " << h
                                          << " dim " << i << ": " << r.out[o] << " want " << want[o]
                                          << " (tol " << tol << ")";
                            break;
                        }
                    }
                }
                // The split bookkeeping is as documented: live splits cover [lo, p] with the
                // documented length, later ones are empty (-inf, 0).
                const int len = split_len(spec, n, max_splits);
                for (int s = 0; s < max_splits; ++s) {
                    const size_t idx = (th * max_splits + s) * 2;
                    const float m = r.part_ml[idx], l = r.part_ml[idx + 1];
                    if (s * len < n)
                        EXPECT_TRUE(std::isfinite(m) && l >= 1.0f)
                            << "split " << s << " m " << m << " l " << l;
                    else
                        EXPECT_TRUE(m == -INFINITY && l == 0.0f)
                            << "empty split " << s << " m " << m << " l " << l;
                }
            }
        }
    }
}

std::vector<int> range(int first, int n) {
    std::vector<int> v(n);
    for (int i = 0; i < n; ++i) v[i] = first + i;
    return v;
}

// Tiles (CHUNK = TILE): tensor cores 32 rows; fp32 path hd 512 -> 16, hd 256 -> 32, hd <= 128
// -> 64.
INSTANTIATE_TEST_SUITE_P(
    Shapes, FlashDecodeTest,
    ::testing::Values(
        // E4B global: hd 512, group 4, 2 KV heads, causal. Lengths across tile/split edges.
        FlashCase{512, 4, 2, 0, 4096, KvType::F16, {0}, 0},
        FlashCase{512, 4, 2, 0, 4096, KvType::F16, {1}, 0},
        FlashCase{512, 4, 2, 0, 4096, KvType::F16, {14}, 0},
        FlashCase{512, 4, 2, 0, 4096, KvType::F16, {15}, 0},
        FlashCase{512, 4, 2, 0, 4096, KvType::F16, {16}, 0},
        FlashCase{512, 4, 2, 0, 4096, KvType::F16, {4095}, 0},
        FlashCase{512, 4, 2, 0, 4096, KvType::F16, {4095}, 1},   // one split: 256 tiles
        FlashCase{512, 4, 2, 0, 4096, KvType::F16, {1000}, 7},   // uneven splits
        FlashCase{512, 4, 2, 0, 4096, KvType::F16, {100}, 300},  // most splits empty
        FlashCase{512, 4, 2, 0, 4096, KvType::BF16, {2049}, 0},
        // E4B sliding: hd 256, window 512, ring of 515 slots (window + 3): edges and wrap.
        FlashCase{256, 4, 2, 512, 515, KvType::F16, {0}, 0},
        FlashCase{256, 4, 2, 512, 515, KvType::F16, {31}, 0},
        FlashCase{256, 4, 2, 512, 515, KvType::F16, {32}, 0},
        FlashCase{256, 4, 2, 512, 515, KvType::F16, {511}, 0},
        FlashCase{256, 4, 2, 512, 515, KvType::F16, {512}, 0},
        FlashCase{256, 4, 2, 512, 515, KvType::F16, {513}, 0},
        FlashCase{256, 4, 2, 512, 515, KvType::F16, {514}, 0},  // slots - 1
        FlashCase{256, 4, 2, 512, 515, KvType::F16, {518}, 0},  // slots + 3: wrapped
        FlashCase{256, 4, 2, 512, 515, KvType::F16, {4095}, 3},
        FlashCase{256, 4, 2, 512, 515, KvType::BF16, {1500}, 0},
        FlashCase{256, 4, 2, 512, 515, KvType::F16, {777}, 0, 40.0f},  // peaked softmax
        // 12B/31B sliding (window 1024, group 2) and globals (MQA group 16, group 8).
        FlashCase{256, 2, 8, 1024, 1024 + 7, KvType::F16, {1023}, 0},
        FlashCase{256, 2, 8, 1024, 1024 + 7, KvType::F16, {1024}, 0},
        FlashCase{256, 2, 8, 1024, 1024 + 7, KvType::F16, {1025}, 0},
        FlashCase{256, 2, 8, 1024, 1024 + 7, KvType::F16, {3001}, 0},
        FlashCase{512, 16, 1, 0, 2048, KvType::F16, {2047}, 0},
        FlashCase{512, 16, 1, 0, 2048, KvType::F16, {33}, 0},
        FlashCase{512, 8, 4, 0, 1024, KvType::F16, {777}, 0},
        // E2B: group 8 on both layer types.
        FlashCase{256, 8, 1, 512, 600, KvType::F16, {599}, 0},
        FlashCase{512, 8, 1, 0, 1024, KvType::BF16, {1023}, 0},
        // Group 1 and groups that are not powers of two (padding queries in the last set).
        FlashCase{512, 1, 2, 0, 512, KvType::F16, {300}, 0},
        FlashCase{256, 3, 2, 0, 512, KvType::F16, {200}, 0},
        FlashCase{512, 12, 1, 0, 512, KvType::F16, {129}, 0},
        // Tiny presets: head dims 32/64, window 8 with a ring of 11, groups 1..16.
        FlashCase{32, 2, 2, 8, 11, KvType::F16, range(0, 24), 0},
        FlashCase{32, 1, 4, 0, 256, KvType::F16, {0, 63, 64, 65, 200}, 0},
        FlashCase{64, 8, 1, 0, 4096, KvType::F16, {4095, 0, 63, 64, 127, 128}, 0},
        FlashCase{64, 16, 1, 8, 11, KvType::F16, {7, 8, 9, 10, 11, 14}, 0},
        FlashCase{64, 4, 2, 0, 300, KvType::BF16, range(0, 40), 2},
        // T > 1 at mixed positions, and a prefill-sized batch.
        FlashCase{512, 4, 2, 0, 4096, KvType::F16, {5, 4095, 0, 16, 1000, 17}, 0},
        FlashCase{256, 4, 2, 512, 515, KvType::F16, {0, 600, 513, 1, 518}, 0},
        FlashCase{256, 4, 2, 512, 811, KvType::F16, range(1000, 300), 0},
        FlashCase{512, 4, 2, 0, 2048, KvType::F16, range(2000, 40), 0},
        // q8_0 caches (fp32 path): E4B global and sliding at tile, split, window and wrap edges,
        // 31B-like groups, the tiny head dims 32/64 (2- and 4-byte scale rows) and 128 (8 bytes),
        // T > 1 at mixed positions.
        FlashCase{512, 4, 2, 0, 4096, KvType::Q8_0, {0}, 0},
        FlashCase{512, 4, 2, 0, 4096, KvType::Q8_0, {16}, 0},
        FlashCase{512, 4, 2, 0, 4096, KvType::Q8_0, {4095}, 0},
        FlashCase{512, 4, 2, 0, 4096, KvType::Q8_0, {1000}, 7},
        FlashCase{256, 4, 2, 512, 515, KvType::Q8_0, {31}, 0},
        FlashCase{256, 4, 2, 512, 515, KvType::Q8_0, {513}, 0},
        FlashCase{256, 4, 2, 512, 515, KvType::Q8_0, {518}, 0},
        FlashCase{256, 4, 2, 512, 515, KvType::Q8_0, {777}, 0, 40.0f},
        FlashCase{256, 2, 8, 1024, 1024 + 7, KvType::Q8_0, {3001}, 0},
        FlashCase{512, 16, 1, 0, 2048, KvType::Q8_0, {2047}, 0},
        FlashCase{256, 3, 2, 0, 512, KvType::Q8_0, {200}, 0},
        FlashCase{128, 4, 2, 0, 1024, KvType::Q8_0, {0, 63, 64, 65, 700}, 0},
        FlashCase{32, 2, 2, 8, 11, KvType::Q8_0, range(0, 24), 0},
        FlashCase{64, 8, 1, 0, 4096, KvType::Q8_0, {4095, 0, 63, 64, 127, 128}, 0},
        FlashCase{64, 16, 1, 8, 11, KvType::Q8_0, {7, 8, 9, 10, 11, 14}, 0},
        FlashCase{256, 4, 2, 512, 811, KvType::Q8_0, range(1000, 300), 0},
        FlashCase{512, 4, 2, 0, 2048, KvType::Q8_0, range(2000, 40), 0}));

// NaN in the cache reaches the output (a NaN must fail loudly, not be masked away).
TEST(FlashDecode, NanInVisibleRowPropagates) {
    GJ_REQUIRE_GPU();
    std::mt19937 rng(5);
    const int slots = 515, T = 1;
    const size_t elems = size_t(slots) * 2 * 256;
    auto kbits = encode(random_normal(elems, 1.0f, rng), false);
    const auto vbits = encode(random_normal(elems, 1.0f, rng), false);
    kbits[size_t(100) * 2 * 256 + 3] = 0x7e00;  // NaN in K at position 100, KV head 0
    auto dkc = to_device(kbits);
    auto dvc = to_device(vbits);
    auto dpos = to_device(std::vector<int>{200});
    const auto q = random_normal(size_t(8) * 256, 0.2f, rng);
    for (bool mma : {true, false}) {
        const KernelSpec spec = gj::gemma4::flash_decode_spec(256, 4, 2, 512, KvType::F16, mma);
        const FlashRun r = run_flash(spec, q, dkc, dvc, dpos, T, slots, 8);
        for (int h = 0; h < 8; ++h)
            EXPECT_EQ(std::isnan(r.out[size_t(h) * 256]), h < 4) << spec.name << " head " << h;
    }
    // q8_0: a NaN scale (what attn_prep stores for a block holding a NaN or an infinity) turns
    // its whole block into NaN.
    auto kq8 = encode_plane(random_normal(elems, 1.0f, rng), KvType::Q8_0);
    const size_t scale = elems + (size_t(100) * 2 * 8 + 1) * 2;  // position 100, head 0, block 1
    kq8[scale] = 0x00, kq8[scale + 1] = 0x7e;
    auto dkq8 = to_device(kq8);
    auto dvq8 = to_device(encode_plane(random_normal(elems, 1.0f, rng), KvType::Q8_0));
    const KernelSpec spec = gj::gemma4::flash_decode_spec(256, 4, 2, 512, KvType::Q8_0);
    const FlashRun r = run_flash(spec, q, dkq8, dvq8, dpos, T, slots, 8);
    for (int h = 0; h < 8; ++h)
        EXPECT_EQ(std::isnan(r.out[size_t(h) * 256]), h < 4) << spec.name << " head " << h;
}

// ---------------------------------------------------------------------------------------------
// The chain as the forward pass runs it: a prefill chunk, then decode steps, with positions in
// device memory, against fp32 attention over unrounded K/V histories.

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
               dkw.ptr(), kc.ptr(), vc.ptr(), dpos.ptr(), T, c.slots, c.base, kEps);
        launch(gs.get(prep_shared.name, "attn_prep"), {ceil_div(H, warps), unsigned(max_t)},
               {unsigned(32 * warps)}, dq2.ptr(), kNull, kNull, dqw.ptr(), kNull, kNull, kNull,
               dpos.ptr(), T, c.slots, c.base, kEps);
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

// ---------------------------------------------------------------------------------------------
// Timing: E4B attention at depth 4096, one query token, as a CUDA graph of many layers (caches
// rotate over enough copies to defeat the L2). Reports us per layer and the KV read rate.

struct GraphTimer {
    const gj::jit::DriverApi& d = gj::jit::driver();
    CUstream stream = gj::jit::Device::get().stream();
    CUgraphExec exec = nullptr;
    template <class F>
    double time_us(F&& record, int launches_per_graph, int reps) {
        CUgraph graph = nullptr;
        gj::jit::check_driver(d.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED),
                              "begin capture");
        record();
        gj::jit::check_driver(d.cuStreamEndCapture(stream, &graph), "end capture");
        gj::jit::check_driver(d.cuGraphInstantiateWithFlags(&exec, graph, 0), "instantiate");
        CUevent a, b;
        gj::jit::check_driver(d.cuEventCreate(&a, 0), "event");
        gj::jit::check_driver(d.cuEventCreate(&b, 0), "event");
        gj::jit::check_driver(d.cuGraphLaunch(exec, stream), "warm-up");
        std::vector<double> per;
        for (int r = 0; r < reps; ++r) {
            gj::jit::check_driver(d.cuEventRecord(a, stream), "record");
            gj::jit::check_driver(d.cuGraphLaunch(exec, stream), "graph launch");
            gj::jit::check_driver(d.cuEventRecord(b, stream), "record");
            gj::jit::check_driver(d.cuEventSynchronize(b), "sync");
            float ms = 0;
            gj::jit::check_driver(d.cuEventElapsedTime(&ms, a, b), "elapsed");
            per.push_back(ms * 1000.0 / launches_per_graph);
        }
        d.cuEventDestroy(a);
        d.cuEventDestroy(b);
        d.cuGraphExecDestroy(exec);
        d.cuGraphDestroy(graph);
        std::sort(per.begin(), per.end());
        return per[per.size() / 2];
    }
};

// One E4B attention layer (group 4, 2 KV heads) at depth 4096 and T = 1: flash_decode alone,
// flash_combine alone, and both, each as a graph over `copies` caches.
void bench_e4b_layer(int hd, int window, int slots, bool mma, int splits = 0) {
    const int depth = 4096, sms = gj::jit::Device::get().sm_count();
    const KernelSpec spec = gj::gemma4::flash_decode_spec(hd, 4, 2, window, KvType::F16, mma);
    const auto& g = kernels_for(spec);
    const int H = 8, kvh = 2, T = 1;
    const int max_splits =
        splits > 0 ? splits : gj::gemma4::flash_decode_splits(spec, depth, T, sms);
    const size_t cache_bytes = size_t(slots) * kvh * hd * 2;
    const int copies = int(std::max<size_t>(8, (512u << 20) / (2 * cache_bytes)));
    std::mt19937 rng(1);
    const auto bits = encode(random_normal(size_t(slots) * kvh * hd, 1.0f, rng), false);
    std::vector<DeviceBuffer> kc, vc;
    for (int i = 0; i < copies; ++i) kc.push_back(to_device(bits)), vc.push_back(to_device(bits));
    auto dq = to_device(random_normal(size_t(H) * hd, 0.2f, rng));
    auto dpos = to_device(std::vector<int>{depth - 1});
    DeviceBuffer part_o(size_t(H) * max_splits * hd * 4), part_ml(size_t(H) * max_splits * 8),
        out(size_t(H) * hd * 4);
    const auto& kd = g.get(spec.name, "flash_decode");
    const auto& kcomb = g.get(spec.name, "flash_combine");
    const unsigned threads = unsigned(spec_constant(spec, "THREADS"));
    const unsigned smem = unsigned(spec_constant(spec, "SMEM"));
    auto run_decode = [&](int i) {
        launch_smem_async(kd, {unsigned(max_splits), unsigned(kvh), 1u}, {threads}, smem, dq.ptr(),
                          kc[i].ptr(), vc[i].ptr(), dpos.ptr(), T, slots, max_splits, part_o.ptr(),
                          part_ml.ptr());
    };
    auto run_combine = [&] {
        launch_smem_async(kcomb, {unsigned(H * hd / 16), 1u}, {128u}, 0u, part_o.ptr(),
                          part_ml.ptr(), out.ptr(), T, max_splits);
    };
    GraphTimer timer;
    const double t_decode = timer.time_us(
        [&] {
            for (int i = 0; i < copies; ++i) run_decode(i);
        },
        copies, 20);
    const double t_combine = timer.time_us(
        [&] {
            for (int i = 0; i < copies; ++i) run_combine();
        },
        copies, 20);
    const double t_layer = timer.time_us(
        [&] {
            for (int i = 0; i < copies; ++i) run_decode(i), run_combine();
        },
        copies, 20);
    const int keys = window > 0 ? std::min(window, depth) : depth;
    const double kv_bytes = double(keys) * kvh * hd * 2 * 2;
    std::printf("%-36s %6s %6s %9s %10s %9s %12s %12s\n", "spec", "keys", "splits", "decode_us",
                "combine_us", "layer_us", "decode_GB/s", "layer_GB/s");
    std::printf("%-36s %6d %6d %9.2f %10.2f %9.2f %12.1f %12.1f\n", spec.name.c_str(), keys,
                max_splits, t_decode, t_combine, t_layer, kv_bytes / (t_decode * 1e3),
                kv_bytes / (t_layer * 1e3));
    const auto o = from_device<float>(out, size_t(H) * hd);
    EXPECT_TRUE(all_finite(o));
}

TEST(FlashDecodeBench, DISABLED_E4bGlobalDepth4096) {
    GJ_REQUIRE_GPU();
    for (bool mma : {true, false}) bench_e4b_layer(512, 0, 4096, mma);
    for (int splits : {33, 128, 264}) bench_e4b_layer(512, 0, 4096, true, splits);
}

TEST(FlashDecodeBench, DISABLED_E4bSlidingDepth4096) {
    GJ_REQUIRE_GPU();
    for (bool mma : {true, false})
        bench_e4b_layer(256, 512, 512 + 512 - 1, mma);  // ring for a 512-token prefill chunk
    for (int splits : {4, 8}) bench_e4b_layer(256, 512, 512 + 512 - 1, true, splits);
}

}  // namespace
