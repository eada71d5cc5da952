// flash_prefill (tensor-core prefill attention over the KV cache) on the GPU against the CPU
// attention reference and against flash_decode's exact fp32 path on the same inputs: head dims
// 32..512, groups 1..16 (and 3, 12), causal and sliding windows, chunks of 1..512 tokens across
// the 16-row and tile edges, first chunks (pos0 = 0) and later ones whose ring has wrapped, f16 and
// bf16 caches, the default tiling of every head dim and the other warp roles (more key sets, head
// dims split over warps by keys or by dims, key splits over clusters of 1..8 blocks), and the
// wgmma kernel (flash_prefill_wgmma, sm_90) in one and two consumer warpgroups.
// FlashPrefillBench.DISABLED_* time the tilings and the wgmma kernel at every model's attention
// shapes (run with --gtest_also_run_disabled_tests).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine/gguf/half.h"
#include "engine/gpu/kernels/flash_decode.h"
#include "engine/gpu/kernels/flash_prefill.h"
#include "engine/gpu/kernels/spec_util.h"
#include "engine/gpu/kv_cache.h"
#include "engine/gpu/kv_type.h"
#include "tests/support/attention_gpu.h"
#include "tests/support/graph_timer.h"
#include "tests/support/kernel_ref.h"
#include "tests/support/kernel_ref_gpu.h"
#include "tests/support/test_env.h"

using namespace gj::test::kref;
using gj::gemma4::FlashPrefillTiling;
using gj::gemma4::FlashPrefillWgmmaTiling;
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

std::vector<float> decode(const std::vector<uint16_t>& h, bool bf16) {
    std::vector<float> x(h.size());
    for (size_t i = 0; i < h.size(); ++i) x[i] = kv_decode(h[i], bf16);
    return x;
}

struct PrefillCase {
    int hd, group, kv_heads, window, T, pos0;
    KvType kv;
    std::optional<FlashPrefillTiling> tiling = std::nullopt;      // default: the builder's
    std::optional<FlashPrefillWgmmaTiling> wgmma = std::nullopt;  // the sm_90a kernel instead
};

void PrintTo(const PrefillCase& c, std::ostream* os) {
    *os << "hd" << c.hd << " g" << c.group << " kv" << c.kv_heads << " w" << c.window << " T" << c.T
        << " pos0 " << c.pos0 << " " << gj::gemma4::kv_type_name(c.kv);
    if (c.tiling)
        *os << " tiling " << c.tiling->row_warps << "x" << c.tiling->dim_slices << "x"
            << c.tiling->key_sets << " kw" << c.tiling->warp_keys << " s" << c.tiling->stages;
    if (c.wgmma) *os << " wgmma wg" << c.wgmma->warpgroups << " s" << c.wgmma->stages;
}

// Cache slots as the engine sizes them for a chunk of T tokens: a ring of window + T - 1 (rounded
// up to 16) on sliding layers; on global layers every position, with spare slots that hold junk.
int slots_for(const PrefillCase& c) {
    if (c.window > 0) return gj::gemma4::sliding_slots(c.window, c.T, 1 << 30);
    return c.pos0 + c.T + 13;
}

// flash_prefill over `T` tokens with a grid sized for T + 40 tokens (times SPLITS: clusters of key
// splits) and the output rows past T poisoned: the extra blocks must exit, and rows past T stay as
// they were.
std::vector<float> run_prefill(const KernelSpec& spec, const DeviceBuffer& q,
                               const DeviceBuffer& kc, const DeviceBuffer& vc,
                               const DeviceBuffer& pos, int T, int slots) {
    const auto& g = kernels_for(spec);
    auto c = [&](const char* n) { return spec_constant(spec, n); };
    const int H = int(c("GROUP") * c("N_KV_HEADS")), hd = int(c("HEAD_DIM"));
    const int grid_t = T + 40;
    const size_t n_out = size_t(grid_t) * H * hd;
    DeviceBuffer out(n_out * 4), out_h(n_out * 2);
    const std::vector<uint8_t> poison(n_out * 4, 0xff);
    out.upload(poison.data(), poison.size());
    out_h.upload(poison.data(), n_out * 2);
    gj::jit::Device::get().synchronize();
    launch_smem_async(
        g.get(spec.name, "flash_prefill"),
        {ceil_div(size_t(grid_t) * c("GROUP"), c("BLOCK_ROWS")) * unsigned(c("SPLITS")),
         unsigned(c("N_KV_HEADS"))},
        {unsigned(c("THREADS"))}, unsigned(c("SMEM")), q.ptr(), kc.ptr(), vc.ptr(), pos.ptr(), T,
        slots, out.ptr(), out_h.ptr());
    gj::jit::Device::get().synchronize();
    auto all = from_device<uint32_t>(out, n_out);
    const auto halves = from_device<uint16_t>(out_h, n_out);
    for (size_t i = size_t(T) * H * hd; i < n_out; ++i)
        if (all[i] != 0xffffffffu || halves[i] != 0xffffu) {
            ADD_FAILURE() << "output element " << i << " past T was written";
            break;
        }
    std::vector<float> r(size_t(T) * H * hd);
    std::memcpy(r.data(), all.data(), r.size() * 4);
    // The f16 copy (an F16 cuBLAS output projection's input) is the fp32 output rounded.
    for (size_t i = 0; i < r.size(); ++i)
        if (halves[i] != gj::f32_to_f16(r[i])) {
            ADD_FAILURE() << "f16 output element " << i << ": 0x" << std::hex << halves[i]
                          << " for " << std::dec << r[i];
            break;
        }
    return r;
}

