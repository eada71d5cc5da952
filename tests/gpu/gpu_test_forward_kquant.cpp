// The GPU forward pass on K-quant files, written with the per-tensor type mixes of llama.cpp's
// quantizer (Q4_K_M: Q4_K matrices, Q6_K for some attn_v / ffn_down and the tied embedding;
// Q5_K_M; pure Q6_K), against the CPU reference: the K-quants stay K-quants on the GPU (repacked
// into their split layouts; the model's bytes within 5% of the file's), decode steps read them
// with the K-quant matvecs, and prefill chunks multiply F16 copies made per chunk with cuBLAS; the
// 32-block fallback types (Q4_1, Q5_0, Q5_1) the same way. Also: a tensor type no kernel reads
// (IQ4_NL) is dequantized to F16 on upload with a one-line notice.
// Tolerance: as for Q8_0/Q4_0 weights (gpu_test_forward.cpp): the activations are quantized to
// int8 per 32 values before every matvec, and K/V are stored as fp16: 3e-2 of max |logit|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "engine/gguf/dequant.h"
#include "engine/gguf/half.h"
#include "engine/gguf/quantize.h"
#include "engine/gguf/reader.h"
#include "engine/gguf/writer.h"
#include "engine/gpu/gpu_model.h"
#include "engine/gpu/session.h"
#include "tests/support/gpu_forward_check.h"
#include "tests/support/test_env.h"

using gj::gemma4::GpuModel;
using gj::gemma4::GpuModelOptions;
using gj::gemma4::GpuSession;
using gj::gemma4::MatvecLayout;
namespace ggml = gj::ggml;
using namespace gj::test;  // synth, load_gpu, cpu_logits, expect_agree, ...

