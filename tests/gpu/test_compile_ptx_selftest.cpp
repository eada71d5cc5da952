// NVRTC compilation, on the CPU, of the PTX helper selftest (kernel_templates/ptx_selftest.cu):
// every helper of gj_ptx.cuh must emit the instructions it exists for, on sm_80 and sm_90.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "tests/support/kernel_specs.h"

using gj::jit::CompiledKernel;
using gj::test::all_specs_of;
using gj::test::compile_and_check;
using gj::test::entry_ptx;

TEST(KernelTemplates, PtxSelftestCompilesWithItsInstructions) {
    compile_and_check(
        all_specs_of({"ptx_selftest"}), [](const CompiledKernel& c, const std::string& /*arch*/) {
            const auto& s = c.spec;
            if (s.family == "ptx_selftest") {
                const std::map<std::string, std::vector<std::string>> want = {
                    {"selftest_convert",
                     {"cvt.rn.f16.f32", "cvt.f32.f16", "cvt.rn.bf16.f32", "cvt.rni.sat.s8.f32"}},
                    {"selftest_pack", {"cvt.rn.f16x2.f32", "fma.rn.f16x2", "prmt.b32"}},
                    {"selftest_dp4a", {"dp4a.s32.s32"}},
                    {"selftest_mma_s8", {"mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"}},
                    {"selftest_mma_f16", {"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"}},
                    {"selftest_mma_bf16", {"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"}},
                    {"selftest_ldmatrix",
                     {"ldmatrix.sync.aligned.m8n8.x1.shared.b16",
                      "ldmatrix.sync.aligned.m8n8.x2.shared.b16",
                      "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
                      "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16",
                      "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16", "cvta.to.shared"}},
                    {"selftest_cp_async",
                     {"cp.async.ca.shared.global", "cp.async.cg.shared.global",
                      "cp.async.commit_group", "cp.async.wait_group 0"}},
                    {"selftest_warp_reduce", {"shfl.sync.bfly.b32"}},
                    {"selftest_fast_math", {"ex2.approx.ftz.f32", "tanh.approx.f32", "rcp.approx"}},
                    {"selftest_loads",
                     {"ld.global.nc.L1::no_allocate.v4.u32", "ld.global.nc.L1::no_allocate.u32",
                      "ld.global.nc.u16", "shf.r."}},
                    {"selftest_q8_scale", {"rcp.approx.ftz.f32", "mul.f64"}},
                    {"selftest_rsqrt", {"rsqrt.approx.f32"}},
                };
                ASSERT_EQ(want.size(), s.entries.size());
                for (const auto& [entry, instrs] : want) {
                    const auto body = entry_ptx(c.ptx, entry);
                    for (const auto& i : instrs)
                        EXPECT_NE(body.find(i), std::string::npos) << entry << " lacks " << i;
                }
            }
        });
}