// flash_decode + flash_combine (the exact fp32 path) on the same inputs.
std::vector<float> run_decode(const KernelSpec& spec, const DeviceBuffer& q, const DeviceBuffer& kc,
                              const DeviceBuffer& vc, const DeviceBuffer& pos, int T, int slots,
                              int max_pos) {
    const auto& g = kernels_for(spec);
    const int hd = int(spec_constant(spec, "HEAD_DIM")),
              kvh = int(spec_constant(spec, "N_KV_HEADS"));
    const int H = int(spec_constant(spec, "GROUP")) * kvh;
    const int splits =
        gj::gemma4::flash_decode_splits(spec, max_pos + 1, T, gj::jit::Device::get().sm_count());
    const size_t parts = size_t(T) * H * splits;
    DeviceBuffer part_o(parts * hd * 4 + 16), part_ml(parts * 8 + 16), out(size_t(T) * H * hd * 4);
    const DeviceBuffer table = kv_table({{kc.ptr(), vc.ptr()}});
    const CUdeviceptr seqs = 0;  // every query of sequence 0
    launch_smem_async(
        g.get(spec.name, "flash_decode"), {unsigned(splits), unsigned(kvh), unsigned(T)},
        {unsigned(spec_constant(spec, "THREADS"))}, unsigned(spec_constant(spec, "SMEM")), q.ptr(),
        table.ptr(), seqs, pos.ptr(), T, slots, splits, part_o.ptr(), part_ml.ptr());
    launch(g.get(spec.name, "flash_combine"), {unsigned(H * hd / 32), unsigned(T)},
           {unsigned(spec_constant(spec, "COMBINE_THREADS"))}, part_o.ptr(), part_ml.ptr(),
           out.ptr(), CUdeviceptr(0), CUdeviceptr(0), T, splits);
    return from_device<float>(out, size_t(T) * H * hd);
}

class FlashPrefillTest : public ::testing::TestWithParam<PrefillCase> {};

