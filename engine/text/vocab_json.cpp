#include "engine/text/vocab_json.h"

#include <nlohmann/json.hpp>

namespace gj::tok {

namespace {

using Json = nlohmann::json;

template <class T>
T field(const Json& j, const char* key) {
    auto it = j.find(key);
    if (it == j.end()) throw VocabJsonError(std::string("vocabulary JSON lacks '") + key + "'");
    try {
        return it->get<T>();
    } catch (const Json::exception& e) {
        throw VocabJsonError(std::string("vocabulary JSON field '") + key +
                             "' has the wrong type: " + e.what());
    }
}

}  // namespace

std::string vocab_to_json(const VocabData& v) {
    Json j;
    j["model"] = v.model;
    j["tokens"] = v.tokens;
    j["scores"] = v.scores;
    j["types"] = v.types;
    j["merges"] = v.merges;
    j["bos_id"] = v.bos_id;
    j["eos_id"] = v.eos_id;
    j["pad_id"] = v.pad_id;
    j["unk_id"] = v.unk_id;
    j["add_bos"] = v.add_bos;
    j["chat_template"] = v.chat_template;
    try {
        return j.dump(0) + "\n";
    } catch (const Json::type_error& e) {
        throw VocabJsonError(std::string("vocabulary cannot be written as JSON: ") + e.what());
    }
}

VocabData vocab_from_json(std::string_view text) {
    Json j;
    try {
        j = Json::parse(text);
    } catch (const Json::parse_error& e) {
        throw VocabJsonError(std::string("vocabulary JSON does not parse: ") + e.what());
    }
    if (!j.is_object()) throw VocabJsonError("vocabulary JSON is not an object");
    VocabData v;
    v.model = field<std::string>(j, "model");
    v.tokens = field<std::vector<std::string>>(j, "tokens");
    v.scores = field<std::vector<float>>(j, "scores");
    v.types = field<std::vector<int32_t>>(j, "types");
    v.merges = field<std::vector<std::string>>(j, "merges");
    v.bos_id = field<int32_t>(j, "bos_id");
    v.eos_id = field<int32_t>(j, "eos_id");
    v.pad_id = field<int32_t>(j, "pad_id");
    v.unk_id = field<int32_t>(j, "unk_id");
    v.add_bos = field<bool>(j, "add_bos");
    if (j.contains("chat_template")) v.chat_template = field<std::string>(j, "chat_template");
    return v;
}

}  // namespace gj::tok
