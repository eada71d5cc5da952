// The PLE cluster probe (kernel_templates/ple_cluster_probe.cu): a PLE layer's projection and its
// post-norm in one launch of one thread-block cluster. The test checks it against the CPU; the
// disabled one measures it against the engine's two launches in a dependent chain:
//   gpu_test_ple_cluster_probe --gtest_also_run_disabled_tests --gtest_filter='*Cost*'
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/gpu/kernels/matvec.h"
#include "engine/gpu/kernels/rmsnorm.h"
#include "engine/gpu/kernels/spec_util.h"
#include "jit/cuda_driver.h"
#include "jit/device.h"
#include "tests/support/graph_timer.h"
#include "tests/support/kernel_ref.h"
#include "tests/support/kernel_ref_gpu.h"
#include "tests/support/kernel_specs.h"
#include "tests/support/test_env.h"

using namespace gj::test::kref;
using gj::jit::DeviceBuffer;
namespace ggml = gj::ggml;

namespace {

constexpr int kP = 256;  // the PLE width of E2B and E4B
constexpr float kEps = 1e-6f;

bool has_clusters() {
    return gj::jit::Device::get().compute_capability() >= 90;
}

// One layer's inputs: the projection (split Q4_0, D x P), the PLE gate product and input, the
// residual stream, the two norm weights and the layer scale.
struct PleLayer {
    int d;
    std::vector<float> wf, gate, other, x, w_post, w_next;
    float scale = 0.7f;
    DeviceBuffer dw, dgate, dother, dx, dwp, dwn, dscale;
    PleLayer(int d_, std::mt19937& rng) : d(d_) {
        const auto blocks = random_weights(ggml::Type::Q4_0, d, kP, rng, wf);
        dw = to_device(split_layout(ggml::Type::Q4_0, blocks, d, kP));
        gate = random_normal(kP, 1.0f, rng);
        other = random_normal(kP, 1.0f, rng);
        x = random_normal(d, 1.0f, rng);
        w_post = random_norm_weights(d, 0.3f, rng);
        w_next = random_norm_weights(d, 0.3f, rng);
        dgate = to_device(gate);
        dother = to_device(other);
        dx = to_device(x);
        dwp = to_device(w_post);
        dwn = to_device(w_next);
        dscale = to_device(std::vector<float>{scale});
    }
};

}  // namespace