TEST_P(FlashPrefillTest, MatchesCpuAndFlashDecode) {
    GJ_REQUIRE_GPU();
    const PrefillCase& c = GetParam();
    const bool bf16 = c.kv == KvType::BF16, q8 = c.kv == KvType::Q8_0;
    const int T = c.T, H = c.group * c.kv_heads, hd = c.hd, slots = slots_for(c);
    if (c.wgmma && gj::jit::Device::get().arch() != "sm_90")
        GTEST_SKIP() << "flash_prefill_wgmma needs an sm_90 GPU (wgmma); this one is "
                     << gj::jit::Device::get().arch();
    const KernelSpec spec =
        c.wgmma ? gj::gemma4::flash_prefill_wgmma_spec(hd, c.group, c.kv_heads, c.window, c.kv,
                                                       *c.wgmma)
        : c.tiling
            ? gj::gemma4::flash_prefill_spec(hd, c.group, c.kv_heads, c.window, c.kv, *c.tiling)
            : gj::gemma4::flash_prefill_spec(hd, c.group, c.kv_heads, c.window, c.kv);
    SCOPED_TRACE(spec.name);
    std::vector<int> positions(T);
    for (int t = 0; t < T; ++t) positions[t] = c.pos0 + t;

    std::mt19937 rng(hd * 31 + c.group * 7 + T * 1009 + c.pos0);
    // Every slot holds data (stale ring entries and spare slots included); K, V ~ N(0, 1) like
    // normed rows; q scaled so scores have standard deviation 4.
    const size_t cache_elems = size_t(slots) * c.kv_heads * hd;
    auto k = random_normal(cache_elems, 1.0f, rng);
    const auto q = random_normal(size_t(T) * H * hd, 4.0f / std::sqrt(float(hd)), rng);
    // Random scores leave single keys with tiny weights, so an off-by-one at a window or causal
    // edge would hide below the tolerance. For a few tokens, plant keys at their edges (and just
    // outside) that score 30 against the token's first query of each KV head: including or
    // dropping one moves that head's output by O(1).
    for (int t : {0, T / 2, T - 1}) {
        const int p = positions[t];
        const int lo = c.window > 0 ? std::max(0, p - c.window + 1) : 0;
        for (int j : {lo - 1, lo, p, p + 1}) {
            if (j < 0) continue;
            for (int kvh = 0; kvh < c.kv_heads; ++kvh) {
                const float* q0 = &q[(size_t(t) * H + size_t(kvh) * c.group) * hd];
                double n2 = 0;
                for (int i = 0; i < hd; ++i) n2 += double(q0[i]) * q0[i];
                float* kr = &k[(size_t(j % slots) * c.kv_heads + kvh) * hd];
                for (int i = 0; i < hd; ++i) kr[i] = float(30.0 * q0[i] / n2);
            }
        }
    }
    // The cache planes as the GPU holds them, and the values they decode to (the reference's K/V).
    const auto v = random_normal(cache_elems, 1.0f, rng);
    std::vector<uint8_t> kplane, vplane;
    std::vector<float> kval, vval;
    if (q8) {
        kplane = kv_q8_encode(k);
        vplane = kv_q8_encode(v);
        kval = kv_q8_decode(kplane);
        vval = kv_q8_decode(vplane);
    } else {
        const auto kbits = encode(k, bf16), vbits = encode(v, bf16);
        kplane.resize(kbits.size() * 2);
        vplane.resize(vbits.size() * 2);
        std::memcpy(kplane.data(), kbits.data(), kplane.size());
        std::memcpy(vplane.data(), vbits.data(), vplane.size());
        kval = decode(kbits, bf16);
        vval = decode(vbits, bf16);
    }
    auto dkc = to_device(kplane);
    auto dvc = to_device(vplane);
    auto dpos = to_device(positions);
    auto dq = to_device(q);
    std::vector<double> l2;
    const auto want =
        attention(q, kval, vval, positions, H, c.kv_heads, hd, c.window, slots, nullptr, &l2);

    const auto got = run_prefill(spec, dq, dkc, dvc, dpos, T, slots);
    ASSERT_TRUE(std::all_of(got.begin(), got.end(), [](float f) { return std::isfinite(f); }))
        << "NaN/inf in the output";
    const KernelSpec exact = gj::gemma4::flash_decode_spec(hd, c.group, c.kv_heads, c.window, c.kv);
    const auto ref_gpu = run_decode(exact, dq, dkc, dvc, dpos, T, slots, positions.back());

    // Tolerance per (token, head), in rms over the head's dims. The same cache values on both
    // sides; the kernel rounds q to the cache type (u = 2^-11 f16, 2^-8 bf16, relative, independent
    // per element), which moves score j by a sum with standard deviation <= u / sqrt(3) *
    // ||q o k_j||, and the output by about twice that against v of rms 1; rounding P to the cache
    // type adds <= u. 4u (max_j ||q o k_j|| + 1) is about 3.5 sigma; a wrong key, slot, head or
    // window edge is O(1) (the planted keys). flash_decode's fp32 path is exact to ~1e-6, so the
    // same bound holds against it. q8_0: products in fp16, and the dequantized K and V rounded to
    // fp16 once more (another 2^-11 per element): u = 2^-10.
    const double u = bf16 ? 0x1p-8 : q8 ? 0x1p-10 : 0x1p-11;
    int failures = 0;
    double worst = 0, worst_rel = 0;  // rms error / tolerance; max |error| / max |reference|
    for (const auto& [name, ref] : {std::pair{"cpu", &want}, std::pair{"flash_decode", &ref_gpu}})
        for (int t = 0; t < T && failures < 8; ++t)
            for (int h = 0; h < H && failures < 8; ++h) {
                const size_t th = size_t(t) * H + h;
                double err2 = 0;
                for (int i = 0; i < hd; ++i) {
                    const double e = double(got[th * hd + i]) - (*ref)[th * hd + i];
                    err2 += e * e;
                }
                const double rms = std::sqrt(err2 / hd), tol = 4 * u * (l2[th] + 1);
                worst = std::max(worst, rms / tol);
                double err_max = 0, ref_max = 0;
                for (int i = 0; i < hd; ++i) {
                    err_max = std::max(err_max,
                                       std::fabs(double(got[th * hd + i]) - (*ref)[th * hd + i]));
                    ref_max = std::max(ref_max, std::fabs(double((*ref)[th * hd + i])));
                }
                worst_rel = std::max(worst_rel, err_max / ref_max);
                if (!(rms <= tol)) {
                    ++failures;
                    ADD_FAILURE() << "vs " << name << ": token " << t << " (pos " << positions[t]
                                  << ") head " << h << ": rms error " << rms << " (tol " << tol
                                  << ")";
                }
            }
    // The measured margin: worst rms error / tolerance, and the worst max |error| relative to
    // the head's max |output|.
    std::printf("[ margin   ] %s: rms error / tol <= %.3f, max|err| / max|out| <= %.2e\n",
                spec.name.c_str(), worst, worst_rel);
}

