// Synthetic Gemma 4 GGUF files: random but well-conditioned weights at a preset's real shapes,
// with llama.cpp's gemma4 metadata keys, tensor names and ggml dim order, plus a synthetic
// tokenizer. Used for tests (tiny presets, golden logits) and benchmarks (real shapes: speed does
// not depend on weight values).
//
// Values are a pure function of (seed, tensor name, element index): each tensor is cut into
// fixed chunks of rows, each chunk has its own random stream, so chunks are generated and
// quantized in parallel and the file does not depend on the thread count.
//
// Scales, chosen so that tolerances stay meaningful (DESIGN.md "Correctness oracles"):
//   projections / FFN / experts / PLE projections  N(0, 1/fan_in), fan_in = ne0
//   token_embd        N(0, 4/d): embeddings of RMS 2 after the sqrt(d) scale, logits of std ~2,
//                     far below the softcap of 30
//   per_layer_token_embd  N(0, 1/P): token part of PLE of RMS 1 after the sqrt(P) scale
//   norm gains        1 + 0.1 N(0,1);  q/k-norm gains 0.25 (1 + 0.1 N(0,1)), so attention scores
//                     (scale 1.0) stay near 0.06 sqrt(head_dim) and softmax does not saturate
//   layer_output_scale  U(0.6, 1.0);  router N(0, 4) (well separated top-k);  router scale
//                     1 + 0.1 N(0,1);  per-expert scale U(0.5, 1.5)
//   rope_freqs        1.0 for the rotated pairs of global layers, 1e30 for the rest (llama.cpp)
// Normal samples are Irwin-Hall sums of four uniforms (unit variance, cheap, deterministic).
//
// Tensor types: norms, scales, rope_freqs and the router are F32 (llama-quant never quantizes
// them); per_layer_model_proj is BF16 and the per-layer PLE inp_gate/proj are F32 when the weight
// type is quantized (as in the real E4B Q8_0 file), else the weight type; all other matrices and
// the embeddings use the weight type.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "engine/gguf/ggml_types.h"
#include "engine/model/gemma4_config.h"
#include "engine/model/gemma4_tensors.h"

namespace gj::synth {

struct Options {
    std::string variant = "tiny";         // a gemma4::Config preset name
    ggml::Type wtype = ggml::Type::Q8_0;  // q8_0, q4_0, bf16, f16 or f32
    std::string mix;                      // a quant mix name; when set it decides, not wtype
    int layers = 0;                       // keep only the first N layers (0 = all)
    int context = 0;  // the context length the file states (0: the preset's); tests of long runs
    uint64_t seed = 1;
    int threads = 0;                                   // <= 0: one per hardware thread
    std::function<void(const std::string&)> progress;  // progress lines for big files; may be null
};

// The config the file will describe (preset, optionally cut to its first layers).
gemma4::Config config_for(const Options& opts);

// The type a tensor of this role is stored as for the weight type `wtype`.
ggml::Type tensor_type(gemma4::TensorRole role, ggml::Type wtype);

// Every tensor's type, in expected_tensors(cfg) order, for these options.
std::vector<ggml::Type> tensor_types(const Options& opts, const gemma4::Config& cfg);

// Writes the model to `path`; returns its config. Throws std::invalid_argument for an unknown
// variant / unsupported weight type and std::runtime_error for I/O failures.
gemma4::Config write_model(const Options& opts, const std::filesystem::path& path);

}  // namespace gj::synth
