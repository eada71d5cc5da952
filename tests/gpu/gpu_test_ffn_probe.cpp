// The FFN probe (kernel_templates/ffn_probe.cu): a decode FFN (GeGLU, its Q8_1 form, the down
// projection) as one launch whose blocks each own a slice of the intermediate width and add their
// part of the down product into y. The test checks it against the CPU; the disabled one measures
// it against the engine's three launches in a dependent chain:
//   gpu_test_ffn_probe --gtest_also_run_disabled_tests --gtest_filter='*Cost*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/gpu/kernels/matvec.h"
#include "engine/gpu/kernels/quantize_q8_1.h"
#include "engine/gpu/kernels/spec_util.h"
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

// One FFN probe spec; compiled and loaded by load() (which throws for a spec asking more shared
// memory than a block may have: fits() first).
struct Probe {
    int k, c, smem;
    gj::jit::KernelSpec spec;
    const gj::jit::Kernel *add = nullptr, *noadd = nullptr;
    // depth 0: the gate|up rows in shared memory (GU_SMEM).
    Probe(int k_, int c_, int depth, int cluster)
        : k(k_), c(c_), spec(gj::test::ffn_probe_spec(k_, c_, depth, depth == 0, cluster)) {
        smem = int(gj::gemma4::spec_constant(spec, "SMEM"));
    }
    bool fits() const { return smem <= gj::jit::Device::get().max_shared_per_block_optin(); }
    void load() {
        const auto& g = kernels_for(spec);
        add = &g.get(spec.name, "ffn_geglu_down");
        noadd = &g.get(spec.name, "ffn_geglu_down_noadd");
    }
};

// GGUF Q4_0 blocks of the down matrix [d][n_ff / 32] -> the probe's column-block-major planes,
// rows interleaved by 4 (slot cb * d + (j % 4) * (d / 4) + j / 4): 16 nibble bytes a slot, then
// an fp16 scale a slot.
std::vector<uint8_t> column_blocks(const std::vector<uint8_t>& blocks, int d, int n_ff) {
    const size_t nb = size_t(n_ff) / 32;
    std::vector<uint8_t> out(nb * d * 18);
    for (int j = 0; j < d; ++j)
        for (size_t cb = 0; cb < nb; ++cb) {
            const uint8_t* b = &blocks[(size_t(j) * nb + cb) * 18];
            const size_t slot = cb * d + size_t(j % 4) * (d / 4) + j / 4;
            std::memcpy(&out[slot * 16], b + 2, 16);
            std::memcpy(&out[nb * d * 16 + slot * 2], b, 2);
        }
    return out;
}

double gelu_tanh_d(double x) {
    return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

}  // namespace

