#include "engine/gpu/kernels/embed_rows.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "engine/gpu/kernels/spec_util.h"
#include "engine/model/gemma4_config.h"

namespace gj::gemma4 {

using spec_util::has_matvec;
using spec_util::round_up;
using spec_util::supported_types;

jit::KernelSpec embed_rows_spec(int n, ggml::Type table_type, int vocab, MatvecLayout layout) {
    if (!has_matvec(table_type))
        throw ConfigError(fmt::format("no embedding gather for table type {} (supported: {})",
                                      ggml::type_name(table_type), supported_types()));
    const int block = spec_util::matvec_block_elems(table_type);
    if (n <= 0 || n % block != 0)
        throw std::invalid_argument(
            fmt::format("embed_rows: row width {} is not a positive multiple of {} ({} table)", n,
                        block, ggml::type_name(table_type)));
    if (vocab <= 0)
        throw std::invalid_argument(fmt::format("embed_rows: vocabulary of {} rows", vocab));
    const bool split = layout == MatvecLayout::Split;
    if (split && !spec_util::is_kquant_split(table_type))
        throw std::invalid_argument(
            fmt::format("embed_rows: {} tables have no split layout (Q4_K, Q5_K, Q6_K)",
                        ggml::type_name(table_type)));
    jit::KernelSpec s;
    s.family = "embed";
    s.name = fmt::format("embed_rows.{}.n{}.v{}{}", ggml::type_name(table_type), n, vocab,
                         split ? ".split" : "");
    s.constants = {{"N", n},
                   {"WTYPE", static_cast<int64_t>(table_type)},
                   {"VOCAB", vocab},
                   {"THREADS", std::clamp(round_up(n / 4, 32), 32, 256)}};
    if (split) s.constants.push_back({"LAYOUT", 1});
    s.entries = {"embed_rows"};
    s.priority = 0;
    return s;
}

}  // namespace gj::gemma4