std::vector<PrefillCase> cases() {
    std::vector<PrefillCase> v;
    // T across the 16-row and tile edges, first chunks, causal and window 8 (ring of 8 + T - 1).
    for (int T : {1, 15, 16, 17, 64, 130}) {
        v.push_back({32, 2, 2, 8, T, 0, KvType::F16});
        v.push_back({64, 4, 1, 0, T, 0, KvType::F16});
    }
    // Later chunks on wrapped rings (pos0 well past the ring size), small and large windows.
    v.push_back({32, 2, 2, 8, 17, 100, KvType::F16});
    v.push_back({32, 1, 4, 0, 130, 37, KvType::BF16});
    v.push_back({64, 16, 1, 8, 17, 40, KvType::F16});
    v.push_back({64, 8, 1, 0, 130, 0, KvType::BF16});
    v.push_back({128, 2, 2, 0, 33, 5, KvType::F16});
    v.push_back({128, 4, 2, 100, 64, 333, KvType::BF16});
    // E4B sliding (hd 256, group 4, 2 KV heads, window 512) and scaled-down windows.
    v.push_back({256, 4, 2, 512, 130, 0, KvType::F16});
    v.push_back({256, 4, 2, 512, 64, 1000, KvType::F16});
    v.push_back({256, 4, 2, 512, 17, 2000, KvType::BF16});
    v.push_back({256, 4, 2, 64, 130, 200, KvType::F16});
    v.push_back({256, 1, 2, 8, 16, 50, KvType::F16});
    v.push_back({256, 3, 2, 0, 17, 20, KvType::F16});
    v.push_back({256, 2, 8, 24, 15, 0, KvType::BF16});
    // E4B global (hd 512, group 4, 2 KV heads), 31B global (group 8, 4 KV heads), 12B MQA
    // (group 16), and odd groups.
    v.push_back({512, 4, 2, 0, 130, 0, KvType::F16});
    v.push_back({512, 4, 2, 0, 64, 700, KvType::BF16});
    v.push_back({512, 4, 2, 0, 1, 0, KvType::F16});
    v.push_back({512, 8, 4, 0, 17, 33, KvType::F16});
    v.push_back({512, 16, 1, 0, 16, 0, KvType::F16});
    v.push_back({512, 12, 1, 0, 15, 50, KvType::F16});
    v.push_back({512, 1, 2, 0, 64, 9, KvType::BF16});
    v.push_back({512, 4, 2, 8, 64, 100, KvType::F16});
    // A q8_0 cache (tiles dequantized to fp16 in shared memory): every head dim (their scale rows
    // of 2, 4, 8, 16 and 32 bytes), windows and wrapped rings, groups, dim-split and key-split
    // tilings, a whole 512-token chunk.
    v.push_back({32, 2, 2, 8, 17, 100, KvType::Q8_0});
    v.push_back({64, 8, 1, 0, 130, 0, KvType::Q8_0});
    v.push_back({128, 4, 2, 100, 64, 333, KvType::Q8_0});
    v.push_back({256, 4, 2, 512, 130, 0, KvType::Q8_0});
    v.push_back({256, 4, 2, 512, 64, 1000, KvType::Q8_0});
    v.push_back({256, 2, 8, 24, 15, 0, KvType::Q8_0});
    v.push_back({512, 4, 2, 0, 130, 0, KvType::Q8_0});
    v.push_back({512, 16, 1, 0, 16, 0, KvType::Q8_0});
    v.push_back({512, 4, 2, 8, 64, 100, KvType::Q8_0});
    v.push_back({256, 4, 2, 512, 512, 0, KvType::Q8_0});
    v.push_back({512, 4, 2, 0, 64, 30, KvType::Q8_0, FlashPrefillTiling{4, 2, 1, 16, 2, 2, true}});
    v.push_back({256, 4, 2, 512, 64, 600, KvType::Q8_0, FlashPrefillTiling{2, 2, 1, 32, 3}});
    v.push_back({64, 2, 2, 8, 40, 30, KvType::Q8_0, FlashPrefillTiling{2, 1, 2, 16, 2, 4}});
    // A whole 512-token chunk at the E4B shapes.
    v.push_back({256, 4, 2, 512, 512, 0, KvType::F16});
    v.push_back({512, 4, 2, 0, 512, 0, KvType::F16});
    // Other tilings: one key set (no merge), four key sets, head dims split over 2 and 4 warps
    // (shared P rows of 16, 32 and 64 keys), deeper pipelines, a 64-key S per warp.
    v.push_back({64, 4, 2, 8, 64, 30, KvType::F16, FlashPrefillTiling{2, 1, 1, 16, 2}});
    v.push_back({128, 4, 2, 0, 130, 0, KvType::F16, FlashPrefillTiling{1, 1, 4, 16, 2}});
    v.push_back({256, 4, 2, 512, 130, 600, KvType::BF16, FlashPrefillTiling{2, 2, 1, 32, 3}});
    v.push_back({512, 4, 2, 0, 130, 40, KvType::F16, FlashPrefillTiling{2, 4, 1, 32, 2}});
    v.push_back({512, 8, 4, 0, 64, 0, KvType::BF16, FlashPrefillTiling{1, 2, 2, 16, 2}});
    v.push_back({256, 4, 2, 512, 512, 0, KvType::F16, FlashPrefillTiling{4, 1, 2, 32, 2}});
    v.push_back({256, 2, 8, 1024, 130, 2000, KvType::F16, FlashPrefillTiling{2, 2, 1, 64, 2}});
    // Key splits (clusters of 2..8 blocks sharing a row block's tiles): with key sets, with shared
    // scores, 128-row blocks, splits that get no tile (T = 1, short first chunks), later chunks
    // on wrapped rings, one split (the combine path's counterpart) at the same shape, a whole
    // 512-token chunk.
    v.push_back({64, 2, 2, 8, 17, 100, KvType::BF16, FlashPrefillTiling{2, 1, 2, 16, 2, 4}});
    v.push_back({128, 1, 4, 0, 130, 37, KvType::F16, FlashPrefillTiling{1, 1, 1, 16, 2, 8}});
    v.push_back({128, 1, 4, 0, 1, 0, KvType::F16, FlashPrefillTiling{1, 1, 1, 16, 2, 8}});
    v.push_back({256, 4, 2, 512, 512, 4100, KvType::F16, FlashPrefillTiling{8, 1, 1, 32, 2, 4}});
    v.push_back({256, 4, 2, 64, 130, 200, KvType::BF16, FlashPrefillTiling{8, 1, 1, 32, 3, 8}});
    v.push_back({512, 4, 2, 0, 130, 40, KvType::F16, FlashPrefillTiling{2, 2, 2, 16, 2, 2}});
    v.push_back({512, 8, 4, 0, 64, 300, KvType::BF16, FlashPrefillTiling{4, 2, 1, 16, 3, 4}});
    v.push_back({512, 4, 2, 0, 64, 300, KvType::F16, FlashPrefillTiling{4, 2, 1, 16, 3, 1}});
    v.push_back({512, 4, 2, 0, 512, 1000, KvType::F16});
    // Scores split by head dims (partial S added up across the dim slices; hd 512's default),
    // with key sets, with key splits, 48-row blocks.
    v.push_back({512, 4, 2, 0, 130, 40, KvType::F16, FlashPrefillTiling{4, 2, 1, 16, 2, 4, true}});
    v.push_back(
        {256, 4, 2, 512, 130, 600, KvType::BF16, FlashPrefillTiling{4, 2, 1, 32, 2, 1, true}});
    v.push_back({128, 2, 2, 0, 64, 5, KvType::F16, FlashPrefillTiling{2, 2, 2, 16, 2, 2, true}});
    v.push_back({512, 8, 4, 0, 17, 33, KvType::BF16, FlashPrefillTiling{3, 2, 1, 16, 3, 4, true}});
    v.push_back({512, 4, 2, 0, 512, 0, KvType::F16, FlashPrefillTiling{4, 2, 1, 16, 3, 2}});
    // The wgmma kernel (sm_90a): one and two warpgroups, 2 and 3 stages, every head dim it takes,
    // f16 and bf16, first chunks at the 31B and E4B shapes, wrapped rings, causal layers, partial
    // row blocks and single tokens.
    using W = FlashPrefillWgmmaTiling;
    v.push_back({256, 2, 16, 1024, 512, 0, KvType::F16, std::nullopt, W{2, 2}});
    v.push_back({256, 4, 2, 512, 512, 0, KvType::F16, std::nullopt, W{1, 2}});
    v.push_back({256, 4, 2, 512, 130, 600, KvType::BF16, std::nullopt, W{1, 3}});
    v.push_back({256, 2, 8, 1024, 130, 2000, KvType::F16, std::nullopt, W{1, 3}});
    v.push_back({256, 4, 2, 512, 512, 4100, KvType::F16, std::nullopt, W{2, 2}});
    v.push_back({128, 4, 2, 0, 130, 0, KvType::F16, std::nullopt, W{2, 2}});
    v.push_back({128, 1, 4, 0, 1, 0, KvType::BF16, std::nullopt, W{1, 2}});
    v.push_back({64, 8, 1, 8, 17, 100, KvType::F16, std::nullopt, W{2, 3}});
    v.push_back({64, 2, 2, 0, 64, 30, KvType::BF16, std::nullopt, W{1, 2}});
    v.push_back({256, 3, 2, 100, 64, 333, KvType::F16, std::nullopt, W{2, 2}});
    // Head dim 512 (the two consumers split the head dims of the same rows): the 31B and E4B
    // global shapes, bf16, a later chunk, a window, a partial row block.
    v.push_back({512, 8, 4, 0, 512, 0, KvType::F16, std::nullopt, W{2, 2}});
    v.push_back({512, 4, 2, 0, 130, 40, KvType::BF16, std::nullopt, W{2, 2}});
    v.push_back({512, 16, 1, 0, 64, 1000, KvType::F16, std::nullopt, W{2, 2}});
    v.push_back({512, 4, 2, 8, 17, 100, KvType::F16, std::nullopt, W{2, 2}});
    return v;
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashPrefillTest, ::testing::ValuesIn(cases()));

