// Numerics of every gj_ptx.cuh helper, through the ptx_selftest kernels, against CPU math.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>

#include "engine/gguf/half.h"
#include "tests/support/kernel_ref.h"
#include "tests/support/kernel_ref_gpu.h"
#include "tests/support/test_env.h"

using namespace gj::test::kref;
using gj::jit::DeviceBuffer;

namespace {

const char* kSpec = "ptx_selftest";

GpuKernels& kernels() {
    static GpuKernels k([] {
        gj::jit::KernelSpec s;
        s.family = "ptx_selftest";
        s.name = kSpec;
        s.entries = {"selftest_convert",   "selftest_pack",     "selftest_dp4a",
                     "selftest_mma_s8",    "selftest_mma_f16",  "selftest_mma_bf16",
                     "selftest_ldmatrix",  "selftest_cp_async", "selftest_warp_reduce",
                     "selftest_fast_math", "selftest_loads",    "selftest_q8_scale",
                     "selftest_rsqrt"};
        return std::vector<gj::jit::KernelSpec>{s};
    }());
    return k;
}

bool same_or_both_nan16(uint16_t a, uint16_t b, bool bf16) {
    const float fa = bf16 ? gj::bf16_to_f32(a) : gj::f16_to_f32(a);
    const float fb = bf16 ? gj::bf16_to_f32(b) : gj::f16_to_f32(b);
    return a == b || (std::isnan(fa) && std::isnan(fb));
}

// Exact double -> half, round to nearest even (the value must be in the normal half range or 0).
uint16_t f64_to_f16_rne(double v) {
    if (v == 0) return gj::f32_to_f16(static_cast<float>(v));
    const int e = std::max(std::ilogb(v), -14);
    const double ulp = std::ldexp(1.0, e - 10);
    return gj::f32_to_f16(static_cast<float>(std::nearbyint(v / ulp) * ulp));  // exact in float
}

}  // namespace

TEST(PtxHelpers, ScalarConversions) {
    GJ_REQUIRE_GPU();
    std::mt19937 rng(1);
    std::vector<float> f = {0.0f,     -0.0f,   1.0f,    -1.0f,         65504.0f,   65519.0f,
                            65520.0f, 1e-8f,   6e-5f,   3e-7f,         INFINITY,   -INFINITY,
                            NAN,      2.5f,    3.5f,    -2.5f,         127.49f,    127.5f,
                            200.7f,   -128.5f, -300.0f, 1.0009765625f, 0.33333334f};
    std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
    std::uniform_int_distribution<int> expo(-30, 20);
    while (f.size() < 65536) f.push_back(std::ldexp(mant(rng), expo(rng)));
    std::vector<uint16_t> h(65536);
    for (int i = 0; i < 65536; ++i) h[i] = static_cast<uint16_t>(i);  // every 16-bit pattern
    const int n = 65536;
    auto df = to_device(f);
    auto dh = to_device(h);
    DeviceBuffer f16_out(n * 2), f16_back(n * 4), bf16_out(n * 2), bf16_back(n * 4), s8_out(n * 4);
    launch(kernels().get(kSpec, "selftest_convert"), {ceil_div(n, 256)}, {256}, df.ptr(), dh.ptr(),
           n, f16_out.ptr(), f16_back.ptr(), bf16_out.ptr(), bf16_back.ptr(), s8_out.ptr());
    auto g_f16 = from_device<uint16_t>(f16_out, n);
    auto g_f16b = from_device<float>(f16_back, n);
    auto g_bf16 = from_device<uint16_t>(bf16_out, n);
    auto g_bf16b = from_device<float>(bf16_back, n);
    auto g_s8 = from_device<int32_t>(s8_out, n);
    int bad = 0;
    for (int i = 0; i < n && bad < 10; ++i) {
        const float half_back = gj::f16_to_f32(h[i]), bf_back = gj::bf16_to_f32(h[i]);
        const double r =
            std::isnan(f[i]) ? 0.0 : std::nearbyint(std::clamp<double>(f[i], -128, 127));
        const bool ok = same_or_both_nan16(g_f16[i], gj::f32_to_f16(f[i]), false) &&
                        same_or_both_nan16(g_bf16[i], gj::f32_to_bf16(f[i]), true) &&
                        (std::bit_cast<uint32_t>(g_f16b[i]) == std::bit_cast<uint32_t>(half_back) ||
                         (std::isnan(g_f16b[i]) && std::isnan(half_back))) &&
                        (std::bit_cast<uint32_t>(g_bf16b[i]) == std::bit_cast<uint32_t>(bf_back) ||
                         (std::isnan(g_bf16b[i]) && std::isnan(bf_back))) &&
                        g_s8[i] == static_cast<int>(r);
        if (!ok) {
            ++bad;
            ADD_FAILURE() << "i=" << i << " f=" << f[i] << " h=" << h[i] << ": f16 " << g_f16[i]
                          << " vs " << gj::f32_to_f16(f[i]) << ", bf16 " << g_bf16[i] << " vs "
                          << gj::f32_to_bf16(f[i]) << ", f16->f32 " << g_f16b[i] << " vs "
                          << half_back << ", bf16->f32 " << g_bf16b[i] << " vs " << bf_back
                          << ", s8 " << g_s8[i] << " vs " << r;
        }
    }
}

