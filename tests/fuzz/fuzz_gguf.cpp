// libFuzzer target for the GGUF reader: any input must either parse or raise gguf::FormatError,
// without a crash, sanitizer report, hang or huge allocation. On success every metadata entry is
// shown with to_display, every value is read through the accessor of its type and a few through
// every accessor, and every tensor's bytes are read and dequantized, so a tensor table that points
// outside the input shows up as an ASan report.
//
// Run it with tools/fuzz.sh SECONDS gguf (builds build-fuzz with clang, libFuzzer, ASan + UBSan;
// new inputs go to build-fuzz/corpus_gguf, the committed seeds in tests/fuzz/corpus_gguf are only
// read; regenerate them with tests/fuzz/make_gguf_corpus.py). tools/test.sh runs it for 60 s.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "engine/gguf/dequant.h"
#include "engine/gguf/reader.h"

namespace {

// The harness must cost little more than the parse: the fuzzer keeps the inputs that reach new
// loop counts, so its corpus drifts towards files with hundreds of values, and anything done per
// value decides the speed. A throwing accessor costs microseconds under ASan + libFuzzer (the
// unwinder, the sanitizer's stack bookkeeping, the message that formats the key and the value),
// and calling all six on every value took the rate from ~13k to below 1k executions/s as the
// corpus grew. So every value goes through the accessor of its own type (which must not throw),
// the mismatched accessors are tried on a few values per input (the first of each array: all
// elements share its type), and to_display runs once per metadata entry (it shows the first 16
// elements at each level of an array).
constexpr int kMismatchProbesPerInput = 2;

// The accessor that matches a value's type must succeed (an exception escaping here is a finding).
void touch_own_accessor(const gj::gguf::Value& v, std::string_view key) {
    using gj::gguf::ValueType;
    switch (v.type) {
        case ValueType::UINT8:
        case ValueType::UINT16:
        case ValueType::UINT32:
        case ValueType::UINT64:
            (void)v.as_u64(key);
            break;
        case ValueType::INT8:
        case ValueType::INT16:
        case ValueType::INT32:
        case ValueType::INT64:
            (void)v.as_i64(key);
            break;
        case ValueType::FLOAT32:
        case ValueType::FLOAT64:
            (void)v.as_f64(key);
            break;
        case ValueType::BOOL:
            (void)v.as_bool(key);
            break;
        case ValueType::STRING:
            (void)v.as_string(key);
            break;
        case ValueType::ARRAY:
            (void)v.as_array(key);
            break;
    }
}

// Each accessor either returns or throws FormatError for a type that does not fit.
void touch_every_accessor(const gj::gguf::Value& v, std::string_view key) {
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
        (void)v.as_array(key);
    } catch (const gj::gguf::FormatError&) {
    }
}

void touch_value(const gj::gguf::Value& v, std::string_view key, int& probes_left) {
    touch_own_accessor(v, key);
    if (probes_left > 0) {
        --probes_left;
        touch_every_accessor(v, key);
    }
    if (v.type != gj::gguf::ValueType::ARRAY) return;
    const auto& elems = v.as_array(key);
    for (size_t i = 0; i < elems.size(); ++i) {
        int no_probes = 0;
        touch_value(elems[i], key, i == 0 ? probes_left : no_probes);
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
    int probes_left = kMismatchProbesPerInput;
    for (const auto& [key, value] : f->metadata()) {
        (void)value.to_display(16);
        touch_value(value, key, probes_left);
    }
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
