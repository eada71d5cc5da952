// VocabData as JSON: how vocabularies travel to tools outside the engine (the Hugging Face
// tokenizers golden script) and back into tests as committed data.
//   {"model", "tokens": [...], "scores": [...], "types": [...], "merges": ["a b", ...],
//    "bos_id", "eos_id", "pad_id", "unk_id", "add_bos", "chat_template"}
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include "engine/text/tokenizer_data.h"

namespace gj::tok {

struct VocabJsonError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Throws VocabJsonError when a token or merge is not valid UTF-8 (JSON cannot carry it).
std::string vocab_to_json(const VocabData& v);
// Throws VocabJsonError naming the missing or mistyped field.
VocabData vocab_from_json(std::string_view json);

}  // namespace gj::tok
