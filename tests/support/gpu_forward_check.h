// What the GPU forward-pass tests share: synthetic models (a preset in one weight type or quant
// mix), GPU loads with explicit flags, the CPU reference's logits, and the comparison of two
// [T][V] logit sets (max |diff| against a tolerance relative to the largest reference logit, and
// the argmax at every position, near ties excepted).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/gguf/ggml_types.h"
#include "engine/gpu/gpu_model.h"
#include "engine/gpu/session.h"
#include "jit/env_flags.h"
#include "tests/support/test_env.h"

namespace gj::test {

// n token ids: BOS (2), then a fixed pseudo-random sequence below `vocab`.
std::vector<int32_t> test_tokens(int n, int vocab, uint32_t seed = 12345);

// The preset `variant` written once into `dir` with every weight in `wtype`, optionally cut to
// its first `layers` layers; the path of the file.
std::filesystem::path synth(const ScratchDir& dir, const std::string& variant, ggml::Type wtype,
                            int layers = 0);
// The same with a quant mix (q4_k_m, ...) deciding each tensor's type.
std::filesystem::path synth_mix(const ScratchDir& dir, const std::string& variant,
                                const std::string& mix, int layers = 0);

jit::Flags flags(jit::EnvMap env = {});

// A GPU load whose sessions hold `sequences` sequences.
std::unique_ptr<gemma4::GpuModel> load_gpu(const std::filesystem::path& path, int context,
                                           int chunk, const jit::Flags& f, int sequences = 1);

// The CPU reference's logits of every position of one prefill.
std::vector<float> cpu_logits(const std::filesystem::path& path,
                              const std::vector<int32_t>& tokens);

// Index of the largest of n values (the first on ties).
int argmax(const float* row, int n);

// Whether the GPU is sm_90: GEMMAJIT_MMQ_VARIANT=auto takes the wgmma GEMM there for chunks
// shorter than copy_min_rows and cuBLAS on F16 copies from there on (else mma.sync).
bool sm90();

struct Agreement {
    float max_diff = 0, scale = 0;
    int mismatches = 0, near_ties = 0;
};
// got vs ref, both [T][V].
Agreement compare(const std::vector<float>& ref, const std::vector<float>& got, int V, float tol);
// compare(), printed, and expected within tol * max|ref| with no argmax mismatch.
void expect_agree(const std::vector<float>& ref, const std::vector<float>& got, int V, float tol,
                  const std::string& what);

// Logits of every position the token-by-token way: prefill of the first token, then decode
// steps (the decode graph when graphs are on).
std::vector<float> decode_logits(gemma4::GpuSession& s, const std::vector<int32_t>& tokens);

}  // namespace gj::test
