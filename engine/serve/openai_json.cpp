#include "engine/serve/openai_json.h"

namespace gj::serve {

namespace {

using Json = nlohmann::json;

Json tool_call_json(const ResponseMeta& meta, const ParsedToolCall& c, int index) {
    // Ids are unique within the server's lifetime because the response id is.
    return {{"id", "call_" + meta.id + "_" + std::to_string(index)},
            {"type", "function"},
            {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

Json finish_json(const char* finish_reason) {
    return finish_reason ? Json(finish_reason) : Json();
}

}  // namespace

std::string dump_json(const Json& j) {
    return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string sse_data(const Json& j) {
    return "data: " + dump_json(j) + "\n\n";
}

Json usage_json(const Usage& u) {
    return {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

Json chat_message(const ResponseMeta& meta, const ParsedDelta& reply) {
    Json m = {{"role", "assistant"}};
    m["content"] =
        reply.content.empty() && !reply.tool_calls.empty() ? Json() : Json(reply.content);
    if (!reply.reasoning.empty()) m["reasoning_content"] = reply.reasoning;
    if (!reply.tool_calls.empty()) {
        m["tool_calls"] = Json::array();
        for (size_t i = 0; i < reply.tool_calls.size(); ++i) {
            m["tool_calls"].push_back(
                tool_call_json(meta, reply.tool_calls[i], static_cast<int>(i)));
        }
    }
    return m;
}

Json chat_completion(const ResponseMeta& meta, const ParsedDelta& reply, Finish finish,
                     const Usage& usage) {
    return {{"id", meta.id},
            {"object", "chat.completion"},
            {"created", meta.created},
            {"model", meta.model},
            {"choices", Json::array({{{"index", 0},
                                      {"message", chat_message(meta, reply)},
                                      {"logprobs", nullptr},
                                      {"finish_reason", finish_reason_name(finish)}}})},
            {"usage", usage_json(usage)}};
}

Json chat_chunk(const ResponseMeta& meta, Json delta, const char* finish_reason) {
    return {{"id", meta.id},
            {"object", "chat.completion.chunk"},
            {"created", meta.created},
            {"model", meta.model},
            {"choices", Json::array({{{"index", 0},
                                      {"delta", std::move(delta)},
                                      {"logprobs", nullptr},
                                      {"finish_reason", finish_json(finish_reason)}}})}};
}

Json chat_deltas(const ResponseMeta& meta, const ParsedDelta& d, int& tool_index) {
    Json out = Json::array();
    if (!d.reasoning.empty()) out.push_back({{"reasoning_content", d.reasoning}});
    if (!d.content.empty()) out.push_back({{"content", d.content}});
    for (const ParsedToolCall& c : d.tool_calls) {
        Json call = tool_call_json(meta, c, tool_index);
        call["index"] = tool_index++;
        out.push_back({{"tool_calls", Json::array({call})}});
    }
    return out;
}

Json chat_usage_chunk(const ResponseMeta& meta, const Usage& usage) {
    return {
        {"id", meta.id},       {"object", "chat.completion.chunk"}, {"created", meta.created},
        {"model", meta.model}, {"choices", Json::array()},          {"usage", usage_json(usage)}};
}

Json text_completion(const ResponseMeta& meta, const std::string& text, Finish finish,
                     const Usage& usage) {
    return {{"id", meta.id},
            {"object", "text_completion"},
            {"created", meta.created},
            {"model", meta.model},
            {"choices", Json::array({{{"index", 0},
                                      {"text", text},
                                      {"logprobs", nullptr},
                                      {"finish_reason", finish_reason_name(finish)}}})},
            {"usage", usage_json(usage)}};
}

Json text_completion_chunk(const ResponseMeta& meta, const std::string& text,
                           const char* finish_reason) {
    return {{"id", meta.id},
            {"object", "text_completion"},
            {"created", meta.created},
            {"model", meta.model},
            {"choices", Json::array({{{"index", 0},
                                      {"text", text},
                                      {"logprobs", nullptr},
                                      {"finish_reason", finish_json(finish_reason)}}})}};
}

}  // namespace gj::serve