namespace {

constexpr float kTolQuant = 3e-2f;

// Bytes of every tensor of a GGUF file.
uint64_t file_tensor_bytes(const std::filesystem::path& path) {
    uint64_t n = 0;
    for (const auto& t : gj::gguf::File::open(path)->tensors()) n += t.n_bytes;
    return n;
}

// Loads with the progress lines collected.
std::unique_ptr<GpuModel> load_noting(const std::filesystem::path& path, int context, int chunk,
                                      const gj::jit::Flags& f, std::vector<std::string>& lines) {
    GpuModelOptions o;
    o.context = context;
    o.prefill_chunk = chunk;
    o.flags = &f;
    o.progress = [&](const std::string& line) { lines.push_back(line); };
    return GpuModel::load(path, o);
}

int f16_notices(const std::vector<std::string>& lines) {
    int n = 0;
    for (const auto& l : lines) n += l.find("dequantized to F16") != std::string::npos;
    return n;
}

// The model holds the file's K-quants as they are: matrices of the expected types, each read by
// the matvec of its type, no F16 fallback, and about the file's bytes on the GPU.
void expect_kquants_in_place(const GpuModel& m, const std::filesystem::path& path,
                             const std::vector<std::string>& lines, ggml::Type matrices,
                             ggml::Type embeddings) {
    EXPECT_EQ(f16_notices(lines), 0) << "a K-quant tensor was dequantized on upload";
    EXPECT_EQ(m.token_embd().type, embeddings);
    EXPECT_EQ(m.lm_head().type, embeddings);
    int kquant = 0;
    for (const auto* g : m.matrices()) {
        if (g->type != matrices && g->type != ggml::Type::Q6_K) continue;
        ++kquant;
        EXPECT_TRUE(g->spec_decode.starts_with("matvec_" + ggml::type_name(g->type) + ".k"))
            << g->name << ": " << g->spec_decode;
        // K-quant matrices are repacked to the split layout (GEMMAJIT_REPACK, on by default),
        // the tied LM head with the embedding table it shares.
        EXPECT_EQ(g->layout, MatvecLayout::Split) << g->name;
        EXPECT_NE(g->spec_decode.find(".split"), std::string::npos) << g->spec_decode;
    }
    EXPECT_GE(kquant, 7 * m.config().n_layers) << "layer matrices kept as K-quants";
    EXPECT_EQ(m.token_embd().layout, MatvecLayout::Split) << "the tied LM head's table";
    EXPECT_EQ(m.lm_head().ptr, m.token_embd().ptr) << "the LM head reads the gather's table";
    EXPECT_EQ(m.layers()[0].q.type, matrices);
    const double on_gpu = double(m.memory().weights + m.memory().ple_table);
    const double in_file = double(file_tensor_bytes(path));
    EXPECT_LT(on_gpu, 1.05 * in_file) << "GPU bytes " << on_gpu << ", file " << in_file;
    EXPECT_GT(on_gpu, 0.95 * in_file) << "GPU bytes " << on_gpu << ", file " << in_file;
}

// A copy of `src` with per_layer_token_embd requantized to `type` (from its dequantized rows).
std::filesystem::path with_ple_table_as(const std::filesystem::path& src,
                                        const std::filesystem::path& dst, ggml::Type type) {
    auto in = gj::gguf::File::open(src);
    gj::gguf::Writer w;
    for (const auto& [key, value] : in->metadata()) w.set(key, value);
    const std::string table = "per_layer_token_embd.weight";
    for (const auto& t : in->tensors())
        w.add_tensor(t.name, t.name == table ? type : t.type, t.dims);
    w.begin(dst);
    for (const auto& t : in->tensors()) {
        if (t.name != table) {
            w.write_tensor_data(t.name, {t.data, size_t(t.n_bytes)});
            continue;
        }
        const uint64_t cols = t.dims[0], row_bytes = *ggml::row_bytes(type, cols);
        std::vector<uint8_t> q(row_bytes * t.rows());
        if (ggml::can_quantize(type)) {
            const std::vector<float> values = gj::ggml::dequantize_tensor(t);
            for (uint64_t r = 0; r < t.rows(); ++r)
                ggml::quantize_row(type, &values[r * cols], &q[r * row_bytes], int64_t(cols));
        } else {  // IQ4_NL (no quantizer here): random level indices, a small fp16 scale
            const size_t block = ggml::type_info(type).block_bytes;
            uint32_t r = 7;
            for (size_t i = 0; i < q.size(); ++i)
                q[i] = uint8_t((r = r * 1664525u + 1013904223u) >> 24);
            const uint16_t d = gj::f32_to_f16(1.0f / 256.0f);
            for (size_t b = 0; b < q.size(); b += block) std::memcpy(&q[b], &d, 2);
        }
        w.write_tensor_data(t.name, q);
    }
    w.finish();
    return dst;
}

}  // namespace

