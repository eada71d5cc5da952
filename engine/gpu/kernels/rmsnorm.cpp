#include "engine/gpu/kernels/rmsnorm.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "engine/gpu/kernels/spec_util.h"

namespace gj::gemma4 {

using spec_util::next_pow2;
using spec_util::round_up;

int rmsnorm_threads_per_row(int n) {
    // Narrow rows (head dims) share a warp between several rows (a block holds 128 / TPR of
    // them), about 4 float4 per thread.
    if (n <= 512) return std::clamp(next_pow2((n + 15) / 16), 8, 32);
    // Wide rows (d_model) get a block each. A decode step's norm is a link in a dependent chain,
    // where its latency is what counts, and fewer float4 per thread shorten it until the
    // block-wide reduction over more warps costs more than it saves. Whole model, H200 tg128
    // (docs/PERFORMANCE.md, 2026-11-30), against the 4 float4 per thread of before:
    //   d 1536 (E2B) 1 float4 per thread (384 threads) +3.5%; d 2560 (E4B) 1 (640) +2..4%;
    //   d 2816 (26B-A4B) 2 (352) +6.3%; d 3840 (12B) 2 (480) -0.7%, 1 (960) -0.6%;
    //   d 5376 (31B) 1 (1024) +-0.
    const int vec = (n + 3) / 4, per_thread = vec <= 640 ? 1 : vec <= 768 ? 2 : 4;
    return std::min(1024, round_up((vec + per_thread - 1) / per_thread, 32));
}

jit::KernelSpec rmsnorm_spec(int n, bool weight, bool quant, bool add, bool scale, bool norm2,
                             int parts, bool moe_norms, bool half, int bf16_in) {
    if (half && (!quant || moe_norms))
        throw std::invalid_argument(
            "rmsnorm: the f16 output replaces the Q8_1 one (quant, and not with the MoE norms)");
    if (moe_norms && !(norm2 && quant && !scale))
        throw std::invalid_argument(
            "rmsnorm: the MoE norms extend the chained, quantized second norm (norm2, quant, no "
            "scale)");
    if (bf16_in < 0 || bf16_in > 8 || (bf16_in && (parts != 1 || !add)))
        throw std::invalid_argument(fmt::format(
            "rmsnorm: a bf16 input is one all-reduced product of a residual update, or 2..8 "
            "ranks' products (add, 1 plane; got {} bf16 rows per row)",
            bf16_in));
    if (parts < 1 || parts > 8 || (parts > 1 && !add))
        throw std::invalid_argument(fmt::format(
            "rmsnorm: {} input planes (1..8, more than 1 only with the residual add)", parts));
    if (n <= 0 || n % 4 != 0)
        throw std::invalid_argument(
            fmt::format("rmsnorm: width {} is not a positive multiple of 4", n));
    if (quant && !half && n % 32 != 0)
        throw std::invalid_argument(fmt::format(
            "rmsnorm: quantized output needs a width that is a multiple of 32, got {}", n));
    if ((scale || norm2) && !add)
        throw std::invalid_argument(
            "rmsnorm: the output scale and the chained second norm apply to a residual update "
            "(add)");
    if (n > 16 * 1024 * 4)
        throw std::invalid_argument(
            fmt::format("rmsnorm: width {} is above the 65536 supported", n));
    const int tpr = rmsnorm_threads_per_row(n), rpb = n <= 512 ? 128 / tpr : 1;
    jit::KernelSpec s;
    s.family = "rmsnorm";
    s.name =
        fmt::format("rmsnorm.n{}.w{}{}{}{}{}{}{}{}", n, weight ? 1 : 0, add ? ".add" : "",
                    scale ? ".scale" : "", norm2 ? ".n2" : "",
                    half    ? ".h16"
                    : quant ? ".q8"
                            : "",
                    parts > 1 ? fmt::format(".p{}", parts) : std::string(), moe_norms ? ".moe" : "",
                    bf16_in > 1   ? fmt::format(".xb16x{}", bf16_in)
                    : bf16_in > 0 ? std::string(".xb16")
                                  : std::string());
    s.constants = {{"N", n},
                   {"TPR", tpr},
                   {"RPB", rpb},
                   {"WEIGHT", weight ? 1 : 0},
                   {"QUANT", half    ? 2
                             : quant ? 1
                                     : 0},
                   {"ADD", add ? 1 : 0},
                   {"SCALE", scale ? 1 : 0},
                   {"NORM2", norm2 ? 1 : 0},
                   {"PARTS", parts},
                   {"MOE_NORMS", moe_norms ? 1 : 0},
                   {"X_BF16", bf16_in}};
    s.entries = {moe_norms ? "rmsnorm_moe" : scale || norm2 ? "rmsnorm_ext" : "rmsnorm"};
    s.priority = 0;
    return s;
}

RmsnormBf16InputSpecs rmsnorm_bf16_input_specs(int n, bool ple, int planes) {
    RmsnormBf16InputSpecs s;
    for (int half = 0; half < 2; ++half) {
        s.post_prenorm[half] =
            rmsnorm_spec(n, true, true, true, false, true, 1, false, half == 1, planes);
        s.post_scale_prenorm[half] =
            rmsnorm_spec(n, true, true, true, true, true, 1, false, half == 1, planes);
    }
    if (ple)
        s.post_quant = rmsnorm_spec(n, true, true, true, false, false, 1, false, false, planes);
    return s;
}

jit::KernelSpec rmsnorm_lsa_spec(const jit::KernelSpec& fp32_form, int peers,
                                 const std::string& nccl_include) {
    auto value = [&](const char* name) {
        for (const auto& [n, v] : fp32_form.constants)
            if (n == name) return v;
        return int64_t(0);
    };
    if (fp32_form.family != "rmsnorm" ||
        fp32_form.entries != std::vector<std::string>{"rmsnorm_ext"} || value("PARTS") != 1 ||
        value("X_BF16") != 0)
        throw std::invalid_argument(fmt::format(
            "rmsnorm: {} has no form that sums the ranks' products (a post-norm of one fp32 "
            "plane, entry rmsnorm_ext)",
            fp32_form.name));
    if (peers < 2 || nccl_include.empty())
        throw std::invalid_argument(fmt::format(
            "rmsnorm: the ranks' sum needs 2 or more ranks and NCCL's device headers ({} ranks)",
            peers));
    jit::KernelSpec s = fp32_form;
    s.name += fmt::format(".lsa{}", peers);
    s.constants.emplace_back("LSA_PEERS", peers);
    s.entries = {"rmsnorm_ext_lsa"};
    s.nccl_include = nccl_include;
    return s;
}

jit::KernelSpec rmsnorm_lsa_push_spec(const jit::KernelSpec& lsa_form) {
    if (lsa_form.entries != std::vector<std::string>{"rmsnorm_ext_lsa"})
        throw std::invalid_argument(fmt::format(
            "rmsnorm: {} is not a form that sums the ranks' products (rmsnorm_lsa_spec)",
            lsa_form.name));
    jit::KernelSpec s = lsa_form;
    s.name += ".push";
    s.constants.emplace_back("LSA_PUSH", 1);
    s.entries = {"rmsnorm_ext_lsa_push", "lsa_window_pointers"};
    return s;
}

RmsnormLsaSpecs rmsnorm_lsa_specs(int n, int peers, const std::string& nccl_include, bool push) {
    RmsnormLsaSpecs s{
        rmsnorm_lsa_spec(rmsnorm_spec(n, true, true, true, false, true), peers, nccl_include),
        rmsnorm_lsa_spec(rmsnorm_spec(n, true, true, true, true, true), peers, nccl_include),
        std::nullopt, std::nullopt};
    if (push) {
        s.push_post_prenorm = rmsnorm_lsa_push_spec(s.post_prenorm);
        s.push_post_scale_prenorm = rmsnorm_lsa_push_spec(s.post_scale_prenorm);
    }
    return s;
}

std::vector<jit::KernelSpec> RmsnormLsaSpecs::all() const {
    std::vector<jit::KernelSpec> out = {post_prenorm, post_scale_prenorm};
    for (const auto& p : {push_post_prenorm, push_post_scale_prenorm})
        if (p) out.push_back(*p);
    return out;
}

std::vector<jit::KernelSpec> RmsnormBf16InputSpecs::all() const {
    std::vector<jit::KernelSpec> out = {post_prenorm[0], post_prenorm[1], post_scale_prenorm[0],
                                        post_scale_prenorm[1]};
    if (post_quant) out.push_back(*post_quant);
    return out;
}

}  // namespace gj::gemma4
