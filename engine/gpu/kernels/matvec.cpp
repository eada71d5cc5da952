#include "engine/gpu/kernels/matvec.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include "engine/gpu/kernels/rmsnorm.h"
#include "engine/gpu/kernels/spec_util.h"
#include "engine/model/gemma4_config.h"

namespace gj::gemma4 {

using spec_util::has_matvec;
using spec_util::is_float_type;
using spec_util::is_kquant;
using spec_util::next_pow2;
using spec_util::quant_type_tag;
using spec_util::supported_types;

namespace {

// Units (the per-thread work items of matvec_common.cuh) per row.
int matvec_units(ggml::Type t, int k, MatvecLayout layout) {
    if (is_float_type(t)) return k / (t == ggml::Type::F32 ? 4 : 8);           // 16 bytes each
    if (t == ggml::Type::Q6_K && layout == MatvecLayout::Ggml) return k / 64;  // 48 bytes each
    if (is_kquant(t)) return k / 32;  // 16 nibble bytes each (split Q5_K: 20, Q6_K: 24 bytes)
    if (layout == MatvecLayout::Split) return t == ggml::Type::Q8_0 ? k / 16 : k / 32;
    return k / (t == ggml::Type::Q8_0 ? 8 : 16);
}

// Threads split a row's units; enough of them per thread (>= 4) to keep UNROLL batches of loads
// in flight, and not more threads than a quarter of the units.
int matvec_threads(int units) {
    return std::clamp(next_pow2(units / 4 + 1) / 2, 32, 256);
}

void check_matvec_shape(const std::string& what, int k, int ncols) {
    if (k <= 0 || k % 32 != 0)
        throw std::invalid_argument(
            fmt::format("{}: input width {} is not a positive multiple of 32", what, k));
    if (ncols < 1 || ncols > 8)
        throw std::invalid_argument(fmt::format("{}: {} columns (1..8 supported)", what, ncols));
}

// Output-row classes that change a single-column launch shape (the spec name's suffix). Tall:
// more one-row blocks of 32 threads than an H100/H200 holds at once (132 SMs x 32 blocks), so
// such a launch would run a second, mostly empty wave. Short: 1024-2048 rows (E2B's d 1536), too
// few one-row blocks of 32 threads to keep every SM's loads in flight.
enum class Rows { Any, Few, Short, Tall, Wide };
Rows row_class(int n_rows) {
    return n_rows >= 65536                    ? Rows::Wide
           : n_rows > 4096                    ? Rows::Tall
           : n_rows > 0 && n_rows < 1024      ? Rows::Few
           : n_rows >= 1024 && n_rows <= 2048 ? Rows::Short
                                              : Rows::Any;
}
const char* row_suffix(Rows r) {
    return r == Rows::Wide    ? ".wide"
           : r == Rows::Tall  ? ".tall"
           : r == Rows::Few   ? ".few"
           : r == Rows::Short ? ".short"
                              : "";
}

// `s` built for row class `rows`: the class's suffix on its name when its constants differ from
// those of the same spec built for any row count (`any`), else `any` itself, so matrices whose
// row count changes nothing share one specialization.
jit::KernelSpec with_row_class(jit::KernelSpec s, jit::KernelSpec any, Rows rows) {
    if (rows == Rows::Any || s.constants == any.constants) return any;
    s.name += row_suffix(rows);
    return s;
}

jit::KernelSpec make_matvec_f_spec(ggml::Type weight_type, int k, int ncols, Rows row_class);

// A decode step's PLE gate (PLE_IN 1) or quantized projection (PLE_IN 2) makes its own input in
// each block, so the launch that made it in global memory is gone from the chain.
jit::KernelSpec with_ple_input(jit::KernelSpec s, int k, PleInput ple) {
    const bool gate = ple == PleInput::Gate;
    s.name += gate ? ".ple_gate" : ".ple_proj";
    s.constants.push_back({"PLE_IN", gate ? 1 : 2});
    if (gate) {  // the post-FFW norm's sum of squares in the norm kernel's order (bit-identical)
        const int norm_threads = rmsnorm_threads_per_row(k);
        s.constants.push_back({"NORM_TPR", norm_threads});
        // The block plays the norm's threads in one trip: every further trip lengthens the
        // prologue, which is on the step's critical path (H200, E4B Q4_K_M tg128: 128 threads,
        // two trips, 455 tokens/s; 256 threads 465.7; 64 threads 415).
        for (auto& [name, value] : s.constants)
            if (name == "THREADS") value = std::max<int64_t>(value, norm_threads);
    } else {
        // One float4 of the GeLU product per thread, for the same reason (E4B Q4_K_M, k 256:
        // 32 threads, two trips, 461.5 tokens/s; 64 threads 465.4; 128 threads 466.0).
        for (auto& [name, value] : s.constants)
            if (name == "THREADS") value = std::max<int64_t>(value, std::min(256, k / 4));
    }
    s.entries.push_back(
        s.family +
        (gate ? (s.family == "matvec_f" ? "_gelu_mul_norm_in" : "_norm_in") : "_gelu_in"));
    return s;
}

// The spec of matvec_spec; moe: for the grouped expert entries (matvec_moe_spec), which keep
// the launch shapes they were measured with.
jit::KernelSpec make_matvec_spec(ggml::Type weight_type, int k, int ncols, MatvecLayout layout,
                                 bool moe, Rows row_class) {
    if (is_float_type(weight_type)) {
        if (layout != MatvecLayout::Ggml)
            throw std::invalid_argument(fmt::format("matvec: {} weights have no split layout",
                                                    ggml::type_name(weight_type)));
        return make_matvec_f_spec(weight_type, k, ncols, moe ? Rows::Any : row_class);
    }
    const char* tag = quant_type_tag(weight_type);
    if (!tag)
        throw ConfigError(fmt::format("no matvec kernel for weight type {} (supported: {})",
                                      ggml::type_name(weight_type), supported_types()));
    check_matvec_shape(fmt::format("matvec_{}", tag), k, ncols);
    if (is_kquant(weight_type)) {
        if (k % 256 != 0)
            throw std::invalid_argument(fmt::format(
                "matvec_{}: input width {} is not a multiple of 256 (whole super-blocks)", tag, k));
    }
    // The K-quant rules below are those of the GGUF super-blocks; a split Q4_K, Q5_K or Q6_K
    // unit is a split Q4_0 unit (16 nibble bytes, 32 activations; Q5_K 4 bytes of fifth bits
    // more, Q6_K 8 bytes of top bits) and takes the split Q4_0 shapes.
    const bool kq_blocks = is_kquant(weight_type) && layout == MatvecLayout::Ggml;
    const bool q4_split = layout == MatvecLayout::Split && weight_type != ggml::Type::Q8_0;
    const int units = matvec_units(weight_type, k, layout);
    const int threads = matvec_threads(units);
    // Batches of 4 iterations, unless a row takes 5..7 iterations: then one batch of all of them,
    // so no batch overhangs the row end (ptxas also spills in one such ragged form: K = 10240,
    // split Q8_0, GeGLU, sm_90).
    const int iters = (units + threads - 1) / threads;
    int unroll = iters > 4 && iters < 8 ? iters : 4;
    // A K-quant unit holds 32 (Q4_K/Q5_K) or 64 (Q6_K) activations per column in registers:
    // fewer batched iterations for them, and fewer again for wide batches, keep the kernels free
    // of spills.
    if (kq_blocks) {
        const int budget = weight_type == ggml::Type::Q6_K ? 2 : 4;
        unroll = std::max(1, std::min(std::min(unroll, budget), budget * 2 / (ncols + 1)));
    }
    // A split K-quant unit carries more scale words and plane pointers per row than Q4_0's:
    // batches of several columns take 2 iterations per batch (Q4_K, Q5_K), Q6_K (8 bytes of top
    // bits more) one (3 spilled 192 bytes in the 8-column Q4_K GeGLU at k 2560 .. 21504, Q6_K with
    // 2 spilled 4-16 bytes on sm_80 at k 4096 .. 16384).
    if (layout == MatvecLayout::Split && is_kquant(weight_type) && ncols > 1)
        unroll = std::min(unroll, weight_type == ggml::Type::Q6_K ? 1 : 2);
    // The split fallbacks' units (a fifth-bit word and a scale word more than Q4_0's) take the
    // batch sizes at which ptxas keeps every spec of the five models free of spills (sm_80 and
    // sm_90, searched over 1, 2 and 4): a dense Q5_0 batch one iteration (4 spilled 4 bytes at
    // k 1536 on sm_90, 2 spilled at k 1536, 3840 and 5376), a Q5_1 expert batch 2 (4 spilled
    // 24 bytes in the GeGLU at k 2816 on sm_90); the rest keep the rule above (Q4_1 with 2 or 1
    // spilled 8-16 bytes on sm_80).
    if (layout == MatvecLayout::Split && ncols > 1) {
        if (weight_type == ggml::Type::Q5_0 && !moe) unroll = 1;
        if (weight_type == ggml::Type::Q5_1 && moe) unroll = std::min(unroll, 2);
    }
    int threads_used = threads, rows = 1;
    // The _geglu entry's own launch shape (threads 0: the spec's).
    struct {
        int threads = 0, rows = 0, unroll = 0;
    } geglu;
    if (kq_blocks && ncols == 1) {
        // Single-column K-quant decode, from an H100 sweep at the E4B shapes (GB/s of plain /
        // GeGLU, 10240 x 2560 and 2560 x 10240): short rows run more, smaller blocks (Q4_K
        // k 2560: 64 threads over 2 rows 1528 / 1845 against 32 threads over 1 row 1409 / 1726;
        // Q6_K k 2560: 64 threads 1403 / 1871 against 32 threads 1277 / 1582), long rows take
        // short batches (Q4_K k 10240: 32 threads, 2 iterations per batch 1558 / 1872 against
        // 64 threads, 4 per batch 1243 / 1571).
        if (k <= 4096) {
            threads_used = 64;
            rows = weight_type == ggml::Type::Q6_K ? 1 : 2;
            unroll = weight_type == ggml::Type::Q6_K ? 4 : 2;
        } else {
            threads_used = 32;
            unroll = 2;
        }
        // Q6_K, H200 sweep (MatvecBench, GB/s): a vocabulary-sized LM head (262144 x 2560) and
        // long rows (2560 x 10240) take 64 threads over 4 rows, one unit per batch: 1725 ->
        // 2216 and 1475 -> 1597 (the LM head of every Q4_K_M / Q5_K_M file is Q6_K). Short rows
        // of few rows keep the shape above (512 x 2560: 4.4 us with it, 3.9 with 4 rows).
        if (weight_type == ggml::Type::Q6_K && !moe && (row_class == Rows::Wide || k > 4096)) {
            threads_used = 64;
            rows = 4;
            unroll = 1;
        }
    }
    // Single-column Q8_0 / Q4_0 decode shapes; split Q4_1 / Q5_0 / Q5_1 take split Q4_0's (a unit
    // of 16 nibble bytes, 32 activations, plus a fifth-bit word and a scale word).
    //  * Split rows of the dense layers, from an H100 sweep (MatvecBench.DISABLED_E4bFfnShapes,
    //    then tg128 with each candidate in the whole model): rows of at least 8192 take 64
    //    threads over 2 rows for Q8_0 (E4B ffn_down k 10240: 2280 -> 2410 GB/s) and 32 threads
    //    over 1 row for Q4_0 (1391 -> 1790), 2 units per batch; shorter rows of more than 32
    //    units take 128 threads over 2 rows (E4B Q8_0 k 2560 plain 1754 -> 2462 GB/s, GeGLU
    //    unchanged; at most 2 iterations there, and 4-unit batches spill from 3 up). tg128 on the
    //    H100, whole model: E4B Q8_0 289.5 -> 308.4, E4B Q4_0 364.1 -> 381.3; 31B Q4_0 123.9 ->
    //    127.8 with 64 x 2 for its long rows (alone 32 x 1 gave 124.4 there and 378.1 on E4B
    //    Q4_0, 64 x 2 122.4 and 375.7).
    //    Re-measured on the H200 (2026-11-26, tg128 whole model, GB/s of the kernel alone from
    //    MatvecBench): split Q4_0 rows of more than 32 units and fewer than 8192 take 64 threads
    //    over 4 rows, one unit per batch (31B k 5376: K/V 4096 rows 1689 -> 2113 GB/s, Q 8192
    //    rows 2473 -> 2929; E4B Q4_0 tg128 482.7 -> 495.7, 31B Q4_0 172.1 -> 173.7); the long
    //    rows of a Tall matrix take 2 rows per 32-thread block (31B ffn_down 5376 x 21504: 3018
    //    -> 3535 GB/s, a single wave instead of 1.3; 31B tg128 172.1 -> 181.4; E4B's 2560-row
    //    ffn_down keeps 1 row: 482.7 -> 480.8 with 2). The split K-quants kept the earlier Q4_0
    //    shapes (with the new ones E4B Q4_K_M went 457.2 -> 450.1) until split Q4_K's plain and
    //    multi entries took 64 x 4 with the GeGLU at 128 x 2 (H200 MatvecBench, 2026-11-29, us
    //    per call: 12B Q|K|V 8192 x 3840 8.81 -> 7.42, E4B attention output 2560 x 2048 4.00 ->
    //    3.67, 3072 x 2560 4.63 -> 4.71; tg128 E4B Q4_K_M 511.2 -> 527.5, 12B Q4_K_M 347.0 ->
    //    358.8). Q5_K and Q6_K measured mixed there (3072 x 2560 +8-10%). All split K-quants'
    //    long rows of a Tall matrix take 2 rows per 32-thread block as well (H200 MatvecBench,
    //    2026-11-29, us per call: 31B ffn_down 5376 x 21504 Q4_K 26.22 -> 20.41, Q5_K 31.92 ->
    //    23.59, Q6_K 29.69 -> 27.52; the global attention output 5376 x 8192 Q4_K 10.39 ->
    //    9.87, Q5_K 11.39 -> 10.61, Q6_K 12.62 -> 13.03). The GeGLU (gate|up pair)
    //    keeps 128 threads over 2 rows in its own entry shape: E4B Q4_0 10240 x 2560 took 12.06
    //    us per call with the new shape against 11.22 (ncu, one decode step), and E4B Q8_0 with
    //    both entries in the new shape went 406.7 -> 405.0. Split Q8_0 takes the same pair of
    //    shapes (plain 64 x 4, GeGLU 128 x 2): tg128 E2B Q8_0 571.5 -> 585.4, E4B Q8_0 409.2 /
    //    406.2 (base, twice) -> 411.1.
    //  * Otherwise (the MoE experts, the GGUF layout, rows of at most 32 units) several rows per
    //    block, so every thread keeps more 16-byte loads in flight: 4 for one unit per thread or
    //    fewer (split Q4_0 k <= 1024: the 26B's 704-wide expert down, whose 32-thread one-row
    //    blocks read 483 GB/s on the H200), 2 for up to 4 units per thread (H200 tg128, before the
    //    rule above: E4B Q4_0 359.2 -> 370.6, 26B-A4B Q4_0 384.4 -> 407.4). Twice that for the
    //    experts (8 and 4 rows): a decode step's 8 experts of 2816 rows ran 5632 blocks of 32
    //    threads, more than the 132 x 32 an H200 holds at once; in one wave the 26B-A4B Q4_0's
    //    tg128 went 555.5 -> 580.9 and 585.4 (H200, 2026-11-29; 8 rows would spill in the
    //    GeGLU entry, 40 bytes on sm_90).
    const bool q32_blocks = spec_util::is_q32_fallback(weight_type) && layout == MatvecLayout::Ggml;
    if (!kq_blocks && !q32_blocks && ncols == 1) {
        const bool dense_split = !moe && layout == MatvecLayout::Split;
        const bool q4_0 = weight_type == ggml::Type::Q4_0;
        if (dense_split && k >= 8192) {
            threads_used = q4_split ? 32 : 64;
            const bool tall_two_rows = (q4_0 || is_kquant(weight_type)) && row_class == Rows::Tall;
            rows = q4_split && !tall_two_rows ? 1 : 2;
            unroll = 2;
        } else if (dense_split && units > 32) {
            // Q8_0, Q4_0, the fallbacks and split Q4_K (measured above); Q5_K / Q6_K keep 128 x 2.
            const bool narrow = !is_kquant(weight_type) || weight_type == ggml::Type::Q4_K;
            threads_used = narrow ? 64 : 128;
            rows = narrow ? 4 : 2;
            unroll = narrow ? 1 : 2;
            // The GeGLU of the narrow types keeps 128 x 2 (above), and Q5_K / Q6_K's the spec's
            // 128 x 2, except over rows of at most 64 units (E2B's d 1536: 48), where 128
            // threads left 80 idle: 32 x 4, one unit per batch, for every type here (H200,
            // tg128 whole model, 2026-11-30: E2B Q4_K_M 673.7 / 672.6 -> 724.3 / 725.4, E2B
            // Q4_0 775.6 / 783.9 -> 819.5 / 826.2, 64 x 4 x 1 715.2 / 720.5 and 814.5 / 819.1,
            // 64 x 2 x 2 701.8 / 704.1 and 770.2 / 771.4; then E2B Q5_K_M 635.1 / 635.7 ->
            // 663.8 / 664.2 and Q6_K 589.7 / 589.1 -> 639.4 / 639.1 with Q5_K / Q6_K too. At
            // E4B's 80 units 32 x 4 lost: Q4_K_M 530.0 / 530.0 -> 523.9 / 522.8). Split Q8_0's
            // 16-element units make 96 at d 1536, which take 32 x 4 x 1 as well (three passes;
            // H200, 2026-11-30, E2B Q8_0 697.5 / 697.5 / 702.9 -> 712.1 / 707.3 / 710.2, 96 x 2
            // x 1 lost: 692.4 / 690.9; E4B Q8_0's 160 units at 160 x 2 x 1 lost too: 483.5 /
            // 482.1 -> 481.6 / 479.5). The K-quants' rows of 65-96 units (E4B's 80, the
            // 26B-A4B's dense MLP 88) take 96 threads over 2 rows, one batch, instead of 128
            // with 48 idle (E4B Q4_K_M 529.8 / 528.0 -> 550.7 / 547.3, 96 x 4 542.1 / 535.7, 96
            // x 1 489.6 / 488.8; 26B-A4B Q4_K_M 541.0 / 540.0 / 540.4 -> 543.3 / 544.1 /
            // 543.3; E4B Q4_0 622.7 / 616.8 -> 624.5 / 623.5 at 96 x 2: not taken).
            if (units <= 64 || (weight_type == ggml::Type::Q8_0 && units <= 96))
                geglu = {32, 4, 1};
            else if (units <= 96 && is_kquant(weight_type))
                geglu = {96, 2, 1};
            else if (narrow)
                geglu = {128, 2, 2};
        } else if (units <= threads) {
            rows = moe ? 8 : 4;
        } else if (moe && is_kquant(weight_type)) {
            // Split K-quant experts (a unit of 16 nibble bytes, scale words, Q5_K's fifth bits,
            // Q6_K's 8 bytes of top bits): 4 rows of one-unit batches; Q6_K's 4-unit batches took
            // 254 registers at k 2816 on sm_90.
            rows = 4;
            unroll = 1;
        } else if (units <= 4 * threads) {
            rows = moe ? 4 : 2;
        }
        const bool short_rows_type =
            q4_0 || weight_type == ggml::Type::Q8_0 || is_kquant(weight_type);
        if (dense_split && short_rows_type && row_class == Rows::Short && k >= 6144) {
            // E2B's FFN down projections (1536 rows of 6144 / 12288): 64 threads over 1 row, 2
            // units per batch (H200, tg128 whole model, E2B, 2026-11-30). Q4_0 k 12288 32 x 1 x 2
            // 843.7 / 844.9 / 838.8 -> 866.4 (+2.8%), 128 x 1 x 1 862.5, 64 x 2 x 1 852.9, 32 x
            // 2 x 1 819.1; Q4_0 k 6144 64 x 4 x 1 -> 853.6 (+1.3%), 32 x 2 x 2 850.6, 128 x 1 x
            // 1 848.7, 32 x 4 x 1 833.7. Q4_K_M (Q4_K and Q6_K downs) 756.4 / 748.1 / 748.2 /
            // 751.1 -> 772.3 / 768.0 / 760.7 (Q6_K alone 763.9 / 763.9, Q4_K alone 753.7 /
            // 761.6); Q5_K_M 681.7 / 682.8 -> 692.3 / 689.1; Q8_0 k 6144 64 x 4 x 1 727.5 / 729.5
            // / 724.1 / 722.0 -> 736.9 / 737.0 / 733.4 (128 x 1 x 1 737.8 / 734.3 / 735.7), k
            // 12288 64 x 2 x 2 729.5 / 725.0 -> 725.9 (kept by the one rule). E4B's 2560 rows of
            // 10240 keep 32 x 1 x 2 (Q4_0 635.1 / 628.8 against 621.0 at 64 x 1 x 2).
            // The _geglu entry, which no model launches at these widths, keeps the shape it had
            // (at the plain shape, split Q4_0's spilled 8 bytes at k 6144 on sm_90).
            if (geglu.threads == 0) geglu = {threads_used, rows, unroll};
            threads_used = 64;
            rows = 1;
            unroll = 2;
        }
    }
    jit::KernelSpec s;
    s.family = fmt::format("matvec_{}", tag);
    s.name = fmt::format("matvec_{}.k{}{}{}", tag, k, ncols > 1 ? fmt::format(".b{}", ncols) : "",
                         layout == MatvecLayout::Split ? ".split" : "");
    s.constants = {{"K", k},
                   {"LAYOUT", layout == MatvecLayout::Split ? 1 : 0},
                   {"THREADS", threads_used},
                   {"ROWS", rows},
                   {"NCOLS", ncols},
                   {"UNROLL", unroll}};
    if (geglu.threads > 0)
        s.constants.insert(s.constants.end(), {{"GEGLU_THREADS", geglu.threads},
                                               {"GEGLU_ROWS", geglu.rows},
                                               {"GEGLU_UNROLL", geglu.unroll}});
    const std::string base = fmt::format("matvec_{}", tag);
    s.entries = {base, base + "_add", base + "_geglu"};
    // The multi entry (a layer's Q, K and V in one launch) selects its matrix at run time: a few
    // registers more, which the batched split K-quants' larger units do not have (8 bytes
    // spilled on sm_80).
    if (!moe && (ncols == 1 || !(is_kquant(weight_type) && layout == MatvecLayout::Split))) {
        s.constants.push_back({"MULTI", 1});
        s.entries.push_back(base + "_multi");
    }
    if (layout == MatvecLayout::Split) s.entries.push_back(repack_entry(weight_type));
    s.priority = 0;
    return s;
}

jit::KernelSpec make_matvec_f_spec(ggml::Type weight_type, int k, int ncols, Rows row_class) {
    if (!is_float_type(weight_type))
        throw ConfigError(fmt::format("matvec_f: weight type {} is not f32, f16 or bf16",
                                      ggml::type_name(weight_type)));
    const std::string tag = ggml::type_name(weight_type);
    check_matvec_shape("matvec_f." + tag, k, ncols);
    // About 10 units (16-byte loads) per thread, 32 to 128 threads; at 128 threads each block
    // takes two rows, which halves the activation reads per weight byte. Measured on the H200 at
    // E4B shapes (bf16 / f16, GB/s of the 4.27 TB/s copy bandwidth): 10240 x 2560 (32 threads)
    // ~3.35-3.4 TB/s, GeGLU ~3.8-3.9; 2560 x 10240 (128 threads, 2 rows) ~3.3-3.5; the
    // previous quarter-of-the-units rule gave 2.7-3.2 on the same shapes.
    const int units = matvec_units(weight_type, k, MatvecLayout::Ggml);
    int threads = std::clamp(next_pow2(units / 10), 32, 128);
    int rows = threads >= 128 ? 2 : 1;
    // Each column keeps a unit's 4 or 8 fp32 activations per batch step in registers: fewer
    // batched iterations for wide batches keep the kernel free of spills.
    int unroll = ncols <= 2 ? 4 : ncols <= 4 ? 2 : 1;
    // Single-column shapes of the small matrices (the PLE gate and projection, the MoE router),
    // H200 sweep (MatvecBench, f32, us per launch back to back): rows of at most 64 units take
    // 4 rows per block (2560 x 256: 4.88 -> 3.93 with 32 threads; 3.46 with 64, but 32 keeps
    // each thread's units and their order those of the batched spec, so a sequence decoded
    // alone and in a batch sums alike); matrices of few rows (< 1024) split each row over 256
    // threads in 8-unit batches (256 x 2560: 4.43 -> 3.50), where the rule above, measured on
    // rows of thousands, leaves most SMs idle.
    if (ncols == 1 && units <= 64) {
        rows = 4;
        unroll = 1;
    } else if (ncols == 1 && row_class == Rows::Few && units >= 256) {
        threads = 256;
        rows = 1;
        unroll = 8;
    }
    jit::KernelSpec s;
    s.family = "matvec_f";
    s.name = fmt::format("matvec_f.{}.k{}{}", tag, k, ncols > 1 ? fmt::format(".b{}", ncols) : "");
    s.constants = {{"K", k},
                   {"WTYPE", static_cast<int64_t>(weight_type)},
                   {"THREADS", threads},
                   {"ROWS", rows},
                   {"NCOLS", ncols},
                   {"UNROLL", unroll}};
    s.entries = {"matvec_f", "matvec_f_add", "matvec_f_geglu", "matvec_f_gelu_mul"};
    s.priority = 0;
    return s;
}

}  // namespace

std::string repack_entry(ggml::Type t) {
    const char* tag = quant_type_tag(t);
    if (!tag || !spec_util::has_split(t))
        throw std::invalid_argument(
            fmt::format("{} has no split layout to repack into", ggml::type_name(t)));
    return std::string("repack_") + tag;
}

jit::KernelSpec with_decode_prefetch(jit::KernelSpec s, int sixteenths) {
    if (sixteenths < 0 || sixteenths > 16)
        throw std::invalid_argument(
            fmt::format("matvec L2 prefetch: {} sixteenths of a row (0..16)", sixteenths));
    if (sixteenths == 0 || spec_has_constant(s, "MOE") || spec_constant(s, "NCOLS") != 1) return s;
    s.constants.push_back({"L2_PREFETCH", sixteenths});
    return s;
}

MatvecShapes parse_matvec_shapes(std::string_view text) {
    MatvecShapes out;
    size_t p = 0;
    while (p < text.size()) {
        const size_t e = std::min(text.find(',', p), text.size());
        const std::string entry(text.substr(p, e - p));
        p = e + 1;
        if (entry.empty()) continue;
        auto bad = [&](const std::string& why) {
            return ConfigError(fmt::format(
                "GEMMAJIT_MATVEC_SHAPE: '{}': {} (expected <type>.k<K>[.geglu]=<threads>x<rows>x"
                "<unroll>, e.g. q4_k.k2560.geglu=96x2x1)",
                entry, why));
        };
        const size_t eq = entry.find('='), dot = entry.find(".k");
        if (eq == std::string::npos || dot == std::string::npos || dot > eq)
            throw bad("not of the form");
        MatvecShapeOverride o;
        const auto t = ggml::type_from_name(entry.substr(0, dot));
        if (!t || !has_matvec(*t)) throw bad("no matvec reads that type");
        o.type = *t;
        std::string key = entry.substr(dot + 2, eq - dot - 2);
        if (key.ends_with(".geglu")) {
            o.geglu = true;
            key.resize(key.size() - std::strlen(".geglu"));
        }
        char tail = 0;
        if (std::sscanf(key.c_str(), "%d%c", &o.k, &tail) != 1 || o.k <= 0 || o.k % 32 != 0)
            throw bad("the width K is not a positive multiple of 32");
        MatvecShape& m = o.shape;
        if (std::sscanf(entry.c_str() + eq + 1, "%dx%dx%d%c", &m.threads, &m.rows, &m.unroll,
                        &tail) != 3)
            throw bad("the shape is not <threads>x<rows>x<unroll>");
        if (m.threads < 32 || m.threads > 1024 || m.threads % 32 != 0)
            throw bad("threads must be a multiple of 32 from 32 to 1024");
        if (m.rows < 1 || m.rows > 8) throw bad("rows must be 1 to 8");
        if (m.unroll < 1 || m.unroll > 8) throw bad("unroll must be 1 to 8");
        if (o.geglu && is_float_type(o.type))
            throw bad("float matvecs run their GeGLU in the spec's own shape");
        for (const auto& prev : out)
            if (prev.type == o.type && prev.k == o.k && prev.geglu == o.geglu)
                throw bad("given twice");
        out.push_back(o);
    }
    return out;
}

jit::KernelSpec with_matvec_shapes(jit::KernelSpec s, const MatvecShapes& shapes,
                                   std::vector<bool>* applied) {
    if (shapes.empty()) return s;
    if (spec_has_constant(s, "MOE") || spec_constant(s, "NCOLS") != 1) return s;
    const int k = int(spec_constant(s, "K"));
    std::string plain_suffix, geglu_suffix;
    for (size_t i = 0; i < shapes.size(); ++i) {
        const MatvecShapeOverride& o = shapes[i];
        if (o.k != k) continue;
        const std::string tag = ggml::type_name(o.type);
        const bool ours = is_float_type(o.type) ? s.name.starts_with("matvec_f." + tag + ".")
                                                : s.family == "matvec_" + tag;
        if (!ours) continue;
        const MatvecShape& m = o.shape;
        // A PLE gate's _norm_in entry plays the norm kernel's threads: it needs as many.
        if (!o.geglu && spec_has_constant(s, "NORM_TPR") &&
            m.threads < spec_constant(s, "NORM_TPR"))
            continue;
        const std::string prefix = o.geglu ? "GEGLU_" : "";
        set_spec_constant(s, prefix + "THREADS", m.threads);
        set_spec_constant(s, prefix + "ROWS", m.rows);
        set_spec_constant(s, prefix + "UNROLL", m.unroll);
        (o.geglu ? geglu_suffix : plain_suffix) =
            fmt::format(".{}{}x{}x{}", o.geglu ? 'g' : 't', m.threads, m.rows, m.unroll);
        if (applied) applied->at(i) = true;
    }
    s.name += plain_suffix + geglu_suffix;
    return s;
}

jit::KernelSpec matvec_push_spec(jit::KernelSpec s, int ranks) {
    if (spec_has_constant(s, "MOE") || spec_has_constant(s, "PLE_IN") ||
        spec_constant(s, "NCOLS") != 1)
        throw std::invalid_argument(fmt::format(
            "matvec: {} has no push form (a single-column dense decode spec has)", s.name));
    if (ranks < 2 || ranks > 8)
        throw std::invalid_argument(
            fmt::format("matvec: a push to {} ranks (2..8 supported)", ranks));
    // The module holds the push entry alone: the multi entry's constant goes.
    std::erase_if(s.constants, [](const auto& c) { return c.first == "MULTI"; });
    s.name += fmt::format(".push{}", ranks);
    s.constants.push_back({"PUSH", ranks});
    s.entries = {s.family + "_push"};
    return s;
}

bool has_multi_v(ggml::Type qk, ggml::Type v) {
    return (qk == ggml::Type::Q4_K || qk == ggml::Type::Q5_K) && v == ggml::Type::Q6_K;
}

jit::KernelSpec matvec_multi_v_spec(jit::KernelSpec s, ggml::Type v) {
    const bool kquant_family = s.family == "matvec_q4_k" || s.family == "matvec_q5_k";
    if (!spec_has_constant(s, "MULTI") || !kquant_family || spec_constant(s, "NCOLS") != 1)
        throw std::invalid_argument(fmt::format(
            "matvec: {} has no mixed multi form (a Q4_K / Q5_K decode spec with _multi has)",
            s.name));
    if (v != ggml::Type::Q6_K)
        throw std::invalid_argument(
            fmt::format("matvec: {}: no multi entry reads a {} V", s.name, ggml::type_name(v)));
    // The module holds the multi entry alone: the other entries' constants go.
    std::erase_if(s.constants, [](const auto& c) {
        return c.first == "MULTI" || c.first.starts_with("GEGLU_");
    });
    s.name += fmt::format(".v_{}", ggml::type_name(v));
    s.constants.push_back({"MULTI_V", 1});
    s.entries = {s.family + "_multi"};
    return s;
}

std::optional<jit::KernelSpec> qkv_multi_v_spec(const jit::KernelSpec& q_spec, ggml::Type q,
                                                ggml::Type v) {
    if (!has_multi_v(q, v) || !spec_has_entry(q_spec, q_spec.family + "_multi"))
        return std::nullopt;
    return matvec_multi_v_spec(q_spec, v);
}

MatvecLaunch matvec_launch(const jit::KernelSpec& spec, bool geglu) {
    auto get = [&](const char* name, const char* geglu_name) {
        for (const auto& [n, v] : spec.constants)
            if (geglu && n == geglu_name) return unsigned(v);
        return unsigned(spec_constant(spec, name));
    };
    return {get("THREADS", "GEGLU_THREADS"), get("ROWS", "GEGLU_ROWS")};
}

uint64_t matrix_bytes(ggml::Type type, MatvecLayout layout, uint64_t rows, uint64_t k) {
    if (layout == MatvecLayout::Split && type == ggml::Type::Q4_K)
        return rows * (k / 256) * 148;  // nibbles 128 + d|dmin 4 + eight sc|m pairs 16
    if (layout == MatvecLayout::Split && type == ggml::Type::Q5_K)
        return rows * (k / 256) * 180;  // nibbles 128 + fifth bits 32 + d|dmin 4 + sc|m 16
    const std::optional<uint64_t> row = ggml::row_bytes(type, k);
    if (!row)
        throw std::invalid_argument(
            fmt::format("{} rows of {} elements are not whole blocks", ggml::type_name(type), k));
    return rows * *row;
}

jit::KernelSpec matvec_spec(ggml::Type weight_type, int k, int ncols, MatvecLayout layout,
                            int n_rows, PleInput ple) {
    const Rows rows = row_class(n_rows);
    jit::KernelSpec s =
        with_row_class(make_matvec_spec(weight_type, k, ncols, layout, false, rows),
                       make_matvec_spec(weight_type, k, ncols, layout, false, Rows::Any), rows);
    // Not for the K-quants' GGUF blocks: their larger units leave no registers for it (Q6_K
    // spilled 4 bytes on sm_80).
    const bool kq_blocks = is_kquant(weight_type) && layout == MatvecLayout::Ggml;
    // A float projection reads the fp32 GeLU product itself (as matvec_f_spec plans it).
    const bool entry =
        ncols == 1 && !kq_blocks &&
        (ple == PleInput::Gate || (ple == PleInput::Proj && !is_float_type(weight_type)));
    return entry ? with_ple_input(std::move(s), k, ple) : s;
}

jit::KernelSpec matvec_f_spec(ggml::Type weight_type, int k, int ncols, int n_rows, PleInput ple) {
    const Rows rows = row_class(n_rows);
    jit::KernelSpec s = with_row_class(make_matvec_f_spec(weight_type, k, ncols, rows),
                                       make_matvec_f_spec(weight_type, k, ncols, Rows::Any), rows);
    // A float projection reads the fp32 GeLU product itself: only the gate has an entry.
    return ple == PleInput::Gate && ncols == 1 ? with_ple_input(std::move(s), k, ple) : s;
}

jit::KernelSpec matvec_moe_spec(ggml::Type weight_type, int k, int ncols, MatvecLayout layout) {
    // A group's column map takes 2 * ncols registers more than the dense matvec: float weights
    // (8 fp32 activations per column and unit) keep groups of at most 4 slots (8 spill at f16 /
    // bf16 k 2816, GeGLU).
    if (is_float_type(weight_type)) ncols = std::min(ncols, 4);
    jit::KernelSpec s = make_matvec_spec(weight_type, k, ncols, layout, true, Rows::Any);
    s.name += ".moe";
    s.constants.push_back({"MOE", 1});
    const std::string base = s.family;  // matvec_<tag> or matvec_f
    s.entries = {base + "_moe", base + "_moe_geglu"};
    // The split layout's upload repacks each expert's matrices with the module's repack entry.
    if (layout == MatvecLayout::Split) s.entries.push_back(repack_entry(weight_type));
    return s;
}

}  // namespace gj::gemma4