TEST(PtxHelpers, PackingAndHalf2Fma) {
    GJ_REQUIRE_GPU();
    std::mt19937 rng(2);
    const int n = 4096;
    // Halves in [2^-4, 2^4) with random sign: products and sums are exact in double, so the
    // reference fma is the exact value rounded once.
    std::uniform_real_distribution<float> mag(0.0625f, 16.0f);
    std::bernoulli_distribution neg(0.5);
    auto rand_half = [&] { return gj::f32_to_f16(neg(rng) ? -mag(rng) : mag(rng)); };
    std::vector<float> f(2 * n);
    std::vector<uint32_t> words(n), a(n), b(n), c(n);
    for (auto& v : f) v = std::ldexp(mag(rng), -2) * (neg(rng) ? -1.f : 1.f);
    for (int i = 0; i < n; ++i) {
        words[i] = rng();
        a[i] = rand_half() | (uint32_t(rand_half()) << 16);
        b[i] = rand_half() | (uint32_t(rand_half()) << 16);
        c[i] = rand_half() | (uint32_t(rand_half()) << 16);
    }
    auto df = to_device(f);
    auto dw = to_device(words);
    auto da = to_device(a), db = to_device(b), dc = to_device(c);
    DeviceBuffer o_f16x2(n * 4), o_unpacked(n * 8), o_fma(n * 4), o_u16(n * 4), o_s8(n * 4);
    launch(kernels().get(kSpec, "selftest_pack"), {ceil_div(n, 128)}, {128}, df.ptr(), dw.ptr(),
           da.ptr(), db.ptr(), dc.ptr(), n, o_f16x2.ptr(), o_unpacked.ptr(), o_fma.ptr(),
           o_u16.ptr(), o_s8.ptr());
    auto f16x2 = from_device<uint32_t>(o_f16x2, n);
    auto unpacked = from_device<float>(o_unpacked, 2 * n);
    auto fma = from_device<uint32_t>(o_fma, n);
    auto u16 = from_device<uint32_t>(o_u16, n);
    auto s8 = from_device<uint32_t>(o_s8, n);
    for (int i = 0; i < n; ++i) {
        SCOPED_TRACE(i);
        ASSERT_EQ(f16x2[i],
                  gj::f32_to_f16(f[2 * i]) | (uint32_t(gj::f32_to_f16(f[2 * i + 1])) << 16));
        for (int k = 0; k < 2; ++k) {
            const float want = gj::f16_to_f32(static_cast<uint16_t>(words[i] >> (16 * k)));
            if (std::isnan(want))
                ASSERT_TRUE(std::isnan(unpacked[2 * i + k]));
            else
                ASSERT_EQ(unpacked[2 * i + k], want);
            auto half = [&](uint32_t w) { return double(gj::f16_to_f32(uint16_t(w >> (16 * k)))); };
            const uint16_t want_fma = f64_to_f16_rne(half(a[i]) * half(b[i]) + half(c[i]));
            ASSERT_EQ(uint16_t(fma[i] >> (16 * k)), want_fma) << "hfma2 half " << k;
        }
        ASSERT_EQ(u16[i], (a[i] & 0xffffu) | (b[i] << 16));
        ASSERT_EQ(s8[i], (a[i] & 0xffu) | ((b[i] & 0xffu) << 8) | ((c[i] & 0xffu) << 16) |
                             (((a[i] + b[i]) & 0xffu) << 24));
    }
}