// Every mix on the tiny-256 preset (E4B structure, all widths whole super-blocks): one-chunk
// prefill through the dequantized cuBLAS products (each layer's copies made ahead on their own
// stream, bit-identical to making them in order), decode steps through the K-quant matvecs
// (graphs), and the batched K-quant matvecs (GEMMAJIT_BLAS=0) all against the CPU reference.
TEST(GpuKQuant, MixesMatchTheCpuReference) {
    GJ_REQUIRE_GPU();
    ScratchDir dir("gpu-kquant");
    struct Mix {
        const char* name;
        ggml::Type matrices, embeddings;
    };
    for (const Mix& mix : {Mix{"q4_k_m", ggml::Type::Q4_K, ggml::Type::Q6_K},
                           Mix{"q5_k_m", ggml::Type::Q5_K, ggml::Type::Q6_K},
                           Mix{"q6_k", ggml::Type::Q6_K, ggml::Type::Q6_K}}) {
        SCOPED_TRACE(mix.name);
        const auto path = synth_mix(dir, "tiny-256", mix.name);
        const auto f = flags();
        std::vector<std::string> lines;
        auto model = load_noting(path, 256, 64, f, lines);
        expect_kquants_in_place(*model, path, lines, mix.matrices, mix.embeddings);
        const int V = model->config().vocab_size;
        const auto tokens = test_tokens(5 * model->config().sliding_window, V);
        const auto ref = cpu_logits(path, tokens);

        GpuSession s(*model);
        const auto ahead = s.prefill_logits(tokens);
        expect_agree(ref, ahead, V, kTolQuant, std::string(mix.name) + " one-chunk prefill vs CPU");
        EXPECT_GT(s.path_counts().dequant, 0u) << "no K-quant matrix was dequantized for cuBLAS";
        // A layer with K and V multiplies its Q, K (and V) copies in one product.
        // Every layer multiplies its FFN gate and up copies in one product, too.
        uint64_t merged = 0, merged_copies = 0, gate_up = 0;
        for (const auto& g : model->layers()) {
            merged += g.qkv_one_product;
            merged_copies += g.qkv_one_product ? (g.v.present() ? 3 : 2) : 0;
            gate_up += g.gate.up_follows;
        }
        EXPECT_GT(merged, 0u) << "no layer's Q, K and V copies lie side by side";
        EXPECT_EQ(s.path_counts().qkv_merged, merged)
            << "not every such layer ran its Q, K and V as one cuBLAS product";
        EXPECT_EQ(gate_up, uint64_t(model->config().n_layers))
            << "a layer's FFN gate and up copies do not lie side by side";
        EXPECT_EQ(s.path_counts().gate_up_merged, gate_up)
            << "not every such layer ran its gate and up as one cuBLAS product";
        EXPECT_EQ(s.path_counts().dequant + merged + gate_up,
                  s.path_counts().blas - 1 + merged_copies + 2 * gate_up)
            << "every cuBLAS product but the F32 PLE projection reads dequantized copies";
        EXPECT_EQ(s.path_counts().dequant_ahead, uint64_t(model->config().n_layers))
            << "the layers' copies were not made ahead on the dequantization stream";
        // Every layer but the last runs its products beside the next layer's copies, leaving them
        // SMs (GEMMAJIT_COPY_SMS, by default at this chunk length).
        if (model->blas()->sm_target_supported()) {
            EXPECT_GT(s.path_counts().blas_beside_copies, 0u)
                << "no cuBLAS product left SMs to the copies made beside it";
        }
        EXPECT_EQ(s.path_counts().geglu_f16, uint64_t(model->config().n_layers))
            << "the FFN GeGLUs were not written as the down products' f16 input";
        // Every pre-norm but the output norm (the LM head reads Q8_1): attn_norm and ffn_norm.
        EXPECT_EQ(s.path_counts().norm_f16, uint64_t(2 * model->config().n_layers))
            << "the norms did not write the f16 input of the cuBLAS products";
        EXPECT_EQ(s.path_counts().attn_f16, uint64_t(model->config().n_layers))
            << "the attention outputs were not written in f16 for the output projections";
        // Made in order on one stream instead: the same products of the same copies, bit for bit
        // (a copy read before it was complete, or overwritten while read, would differ). Both on
        // the whole GPU: an SM-count target may give cuBLAS another kernel, so other last bits.
        auto whole = load_gpu(path, 256, 64, flags({{"GEMMAJIT_COPY_SMS", "0"}}));
        GpuSession beside(*whole);
        const auto ahead_whole = beside.prefill_logits(tokens);
        EXPECT_EQ(beside.path_counts().dequant_ahead, uint64_t(model->config().n_layers));
        EXPECT_EQ(beside.path_counts().blas_beside_copies, 0u);
        expect_agree(ahead, ahead_whole, V, kTolQuant,
                     std::string(mix.name) + " copies beside products on all SMs vs fewer");
        // Q, K and V as three products instead (K and V on the side streams).
        auto apart = load_gpu(path, 256, 64, flags({{"GEMMAJIT_MERGE_QKV", "0"}}));
        GpuSession three(*apart);
        expect_agree(ahead, three.prefill_logits(tokens), V, kTolQuant,
                     std::string(mix.name) + " one Q|K|V product vs three");
        EXPECT_EQ(three.path_counts().qkv_merged, 0u);
        EXPECT_EQ(three.path_counts().dequant, s.path_counts().dequant);
        // Gate and up as two products instead, the GeGLU reading two buffers.
        auto two = load_gpu(path, 256, 64, flags({{"GEMMAJIT_MERGE_GATE_UP", "0"}}));
        GpuSession gate_apart(*two);
        expect_agree(ahead, gate_apart.prefill_logits(tokens), V, kTolQuant,
                     std::string(mix.name) + " one gate|up product vs two");
        EXPECT_EQ(gate_apart.path_counts().gate_up_merged, 0u);
        EXPECT_EQ(gate_apart.path_counts().geglu_f16, uint64_t(model->config().n_layers));
        EXPECT_EQ(gate_apart.path_counts().dequant, s.path_counts().dequant);
        auto serial = load_gpu(path, 256, 64, flags({{"GEMMAJIT_STREAMS", "0"}}));
        GpuSession in_order(*serial);
        EXPECT_TRUE(in_order.prefill_logits(tokens) == ahead_whole)
            << "copies made ahead on their own stream differ from in-order ones";
        EXPECT_EQ(in_order.path_counts().dequant_ahead, 0u);
        EXPECT_EQ(in_order.path_counts().blas_beside_copies, 0u);
        EXPECT_GT(in_order.path_counts().dequant, 0u);
        s.reset();
        EXPECT_TRUE(s.prefill_logits(tokens) == ahead)
            << "a second prefill of the same tokens differs";

        auto small = load_gpu(path, 256, 4, f);
        GpuSession d(*small);
        const auto decoded = decode_logits(d, tokens);
        expect_agree(ref, decoded, V, kTolQuant, std::string(mix.name) + " decode steps vs CPU");
        EXPECT_EQ(d.graph_launches(), uint64_t(tokens.size() - 1));
        // The _M mixes' layers that keep V in Q6_K still run Q, K and V as one decode launch.
        uint64_t multi_v = 0;
        for (const auto& g : small->layers()) multi_v += !g.spec_qkv_multi_v.empty();
        if (mix.matrices == ggml::Type::Q6_K) {
            EXPECT_EQ(multi_v, 0u) << "a pure file has no layer whose V differs";
        } else {
            EXPECT_GT(multi_v, 0u) << "no layer pairs Q6_K V with " << mix.name << "'s Q and K";
            EXPECT_GE(d.path_counts().qkv_multi_v, multi_v)
                << "a layer with a Q6_K V ran its decode Q, K and V apart";
            auto apart = load_gpu(path, 256, 4, flags({{"GEMMAJIT_FUSE_QKV", "0"}}));
            GpuSession three(*apart);
            expect_agree(decoded, decode_logits(three, tokens), V, kTolQuant,
                         std::string(mix.name) + " decode: one Q|K|V launch vs three");
            EXPECT_EQ(three.path_counts().qkv_multi_v, 0u);
        }

        const auto no_blas = flags({{"GEMMAJIT_BLAS", "0"}});
        auto batched = load_gpu(path, 256, 64, no_blas);
        GpuSession b(*batched);
        expect_agree(ref, b.prefill_logits(tokens), V, kTolQuant,
                     std::string(mix.name) + " batched K-quant matvecs vs CPU");
        EXPECT_EQ(b.path_counts().dequant, 0u);
        EXPECT_EQ(b.path_counts().blas, 0u);
    }
}