// A NaN in a visible K row reaches the rows that see it and no others (another KV head, a
// token before it).
TEST(FlashPrefill, NanInVisibleRowPropagates) {
    GJ_REQUIRE_GPU();
    const int hd = 256, group = 4, kvh = 2, H = 8, T = 32, pos0 = 90;
    const int slots = gj::gemma4::sliding_slots(512, T, 1 << 30);
    std::mt19937 rng(5);
    const size_t elems = size_t(slots) * kvh * hd;
    auto kbits = encode(random_normal(elems, 1.0f, rng), false);
    const auto vbits = encode(random_normal(elems, 1.0f, rng), false);
    const int nan_pos = pos0 + 10;                           // visible to tokens 10.. of the chunk
    kbits[size_t(nan_pos % slots) * kvh * hd + 3] = 0x7e00;  // KV head 0
    auto dkc = to_device(kbits);
    auto dvc = to_device(vbits);
    std::vector<int> positions(T);
    for (int t = 0; t < T; ++t) positions[t] = pos0 + t;
    auto dpos = to_device(positions);
    auto dq = to_device(random_normal(size_t(T) * H * hd, 0.2f, rng));
    const KernelSpec spec = gj::gemma4::flash_prefill_spec(hd, group, kvh, 512, KvType::F16);
    const auto out = run_prefill(spec, dq, dkc, dvc, dpos, T, slots);
    for (int t = 0; t < T; ++t)
        for (int h = 0; h < H; ++h)
            EXPECT_EQ(std::isnan(out[(size_t(t) * H + h) * hd]), t >= 10 && h < group)
                << "token " << t << " head " << h;
}