TEST(PtxHelpers, Dp4a) {
    GJ_REQUIRE_GPU();
    std::mt19937 rng(3);
    const int n = 4096;
    std::vector<int32_t> a(n), b(n), c(n);
    for (int i = 0; i < n; ++i)
        a[i] = int32_t(rng()), b[i] = int32_t(rng()), c[i] = int32_t(rng() >> 4);
    a[0] = int32_t(0x80808080u), b[0] = int32_t(0x80808080u);  // -128 * -128 four times
    a[1] = int32_t(0x7f7f7f7fu), b[1] = int32_t(0x80808080u);
    auto da = to_device(a), db = to_device(b), dc = to_device(c);
    DeviceBuffer out(n * 4);
    launch(kernels().get(kSpec, "selftest_dp4a"), {ceil_div(n, 256)}, {256}, da.ptr(), db.ptr(),
           dc.ptr(), n, out.ptr());
    auto got = from_device<int32_t>(out, n);
    for (int i = 0; i < n; ++i) {
        int64_t want = c[i];
        for (int k = 0; k < 4; ++k)
            want += int64_t(int8_t(uint32_t(a[i]) >> (8 * k))) * int8_t(uint32_t(b[i]) >> (8 * k));
        ASSERT_EQ(got[i], int32_t(want)) << i;
    }
}

TEST(PtxHelpers, MmaInt8FragmentsMatchCpuMatmul) {
    GJ_REQUIRE_GPU();
    std::mt19937 rng(4);
    std::vector<int8_t> A(16 * 32), Bt(8 * 32);
    std::vector<int32_t> C(16 * 8);
    for (auto& v : A) v = int8_t(rng());
    for (auto& v : Bt) v = int8_t(rng());
    for (auto& v : C) v = int32_t(rng() % 20001) - 10000;
    auto dA = to_device(A), dB = to_device(Bt), dC = to_device(C);
    DeviceBuffer dD(16 * 8 * 4);
    launch(kernels().get(kSpec, "selftest_mma_s8"), {1}, {32}, dA.ptr(), dB.ptr(), dC.ptr(),
           dD.ptr());
    auto D = from_device<int32_t>(dD, 16 * 8);
    for (int m = 0; m < 16; ++m)
        for (int n = 0; n < 8; ++n) {
            int32_t want = C[m * 8 + n];
            for (int k = 0; k < 32; ++k) want += int32_t(A[m * 32 + k]) * Bt[n * 32 + k];
            EXPECT_EQ(D[m * 8 + n], want) << "D[" << m << "][" << n << "]";
        }
}