// The real E4B shapes in Q4_K_M (d 2560, FFN 10240, the tied 262144-row Q6_K embedding and LM
// head, the Q6_K PLE table), cut to 6 layers: decode and a one-chunk prefill against the CPU.
TEST(GpuKQuant, E4bShapedQ4KMMatchesTheCpuReference) {
    GJ_REQUIRE_GPU();
    ScratchDir dir("gpu-kquant-e4b");
    const auto path = synth_mix(dir, "e4b", "q4_k_m", 6);
    const auto f = flags();
    std::vector<std::string> lines;
    auto model = load_noting(path, 1024, 8, f, lines);
    expect_kquants_in_place(*model, path, lines, ggml::Type::Q4_K, ggml::Type::Q6_K);
    const int V = model->config().vocab_size;
    const auto tokens = test_tokens(20, V, 777);
    const auto ref = cpu_logits(path, tokens);
    GpuSession s(*model);
    expect_agree(ref, decode_logits(s, tokens), V, kTolQuant, "e4b q4_k_m decode vs CPU");
    auto big = load_gpu(path, 1024, 64, f);
    GpuSession b(*big);
    expect_agree(ref, b.prefill_logits(tokens), V, kTolQuant,
                 "e4b q4_k_m one-chunk prefill vs CPU");
    EXPECT_GT(b.path_counts().dequant, 0u);
    EXPECT_EQ(b.path_counts().flash_prefill, uint64_t(big->config().n_layers));
}

