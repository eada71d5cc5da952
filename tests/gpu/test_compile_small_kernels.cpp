// NVRTC compilation, on the CPU, of the small kernels between the products (rmsnorm,
// quantize_q8_1, convert_f32, embed_rows, ple, logits) for every preset's plan: each must compile,
// contain the instructions it exists for, and spill nothing.
#include <gtest/gtest.h>

#include <string>

#include "engine/gpu/kernels/spec_util.h"
#include "tests/support/kernel_specs.h"

using gj::gemma4::spec_constant;
using gj::jit::CompiledKernel;
using gj::test::all_specs_of;
using gj::test::compile_and_check;
using gj::test::entry_ptx;
using gj::test::occurrences;

// convert_f32 has the shared checks only (a CUBIN, its entries, no spills).
TEST(KernelTemplates, SmallKernelSpecsCompileWithTheirInstructionsAndNoSpills) {
    compile_and_check(
        all_specs_of({"rmsnorm", "quantize_q8_1", "convert_f32", "embed", "ple", "logits", "moe"}),
        [](const CompiledKernel& c, const std::string& /*arch*/) {
            const auto& s = c.spec;
            if (s.family == "rmsnorm") {
                const bool quant = spec_constant(s, "QUANT") == 1;
                const bool half = spec_constant(s, "QUANT") == 2;  // ".h16": f16 output
                const bool norm2 = spec_constant(s, "NORM2") == 1;
                EXPECT_EQ(c.ptx.find("cvt.rni.sat.s8.f32") != std::string::npos, quant);
                EXPECT_EQ(c.ptx.find("cvt.rn.f16x2.f32") != std::string::npos, half);
                // One refined reciprocal square root per norm, and no IEEE sqrt / division (their
                // slow-path calls cost stack and spills).
                EXPECT_EQ(occurrences(c.ptx, "rsqrt.approx.f32"), norm2 ? 2u : 1u);
                EXPECT_EQ(c.ptx.find("sqrt.rn.f32"), std::string::npos);
                EXPECT_EQ(c.ptx.find("div.rn.f32"), std::string::npos);
                EXPECT_EQ(c.ptx.find("rcp.rn.f32"), std::string::npos);
                if (spec_constant(s, "SCALE") == 1) {  // the scale is a device load
                    EXPECT_NE(entry_ptx(c.ptx, "rmsnorm_ext").find("ld.global.nc.f32"),
                              std::string::npos);
                }
            } else if (s.family == "embed") {
                const auto body = entry_ptx(c.ptx, "embed_rows");
                EXPECT_NE(body.find("st.global.v4.f32"), std::string::npos);
                const auto wtype = spec_constant(s, "WTYPE");
                if (wtype == 0) {
                    EXPECT_NE(body.find("ld.global.nc.v4.f32"), std::string::npos);
                }
                if (wtype == 1 || wtype == 2 || wtype == 8) {  // f16 values or block scales
                    EXPECT_NE(body.find("cvt.f32.f16"), std::string::npos);
                }
            } else if (s.family == "ple") {
                if (s.name.starts_with("ple_finish")) {
                    const auto body = entry_ptx(c.ptx, "ple_finish");
                    EXPECT_NE(body.find("rsqrt.approx.f32"), std::string::npos);
                    EXPECT_NE(body.find("shfl.sync.bfly"), std::string::npos);
                } else {
                    EXPECT_NE(entry_ptx(c.ptx, "gelu_mul_q8").find("cvt.rni.sat.s8.f32"),
                              std::string::npos);
                    EXPECT_NE(entry_ptx(c.ptx, "gelu_mul_f16").find("cvt.rn.f16x2.f32"),
                              std::string::npos);
                    EXPECT_EQ(entry_ptx(c.ptx, "gelu_mul").find("cvt.rni.sat.s8.f32"),
                              std::string::npos);
                }
            } else if (s.family == "logits") {
                // One launch each: partials, a fence, the arrival counter, the last block's merge.
                for (const char* e : {"softcap_argmax", "softcap_topk"}) {
                    const auto body = entry_ptx(c.ptx, e);
                    EXPECT_NE(body.find("membar.gl"), std::string::npos) << e;
                    EXPECT_NE(body.find("atom.global.add.u32"), std::string::npos) << e;
                    EXPECT_NE(body.find("ld.global.cg"), std::string::npos) << e;
                    EXPECT_NE(body.find("div.rn.f32"), std::string::npos) << e << ": IEEE z / cap";
                }
                const auto topk = entry_ptx(c.ptx, "softcap_topk");
                EXPECT_NE(topk.find("match.any.sync.b32"), std::string::npos);
                EXPECT_NE(topk.find("atom.shared.add.u32"), std::string::npos);
            } else if (s.family == "moe") {
                // Routing: a warp per token (max and sum by shuffles), the accurate expf and
                // IEEE divisions of the CPU reference; grouping: shared-memory counts and a
                // stable placement by warp peers; no local memory anywhere (the top-K lists live
                // in registers).
                const auto route = entry_ptx(c.ptx, "moe_route");
                EXPECT_NE(route.find("shfl.sync.bfly"), std::string::npos);
                EXPECT_NE(route.find("div.rn.f32"), std::string::npos);
                const auto group = entry_ptx(c.ptx, "moe_group");
                EXPECT_NE(group.find("atom.shared.add"), std::string::npos);
                EXPECT_NE(group.find("match.any.sync.b32"), std::string::npos);
                EXPECT_NE(group.find("popc.b32"), std::string::npos);
                // The decode form of both: routing by shuffles, grouping by warp peers.
                const auto fused = entry_ptx(c.ptx, "moe_route_group");
                EXPECT_NE(fused.find("div.rn.f32"), std::string::npos);
                EXPECT_NE(fused.find("match.any.sync.b32"), std::string::npos);
                EXPECT_NE(fused.find("bar.sync"), std::string::npos);
                EXPECT_NE(entry_ptx(c.ptx, "moe_ffn_out").find("fma.rn.f32"), std::string::npos);
                EXPECT_EQ(c.ptx.find(".local"), std::string::npos) << "moe uses local memory";
            } else if (s.family == "quantize_q8_1") {
                EXPECT_NE(c.ptx.find("cvt.rni.sat.s8.f32"), std::string::npos);
                EXPECT_NE(c.ptx.find("shfl.sync.bfly"), std::string::npos);
            }
        });
}

