// The fused decode attention probe (kernel_templates/attn_fused_probe.cu): a sliding layer's
// Q|K|V projections, norms, RoPE, K/V append, attention and split merge as one launch of one
// thread-block cluster per KV head. The test checks it against the engine's four launches
// (Q|K|V matvec, attn_prep, flash_decode, flash_combine) on the same inputs; the disabled one
// measures both as chains of layers in one CUDA graph:
//   gpu_test_attn_fused_probe --gtest_also_run_disabled_tests --gtest_filter='*Cost*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/gguf/half.h"
#include "engine/gpu/kernel_plan.h"
#include "engine/gpu/kernels/attn_prep.h"
#include "engine/gpu/kernels/flash_decode.h"
#include "engine/gpu/kernels/matvec.h"
#include "engine/gpu/kernels/spec_util.h"
#include "jit/cuda_driver.h"
#include "jit/device.h"
#include "tests/support/attention_gpu.h"
#include "tests/support/graph_timer.h"
#include "tests/support/kernel_ref.h"
#include "tests/support/kernel_ref_gpu.h"
#include "tests/support/kernel_specs.h"
#include "tests/support/test_env.h"

using namespace gj::test::kref;
using gj::gemma4::KvType;
using gj::jit::DeviceBuffer;
namespace ggml = gj::ggml;