// ---------------------------------------------------------------------------------------------
// Timing (FlashPrefillBench.DISABLED_*, run with --gtest_also_run_disabled_tests): first chunks
// (pos0 0) at every model's attention shapes, the builder's tiling against candidates. Phase 1
// times every candidate on the 31B and E4B shapes; phase 2 the best of them on every shape at
// 512 and 2048 tokens.

struct BenchShape {
    const char* layer;
    int hd, group, kvh, window;
};

const BenchShape kBenchShapes[] = {
    {"31B sliding", 256, 2, 16, 1024},    {"E4B sliding", 256, 4, 2, 512},
    {"31B global", 512, 8, 4, 0},         {"E4B global", 512, 4, 2, 0},
    {"12B/26B sliding", 256, 2, 8, 1024}, {"E2B sliding", 256, 8, 1, 512},
    {"12B global", 512, 16, 1, 0},        {"26B global", 512, 8, 2, 0},
    {"E2B global", 512, 8, 1, 0}};

std::string tiling_name(const FlashPrefillTiling& t) {
    char b[64];
    std::snprintf(b, sizeof b, "m%dd%d%sk%dw%ds%dx%d", t.row_warps, t.dim_slices,
                  t.dim_scores ? "h" : "", t.key_sets, t.warp_keys, t.stages, t.splits);
    return b;
}

// Tilings worth timing at a head dim: 128..512 threads, O at most 128 registers per thread.
std::vector<FlashPrefillTiling> bench_tilings(int hd) {
    const std::vector<std::pair<int, bool>> dims =
        hd >= 512 ? std::vector<std::pair<int, bool>>{{2, false}, {2, true}, {4, false}, {4, true}}
                  : std::vector<std::pair<int, bool>>{{1, false}, {2, false}, {2, true}, {4, true}};
    const std::vector<int> kws = hd >= 512 ? std::vector<int>{16, 32} : std::vector<int>{32, 64};
    std::vector<FlashPrefillTiling> v;
    for (int wm : {1, 2, 4, 8})
        for (const auto& [ds, dim] : dims)
            for (int ks : {1, 2})
                for (int kw : kws)
                    for (int stages : {2, 3}) {
                        const int threads = 32 * wm * ds * ks;
                        if (threads < 128 || threads > 512) continue;
                        const FlashPrefillTiling t{wm, ds, ks, kw, stages, 1, dim};
                        try {
                            gj::gemma4::flash_prefill_spec(hd, 1, 1, 0, KvType::F16, t);
                        } catch (const std::invalid_argument&) {
                            continue;
                        }
                        v.push_back(t);
                    }
    return v;
}