TEST(FfnProbe, GegluDownMatchesTheCpu) {
    GJ_REQUIRE_GPU();
    std::mt19937 rng(11);
    auto& dev = gj::jit::Device::get();
    for (const int k : {1536, 2560}) {
        const int n_ff = 1024;
        std::vector<float> wg, wu, wd;
        const auto bg = random_weights(ggml::Type::Q4_0, n_ff, k, rng, wg);
        const auto bu = random_weights(ggml::Type::Q4_0, n_ff, k, rng, wu);
        const auto bd = random_weights(ggml::Type::Q4_0, k, n_ff, rng, wd);
        auto dg = to_device(split_layout(ggml::Type::Q4_0, bg, n_ff, k));
        auto du = to_device(split_layout(ggml::Type::Q4_0, bu, n_ff, k));
        auto dd = to_device(column_blocks(bd, k, n_ff));
        const auto h = random_normal(k, 1.0f, rng);
        const Q81 q = quantize_q8_1(h.data(), k);
        auto dxq = to_device(q.q);
        auto dxds = to_device(interleave(q));
        // The GeGLU products: exact Q8_1 sums, within the fp32 rounding of sums of |w x|.
        std::vector<double> want_g(n_ff), tol_g(n_ff);
        for (int r = 0; r < n_ff; ++r) {
            double sg = 0, su = 0;
            const double a = matvec_row_q81(&wg[size_t(r) * k], q, 0, k, &sg);
            const double b = matvec_row_q81(&wu[size_t(r) * k], q, 0, k, &su);
            want_g[r] = gelu_tanh_d(a) * b;
            tol_g[r] = 1.2e-5 * sg * std::abs(b) + 1e-5 * su * std::abs(gelu_tanh_d(a)) +
                       1e-6 * std::abs(want_g[r]) + 1e-30;
        }
        // depth 0: the gate|up rows in shared memory.
        struct Case {
            int c, depth, cluster;
        };
        for (const Case cs :
             {Case{32, 1, 1}, Case{32, 4, 1}, Case{64, 2, 1}, Case{64, 8, 1}, Case{32, 0, 1},
              Case{64, 0, 1}, Case{32, 4, 8}, Case{64, 8, 8}, Case{32, 0, 8}}) {
            const int c = cs.c;
            SCOPED_TRACE(std::to_string(k) + " c" + std::to_string(c) + " depth " +
                         std::to_string(cs.depth) + " cluster " + std::to_string(cs.cluster));
            Probe p(k, c, cs.depth, cs.cluster);
            if (!p.fits()) continue;  // more shared memory than a block may have
            p.load();
            DeviceBuffer y(size_t(k) * 4), g(size_t(n_ff) * 4);
            y.zero();
            CUdeviceptr gp = dg.ptr(), up = du.ptr(), dp = dd.ptr(), xq = dxq.ptr(),
                        xds = dxds.ptr(), yp = y.ptr(), gout = g.ptr();
            void* args[] = {&gp, &up, &dp, &xq, &xds, &yp, &gout};
            dev.synchronize();
            p.add->launch({unsigned(n_ff / c)}, {256}, p.smem, dev.stream(), args);
            dev.synchronize();
            const auto gh = from_device<float>(g, n_ff);
            for (int r = 0; r < n_ff; ++r)
                ASSERT_NEAR(gh[r], want_g[r], tol_g[r]) << "GeGLU row " << r;
            // The down product of the kernel's own Q8_1 form of those products (the CPU's, bit
            // for bit), summed in an order the reductions do not fix: within fp32 rounding of
            // the sum of |terms|.
            const Q81 gq = quantize_q8_1(gh.data(), n_ff);
            const auto yh = from_device<float>(y, k);
            for (int j = 0; j < k; ++j) {
                double scale = 0;
                const double want = matvec_row_q81(&wd[size_t(j) * n_ff], gq, 0, n_ff, &scale);
                ASSERT_NEAR(yh[j], want, 2e-6 * scale + 1e-30) << "y " << j;
            }
            // The timing-only entry writes nothing.
            y.zero();
            p.noadd->launch({unsigned(n_ff / c)}, {256}, p.smem, dev.stream(), args);
            dev.synchronize();
            const auto y0 = from_device<float>(y, k);
            EXPECT_EQ(std::count(y0.begin(), y0.end(), 0.0f), k);
        }
    }
}

