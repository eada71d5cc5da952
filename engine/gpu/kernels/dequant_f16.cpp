#include "engine/gpu/kernels/dequant_f16.h"

#include <fmt/format.h>

#include <stdexcept>

#include "engine/gpu/kernels/spec_util.h"
#include "engine/model/gemma4_config.h"

namespace gj::gemma4 {

jit::KernelSpec dequant_f16_spec(ggml::Type weight_type, int k, MatvecLayout layout) {
    const bool split32 = spec_util::has_gemm(weight_type);  // Q8_0 / Q4_0: split layout only
    if (!spec_util::has_dequant_f16(weight_type) && !split32)
        throw ConfigError(fmt::format(
            "dequant_f16: weight type {} is not q4_k, q5_k, q6_k, q4_1, q5_0, q5_1, q8_0 or q4_0",
            ggml::type_name(weight_type)));
    const int block = spec_util::matvec_block_elems(weight_type);
    if (k <= 0 || k % block != 0)
        throw std::invalid_argument(
            fmt::format("dequant_f16: row width {} is not a positive multiple of {}", k, block));
    const bool split = layout == MatvecLayout::Split;
    if (split32 && !split)
        throw std::invalid_argument(fmt::format("dequant_f16: {} is read in its split layout only",
                                                ggml::type_name(weight_type)));
    jit::KernelSpec s;
    s.family = "dequant_f16";
    s.name =
        fmt::format("dequant_f16.{}.k{}{}", ggml::type_name(weight_type), k, split ? ".split" : "");
    s.constants = {
        {"K", k}, {"WTYPE", static_cast<int64_t>(weight_type)}, {"ELEMS", 8}, {"THREADS", 256}};
    if (split) s.constants.push_back({"LAYOUT", 1});
    s.entries = {"dequant_f16"};
    s.priority = 1;
    return s;
}

}  // namespace gj::gemma4