// One chunk's inputs at a shape: queries, f16 caches, positions 0..T-1 and the outputs.
struct BenchChunk {
    int T, slots, H, hd;
    DeviceBuffer q, kc, vc, pos, out, out_h;
    double flops;  // 4 x head dim x visible (query, key) pairs x heads
    BenchChunk(const BenchShape& s, int t)
        : T(t),
          slots(s.window > 0 ? gj::gemma4::sliding_slots(s.window, t, 1 << 30) : t),
          H(s.group * s.kvh),
          hd(s.hd),
          q(size_t(t) * H * hd * 4),
          kc(size_t(slots) * s.kvh * hd * 2),
          vc(size_t(slots) * s.kvh * hd * 2),
          pos(size_t(t) * 4),
          out(size_t(t) * H * hd * 4),
          out_h(size_t(t) * H * hd * 2) {
        std::mt19937 rng(7);
        const auto qv = random_normal(size_t(T) * H * hd, 4.0f / std::sqrt(float(hd)), rng);
        q.upload(qv.data(), qv.size() * 4);
        const auto kv = encode(random_normal(size_t(slots) * s.kvh * hd, 1.0f, rng), false);
        kc.upload(kv.data(), kv.size() * 2);
        vc.upload(kv.data(), kv.size() * 2);
        std::vector<int> p(T);
        double pairs = 0;
        for (int i = 0; i < T; ++i) {
            p[i] = i;
            pairs += s.window > 0 ? std::min(i + 1, s.window) : i + 1;
        }
        pos.upload(p.data(), p.size() * 4);
        flops = 4.0 * hd * pairs * H;
    }
};

struct BenchResult {
    double us;
    double max_diff;  // against the first spec timed, relative to its largest |output|
};

// Times each spec on the chunk (a graph of 10 launches, median of 7) and compares its output with
// the first spec's.
std::vector<BenchResult> time_specs(const std::vector<KernelSpec>& specs, BenchChunk& c) {
    const GpuKernels g(specs);
    std::vector<BenchResult> r;
    std::vector<float> first;
    for (const KernelSpec& spec : specs) {
        auto k = [&](const char* n) { return unsigned(spec_constant(spec, n)); };
        auto run = [&] {
            launch_smem_async(g.get(spec.name, "flash_prefill"),
                              {ceil_div(size_t(c.T) * k("GROUP"), k("BLOCK_ROWS")) * k("SPLITS"),
                               k("N_KV_HEADS")},
                              {k("THREADS")}, k("SMEM"), c.q.ptr(), c.kc.ptr(), c.vc.ptr(),
                              c.pos.ptr(), c.T, c.slots, c.out.ptr(), c.out_h.ptr());
        };
        GraphTimer timer;
        const double us = timer.time_us(
            [&] {
                for (int i = 0; i < 10; ++i) run();
            },
            10, 7);
        const auto o = from_device<float>(c.out, size_t(c.T) * c.H * c.hd);
        if (first.empty()) first = o;
        double big = 0, diff = 0;
        for (size_t i = 0; i < o.size(); ++i) {
            big = std::max(big, double(std::fabs(first[i])));
            diff = std::max(diff, double(std::fabs(o[i] - first[i])));
        }
        r.push_back({us, std::isfinite(diff) ? diff / std::max(big, 1e-30) : 1e30});
    }
    return r;
}

void print_row(const KernelSpec& spec, const std::string& name, const BenchResult& r, double flops,
               double base_us) {
    std::printf("  %-22s %4lld thr %6lld B smem %9.2f us %7.1f TFLOP/s %6.3fx diff %.1e\n",
                name.c_str(), static_cast<long long>(spec_constant(spec, "THREADS")),
                static_cast<long long>(spec_constant(spec, "SMEM")), r.us, flops / (r.us * 1e6),
                base_us / r.us, r.max_diff);
}

