// The OpenAI response shapes this server sends: chat.completion and chat.completion.chunk,
// text_completion (and its stream chunks), usage, and the SSE framing of a chunk. Built from the
// scheduler's typed output only, so every byte a client parses is made in this one file.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/serve/output_parser.h"
#include "engine/serve/scheduler.h"

namespace gj::serve {

// What every response of one request repeats.
struct ResponseMeta {
    std::string id;       // "chatcmpl-..." or "cmpl-..."
    int64_t created = 0;  // unix seconds
    std::string model;
};

nlohmann::json usage_json(const Usage& u);

// A chat reply's message: content (null when the reply is only tool calls), reasoning_content
// when the model thought, tool_calls when it called tools.
nlohmann::json chat_message(const ResponseMeta& meta, const ParsedDelta& reply);
nlohmann::json chat_completion(const ResponseMeta& meta, const ParsedDelta& reply, Finish finish,
                               const Usage& usage);

// One streamed chunk of a chat reply. `delta` is the chunk's choices[0].delta; finish_reason is
// null until the last chunk.
nlohmann::json chat_chunk(const ResponseMeta& meta, nlohmann::json delta,
                          const char* finish_reason = nullptr);
// The delta objects of one parsed delta (reasoning, content, each tool call with its stream
// index, counted by `tool_index`), in the order the model wrote them.
nlohmann::json chat_deltas(const ResponseMeta& meta, const ParsedDelta& d, int& tool_index);
// The last chunk with stream_options.include_usage: no choices, the usage.
nlohmann::json chat_usage_chunk(const ResponseMeta& meta, const Usage& usage);

nlohmann::json text_completion(const ResponseMeta& meta, const std::string& text, Finish finish,
                               const Usage& usage);
nlohmann::json text_completion_chunk(const ResponseMeta& meta, const std::string& text,
                                     const char* finish_reason = nullptr);

// "data: {json}\n\n"; invalid UTF-8 (there should be none) is replaced, never thrown.
std::string sse_data(const nlohmann::json& j);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

// JSON text with invalid UTF-8 replaced rather than thrown.
std::string dump_json(const nlohmann::json& j);

}  // namespace gj::serve
