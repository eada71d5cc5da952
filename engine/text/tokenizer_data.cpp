// tokenizer.ggml.* metadata <-> VocabData.
#include "engine/text/tokenizer_data.h"

#include <stdexcept>

#include "engine/gguf/reader.h"
#include "engine/gguf/writer.h"

namespace gj::tok {

namespace {

constexpr const char* kModelKey = "tokenizer.ggml.model";
constexpr const char* kTokensKey = "tokenizer.ggml.tokens";
constexpr const char* kScoresKey = "tokenizer.ggml.scores";
constexpr const char* kTypesKey = "tokenizer.ggml.token_type";
constexpr const char* kMergesKey = "tokenizer.ggml.merges";
constexpr const char* kBosKey = "tokenizer.ggml.bos_token_id";
constexpr const char* kEosKey = "tokenizer.ggml.eos_token_id";
constexpr const char* kPadKey = "tokenizer.ggml.padding_token_id";
constexpr const char* kUnkKey = "tokenizer.ggml.unknown_token_id";
constexpr const char* kAddBosKey = "tokenizer.ggml.add_bos_token";
constexpr const char* kAddSpacePrefixKey = "tokenizer.ggml.add_space_prefix";
constexpr const char* kChatTemplateKey = "tokenizer.chat_template";

std::vector<std::string> read_string_array(const gguf::File& f, const char* key) {
    const auto& arr = f.get(key).as_array(key);
    std::vector<std::string> out;
    out.reserve(arr.size());
    for (const auto& v : arr) out.push_back(v.as_string(key));
    return out;
}

int32_t read_token_id(const gguf::File& f, const char* key, int32_t fallback, size_t n_tokens) {
    auto v = f.get_u64_opt(key);
    if (!v) return fallback;
    if (*v >= n_tokens) {
        throw gguf::FormatError(std::string("metadata key ") + key + " = " + std::to_string(*v) +
                                " is not a token id (vocabulary has " + std::to_string(n_tokens) +
                                " tokens)");
    }
    return static_cast<int32_t>(*v);
}

}  // namespace

VocabData read_vocab(const gguf::File& file) {
    VocabData v;
    v.model = file.get_string(kModelKey);
    v.tokens = read_string_array(file, kTokensKey);
    const size_t n = v.tokens.size();
    if (n == 0) throw gguf::FormatError(std::string("metadata key ") + kTokensKey + " is empty");

    if (const auto* scores = file.find(kScoresKey)) {
        const auto& arr = scores->as_array(kScoresKey);
        v.scores.reserve(arr.size());
        for (const auto& s : arr) v.scores.push_back(static_cast<float>(s.as_f64(kScoresKey)));
    } else {
        v.scores.assign(n, 0.0f);
    }
    if (const auto* types = file.find(kTypesKey)) {
        const auto& arr = types->as_array(kTypesKey);
        v.types.reserve(arr.size());
        for (const auto& t : arr) {
            int64_t x = t.as_i64(kTypesKey);
            if (x < static_cast<int64_t>(TokenType::Normal) ||
                x > static_cast<int64_t>(TokenType::Byte)) {
                throw gguf::FormatError(std::string("metadata key ") + kTypesKey +
                                        " holds invalid token type " + std::to_string(x));
            }
            v.types.push_back(static_cast<int32_t>(x));
        }
    } else {
        v.types.assign(n, static_cast<int32_t>(TokenType::Normal));
    }
    if (v.scores.size() != n || v.types.size() != n) {
        throw gguf::FormatError(std::string("metadata keys ") + kScoresKey + " (" +
                                std::to_string(v.scores.size()) + ") and " + kTypesKey + " (" +
                                std::to_string(v.types.size()) +
                                ") must have one entry per token (" + std::to_string(n) + ")");
    }
    if (file.find(kMergesKey)) v.merges = read_string_array(file, kMergesKey);

    v.bos_id = read_token_id(file, kBosKey, v.bos_id, n);
    v.eos_id = read_token_id(file, kEosKey, v.eos_id, n);
    v.pad_id = read_token_id(file, kPadKey, v.pad_id, n);
    v.unk_id = read_token_id(file, kUnkKey, v.unk_id, n);
    if (const auto* b = file.find(kAddBosKey)) v.add_bos = b->as_bool(kAddBosKey);
    if (auto t = file.get_string_opt(kChatTemplateKey)) v.chat_template = *t;
    return v;
}

void write_vocab(gguf::Writer& w, const VocabData& v) {
    const size_t n = v.tokens.size();
    if (v.scores.size() != n || v.types.size() != n) {
        throw std::invalid_argument("write_vocab: tokens, scores and types differ in length (" +
                                    std::to_string(n) + ", " + std::to_string(v.scores.size()) +
                                    ", " + std::to_string(v.types.size()) + ")");
    }
    for (int32_t id : {v.bos_id, v.eos_id, v.pad_id, v.unk_id}) {
        if (id < 0 || static_cast<size_t>(id) >= n) {
            throw std::invalid_argument("write_vocab: special token id " + std::to_string(id) +
                                        " outside the vocabulary of " + std::to_string(n));
        }
    }
    w.set_string(kModelKey, v.model);
    w.set_string_array(kTokensKey, v.tokens);
    w.set_f32_array(kScoresKey, v.scores);
    w.set_i32_array(kTypesKey, v.types);
    w.set_string_array(kMergesKey, v.merges);
    w.set_u32(kBosKey, static_cast<uint32_t>(v.bos_id));
    w.set_u32(kEosKey, static_cast<uint32_t>(v.eos_id));
    w.set_u32(kPadKey, static_cast<uint32_t>(v.pad_id));
    w.set_u32(kUnkKey, static_cast<uint32_t>(v.unk_id));
    w.set_bool(kAddBosKey, v.add_bos);
    // Gemma 4 never inserts a space prefix; readers that default to SPM behaviour need to be told.
    w.set_bool(kAddSpacePrefixKey, false);
    if (!v.chat_template.empty()) w.set_string(kChatTemplateKey, v.chat_template);
}

}  // namespace gj::tok