TEST(FlashPrefillBench, DISABLED_Tilings) {
    GJ_REQUIRE_GPU();
    using gj::gemma4::flash_prefill_spec;
    using gj::gemma4::flash_prefill_splits;
    using gj::gemma4::flash_prefill_tiling;
    // Phase 1: every candidate on the 31B and E4B shapes at 512 tokens; log(time / default)
    // summed per tiling (without its splits) and head dim.
    std::map<std::string, double> score;
    std::map<std::string, FlashPrefillTiling> by_name;
    for (int si = 0; si < 4; ++si) {
        const BenchShape& s = kBenchShapes[si];
        BenchChunk chunk(s, 512);
        std::vector<FlashPrefillTiling> tilings{flash_prefill_tiling(s.hd, s.group, s.kvh)};
        for (FlashPrefillTiling t : bench_tilings(s.hd)) {
            t.splits = flash_prefill_splits(t, s.group, s.kvh, 512);
            tilings.push_back(t);
        }
        std::vector<KernelSpec> specs;
        for (const auto& t : tilings)
            specs.push_back(flash_prefill_spec(s.hd, s.group, s.kvh, s.window, KvType::F16, t));
        const auto r = time_specs(specs, chunk);
        std::printf("%s (hd %d, group %d, %d KV heads, window %d), T 512, %zu tilings:\n", s.layer,
                    s.hd, s.group, s.kvh, s.window, tilings.size());
        std::vector<size_t> order(tilings.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::sort(order.begin(), order.end(),
                  [&](size_t a, size_t b) { return r[a].us < r[b].us; });
        for (size_t i : order)
            print_row(specs[i], tiling_name(tilings[i]), r[i], chunk.flops, r[0].us);
        for (size_t i = 1; i < tilings.size(); ++i) {
            FlashPrefillTiling t = tilings[i];
            t.splits = 1;
            const std::string key = std::to_string(s.hd) + " " + tiling_name(t);
            score[key] += std::log(r[i].us / r[0].us) + (r[i].max_diff > 1e-2 ? 1e9 : 0.0);
            by_name[key] = t;
        }
    }
    // Phase 2: the six best per head dim on every shape, at 512 and 2048 tokens.
    for (int hd : {256, 512}) {
        std::vector<std::pair<double, std::string>> ranked;
        for (const auto& [key, sc] : score)
            if (key.rfind(std::to_string(hd) + " ", 0) == 0) ranked.push_back({sc, key});
        std::sort(ranked.begin(), ranked.end());
        ranked.resize(std::min<size_t>(ranked.size(), 6));
        for (const BenchShape& s : kBenchShapes) {
            if (s.hd != hd) continue;
            for (int T : {512, 2048}) {
                BenchChunk chunk(s, T);
                std::vector<FlashPrefillTiling> tilings{flash_prefill_tiling(s.hd, s.group, s.kvh)};
                for (const auto& [sc, key] : ranked) {
                    FlashPrefillTiling t = by_name[key];
                    t.splits = flash_prefill_splits(t, s.group, s.kvh, T);
                    tilings.push_back(t);
                }
                std::vector<KernelSpec> specs;
                for (const auto& t : tilings)
                    specs.push_back(
                        flash_prefill_spec(s.hd, s.group, s.kvh, s.window, KvType::F16, t));
                const auto r = time_specs(specs, chunk);
                std::printf("%s, T %d (default first):\n", s.layer, T);
                for (size_t i = 0; i < tilings.size(); ++i)
                    print_row(specs[i], tiling_name(tilings[i]), r[i], chunk.flops, r[0].us);
            }
        }
    }
}

// The wgmma kernel (sm_90a) against the builder's mma.sync tiling at every model shape.
TEST(FlashPrefillBench, DISABLED_Wgmma) {
    GJ_REQUIRE_GPU();
    if (gj::jit::Device::get().arch() != "sm_90") GTEST_SKIP() << "needs an sm_90 GPU";
    for (const BenchShape& s : kBenchShapes) {
        for (int T : {512, 2048}) {
            BenchChunk chunk(s, T);
            std::vector<KernelSpec> specs{
                gj::gemma4::flash_prefill_spec(s.hd, s.group, s.kvh, s.window, KvType::F16)};
            std::vector<std::string> names{"mma.sync default"};
            for (int wg : {1, 2})
                for (int st : {2, 3}) {
                    // Over the shared memory at head dim 256; head dim 512 takes 2 x 2 only.
                    if ((wg == 2 && st == 3) || (s.hd == 512 && (wg != 2 || st != 2))) continue;
                    specs.push_back(gj::gemma4::flash_prefill_wgmma_spec(
                        s.hd, s.group, s.kvh, s.window, KvType::F16, {wg, st}));
                    names.push_back("wgmma wg" + std::to_string(wg) + "s" + std::to_string(st));
                }
            const auto r = time_specs(specs, chunk);
            std::printf("%s, T %d:\n", s.layer, T);
            for (size_t i = 0; i < specs.size(); ++i)
                print_row(specs[i], names[i], r[i], chunk.flops, r[0].us);
        }
    }
}

}  // namespace