TEST(PleClusterProbe, ProjectionAndPostNormMatchTheCpu) {
    GJ_REQUIRE_GPU();
    if (!has_clusters()) GTEST_SKIP() << "thread-block clusters need sm_90";
    auto& dev = gj::jit::Device::get();
    std::mt19937 rng(17);
    for (const int d : {1536, 2560}) {
        SCOPED_TRACE(d);
        PleLayer L(d, rng);
        const auto spec = gj::test::ple_cluster_probe_spec(d, 8);
        const auto& k = kernels_for(spec).get(spec.name, "ple_proj_norm");
        DeviceBuffer x_out(size_t(d) * 4), yq(size_t(d) + 16), yds(size_t(d) / 32 * 8);
        CUdeviceptr w = L.dw.ptr(), g = L.dgate.ptr(), o = L.dother.ptr(), x = L.dx.ptr(),
                    wp = L.dwp.ptr(), sc = L.dscale.ptr(), wn = L.dwn.ptr(), xo = x_out.ptr(),
                    q = yq.ptr(), qd = yds.ptr();
        float eps = kEps;
        void* args[] = {&w, &g, &o, &x, &wp, &sc, &wn, &xo, &q, &qd, &eps};
        dev.synchronize();
        k.launch({unsigned(gj::gemma4::spec_constant(spec, "CLUSTER"))},
                 {unsigned(gj::gemma4::spec_constant(spec, "THREADS"))},
                 unsigned(gj::gemma4::spec_constant(spec, "SMEM")), dev.stream(), args);
        dev.synchronize();

        // The CPU: q8(gelu(gate) * other) (a rounding of an activation may differ: a tolerance
        // of a few int8 steps below), products in double, the two norms.
        std::vector<float> a(kP);
        for (int i = 0; i < kP; ++i) a[i] = float(gelu_tanh(L.gate[i]) * L.other[i]);
        const Q81 aq = quantize_q8_1(a.data(), kP);
        std::vector<double> p(d), xn(d);
        double ss = 0, mag = 0;
        for (int r = 0; r < d; ++r) {
            double scale_r = 0;
            p[r] = matvec_row_q81(&L.wf[size_t(r) * kP], aq, 0, kP, &scale_r);
            ss += p[r] * p[r];
            mag = std::max(mag, scale_r);
        }
        const double s1 = 1.0 / std::sqrt(ss / d + kEps);
        double ss2 = 0;
        for (int r = 0; r < d; ++r) {
            xn[r] = (L.x[r] + p[r] * s1 * L.w_post[r]) * L.scale;
            ss2 += xn[r] * xn[r];
        }
        const double s2 = 1.0 / std::sqrt(ss2 / d + kEps);
        const auto xo_h = from_device<float>(x_out, d);
        const auto q_h = from_device<int8_t>(yq, d);
        const auto ds_h = from_device<float>(yds, d / 32 * 2);
        for (int r = 0; r < d; ++r) {
            // p's rounding (fp32 sums, a flipped activation) moves x' by far less than 1e-3.
            ASSERT_NEAR(xo_h[r], xn[r], 1e-3 * (1.0 + std::abs(xn[r]))) << "x' row " << r;
            const double h = xn[r] * s2 * L.w_next[r];
            const double step = ds_h[(r / 32) * 2];
            ASSERT_NEAR(q_h[r] * step, h, 1.01 * step) << "h row " << r;
        }
        EXPECT_GT(mag, 0.0);
    }
}

