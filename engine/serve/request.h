// OpenAI request bodies turned into typed requests. Everything a client can get wrong (malformed
// JSON, invalid UTF-8, a field of the wrong type, an unknown role, an empty conversation, an
// option this server does not implement) is an ApiError(400) that names the field, thrown before
// any work is queued; a request that parses is one the scheduler can run. An nlohmann exception
// that a shape no check anticipated still raises leaves these functions as an ApiError(400) too.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "engine/text/chat_format.h"
#include "engine/text/sampler.h"

namespace gj::serve {

// What every generating request carries besides its prompt.
struct GenerationParams {
    std::string model;  // echoed back in the response
    sample::SamplerParams sampling;
    int max_tokens = -1;            // < 0: until a stop token or the context is full
    std::vector<std::string> stop;  // stop strings (never in the output), non-empty each
    bool stream = false;
    bool include_usage = false;  // stream_options.include_usage: a last chunk with usage
};

struct ChatRequest {
    GenerationParams gen;
    std::vector<chat::Message> messages;  // in the chat format's shape (tool results attached)
    chat::ChatOptions options;            // thinking, tools
    // What the reply is made to begin with, markers spelled out (tool_choice "required":
    // "<|tool_call>call:", a named function: "<|tool_call>call:NAME{"): the prompt ends with it,
    // so the model writes the rest of that call, and the reply's parser reads it first.
    std::string reply_prefix;
};

struct CompletionRequest {
    GenerationParams gen;
    std::string prompt;  // raw text, tokenized as is (with <bos>)
};

// Parses a request body: malformed JSON, invalid UTF-8, a number no double holds, nesting deeper
// than kMaxJsonDepth (json_depth.h) or a body that is not a JSON object are ApiError(400).
nlohmann::json parse_body(std::string_view body);

// `defaults` are the server's sampling settings (command line); a request overrides them.
ChatRequest parse_chat_request(const nlohmann::json& body, const sample::SamplerParams& defaults);
CompletionRequest parse_completion_request(const nlohmann::json& body,
                                           const sample::SamplerParams& defaults);

// OpenAI `messages` -> the chat format's messages: assistant tool_calls (arguments given as a
// JSON string are parsed), and each `tool` message attached as a tool response to the assistant
// turn whose call it answers (the Gemma 4 template writes the result inside the model's turn,
// which the model then continues). Text content parts are joined; other parts are a 400.
std::vector<chat::Message> messages_from_openai(const nlohmann::json& messages);

}  // namespace gj::serve
