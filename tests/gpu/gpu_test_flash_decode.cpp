// flash_decode + flash_combine on the GPU against exact attention on random data, over the spec
// grid: head dims 32/64/256/512, groups 1..16 and non-powers of two, windows 0/8/512/1024,
// positions across tile, split and window edges, ring wrap-around, several max_splits, T = 1 and
// T > 1 at mixed positions, large scores; q8_0 caches against exact attention over the same
// dequantized values.
// FlashDecodeBench.DISABLED_* time E4B's two attention shapes at depth 4096 (run with
// --gtest_also_run_disabled_tests).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "engine/gpu/kernel_plan.h"
#include "jit/cuda_driver.h"
#include "tests/support/attention_gpu.h"
#include "tests/support/graph_timer.h"
#include "tests/support/kernel_ref.h"
#include "tests/support/kernel_ref_gpu.h"
#include "tests/support/test_env.h"

using namespace gj::test::kref;
using gj::gemma4::KvType;
using gj::gemma4::spec_constant;
using gj::jit::DeviceBuffer;
using gj::jit::KernelSpec;

namespace {

std::vector<uint16_t> encode(const std::vector<float>& x, bool bf16) {
    std::vector<uint16_t> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) h[i] = kv_encode(x[i], bf16);
    return h;
}

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

// Batched decode: queries of several sequences in one launch, each reading the planes its
// seqs[] entry names through the table, give bit for bit what each query gives alone on its own
// sequence's planes (same split count).
TEST(FlashDecode, QueriesReadTheirOwnSequencesPlanes) {
    GJ_REQUIRE_GPU();
    for (KvType kv : {KvType::F16, KvType::Q8_0}) {
        const KernelSpec spec = gj::gemma4::flash_decode_spec(256, 4, 2, 512, kv);
        SCOPED_TRACE(spec.name);
        const int hd = 256, H = 8, slots = 515, S = 3, splits = 6;
        const std::vector<int> seqs = {2, 0, 1, 0, 2}, positions = {600, 3, 514, 40, 9};
        const int T = int(seqs.size());
        std::mt19937 rng(21);
        const size_t elems = size_t(slots) * 2 * hd;
        std::vector<DeviceBuffer> kc, vc;
        std::vector<std::pair<CUdeviceptr, CUdeviceptr>> planes;
        for (int s = 0; s < S; ++s) {
            kc.push_back(to_device(encode_plane(random_normal(elems, 1.0f, rng), kv)));
            vc.push_back(to_device(encode_plane(random_normal(elems, 1.0f, rng), kv)));
            planes.push_back({kc.back().ptr(), vc.back().ptr()});
        }
        const DeviceBuffer table = kv_table(planes);
        const auto q = random_normal(size_t(T) * H * hd, 0.2f, rng);
        auto dpos = to_device(positions), dseq = to_device(seqs);
        const FlashRun all =
            run_flash(spec, q, kc[0], vc[0], dpos, T, slots, splits, &table, &dseq);
        ASSERT_TRUE(all_finite(all.out));
        for (int t = 0; t < T; ++t) {
            const size_t n = size_t(H) * hd;
            const std::vector<float> q1(q.begin() + t * n, q.begin() + (t + 1) * n);
            auto dp1 = to_device(std::vector<int>{positions[t]});
            const FlashRun one =
                run_flash(spec, q1, kc[seqs[t]], vc[seqs[t]], dp1, 1, slots, splits);
            EXPECT_EQ(std::vector<float>(all.out.begin() + t * n, all.out.begin() + (t + 1) * n),
                      one.out)
                << "query " << t << " of sequence " << seqs[t];
        }
    }
}

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
// Timing: E4B attention at depth 4096, one query token, as a CUDA graph of many layers (caches
// rotate over enough copies to defeat the L2). Reports us per layer and the KV read rate.

// One attention layer (E4B: group 4, 2 KV heads) at depth 4096 and T = 1: flash_decode alone,
// flash_combine alone, and both, each as a graph over `copies` caches.
void bench_layer(int hd, int window, int slots, bool mma, int splits = 0, int group = 4,
                 int kvh = 2) {
    const int depth = 4096, sms = gj::jit::Device::get().sm_count();
    const KernelSpec spec = gj::gemma4::flash_decode_spec(hd, group, kvh, window, KvType::F16, mma);
    const auto& g = kernels_for(spec);
    const int H = group * kvh, T = 1;
    const int max_splits =
        splits > 0 ? splits : gj::gemma4::flash_decode_splits(spec, depth, T, sms);
    const size_t cache_bytes = size_t(slots) * kvh * hd * 2;
    const int copies = int(std::max<size_t>(8, (512u << 20) / (2 * cache_bytes)));
    std::mt19937 rng(1);
    const auto bits = encode(random_normal(size_t(slots) * kvh * hd, 1.0f, rng), false);
    std::vector<DeviceBuffer> kc, vc;
    std::vector<DeviceBuffer> tables;
    for (int i = 0; i < copies; ++i) {
        kc.push_back(to_device(bits)), vc.push_back(to_device(bits));
        tables.push_back(kv_table({{kc.back().ptr(), vc.back().ptr()}}));
    }
    auto dq = to_device(random_normal(size_t(H) * hd, 0.2f, rng));
    auto dpos = to_device(std::vector<int>{depth - 1});
    DeviceBuffer part_o(size_t(H) * max_splits * hd * 4), part_ml(size_t(H) * max_splits * 8),
        out(size_t(H) * hd * 4);
    const auto& kd = g.get(spec.name, "flash_decode");
    const auto& kcomb = g.get(spec.name, "flash_combine");
    const unsigned threads = unsigned(spec_constant(spec, "THREADS"));
    const unsigned smem = unsigned(spec_constant(spec, "SMEM"));
    auto run_decode = [&](int i) {
        const CUdeviceptr seqs = 0;
        launch_smem_async(kd, {unsigned(max_splits), unsigned(kvh), 1u}, {threads}, smem, dq.ptr(),
                          tables[i].ptr(), seqs, dpos.ptr(), T, slots, max_splits, part_o.ptr(),
                          part_ml.ptr());
    };
    auto run_combine = [&] {
        launch_smem_async(kcomb, {unsigned(H * hd / 32), 1u}, {128u}, 0u, part_o.ptr(),
                          part_ml.ptr(), out.ptr(), CUdeviceptr(0), CUdeviceptr(0), T, max_splits);
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
    for (bool mma : {true, false}) bench_layer(512, 0, 4096, mma);
    for (int splits : {33, 128, 264}) bench_layer(512, 0, 4096, true, splits);
}

TEST(FlashDecodeBench, DISABLED_31bDepth4096) {
    GJ_REQUIRE_GPU();
    for (bool mma : {false, true}) {
        bench_layer(512, 0, 4096, mma, 0, 8, 4);                // global: group 8, 4 KV heads
        bench_layer(256, 1024, 1024 + 512 - 1, mma, 0, 2, 16);  // sliding: group 2, 16 KV heads
    }
    for (int splits : {66, 132}) bench_layer(512, 0, 4096, false, splits, 8, 4);
    for (int splits : {16, 32}) bench_layer(256, 1024, 1024 + 512 - 1, false, splits, 2, 16);
}

TEST(FlashDecodeBench, DISABLED_E4bSlidingDepth4096) {
    GJ_REQUIRE_GPU();
    for (bool mma : {true, false})
        bench_layer(256, 512, 512 + 512 - 1, mma);  // ring for a 512-token prefill chunk
    for (int splits : {4, 8}) bench_layer(256, 512, 512 + 512 - 1, true, splits);
}

}  // namespace