// Both 16-bit mma forms on the same fragments; bf16 inputs are the same small values.
TEST(PtxHelpers, MmaF16Bf16FragmentsMatchCpuMatmul) {
    GJ_REQUIRE_GPU();
    for (const bool bf16 : {false, true}) {
        SCOPED_TRACE(bf16 ? "bf16" : "f16");
        std::mt19937 rng(5);
        // Multiples of 1/4 in [-4, 4]: exact in both types, and every product and partial sum
        // is exact in fp32, so the tensor core's accumulation order cannot change the result.
        auto q = [&] { return float(int(rng() % 33) - 16) / 4.0f; };
        auto enc = [&](float v) { return bf16 ? gj::f32_to_bf16(v) : gj::f32_to_f16(v); };
        auto dec = [&](uint16_t h) { return bf16 ? gj::bf16_to_f32(h) : gj::f16_to_f32(h); };
        std::vector<uint16_t> A(16 * 16), Bt(8 * 16);
        std::vector<float> C(16 * 8);
        for (auto& v : A) v = enc(q());
        for (auto& v : Bt) v = enc(q());
        for (auto& v : C) v = q() * 8;
        auto dA = to_device(A), dB = to_device(Bt), dC = to_device(C);
        DeviceBuffer dD(16 * 8 * 4);
        launch(kernels().get(kSpec, bf16 ? "selftest_mma_bf16" : "selftest_mma_f16"), {1}, {32},
               dA.ptr(), dB.ptr(), dC.ptr(), dD.ptr());
        auto D = from_device<float>(dD, 16 * 8);
        for (int m = 0; m < 16; ++m)
            for (int n = 0; n < 8; ++n) {
                double want = C[m * 8 + n];
                for (int k = 0; k < 16; ++k)
                    want += double(dec(A[m * 16 + k])) * dec(Bt[n * 16 + k]);
                EXPECT_EQ(D[m * 8 + n], float(want)) << "D[" << m << "][" << n << "]";
            }
    }
}

TEST(PtxHelpers, LdmatrixDeliversFragmentLayout) {
    GJ_REQUIRE_GPU();
    std::vector<uint16_t> M(256);
    for (int i = 0; i < 256; ++i) M[i] = uint16_t(1000 + 7 * i);
    auto dM = to_device(M);
    DeviceBuffer out(5 * 32 * 4 * 4);
    launch(kernels().get(kSpec, "selftest_ldmatrix"), {1}, {32}, dM.ptr(), out.ptr());
    auto got = from_device<uint32_t>(out, 5 * 32 * 4);
    auto elem = [&](int mat, int row, int col) { return uint32_t(M[mat * 64 + row * 8 + col]); };
    const int counts[5] = {1, 2, 4, 2, 4};
    for (int v = 0; v < 5; ++v) {
        const bool trans = v >= 3;
        for (int l = 0; l < 32; ++l)
            for (int r = 0; r < 4; ++r) {
                uint32_t want = 0;
                if (r < counts[v]) {
                    const int a = l / 4, b = 2 * (l % 4);
                    want = trans ? elem(r, b, a) | (elem(r, b + 1, a) << 16)
                                 : elem(r, a, b) | (elem(r, a, b + 1) << 16);
                }
                EXPECT_EQ(got[(v * 32 + l) * 4 + r], want)
                    << "variant " << v << " lane " << l << " reg " << r;
            }
    }
}

TEST(PtxHelpers, CpAsyncCopiesThroughSharedMemory) {
    GJ_REQUIRE_GPU();
    std::mt19937 rng(6);
    std::vector<uint32_t> src(256 * 4);
    for (auto& v : src) v = rng();
    auto dsrc = to_device(src);
    DeviceBuffer dst(256 * 16);
    launch(kernels().get(kSpec, "selftest_cp_async"), {1}, {128}, dsrc.ptr(), dst.ptr());
    auto got = from_device<uint32_t>(dst, 256 * 4);
    for (int t = 0; t < 256; ++t)
        for (int k = 0; k < 4; ++k) ASSERT_EQ(got[t * 4 + k], src[(255 - t) * 4 + k]) << t;
}

