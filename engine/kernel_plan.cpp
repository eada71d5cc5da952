// Kernel plan: which template specializations a Gemma 4 model needs for its decode path, and the
// launch-geometry choices (threads, rows per block) baked into each of them.
#include "engine/kernel_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>

namespace gj::gemma4 {

namespace {

int round_up(int v, int m) {
    return (v + m - 1) / m * m;
}

int next_pow2(int v) {
    int p = 1;
    while (p < v) p *= 2;
    return p;
}

const char* matvec_type_tag(ggml::Type t) {
    switch (t) {
        case ggml::Type::Q8_0:
            return "q8_0";
        case ggml::Type::Q4_0:
            return "q4_0";
        default:
            return nullptr;
    }
}

// Units (the per-thread work items of matvec_common.cuh) per row.
int matvec_units(ggml::Type t, int k, MatvecLayout layout) {
    if (layout == MatvecLayout::Split) return t == ggml::Type::Q8_0 ? k / 16 : k / 32;
    return k / (t == ggml::Type::Q8_0 ? 8 : 16);
}

}  // namespace

jit::KernelSpec rmsnorm_spec(int n, bool weight, bool quant, bool add) {
    if (n <= 0 || n % 4 != 0)
        throw std::invalid_argument(
            fmt::format("rmsnorm: width {} is not a positive multiple of 4", n));
    if (quant && n % 32 != 0)
        throw std::invalid_argument(
            fmt::format("rmsnorm: quantized output needs a width that is a "
                        "multiple of 32, got {}",
                        n));
    if (quant && add)
        throw std::invalid_argument(
            "rmsnorm: quantized output and residual add exclude each other");
    if (n > 16 * 1024 * 4)
        throw std::invalid_argument(
            fmt::format("rmsnorm: width {} is above the 65536 supported", n));
    // About 4 float4 per thread. Narrow rows (head dims) share a warp between several rows;
    // wide rows (d_model) get a block each.
    int tpr, rpb;
    if (n <= 512) {
        tpr = std::clamp(next_pow2((n + 15) / 16), 8, 32);
        rpb = 128 / tpr;
    } else {
        tpr = std::min(1024, round_up((n + 15) / 16, 32));
        rpb = 1;
    }
    jit::KernelSpec s;
    s.family = "rmsnorm";
    s.name = fmt::format("rmsnorm.n{}.w{}{}{}", n, weight ? 1 : 0, quant ? ".q8" : "",
                         add ? ".add" : "");
    s.constants = {{"N", n},
                   {"TPR", tpr},
                   {"RPB", rpb},
                   {"WEIGHT", weight ? 1 : 0},
                   {"QUANT", quant ? 1 : 0},
                   {"ADD", add ? 1 : 0}};
    s.entries = {"rmsnorm"};
    s.priority = 0;
    return s;
}

jit::KernelSpec matvec_spec(ggml::Type weight_type, int k, int ncols, MatvecLayout layout) {
    const char* tag = matvec_type_tag(weight_type);
    if (!tag)
        throw ConfigError(fmt::format("no matvec kernel for weight type {} (supported: q8_0, q4_0)",
                                      ggml::type_name(weight_type)));
    if (k <= 0 || k % 64 != 0)
        throw std::invalid_argument(
            fmt::format("matvec_{}: input width {} is not a positive multiple of 64", tag, k));
    if (ncols < 1 || ncols > 8)
        throw std::invalid_argument(
            fmt::format("matvec_{}: {} columns (1..8 supported)", tag, ncols));
    // Threads split a row's units; enough of them per thread (>= 4) to keep UNROLL batches of
    // loads in flight, and not more threads than a quarter of the units.
    const int units = matvec_units(weight_type, k, layout);
    const int threads = std::clamp(next_pow2(units / 4 + 1) / 2, 32, 256);
    jit::KernelSpec s;
    s.family = fmt::format("matvec_{}", tag);
    s.name = fmt::format("matvec_{}.k{}{}{}", tag, k, ncols > 1 ? fmt::format(".b{}", ncols) : "",
                         layout == MatvecLayout::Split ? ".split" : "");
    s.constants = {{"K", k},
                   {"LAYOUT", layout == MatvecLayout::Split ? 1 : 0},
                   {"THREADS", threads},
                   {"ROWS", 1},
                   {"NCOLS", ncols},
                   {"UNROLL", 4}};
    const std::string base = fmt::format("matvec_{}", tag);
    s.entries = {base, base + "_add", base + "_geglu"};
    if (layout == MatvecLayout::Split) s.entries.push_back(fmt::format("repack_{}", tag));
    s.priority = 0;
    return s;
}

jit::KernelSpec quantize_spec() {
    jit::KernelSpec s;
    s.family = "quantize_q8_1";
    s.name = "quantize_q8_1";
    s.constants = {{"THREADS", 256}};
    s.entries = {"quantize_q8_1"};
    s.priority = 0;
    return s;
}

int64_t spec_constant(const jit::KernelSpec& spec, std::string_view name) {
    for (const auto& [n, v] : spec.constants)
        if (n == name) return v;
    throw std::out_of_range(fmt::format("kernel spec {} has no constant {}", spec.name, name));
}

std::vector<jit::KernelSpec> build_kernel_plan(const Config& cfg, ggml::Type weight_type) {
    if (!matvec_type_tag(weight_type))
        throw ConfigError(
            fmt::format("model {}: no matvec kernel for weight type {} (supported: q8_0, q4_0)",
                        cfg.name, ggml::type_name(weight_type)));
    if (cfg.d_model <= 0 || cfg.n_heads <= 0 || cfg.layers.empty())
        throw ConfigError(
            fmt::format("model {}: config has no shape (d_model {}, heads {}, {} "
                        "layers)",
                        cfg.name, cfg.d_model, cfg.n_heads, cfg.layers.size()));

    std::vector<jit::KernelSpec> plan;
    std::set<std::string> names;
    auto add = [&](jit::KernelSpec s) {
        if (names.insert(s.name).second) plan.push_back(std::move(s));
    };
    const int d = cfg.d_model;

    // Norms over the residual stream: pre-norms feeding matvecs quantize their output
    // (attn_norm, ffn_norm, output_norm; MoE pre_ffw_norm_2); post-norms add into the stream
    // (post_attention_norm, post_ffw_norm, PLE post_norm). The MoE block also has a plain
    // weighted norm (post_ffw_norm_1/2) and the router's weightless one.
    add(rmsnorm_spec(d, true, true, false));
    add(rmsnorm_spec(d, true, false, true));
    if (cfg.is_moe()) {
        add(rmsnorm_spec(d, true, false, false));
        add(rmsnorm_spec(d, false, false, false));
    }
    // Per-head norms: Q/K norm (weighted, shared across heads) on every layer, V-norm
    // (weightless) on layers that own their KV.
    for (const auto& l : cfg.layers) {
        if (l.head_dim <= 0)
            throw ConfigError(
                fmt::format("model {}: a layer has head_dim {}", cfg.name, l.head_dim));
        add(rmsnorm_spec(l.head_dim, true));
        if (l.has_kv) add(rmsnorm_spec(l.head_dim, false));
    }
    // PLE: RMS-normalize each layer's P-slice of the projected context.
    if (cfg.ple_dim > 0) add(rmsnorm_spec(cfg.ple_dim, true));

    // Activations not produced by a quantizing norm (attention output, GeGLU output, PLE gate).
    add(quantize_spec());

    // One matvec per distinct input width: d (q/k/v, gate/up, PLE inp_gate, LM head), the
    // attention output width per layer type (o-proj), each FFN width (down; E2B's double-wide
    // layers and the MoE model's dense MLP included) and P (PLE proj).
    std::set<int> widths = {d};
    for (size_t i = 0; i < cfg.layers.size(); ++i) {
        widths.insert(cfg.q_dim(static_cast<int>(i)));
        if (cfg.layers[i].ffn_dim > 0) widths.insert(cfg.layers[i].ffn_dim);
    }
    if (cfg.ple_dim > 0) widths.insert(cfg.ple_dim);
    for (int k : widths) add(matvec_spec(weight_type, k));
    return plan;
}

}  // namespace gj::gemma4