namespace {

constexpr int kHd = 256, kWindow = 512, kCluster = 16, kSlots = kWindow + 32;
constexpr float kEps = 1e-6f, kBase = 10000.0f;

struct Shape {
    const char* model;
    int k, heads, kv_heads;
};
constexpr Shape kE2B{"E2B", 1536, 8, 1}, kE4B{"E4B", 2560, 8, 2};

// The probe's kernel, loaded, with the attributes a cluster of 16 needs.
struct Fused {
    gj::jit::KernelSpec spec;
    const gj::jit::Kernel* k = nullptr;
    unsigned smem = 0;
    Fused(const Shape& s, bool raw_in)
        : spec(gj::test::attn_fused_probe_spec(s.k, s.heads / s.kv_heads, s.kv_heads, kWindow,
                                               kCluster, raw_in)) {
        smem = unsigned(gj::gemma4::spec_constant(spec, "SMEM"));
        k = &kernels_for(spec).get(spec.name, "attn_fused");
        gj::jit::check_driver(
            gj::jit::driver().cuFuncSetAttribute(
                k->handle(), CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
            "cluster of 16");
    }
};

// The engine's four launches of a sliding decode layer's attention at this shape.
struct Engine {
    gj::jit::KernelSpec qkv, prep, flash;
    const gj::jit::Kernel *multi, *prep_k, *flash_k, *combine_k;
    unsigned mv_threads, mv_rows, prep_warps, flash_threads, flash_smem, combine_threads,
        combine_blocks;
    int splits;
    explicit Engine(const Shape& s)
        : qkv(gj::gemma4::with_decode_prefetch(
              gj::gemma4::matvec_spec(ggml::Type::Q4_0, s.k, 1, gj::gemma4::MatvecLayout::Split,
                                      s.heads * kHd),
              2)),
          prep(gj::gemma4::attn_prep_spec(kHd, s.heads, s.kv_heads, kHd / 2, true, true,
                                          KvType::F16)),
          flash(gj::gemma4::flash_decode_spec(kHd, s.heads / s.kv_heads, s.kv_heads, kWindow,
                                              KvType::F16, false)) {
        using gj::gemma4::spec_constant;
        multi = &kernels_for(qkv).get(qkv.name, qkv.family + "_multi");
        prep_k = &kernels_for(prep).get(prep.name, "attn_prep");
        flash_k = &kernels_for(flash).get(flash.name, "flash_decode");
        combine_k = &kernels_for(flash).get(flash.name, "flash_combine");
        const auto shape = gj::gemma4::matvec_launch(qkv, false);
        mv_threads = shape.threads;
        mv_rows = shape.rows;
        prep_warps = unsigned(spec_constant(prep, "WARPS"));
        flash_threads = unsigned(spec_constant(flash, "THREADS"));
        flash_smem = unsigned(spec_constant(flash, "SMEM"));
        combine_threads = unsigned(spec_constant(flash, "COMBINE_THREADS"));
        combine_blocks =
            unsigned(spec_constant(flash, "GROUP") * spec_constant(flash, "N_KV_HEADS") * kHd / 32);
        splits =
            gj::gemma4::flash_decode_splits(flash, 1 << 16, 1, gj::jit::Device::get().sm_count());
    }
};

// One layer's buffers: weights (split Q4_0), norm weights, its cache planes.
struct Layer {
    DeviceBuffer wq, wk, wv, kc, vc, table;
};

// Everything a layer reads and writes that is not its own.
struct Io {
    DeviceBuffer xq, xds, qn, kn, pos, q, kraw, vraw, part_o, part_ml, out, outq, outds;
};

Layer make_layer(const Shape& s, std::mt19937& rng) {
    std::vector<float> unused;
    auto weights = [&](int rows) {
        return to_device(split_layout(
            ggml::Type::Q4_0, random_weights(ggml::Type::Q4_0, rows, s.k, rng, unused), rows, s.k));
    };
    Layer l{
        weights(s.heads * kHd), weights(s.kv_heads * kHd), weights(s.kv_heads * kHd), {}, {}, {}};
    // Cached rows of modest size (normed keys have unit rms; the scores stay in a few units).
    const size_t plane = size_t(kSlots) * s.kv_heads * kHd;
    std::vector<uint16_t> k(plane), v(plane);
    std::normal_distribution<float> nd(0.0f, 0.25f);
    for (size_t i = 0; i < plane; ++i)
        k[i] = gj::f32_to_f16(nd(rng)), v[i] = gj::f32_to_f16(nd(rng));
    l.kc = to_device(k);
    l.vc = to_device(v);
    const std::vector<uint64_t> t = {l.kc.ptr(), l.vc.ptr()};
    l.table = to_device(t);
    return l;
}

Io make_io(const Shape& s, const Engine& e, std::mt19937& rng) {
    Io io;
    const auto h = random_normal(s.k, 1.0f, rng);
    const Q81 q = quantize_q8_1(h.data(), s.k);
    io.xq = to_device(q.q);
    io.xds = to_device(interleave(q));
    io.qn = to_device(norm_weights(kHd, rng));
    io.kn = to_device(norm_weights(kHd, rng));
    io.pos = DeviceBuffer(16);
    const size_t qdim = size_t(s.heads) * kHd;
    io.q = DeviceBuffer(qdim * 4);
    io.kraw = DeviceBuffer(size_t(s.kv_heads) * kHd * 4);
    io.vraw = DeviceBuffer(size_t(s.kv_heads) * kHd * 4);
    io.part_o = DeviceBuffer(qdim * size_t(e.splits) * 4);
    io.part_ml = DeviceBuffer(size_t(s.heads) * e.splits * 8);
    io.out = DeviceBuffer(qdim * 4);
    io.outq = DeviceBuffer(qdim + 16);
    io.outds = DeviceBuffer(qdim / 32 * 8);
    return io;
}

void set_pos(Io& io, int pos) {
    const std::vector<int> p = {pos};
    io.pos.upload(p.data(), 4);
    gj::jit::Device::get().synchronize();
}

void enqueue_engine(const Shape& s, const Engine& e, const Layer& l, Io& io, CUstream stream,
                    bool dependent, bool qkv = true, bool rest = true) {
    CUdeviceptr none = 0;
    if (qkv) {
        CUdeviceptr w0 = l.wq.ptr(), w1 = l.wk.ptr(), w2 = l.wv.ptr(), xq = io.xq.ptr(),
                    xds = io.xds.ptr(), y0 = io.q.ptr(), y1 = io.kraw.ptr(), y2 = io.vraw.ptr();
        int n0 = s.heads * kHd, n1 = s.kv_heads * kHd, n2 = n1;
        void* a[] = {&w0, &w1, &w2, &xq, &xds, &y0, &y1, &y2, &n0, &n1, &n2};
        const unsigned blocks = ceil_div(n0, e.mv_rows) + 2 * ceil_div(n1, e.mv_rows);
        e.multi->launch({blocks}, {e.mv_threads}, 0, stream, a, dependent);
    }
    if (!rest) return;
    CUdeviceptr q = io.q.ptr(), kraw = io.kraw.ptr(), vraw = io.vraw.ptr(), qn = io.qn.ptr(),
                kn = io.kn.ptr(), table = l.table.ptr(), pos = io.pos.ptr();
    int T = 1, slots = kSlots, stride = 0;
    float base = kBase, eps = kEps;
    void* pa[] = {&q,   &kraw, &vraw,  &qn,   &kn,  &table, &none,
                  &pos, &T,    &slots, &base, &eps, &none,  &stride};
    const unsigned rows = unsigned(s.heads + 2 * s.kv_heads);
    e.prep_k->launch({ceil_div(rows, e.prep_warps), 1}, {32 * e.prep_warps}, 0, stream, pa,
                     dependent);
    CUdeviceptr po = io.part_o.ptr(), pml = io.part_ml.ptr();
    int splits = e.splits;
    void* fa[] = {&q, &table, &none, &pos, &T, &slots, &splits, &po, &pml};
    e.flash_k->launch({unsigned(splits), unsigned(s.kv_heads), 1}, {e.flash_threads}, e.flash_smem,
                      stream, fa, dependent);
    CUdeviceptr out = io.out.ptr(), outq = io.outq.ptr(), outds = io.outds.ptr();
    void* ca[] = {&po, &pml, &out, &outq, &outds, &T, &splits};
    e.combine_k->launch({e.combine_blocks, 1}, {e.combine_threads}, 0, stream, ca, dependent);
}

// stop: 0, or a timing-only subset of the steps (attn_fused_probe.cu).
void enqueue_fused(const Shape& s, const Fused& f, const Layer& l, Io& io, CUstream stream,
                   bool dependent, int stop = 0) {
    CUdeviceptr wq = l.wq.ptr(), wk = l.wk.ptr(), wv = l.wv.ptr(), xq = io.xq.ptr(),
                xds = io.xds.ptr(), qn = io.qn.ptr(), kn = io.kn.ptr(), kc = l.kc.ptr(),
                vc = l.vc.ptr(), pos = io.pos.ptr(), out = io.out.ptr(), outq = io.outq.ptr(),
                outds = io.outds.ptr();
    CUdeviceptr q = io.q.ptr(), kraw = io.kraw.ptr(), vraw = io.vraw.ptr();
    int slots = kSlots;
    float base = kBase, eps = kEps;
    void* a[] = {&wq,    &wk,   &wv,  &xq,  &xds,  &qn,    &kn,   &kc, &vc,   &pos,
                 &slots, &base, &eps, &out, &outq, &outds, &stop, &q,  &kraw, &vraw};
    f.k->launch({unsigned(kCluster * s.kv_heads)}, {512}, f.smem, stream, a, dependent);
}

}  // namespace

// The probe's output and appended K/V rows against the engine's four launches from the same
// state, at positions inside the first split, across the window and past it (ring slots), in
// both forms (its own projections; the engine's Q|K|V matvec, then the probe reading its rows).
TEST(AttnFusedProbe, MatchesTheEngineLaunches) {
    GJ_REQUIRE_GPU();
    auto& dev = gj::jit::Device::get();
    if (dev.compute_capability() < 90) GTEST_SKIP() << "clusters of 16 need sm_90";
    for (const Shape& s : {kE2B, kE4B}) {
        SCOPED_TRACE(s.model);
        std::mt19937 rng(5);
        const Engine e(s);
        const Fused fused(s, false), raw_in(s, true);
        Layer l = make_layer(s, rng);
        Io io = make_io(s, e, rng);
        const size_t qdim = size_t(s.heads) * kHd, plane = size_t(kSlots) * s.kv_heads * kHd;
        const auto k0 = from_device<uint16_t>(l.kc, plane), v0 = from_device<uint16_t>(l.vc, plane);
        auto restore_cache = [&] {  // the state before the step, for each path
            l.kc.upload(k0.data(), plane * 2);
            l.vc.upload(v0.data(), plane * 2);
            io.out.zero();
            dev.synchronize();
        };
        for (const int pos : {5, 40, 300, 511, 1000, 1337})
            for (const Fused* f : {&fused, &raw_in}) {
                SCOPED_TRACE("pos " + std::to_string(pos) + " " + f->spec.name);
                set_pos(io, pos);
                restore_cache();
                enqueue_engine(s, e, l, io, dev.stream(), false);
                dev.synchronize();
                const auto want = from_device<float>(io.out, qdim);
                const auto want_k = from_device<uint16_t>(l.kc, plane),
                           want_v = from_device<uint16_t>(l.vc, plane);
                restore_cache();
                if (f == &raw_in) enqueue_engine(s, e, l, io, dev.stream(), false, true, false);
                enqueue_fused(s, *f, l, io, dev.stream(), false);
                dev.synchronize();
                const auto got = from_device<float>(io.out, qdim);
                const auto got_k = from_device<uint16_t>(l.kc, plane),
                           got_v = from_device<uint16_t>(l.vc, plane);
                float scale = 0;
                for (float x : want) scale = std::max(scale, std::abs(x));
                ASSERT_GT(scale, 0.0f);
                for (size_t i = 0; i < qdim; ++i)
                    ASSERT_NEAR(got[i], want[i], 2e-3f * scale) << "output " << i;
                // The appended rows: equal but for the last bit of a rounding the two sums order
                // differently; every other row untouched.
                const size_t row0 = size_t(pos % kSlots) * s.kv_heads * kHd;
                for (size_t i = 0; i < plane; ++i) {
                    const bool appended = i >= row0 && i < row0 + size_t(s.kv_heads) * kHd;
                    if (!appended) {
                        ASSERT_EQ(got_k[i], k0[i]) << "K row untouched " << i;
                        ASSERT_EQ(got_v[i], v0[i]) << "V row untouched " << i;
                        continue;
                    }
                    ASSERT_NEAR(gj::f16_to_f32(got_k[i]), gj::f16_to_f32(want_k[i]), 4e-3f)
                        << "appended K " << i - row0;
                    ASSERT_NEAR(gj::f16_to_f32(got_v[i]), gj::f16_to_f32(want_v[i]), 4e-3f)
                        << "appended V " << i - row0;
                }
            }
    }
}

// us per layer of a chain of 64 sliding decode layers' attention in one CUDA graph, every launch
// a programmatic dependent of the one before, weights and caches per layer (more than L2
// holds): the engine's four launches, its Q|K|V matvec alone, its three attention launches
// alone, the probe, and the engine's matvec followed by the probe reading its rows. Median of 5
// replays, at a shallow and a full window.
TEST(AttnFusedProbe, DISABLED_ChainCost) {
    GJ_REQUIRE_GPU();
    auto& dev = gj::jit::Device::get();
    if (dev.compute_capability() < 90) GTEST_SKIP() << "clusters of 16 need sm_90";
    GraphTimer timer;
    const CUstream stream = timer.stream;
    const int layers = 64;
    std::printf("%-5s %-6s %-40s %9s\n", "model", "pos", "form", "us/layer");
    for (const Shape& s : {kE2B, kE4B}) {
        std::mt19937 rng(3);
        const Engine e(s);
        const Fused f(s, false), raw_in(s, true);
        std::vector<Layer> ls;
        for (int i = 0; i < layers; ++i) ls.push_back(make_layer(s, rng));
        Io io = make_io(s, e, rng);
        for (const int pos : {64, 2000}) {
            set_pos(io, pos);
            auto time = [&](const char* form, const std::function<void()>& enqueue) {
                const double us = timer.time_us(enqueue, layers, 5);
                std::printf("%-5s %-6d %-40s %9.2f\n", s.model, pos, form, us);
            };
            time("engine: 4 launches", [&] {
                for (const Layer& l : ls) enqueue_engine(s, e, l, io, stream, true);
            });
            time("engine: Q|K|V matvec alone", [&] {
                for (const Layer& l : ls) enqueue_engine(s, e, l, io, stream, true, true, false);
            });
            time("engine: prep, flash, combine alone", [&] {
                for (const Layer& l : ls) enqueue_engine(s, e, l, io, stream, true, false, true);
            });
            time("probe: one cluster launch", [&] {
                for (const Layer& l : ls) enqueue_fused(s, f, l, io, stream, true);
            });
            for (const int stop : {5, 1, 2, 3}) {
                const std::string form = stop == 5
                                             ? std::string("probe: copies and barriers only")
                                             : "probe: steps 1.." + std::to_string(stop) + " only";
                time(form.c_str(), [&] {
                    for (const Layer& l : ls) enqueue_fused(s, f, l, io, stream, true, stop);
                });
            }
            time("engine Q|K|V + probe reading its rows", [&] {
                for (const Layer& l : ls) {
                    enqueue_engine(s, e, l, io, stream, true, true, false);
                    enqueue_fused(s, raw_in, l, io, stream, true);
                }
            });
            time("the same, probe's barriers only", [&] {
                for (const Layer& l : ls) {
                    enqueue_engine(s, e, l, io, stream, true, true, false);
                    enqueue_fused(s, raw_in, l, io, stream, true, 5);
                }
            });
        }
    }
    dev.synchronize();
}