// The split Q4_K / Q5_K / Q6_K layouts against the same file read in its GGUF blocks
// (GEMMAJIT_REPACK=0), on tiny-256 in Q4_K_M and Q5_K_M (the tied LM head and embedding table
// Q6_K, split too), in pure Q5_K (a tied Q5_K table, split) and in pure Q6_K: one-chunk prefills
// (the split dequant_f16 copies hold the same F16 values, so only the LM head's summation order
// differs: 1e-4), decode steps within the int8 tolerance, and against the CPU reference.
TEST(GpuKQuant, SplitLayoutsAgreeWithTheGgufBlocks) {
    GJ_REQUIRE_GPU();
    ScratchDir dir("gpu-kquant-split");
    for (const char* mix : {"q4_k_m", "q5_k_m", "q5_k", "q6_k"}) {
        SCOPED_TRACE(mix);
        const auto path = synth_mix(dir, "tiny-256", mix);
        const auto on = flags(), off = flags({{"GEMMAJIT_REPACK", "0"}});
        auto split = load_gpu(path, 256, 64, on);
        auto plain = load_gpu(path, 256, 64, off);
        const auto& gate = split->layers()[0].gate;
        EXPECT_EQ(gate.layout, MatvecLayout::Split);
        EXPECT_NE(gate.spec_dequant.find(".split"), std::string::npos) << gate.spec_dequant;
        EXPECT_EQ(split->lm_head().layout, MatvecLayout::Split);
        EXPECT_EQ(split->token_embd().layout, MatvecLayout::Split);
        EXPECT_NE(split->token_embd().spec.find(".split"), std::string::npos);
        EXPECT_EQ(plain->layers()[0].gate.layout, MatvecLayout::Ggml);
        EXPECT_EQ(plain->token_embd().layout, MatvecLayout::Ggml);
        // Q4_K: 148 bytes per 256 elements instead of 144; Q5_K 180 instead of 176; Q6_K: the
        // file's 210.
        const uint64_t file_bytes = plain->layers()[0].gate.bytes;
        EXPECT_EQ(gate.bytes, gate.type == ggml::Type::Q4_K   ? file_bytes / 144 * 148
                              : gate.type == ggml::Type::Q5_K ? file_bytes / 176 * 180
                                                              : file_bytes);
        const int V = split->config().vocab_size;
        const auto tokens = test_tokens(3 * split->config().sliding_window, V, 4242);
        GpuSession a(*split), b(*plain);
        const auto pa = a.prefill_logits(tokens);
        EXPECT_GT(a.path_counts().dequant, 0u);
        expect_agree(b.prefill_logits(tokens), pa, V, 1e-4f,
                     std::string(mix) + " split vs GGUF one-chunk prefill");
        a.reset();
        b.reset();
        const auto da = decode_logits(a, tokens);
        expect_agree(decode_logits(b, tokens), da, V, kTolQuant,
                     std::string(mix) + " split vs GGUF decode");
        expect_agree(cpu_logits(path, tokens), da, V, kTolQuant,
                     std::string(mix) + " split decode vs CPU");
    }
}