TEST(PtxHelpers, WarpReductions) {
    GJ_REQUIRE_GPU();
    std::mt19937 rng(7);
    const int n = 128;
    auto x = random_normal(n, 3.0f, rng);
    std::vector<int32_t> xi(n);
    for (auto& v : xi) v = int32_t(rng() % 2001) - 1000;
    auto dx = to_device(x), dxi = to_device(xi);
    DeviceBuffer s32(n * 4), m32(n * 4), s8(n * 4), i32(n * 4);
    launch(kernels().get(kSpec, "selftest_warp_reduce"), {1}, {n}, dx.ptr(), dxi.ptr(), s32.ptr(),
           m32.ptr(), s8.ptr(), i32.ptr());
    auto gs32 = from_device<float>(s32, n), gm32 = from_device<float>(m32, n);
    auto gs8 = from_device<float>(s8, n);
    auto gi32 = from_device<int32_t>(i32, n);
    for (int i = 0; i < n; ++i) {
        double s = 0, a = 0, s_8 = 0, a_8 = 0;
        float mx = -INFINITY;
        int64_t si = 0;
        for (int j = i / 32 * 32; j < i / 32 * 32 + 32; ++j)
            s += x[j], a += std::fabs(x[j]), mx = std::max(mx, x[j]), si += xi[j];
        for (int j = i / 8 * 8; j < i / 8 * 8 + 8; ++j) s_8 += x[j], a_8 += std::fabs(x[j]);
        // fp32 tree sums vs double: a few roundings of partial sums bounded by sum |x|.
        EXPECT_NEAR(gs32[i], s, 1e-6 * a * 8) << i;
        EXPECT_NEAR(gs8[i], s_8, 1e-6 * a_8 * 4) << i;
        EXPECT_EQ(gm32[i], mx) << i;
        EXPECT_EQ(gi32[i], si) << i;
    }
}

TEST(PtxHelpers, FastMathApproximations) {
    GJ_REQUIRE_GPU();
    const int n = 4001;
    std::vector<float> x(n);
    for (int i = 0; i < n; ++i) x[i] = -20.0f + 40.0f * i / (n - 1);
    x[n / 2] = 0.0f;
    auto dx = to_device(x);
    DeviceBuffer e(n * 4), t(n * 4), r(n * 4), g(n * 4);
    launch(kernels().get(kSpec, "selftest_fast_math"), {ceil_div(n, 256)}, {256}, dx.ptr(), n,
           e.ptr(), t.ptr(), r.ptr(), g.ptr());
    auto ge = from_device<float>(e, n), gt = from_device<float>(t, n);
    auto gr = from_device<float>(r, n), gg = from_device<float>(g, n);
    for (int i = 0; i < n; ++i) {
        SCOPED_TRACE(x[i]);
        const double ex = std::exp2(double(x[i]));
        EXPECT_NEAR(ge[i], ex, ex * std::ldexp(1.0, -21));  // ex2.approx: 2^-22 documented
        EXPECT_NEAR(gt[i], std::tanh(double(x[i])), std::ldexp(1.0, -10));  // tanh.approx: 2^-10.7
        if (x[i] != 0.0f) {
            EXPECT_NEAR(gr[i], 1.0 / x[i], std::fabs(1.0 / x[i]) * std::ldexp(1.0, -22));
        }
        EXPECT_NEAR(gg[i], gelu_tanh(x[i]), 2e-6 * std::max(1.0f, std::fabs(x[i])));  // tanhf: ulps
    }
}

