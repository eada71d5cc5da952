// libFuzzer target for the GGUF reader: any input must either parse or raise gguf::FormatError,
// without a crash, sanitizer report, hang or huge allocation. On success every metadata value is
// read through every accessor and every tensor's bytes are read and dequantized, so a tensor
// table that points outside the input shows up as an ASan report.
//
// Build and run for a bounded time (new inputs go to the scratch corpus, the committed seeds in
// tests/fuzz/corpus_gguf are only read; regenerate them with tests/fuzz/make_gguf_corpus.py):
//   CC=clang CXX=clang++ cmake -G Ninja -S . -B build-fuzz -DGEMMAJIT_FUZZ=ON -DGEMMAJIT_SANITIZE=ON
//   ninja -C build-fuzz fuzz_gguf && mkdir -p build-fuzz/corpus_gguf
//   ./build-fuzz/tests/fuzz_gguf -max_total_time=60 -rss_limit_mb=2048 -timeout=10 \
//       -dict=tests/fuzz/gguf.dict build-fuzz/corpus_gguf tests/fuzz/corpus_gguf
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/gguf/dequant.h"
#include "engine/gguf/reader.h"

namespace {

void touch_value(const gj::gguf::Value& v, std::string_view key) {
    (void)v.to_display(16);
    // Each accessor either returns or throws FormatError for a type that does not fit.
    try {
        (void)v.as_u64(key);
    } catch (const gj::gguf::FormatError&) {
    }
    try {
        (void)v.as_i64(key);
    } catch (const gj::gguf::FormatError&) {
    }
    try {
        (void)v.as_f64(key);
    } catch (const gj::gguf::FormatError&) {
    }
    try {
        (void)v.as_bool(key);
    } catch (const gj::gguf::FormatError&) {
    }
    try {
        (void)v.as_string(key);
    } catch (const gj::gguf::FormatError&) {
    }
    try {
        for (const auto& e : v.as_array(key)) touch_value(e, key);
    } catch (const gj::gguf::FormatError&) {
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::unique_ptr<gj::gguf::File> f;
    try {
        f = gj::gguf::parse(data, size, "fuzz-input");
    } catch (const gj::gguf::FormatError&) {
        return 0;
    }
    for (const auto& [key, value] : f->metadata()) touch_value(value, key);
    (void)f->get_u64_opt("general.alignment");

    volatile uint8_t sink = 0;
    for (const auto& t : f->tensors()) {
        if (f->find_tensor(t.name) != &t) __builtin_trap();  // the index must agree with the table
        uint8_t acc = 0;
        for (uint64_t i = 0; i < t.n_bytes; ++i) acc ^= t.data[i];
        sink = sink ^ acc;
        if (gj::ggml::can_dequantize(t.type)) {
            const auto values = gj::ggml::dequantize_tensor(t);
            if (values.size() != t.n_elements) __builtin_trap();
        }
    }
    return 0;
}
