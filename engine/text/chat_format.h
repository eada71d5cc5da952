// The Gemma 4 chat format, rendered natively (no Jinja engine) to match the public template
// (llama.cpp models/templates/gemma4.jinja, a copy in tests/data/chat/) byte for byte:
//
//   <bos>[<|turn>system\n[<|think|>]{system text, trimmed}<turn|>\n]
//   <|turn>{user|model|...}\n{content}<turn|>\n ...
//   <|turn>model\n[<|channel>thought\n<channel|>]          (generation prompt; the empty thought
//                                                            block only when thinking is off)
//
// Past model turns lose their reasoning (<|channel>...<channel|> spans). Tool declarations, tool
// calls and tool responses given as structured data are written in Gemma's call:NAME{k:v} syntax
// with <|"|> around strings; tool-call text already inside a message's content passes through
// unchanged.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace gj::chat {

struct ChatError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The most levels of objects and arrays render() writes in one tool call's arguments, one tool
// result or one tool's parameter schema: it walks them recursively, so deeper input is a
// ChatError rather than a stack overflow.
constexpr int kMaxNesting = 64;

struct ToolCall {
    std::string name;
    nlohmann::ordered_json arguments;  // an object (rendered k:v) or a string (copied as is)
};

struct ToolResponse {
    std::string name = "unknown";     // the template's default for a response without a name
    nlohmann::ordered_json response;  // an object (k:v) or any other value (value:...)
};

struct Message {
    std::string role;  // "system", "developer", "user", "assistant" (written as "model"), ...
    std::string content;
    std::vector<ToolCall> tool_calls;
    std::vector<ToolResponse> tool_responses;
};

struct ChatOptions {
    bool enable_thinking = false;
    bool add_generation_prompt = true;
    // Tool declarations, OpenAI-style: [{"type": "function", "function": {"name", "description",
    // "parameters": <JSON schema>, "response": {...}}}]; written into the system turn as
    // <|tool>declaration:NAME{...}<tool|>. Empty: no tools.
    nlohmann::ordered_json tools = nlohmann::ordered_json::array();
};

// Where template revisions differ. The defaults follow llama.cpp's gemma4.jinja (and the
// 26B/31B templates); from_template() reads them off a GGUF's tokenizer.chat_template.
struct ChatStyle {
    bool empty_thought_when_not_thinking =
        true;                          // generation prompt ends <|channel>thought\n<channel|>
    bool newline_after_think = false;  // "<|think|>\n" (some HF revisions)
    bool recognized = true;            // the template looked like a Gemma 4 one

    static ChatStyle from_template(std::string_view jinja_source);  // "" -> defaults
};

// Throws ChatError for an empty conversation, a message without a role, a tool declaration the
// template could not render (no function name, a parameter without a type, 'properties' that are
// not an object), or a value nested deeper than kMaxNesting.
std::string render(const std::vector<Message>& messages, const ChatOptions& options,
                   const ChatStyle& style = {});

// Reads a conversation in the OpenAI-like JSON shape the template consumes: an array of
// {"role", "content", "tool_calls": [{"function": {"name", "arguments"}}],
//  "tool_responses": [{"name", "response"}]}. Throws ChatError naming the bad field.
std::vector<Message> messages_from_json(const nlohmann::ordered_json& j);

}  // namespace gj::chat