// q8_inv_scale against the IEEE quotient 127.0f / amax: every mantissa at exponents across each
// scaling range and its edges (subnormals, the 2^-60 / 2^60 switch points, the overflow region
// below 3.7e-37, the top binade), plus inf.
TEST(PtxHelpers, Q8InvScaleIsTheIeeeQuotient) {
    GJ_REQUIRE_GPU();
    const int n = 1 << 23;
    std::vector<float> amax(n);
    DeviceBuffer din(size_t(n) * 4), dout(size_t(n) * 4);
    for (int e : {-149, -126, -122, -100, -61, -60, -59, -1, 0, 6, 7, 59, 60, 61, 100, 127}) {
        SCOPED_TRACE("exponent " + std::to_string(e));
        for (int m = 0; m < n; ++m)  // e = -149: the subnormals (mantissa m, m > 0)
            amax[m] = e == -149 ? std::ldexp(float(std::max(m, 1)), -149)
                                : std::ldexp(1.0f + float(m) * 0x1p-23f, e);
        din.upload(amax.data(), size_t(n) * 4);
        launch(kernels().get(kSpec, "selftest_q8_scale"), {ceil_div(n, 256)}, {256}, din.ptr(), n,
               dout.ptr());
        const auto got = from_device<float>(dout, n);
        int bad = 0;
        for (int m = 0; m < n && bad < 5; ++m) {
            const float want = 127.0f / amax[m];
            if (std::memcmp(&want, &got[m], 4) != 0) {
                ++bad;
                ADD_FAILURE() << "amax " << amax[m] << ": got " << got[m] << " want " << want;
            }
        }
    }
    const std::vector<float> inf = {INFINITY};
    auto di = to_device(inf);
    launch(kernels().get(kSpec, "selftest_q8_scale"), {1}, {32}, di.ptr(), 1, dout.ptr());
    EXPECT_EQ(from_device<float>(dout, 1)[0], 0.0f);
}

// rsqrt_refined against the double 1 / sqrt(x) over positive normals of every size (norm inputs
// are mean squares plus eps >= 1e-6) and inf.
TEST(PtxHelpers, RsqrtRefinedIsWithinAboutAnUlp) {
    GJ_REQUIRE_GPU();
    std::mt19937 rng(12);
    std::vector<float> x = {1.0f, 4.0f, 2.0f, 1e-6f, 3.4e38f, 1.17549435e-38f, INFINITY};
    std::uniform_real_distribution<float> mant(1.0f, 2.0f);
    for (int e = -126; e < 128; ++e)
        for (int k = 0; k < 200; ++k) x.push_back(std::ldexp(mant(rng), e));
    const int n = int(x.size());
    auto dx = to_device(x);
    DeviceBuffer out(size_t(n) * 4);
    launch(kernels().get(kSpec, "selftest_rsqrt"), {ceil_div(n, 256)}, {256}, dx.ptr(), n,
           out.ptr());
    const auto got = from_device<float>(out, n);
    for (int i = 0; i < n; ++i) {
        const double want = 1.0 / std::sqrt(double(x[i]));
        // One Newton step squares rsqrt.approx's 2^-22 error away; the fp32 steps leave ~1 ulp.
        ASSERT_NEAR(got[i], want, want * 0x1p-22) << "x = " << x[i];
    }
}

TEST(PtxHelpers, UnalignedAndStreamingLoads) {
    GJ_REQUIRE_GPU();
    std::mt19937 rng(8);
    const int n = 1024;
    std::vector<uint8_t> bytes(4 * n + 64);
    for (auto& b : bytes) b = uint8_t(rng());
    auto db = to_device(bytes);
    DeviceBuffer a2(n * 4), fun(n * 4), s32(n * 4), u16(n * 4), s128(n * 4);
    launch(kernels().get(kSpec, "selftest_loads"), {ceil_div(n, 128)}, {128}, db.ptr(), n, a2.ptr(),
           fun.ptr(), s32.ptr(), u16.ptr(), s128.ptr());
    auto u32_at = [&](size_t off) {
        uint32_t v;
        std::memcpy(&v, &bytes[off], 4);
        return v;
    };
    auto ga2 = from_device<uint32_t>(a2, n), gf = from_device<uint32_t>(fun, n);
    auto gs = from_device<uint32_t>(s32, n), gu = from_device<uint32_t>(u16, n);
    auto g128 = from_device<uint32_t>(s128, n);
    for (int i = 0; i < n; ++i) {
        ASSERT_EQ(ga2[i], u32_at(2 * i)) << i;
        ASSERT_EQ(gf[i], u32_at(i)) << i;
        ASSERT_EQ(gs[i], u32_at(4 * i)) << i;
        ASSERT_EQ(gu[i], u32_at(2 * i) & 0xffffu) << i;
        ASSERT_EQ(g128[i], u32_at(16 * (i / 4) + 4 * (i % 4))) << i;
    }
}