// The chain probe (tests/gpu/gpu_test_chain_probe.cpp): its persistent entry's barrier is an
// acquire load and a release reduction at GPU scope, its per-step entry has no barrier of its own.
TEST(KernelTemplates, ChainProbeCompilesWithItsDeviceWideBarrier) {
    compile_and_check(all_specs_of({"chain_probe"}),
                      [](const CompiledKernel& c, const std::string& /*arch*/) {
                          const std::string persistent = entry_ptx(c.ptx, "probe_persistent");
                          EXPECT_NE(persistent.find("ld.acquire.gpu"), std::string::npos);
                          EXPECT_NE(persistent.find("red.release.gpu"), std::string::npos);
                          EXPECT_EQ(entry_ptx(c.ptx, "probe_step").find("red."), std::string::npos);
                      });
}

// The stream probe (tests/gpu/gpu_test_stream_probe.cpp) at the four dense models' widths: both
// entries stream their weights with cp.async and wait on the grid after issuing them.
TEST(KernelTemplates, StreamProbeCompilesWithItsCopiesAheadOfTheWait) {
    compile_and_check(all_specs_of({"stream_probe"}),
                      [](const CompiledKernel& c, const std::string& arch) {
                          for (const char* e : {"stream_geglu_q8", "stream_geglu_norm"}) {
                              const std::string ptx = entry_ptx(c.ptx, e);
                              const size_t copy = ptx.find("cp.async.cg.shared.global");
                              ASSERT_NE(copy, std::string::npos) << e;
                              if (arch == "sm_90") {
                                  EXPECT_LT(copy, ptx.find("griddepcontrol.wait")) << e;
                              }
                          }
                      });
}

