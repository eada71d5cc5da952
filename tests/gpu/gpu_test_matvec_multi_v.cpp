// The mixed multi matvec (matvec_multi_v_spec): the Q, K and V products of an _M mix's layer that
// keeps V in Q6_K while Q and K are Q4_K / Q5_K, in one launch. Its Q and K blocks must compute
// what the plain decode entry of Q's spec computes, bit for bit; its V blocks what a Q6_K spec in
// the same launch shape computes, bit for bit, and that within the exact path's rounding of the
// CPU's sum over the same int8 activations. Both layouts, real widths, ragged row counts.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/gpu/kernels/matvec.h"
#include "engine/gpu/kernels/spec_util.h"
#include "tests/support/kernel_ref.h"
#include "tests/support/kernel_ref_gpu.h"
#include "tests/support/matvec_gpu.h"
#include "tests/support/test_env.h"

using namespace gj::test::kref;
using gj::gemma4::MatvecLayout;
using gj::jit::DeviceBuffer;
using gj::jit::KernelSpec;
namespace ggml = gj::ggml;

namespace {

struct MultiVCase {
    ggml::Type qk;
    MatvecLayout layout;
    int k, n_q, n_kv;
};

void check_multi_v(const MultiVCase& c) {
    // The plan's decode spec of Q (with its L2 prefetch) and its mixed multi form.
    const KernelSpec q_spec =
        gj::gemma4::with_decode_prefetch(gj::gemma4::matvec_spec(c.qk, c.k, 1, c.layout, c.n_q), 2);
    const KernelSpec multi = gj::gemma4::matvec_multi_v_spec(q_spec, ggml::Type::Q6_K);
    const auto shape = gj::gemma4::matvec_launch(q_spec, false);
    const int unroll = int(gj::gemma4::spec_constant(q_spec, "UNROLL"));
    const KernelSpec v_spec = matvec_variant(ggml::Type::Q6_K, c.k, 1, c.layout, int(shape.threads),
                                             int(shape.rows), unroll);
    SCOPED_TRACE(multi.name + fmt::format(" n_q {} n_kv {}", c.n_q, c.n_kv));
    ASSERT_EQ(multi.entries, std::vector<std::string>{q_spec.family + "_multi"});
    GpuKernels g({q_spec, multi, v_spec});

    std::mt19937 rng(c.k + c.n_q);
    std::vector<float> qf, kf, vf;
    const auto qb = random_weights(c.qk, c.n_q, c.k, rng, qf);
    const auto kb = random_weights(c.qk, c.n_kv, c.k, rng, kf);
    const auto vb = random_weights(ggml::Type::Q6_K, c.n_kv, c.k, rng, vf);
    const auto x = random_normal(size_t(c.k), 1.0f, rng);
    const Q81 q8 = quantize_q8_1(x.data(), x.size());
    auto dq = weights_on_device(g, q_spec, c.qk, qb, c.n_q, c.k, c.layout);
    auto dk = weights_on_device(g, q_spec, c.qk, kb, c.n_kv, c.k, c.layout);
    auto dv = weights_on_device(g, v_spec, ggml::Type::Q6_K, vb, c.n_kv, c.k, c.layout);
    auto dxq = to_device(q8.q);
    auto dxds = to_device(interleave(q8));

    const CUdeviceptr none = 0;
    auto plain = [&](const KernelSpec& spec, const DeviceBuffer& w, int n) {
        DeviceBuffer y(size_t(n) * 4);
        launch(g.get(spec.name, spec.family), {ceil_div(n, shape.rows)}, {shape.threads}, w.ptr(),
               none, dxq.ptr(), dxds.ptr(), none, y.ptr(), n);
        return from_device<float>(y, size_t(n));
    };
    const auto want_q = plain(q_spec, dq, c.n_q), want_k = plain(q_spec, dk, c.n_kv),
               want_v = plain(v_spec, dv, c.n_kv);

    DeviceBuffer yq(size_t(c.n_q) * 4), yk(size_t(c.n_kv) * 4), yv(size_t(c.n_kv) * 4);
    const unsigned blocks = ceil_div(c.n_q, shape.rows) + 2 * ceil_div(c.n_kv, shape.rows);
    launch(g.get(multi.name, multi.entries[0]), {blocks}, {shape.threads}, dq.ptr(), dk.ptr(),
           dv.ptr(), dxq.ptr(), dxds.ptr(), yq.ptr(), yk.ptr(), yv.ptr(), c.n_q, c.n_kv, c.n_kv);
    const auto got_v = from_device<float>(yv, size_t(c.n_kv));
    ASSERT_TRUE(all_finite(got_v));
    EXPECT_EQ(from_device<float>(yq, size_t(c.n_q)), want_q) << "Q blocks";
    EXPECT_EQ(from_device<float>(yk, size_t(c.n_kv)), want_k) << "K blocks";
    EXPECT_EQ(got_v, want_v) << "V blocks against the Q6_K spec of the same launch shape";
    int failures = 0;
    for (int r = 0; r < c.n_kv && failures < 10; ++r) {
        double scale;
        const double exact = matvec_row_q81(&vf[size_t(r) * c.k], q8, 0, c.k, &scale);
        if (std::fabs(got_v[r] - exact) > 1e-5 * scale + 1e-30) {
            ++failures;
            ADD_FAILURE() << "V row " << r << ": " << got_v[r] << " against " << exact << " (tol "
                          << 1e-5 * scale << ")";
        }
    }
}

}  // namespace

// E2B (k 1536), E4B (k 2560, 2048 Q rows, 512 KV rows), 12B (k 3840)
// and 31B (k 5376) widths; row counts that leave the last block of each matrix short.
TEST(MatvecMultiV, QAndKAsTheirSpecVAsQ6K) {
    GJ_REQUIRE_GPU();
    for (ggml::Type qk : {ggml::Type::Q4_K, ggml::Type::Q5_K})
        for (MatvecLayout layout : {MatvecLayout::Split, MatvecLayout::Ggml}) {
            check_multi_v({qk, layout, 1536, 2047, 255});
            check_multi_v({qk, layout, 2560, 2048, 512});
            check_multi_v({qk, layout, 3840, 4094, 2047});
            check_multi_v({qk, layout, 5376, 1023, 258});
        }
}