// us per layer of a chain of `layers` PLE tails (projection + post-norm), one CUDA graph, every
// launch a programmatic dependent of the one before, the projections cycling through more than
// L2 holds: the engine's projection launch (`_gelu_in`) + its post-norm launch, each alone, and
// the cluster. Median of 5 replays.
TEST(PleClusterProbe, DISABLED_ProjectionAndNormCost) {
    GJ_REQUIRE_GPU();
    if (!has_clusters()) GTEST_SKIP() << "thread-block clusters need sm_90";
    auto& dev = gj::jit::Device::get();
    GraphTimer timer;
    const CUstream stream = timer.stream;
    std::mt19937 rng(23);
    const int layers = 64;
    std::printf("%-5s %-44s %9s\n", "d", "form", "us/layer");
    for (const int d : {1536, 2560}) {
        PleLayer L(d, rng);
        const size_t mat = size_t(d) * (kP / 2 + kP / 16);
        const int copies = int((96u << 20) / mat);
        std::vector<DeviceBuffer> w;
        {
            std::vector<uint8_t> bytes(mat);
            L.dw.download(bytes.data(), mat);
            for (int i = 0; i < copies; ++i) w.push_back(to_device(bytes));
        }
        DeviceBuffer p(size_t(d) * 4), x_out(size_t(d) * 4), yq(size_t(d) + 16),
            yds(size_t(d) / 32 * 8);
        CUdeviceptr g = L.dgate.ptr(), o = L.dother.ptr(), x = L.dx.ptr(), wp = L.dwp.ptr(),
                    sc = L.dscale.ptr(), wn = L.dwn.ptr(), xo = x_out.ptr(), q = yq.ptr(),
                    qd = yds.ptr(), pp = p.ptr(), none = 0;
        float eps = kEps;
        int rows = d, one = 1;

        const auto ps = gj::gemma4::with_decode_prefetch(
            gj::gemma4::matvec_spec(ggml::Type::Q4_0, kP, 1, gj::gemma4::MatvecLayout::Split, d,
                                    gj::gemma4::PleInput::Proj),
            2);
        const auto& proj = kernels_for(ps).get(ps.name, "matvec_q4_0_gelu_in");
        const auto shape = gj::gemma4::matvec_launch(ps, false);
        const auto ns = gj::gemma4::rmsnorm_spec(d, true, true, true, true, true);
        const auto& norm = kernels_for(ns).get(ns.name, "rmsnorm_ext");
        const unsigned tpr = unsigned(gj::gemma4::spec_constant(ns, "TPR"));
        // Clusters of 4, 8 (the portable limit) and 16 blocks (a non-portable size: allowed per
        // kernel).
        std::vector<gj::jit::KernelSpec> cs;
        std::vector<const gj::jit::Kernel*> cluster;
        for (int c : {4, 8, 16}) {
            cs.push_back(gj::test::ple_cluster_probe_spec(d, c));
            cluster.push_back(&kernels_for(cs.back()).get(cs.back().name, "ple_proj_norm"));
            if (c > 8)
                gj::jit::check_driver(gj::jit::driver().cuFuncSetAttribute(
                                          cluster.back()->handle(),
                                          CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
                                      "non-portable cluster size");
        }
        auto engine = [&](bool with_proj, bool with_norm) {
            for (int l = 0; l < layers; ++l) {
                if (with_proj) {
                    CUdeviceptr wl = w[l % copies].ptr();
                    void* a[] = {&wl, &g, &o, &pp, &rows};
                    proj.launch({ceil_div(d, shape.rows)}, {shape.threads}, 0, stream, a, true);
                }
                if (with_norm) {
                    void* a[] = {&pp, &wp, &x, &xo, &sc, &wn, &none, &q, &qd, &one, &eps};
                    norm.launch({1}, {tpr}, 0, stream, a, true);
                }
            }
        };
        auto fused = [&](size_t i) {
            for (int l = 0; l < layers; ++l) {
                CUdeviceptr wl = w[l % copies].ptr();
                void* a[] = {&wl, &g, &o, &x, &wp, &sc, &wn, &xo, &q, &qd, &eps};
                cluster[i]->launch({unsigned(gj::gemma4::spec_constant(cs[i], "CLUSTER"))},
                                   {unsigned(gj::gemma4::spec_constant(cs[i], "THREADS"))},
                                   unsigned(gj::gemma4::spec_constant(cs[i], "SMEM")), stream, a,
                                   true);
            }
        };
        auto time = [&](const std::string& form, const std::function<void()>& enqueue) {
            std::printf("%-5d %-44s %9.2f\n", d, form.c_str(), timer.time_us(enqueue, layers, 5));
        };
        dev.synchronize();
        time("engine: projection + post-norm launches", [&] { engine(true, true); });
        time("engine: projection alone", [&] { engine(true, false); });
        time("engine: post-norm alone", [&] { engine(false, true); });
        for (size_t i = 0; i < cs.size(); ++i)
            time("cluster: both, " + cs[i].name, [&] { fused(i); });
        time("engine: projection + post-norm launches", [&] { engine(true, true); });
        // The post-norm over more threads than the plan's (about 4 float4 each): 2 and 1.
        for (const unsigned t : {2 * tpr, 4 * tpr}) {
            if (t > 1024) continue;
            auto wide = ns;
            gj::gemma4::set_spec_constant(wide, "TPR", t);
            wide.name += ".tpr" + std::to_string(t);
            const auto& kw = kernels_for(wide).get(wide.name, "rmsnorm_ext");
            time("post-norm alone, " + std::to_string(t) +
                     " threads (plan: " + std::to_string(tpr) + ")",
                 [&] {
                     for (int l = 0; l < layers; ++l) {
                         void* a[] = {&pp, &wp, &x, &xo, &sc, &wn, &none, &q, &qd, &one, &eps};
                         kw.launch({1}, {t}, 0, stream, a, true);
                     }
                 });
        }
    }
    dev.synchronize();
}