// The PLE cluster probe (tests/gpu/gpu_test_ple_cluster_probe.cpp) at E2B's and E4B's widths: on
// sm_90 its sums meet at cluster barriers through distributed shared memory; on sm_80 it traps.
TEST(KernelTemplates, PleClusterProbeCompilesWithItsClusterBarrier) {
    compile_and_check(
        all_specs_of({"ple_cluster_probe"}), [](const CompiledKernel& c, const std::string& arch) {
            const std::string ptx = entry_ptx(c.ptx, "ple_proj_norm");
            if (arch == "sm_90") {
                EXPECT_NE(ptx.find("barrier.cluster.arrive.release"), std::string::npos);
                EXPECT_NE(ptx.find("st.shared::cluster"), std::string::npos);
                EXPECT_NE(ptx.find(".reqnctapercluster 8"), std::string::npos);
            } else {
                EXPECT_NE(ptx.find("trap"), std::string::npos);
            }
        });
}

// The FFN probe (tests/gpu/gpu_test_ffn_probe.cpp) at the four dense models' widths: its down
// slice (and gate|up rows, in the shared-memory form) streams in with cp.async ahead of the grid
// wait, and its partial products go into y as fp32 reductions, 4 floats each on sm_90 (the
// timing-only entry has none), summed first over a cluster's blocks where it has one (sm_90).
TEST(KernelTemplates, FfnProbeCompilesWithItsCopiesAheadAndItsReductions) {
    compile_and_check(all_specs_of({"ffn_probe"}), [](const CompiledKernel& c,
                                                      const std::string& arch) {
        const std::string ptx = entry_ptx(c.ptx, "ffn_geglu_down");
        const size_t copy = ptx.find("cp.async.cg.shared.global");
        ASSERT_NE(copy, std::string::npos);
        if (arch == "sm_90") {
            EXPECT_LT(copy, ptx.find("griddepcontrol.wait"));
        }
        EXPECT_NE(ptx.find(arch == "sm_90" ? "red.global.add.v4.f32" : "red.global.add.f32"),
                  std::string::npos);
        const bool clustered = arch == "sm_90" && gj::gemma4::spec_constant(c.spec, "CLUSTER") > 1;
        EXPECT_EQ(ptx.find("ld.shared::cluster") != std::string::npos, clustered);
        EXPECT_EQ(entry_ptx(c.ptx, "ffn_geglu_down_noadd").find("red.global.add"),
                  std::string::npos);
    });
}

// The fused decode attention probe (tests/gpu/gpu_test_attn_fused_probe.cpp) at E2B's and E4B's
// sliding layers: on sm_90 a cluster of 16 whose weight and cache copies come before the grid wait
// and whose blocks read each other's results through distributed shared memory (mapped
// addresses); on sm_80 it traps.
TEST(KernelTemplates, AttnFusedProbeCompilesAsAClusterWithItsCopiesAheadOfTheWait) {
    compile_and_check(
        all_specs_of({"attn_fused_probe"}), [](const CompiledKernel& c, const std::string& arch) {
            const std::string ptx = entry_ptx(c.ptx, "attn_fused");
            if (arch == "sm_90") {
                EXPECT_LT(ptx.find("cp.async.cg.shared.global"), ptx.find("griddepcontrol.wait"));
                EXPECT_NE(ptx.find("barrier.cluster.arrive.release"), std::string::npos);
                EXPECT_NE(ptx.find("mapa.u64"), std::string::npos);
                EXPECT_NE(ptx.find(".reqnctapercluster 16"), std::string::npos);
            } else {
                EXPECT_NE(ptx.find("trap"), std::string::npos);
            }
        });
}
