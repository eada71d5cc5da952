// libFuzzer target for the text side: the tokenizer (any bytes round-trip through encode/decode;
// streamed text is always valid UTF-8), the chat renderer (any JSON either renders or raises
// ChatError) and the sampler (any logits and settings either raise SamplerError or give the same
// token on the fast path as on the full-vocabulary path).
//
// Build and run for a bounded time:
//   CC=clang CXX=clang++ cmake -G Ninja -S . -B build-fuzz -DGEMMAJIT_FUZZ=ON
//   -DGEMMAJIT_SANITIZE=ON ninja -C build-fuzz fuzz_tokenizer && mkdir -p
//   build-fuzz/corpus_tokenizer
//   ./build-fuzz/tests/fuzz_tokenizer -max_total_time=60 -timeout=10 build-fuzz/corpus_tokenizer \
//       tests/fuzz/corpus_tokenizer
// The committed seeds (first byte: mode 0 text, 1 chat JSON, 2 sampler) are only read.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine/text/chat_format.h"
#include "engine/text/sampler.h"
#include "engine/text/tokenizer.h"

namespace {

const gj::tok::Tokenizer& tokenizer() {
    static const gj::tok::Tokenizer t(gj::tok::make_synthetic_vocab(2048, 1));
    return t;
}

void check(bool ok) {
    if (!ok) std::abort();
}

bool valid_utf8(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        const size_t n = gj::tok::utf8_char_length(s.substr(i));
        if (n == 0) return false;
        i += n;
    }
    return true;
}

void fuzz_tokenizer(uint8_t flags, std::string_view text) {
    const auto& t = tokenizer();
    const bool parse_special = flags & 1, add_bos = flags & 2;
    const auto ids = t.encode(text, add_bos, parse_special);
    std::string expect = add_bos ? "<bos>" : "";
    for (size_t i = 0; i < text.size(); ++i) {  // ▁ in the input decodes as a space
        if (text.compare(i, 3, "\xE2\x96\x81") == 0) {
            expect += ' ';
            i += 2;
        } else {
            expect += text[i];
        }
    }
    check(t.decode(ids, true) == expect);
    gj::tok::StreamDecoder stream(t);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.push(id);
    streamed += stream.finish();
    check(valid_utf8(streamed));
    const std::string plain = t.decode(ids, false);
    if (valid_utf8(plain)) check(streamed == plain);
}

void fuzz_chat(uint8_t flags, std::string_view text) {
    auto j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return;
    gj::chat::ChatOptions opt;
    opt.enable_thinking = flags & 1;
    opt.add_generation_prompt = flags & 2;
    try {
        if (j.is_object() && j.contains("tools")) opt.tools = j["tools"];
        auto messages = gj::chat::messages_from_json(j.is_object() ? j.value("messages", j) : j);
        const std::string prompt = gj::chat::render(messages, opt);
        (void)tokenizer().encode(prompt, false);
    } catch (const gj::chat::ChatError&) {
    }
}

void fuzz_sampler(const uint8_t* data, size_t size) {
    if (size < 16) return;
    gj::sample::SamplerParams p;
    p.temperature = static_cast<float>(data[0] % 5) * 0.5f;  // includes 0 (greedy)
    p.top_k = data[1] % 4 == 0 ? 0 : data[1] % 70;
    p.top_p = data[2] % 3 == 0 ? 1.0f : static_cast<float>(data[2]) / 255.0f;
    p.min_p = data[3] % 3 == 0 ? 0.0f : static_cast<float>(data[3]) / 255.0f;
    p.repeat_penalty = 0.5f + static_cast<float>(data[4] % 4) * 0.5f;
    p.seed = data[5];
    std::vector<float> logits((size - 8) / 2);
    for (size_t i = 0; i < logits.size(); ++i) {  // coarse values: many ties
        const int v = static_cast<int8_t>(data[8 + 2 * i]);
        logits[i] = data[9 + 2 * i] == 0xFF ? -INFINITY : static_cast<float>(v) / 8.0f;
    }
    if (logits.empty()) return;
    try {
        gj::sample::Sampler fast(p), full(p);
        for (int step = 0; step < 3; ++step) {
            const int32_t a = fast.sample(logits);
            const int32_t b = full.sample(logits, /*force_full=*/true);
            check(a == b);
            fast.accept(a);
            full.accept(b);
        }
    } catch (const gj::sample::SamplerError&) {
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) return 0;
    const uint8_t mode = data[0];
    const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
    switch (mode % 3) {
        case 0:
            fuzz_tokenizer(mode >> 2, rest);
            break;
        case 1:
            fuzz_chat(mode >> 2, rest);
            break;
        default:
            fuzz_sampler(data + 1, size - 1);
            break;
    }
    return 0;
}