// The 32-block fallback types of K-quant files (Q4_1, Q5_0, Q5_1): every matrix and table of
// tiny-e2b in each, decode steps and 32-token prefill chunks (cuBLAS products of dequantized
// copies) against the CPU reference, with the matrices in their split layout (the default) and
// in their GGUF blocks (GEMMAJIT_REPACK=0); the tied table stays in its GGUF blocks and the LM
// head gets its own split copy.
TEST(GpuKQuant, FallbackBlockTypesMatchTheCpuReference) {
    GJ_REQUIRE_GPU();
    ScratchDir dir("gpu-q32");
    for (auto type : {ggml::Type::Q4_1, ggml::Type::Q5_0, ggml::Type::Q5_1}) {
        const std::string what = ggml::type_name(type);
        SCOPED_TRACE(what);
        const auto path = synth_mix(dir, "tiny-e2b", what);
        std::vector<float> decoded[2];
        int V = 0;
        for (int repack : {1, 0}) {
            const auto f = flags({{"GEMMAJIT_REPACK", repack ? "1" : "0"}});
            const std::string how = what + (repack ? " split" : " GGUF blocks");
            std::vector<std::string> lines;
            auto model = load_noting(path, 256, 32, f, lines);
            EXPECT_EQ(f16_notices(lines), 0);
            EXPECT_EQ(model->layers()[0].gate.type, type);
            EXPECT_EQ(model->layers()[0].gate.layout,
                      repack ? MatvecLayout::Split : MatvecLayout::Ggml);
            EXPECT_EQ(model->lm_head().layout, repack ? MatvecLayout::Split : MatvecLayout::Ggml);
            EXPECT_EQ(model->token_embd().type, type);
            EXPECT_EQ(model->token_embd().layout, MatvecLayout::Ggml);
            V = model->config().vocab_size;
            const auto tokens = test_tokens(40, V);
            const auto ref = cpu_logits(path, tokens);
            GpuSession s(*model);
            expect_agree(ref, s.prefill_logits(tokens), V, kTolQuant,
                         how + " 32-token chunks vs CPU");
            EXPECT_GT(s.path_counts().dequant, 0u);
            s.reset();
            decoded[repack] = decode_logits(s, tokens);
            expect_agree(ref, decoded[repack], V, kTolQuant, how + " decode steps vs CPU");
        }
        expect_agree(decoded[0], decoded[1], V, kTolQuant, what + " split vs GGUF decode");
    }
}

// A tensor type no kernel reads (here the PLE table as IQ4_NL) is dequantized to F16 on upload,
// with a one-line notice, and the model still matches the CPU reference (which reads the IQ4_NL
// rows).
TEST(GpuKQuant, UnsupportedTensorTypesAreDequantizedToF16) {
    GJ_REQUIRE_GPU();
    ScratchDir dir("gpu-iq4_nl");
    const auto path = with_ple_table_as(synth(dir, "tiny", ggml::Type::Q8_0),
                                        dir.path() / "iq4_nl.gguf", ggml::Type::IQ4_NL);
    const auto f = flags();
    std::vector<std::string> lines;
    auto model = load_noting(path, 128, 8, f, lines);
    EXPECT_EQ(model->ple_table().type, ggml::Type::F16);
    int notices = 0;
    for (const auto& l : lines)
        notices += l.find("iq4_nl") != std::string::npos && l.find("F16") != std::string::npos;
    EXPECT_EQ(notices, 1);
    const auto tokens = test_tokens(24, model->config().vocab_size);
    GpuSession s(*model);
    expect_agree(cpu_logits(path, tokens), s.prefill_logits(tokens), model->config().vocab_size,
                 kTolQuant, "IQ4_NL PLE table (F16 on the GPU) vs CPU");
}