// us per layer of a chain of `layers` decode FFNs at a model's shape (split Q4_0), captured in one
// CUDA graph with every launch a programmatic dependent of the one before, the weights cycling
// through more than L2 holds: the engine's GeGLU + quantize + down launches, the GeGLU alone, and
// the probe over C and DEPTH or with its gate|up rows in shared memory, alone or in clusters of 8
// (with and without its reductions into y). Median of 5 replays.
TEST(FfnProbe, DISABLED_ChainCost) {
    GJ_REQUIRE_GPU();
    auto& dev = gj::jit::Device::get();
    GraphTimer timer;
    const CUstream stream = timer.stream;
    std::mt19937 rng(9);
    const int layers = 64;
    struct Shape {
        const char* model;
        int k, n_ff;
    };
    std::printf("%-9s %-40s %9s %8s\n", "model", "form", "us/layer", "GB/s");
    for (const Shape sh :
         {Shape{"E2B", 1536, 6144}, Shape{"E2B-wide", 1536, 12288}, Shape{"E4B", 2560, 10240},
          Shape{"12B", 3840, 15360}, Shape{"31B", 5376, 21504}}) {
        const int k = sh.k, n_ff = sh.n_ff;
        const size_t mat = size_t(n_ff) * (k / 2 + k / 16);  // one of the three matrices
        const int copies = int(std::max<size_t>(2, (320u << 20) / (3 * mat) + 1));
        std::vector<float> unused;
        const auto gu = split_layout(
            ggml::Type::Q4_0, random_weights(ggml::Type::Q4_0, n_ff, k, rng, unused), n_ff, k);
        const auto down_blocks = random_weights(ggml::Type::Q4_0, k, n_ff, rng, unused);
        const auto down_split = split_layout(ggml::Type::Q4_0, down_blocks, k, n_ff);
        const auto down_cols = column_blocks(down_blocks, k, n_ff);
        std::vector<DeviceBuffer> w;  // per copy: gate, up, engine down, probe down
        for (int i = 0; i < copies; ++i) {
            w.push_back(to_device(gu));
            w.push_back(to_device(gu));
            w.push_back(to_device(down_split));
            w.push_back(to_device(down_cols));
        }
        const auto h = random_normal(k, 1.0f, rng);
        const Q81 q = quantize_q8_1(h.data(), k);
        auto dxq = to_device(q.q);
        auto dxds = to_device(interleave(q));
        DeviceBuffer g(size_t(n_ff) * 4), gq(size_t(n_ff) + 16), gds(size_t(n_ff) / 32 * 8),
            y(size_t(k) * 4);
        y.zero();
        CUdeviceptr none = 0, xq = dxq.ptr(), xds = dxds.ptr(), gp = g.ptr(), gqp = gq.ptr(),
                    gdsp = gds.ptr(), yp = y.ptr();
        int rows_ff = n_ff, rows_d = k, g_blocks = n_ff / 32;

        const auto up_spec = gj::gemma4::with_decode_prefetch(
            gj::gemma4::matvec_spec(ggml::Type::Q4_0, k, 1, gj::gemma4::MatvecLayout::Split, n_ff),
            2);
        const auto& geglu = kernels_for(up_spec).get(up_spec.name, up_spec.entries[2]);
        const auto geglu_shape = gj::gemma4::matvec_launch(up_spec, true);
        const auto down_spec = gj::gemma4::with_decode_prefetch(
            gj::gemma4::matvec_spec(ggml::Type::Q4_0, n_ff, 1, gj::gemma4::MatvecLayout::Split, k),
            2);
        const auto& down = kernels_for(down_spec).get(down_spec.name, down_spec.entries[0]);
        const auto down_shape = gj::gemma4::matvec_launch(down_spec, false);
        const auto qs = gj::gemma4::quantize_spec();
        const auto& quantize = kernels_for(qs).get(qs.name, "quantize_q8_1");
        const unsigned q_threads = unsigned(gj::gemma4::spec_constant(qs, "THREADS"));

        auto enqueue_engine = [&](bool full) {
            for (int l = 0; l < layers; ++l) {
                const int i = 4 * (l % copies);
                CUdeviceptr wg = w[i].ptr(), wu = w[i + 1].ptr(), wd = w[i + 2].ptr();
                void* a[] = {&wg, &wu, &xq, &xds, &none, &gp, &rows_ff};
                geglu.launch({ceil_div(n_ff, geglu_shape.rows)}, {geglu_shape.threads}, 0, stream,
                             a, true);
                if (!full) continue;
                void* b[] = {&gp, &gqp, &gdsp, &g_blocks};
                quantize.launch({ceil_div(size_t(g_blocks) * 8, q_threads)}, {q_threads}, 0, stream,
                                b, true);
                void* c[] = {&wd, &none, &gqp, &gdsp, &none, &yp, &rows_d};
                down.launch({ceil_div(k, down_shape.rows)}, {down_shape.threads}, 0, stream, c,
                            true);
            }
        };
        auto enqueue_probe = [&](const Probe& p, bool add) {
            for (int l = 0; l < layers; ++l) {
                const int i = 4 * (l % copies);
                CUdeviceptr wg = w[i].ptr(), wu = w[i + 1].ptr(), wd = w[i + 3].ptr();
                void* a[] = {&wg, &wu, &wd, &xq, &xds, &yp, &none};
                (add ? p.add : p.noadd)
                    ->launch({unsigned(n_ff / p.c)}, {256}, p.smem, stream, a, true);
            }
        };
        auto time = [&](const std::string& form, double bytes,
                        const std::function<void()>& enqueue) {
            const double us = timer.time_us(enqueue, layers, 5);
            std::printf("%-9s %-40s %9.2f %8.0f\n", sh.model, form.c_str(), us, bytes / us / 1e3);
        };
        dev.synchronize();
        time("engine: GeGLU + quantize + down", 3.0 * mat, [&] { enqueue_engine(true); });
        time("engine: GeGLU alone", 2.0 * mat, [&] { enqueue_engine(false); });
        for (const int cluster : {1, 8}) {
            for (const int c : {32, 64}) {
                for (const int depth : {0, 1, 2, 4, 8}) {
                    if (depth > c / 8) continue;
                    Probe p(k, c, depth, cluster);
                    if (!p.fits()) continue;
                    p.load();
                    const std::string form =
                        "probe c" + std::to_string(c) +
                        (depth == 0 ? std::string(" gate|up in smem")
                                    : " depth " + std::to_string(depth)) +
                        (cluster > 1 ? " cluster " + std::to_string(cluster) : std::string());
                    time(form, 3.0 * mat, [&] { enqueue_probe(p, true); });
                    time(form + " without reductions", 3.0 * mat, [&] { enqueue_probe(p, false); });
                }
            }
        }
    }
    dev.synchronize();
}