// GEMMAJIT_MATVEC_PREFETCH: the decode matvecs' L2 prefetch (on by default) changes no logit.
// Every weight format of the decode matvecs (split Q4_0 with the float PLE matrices of tiny-e2b,
// split Q4_K / Q6_K of a Q4_K_M mix, GGUF-block Q8_0, F32), bitwise against the prefetch off, and
// the single-column specs really carry it (the MoE-free plans: every decode matvec).
TEST(GpuKQuant, DecodeL2PrefetchIsBitIdenticalToNone) {
    GJ_REQUIRE_GPU();
    ScratchDir dir("gpu-prefetch");
    struct Case {
        std::filesystem::path path;
        const char* repack;
    };
    const Case cases[] = {{synth(dir, "tiny-e2b", ggml::Type::Q4_0), "1"},
                          {synth_mix(dir, "tiny-256", "q4_k_m"), "1"},
                          {synth(dir, "tiny", ggml::Type::Q8_0), "0"},
                          {synth(dir, "tiny", ggml::Type::F32), "1"}};
    for (const Case& c : cases) {
        SCOPED_TRACE(c.path.filename().string());
        const auto on = flags({{"GEMMAJIT_REPACK", c.repack}});
        const auto off = flags({{"GEMMAJIT_REPACK", c.repack}, {"GEMMAJIT_MATVEC_PREFETCH", "0"}});
        auto a = load_gpu(c.path, 128, 8, on);
        auto b = load_gpu(c.path, 128, 8, off);
        for (const auto* m : {&a->layers()[0].q, &a->layers()[0].down, &a->lm_head()})
            EXPECT_EQ(gj::gemma4::spec_constant(a->kernels().spec(m->spec_decode), "L2_PREFETCH"),
                      2)
                << m->name << " " << m->spec_decode;
        for (const auto& s : b->kernels().specs())
            for (const auto& [name, value] : s.constants) EXPECT_NE(name, "L2_PREFETCH") << s.name;
        const auto tokens = test_tokens(40, a->config().vocab_size, 77);
        GpuSession sa(*a), sb(*b);
        const auto la = decode_logits(sa, tokens), lb = decode_logits(sb, tokens);
        ASSERT_EQ(la.size(), lb.size());
        EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * 4)) << "logits differ";
    }
}

// GEMMAJIT_MATVEC_SHAPE: decode matvecs in shapes set by hand (here every single-column matvec of
// tiny-256's d 256 in the K-quant mix and in Q4_0, the GeGLU in its own) load with those shapes
// and decode what the CPU reference computes.
TEST(GpuKQuant, MatvecShapesSetByHandMatchTheCpuReference) {
    GJ_REQUIRE_GPU();
    ScratchDir dir("gpu-matvec-shape");
    struct Case {
        std::filesystem::path path;
        const char* shapes;
        const char* suffix;
        unsigned threads, rows;  // the plain entries'
    };
    const Case cases[] = {
        {synth_mix(dir, "tiny-256", "q4_k_m"),
         "q4_k.k256=64x2x1,q4_k.k256.geglu=96x1x2,q6_k.k256=32x4x1,q8_0.k512=64x1x1",
         ".t64x2x1.g96x1x2", 64, 2},
        {synth(dir, "tiny-256", ggml::Type::Q4_0), "q4_0.k256=32x4x1,q4_0.k256.geglu=64x2x2",
         ".t32x4x1.g64x2x2", 32, 4}};
    for (const Case& c : cases) {
        SCOPED_TRACE(c.path.filename().string());
        const auto f = flags({{"GEMMAJIT_MATVEC_SHAPE", c.shapes}});
        std::vector<std::string> lines;
        auto model = load_noting(c.path, 256, 4, f, lines);
        // An entry no matvec of the model takes is said at load.
        const bool q8 = std::string(c.shapes).find("q8_0") != std::string::npos;
        EXPECT_EQ(std::count_if(lines.begin(), lines.end(),
                                [](const std::string& l) {
                                    return l.find(
                                               "no decode matvec of this model took "
                                               "q8_0.k512=64x1x1") != std::string::npos;
                                }),
                  q8 ? 1 : 0);
        const auto& q = model->layers()[0].q;
        EXPECT_TRUE(q.spec_decode.ends_with(c.suffix)) << q.spec_decode;
        const auto shape = gj::gemma4::matvec_launch(model->kernels().spec(q.spec_decode), false);
        EXPECT_EQ(shape.threads, c.threads);
        EXPECT_EQ(shape.rows, c.rows);
        const auto tokens =
            test_tokens(5 * model->config().sliding_window, model->config().vocab_size);
        GpuSession s(*model);
        expect_agree(cpu_logits(c.path, tokens), decode_logits(s, tokens),
                     model->config().vocab_size, kTolQuant, "decode in shapes set by hand vs CPU");
        EXPECT_EQ(s.graph_launches(), uint64_t(tokens.size() - 1));
    }
}
