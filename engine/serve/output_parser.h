// Splits a chat reply, as it is generated, into what OpenAI clients expect apart: the Gemma 4
// thought channel (<|channel>thought\n ... <channel|>) as `reasoning_content`, tool calls
// (<|tool_call>call:NAME{k:v,...}<tool_call|>, strings between <|"|> quotes) as `tool_calls` with
// JSON arguments, and the rest as `content`.
//
// The markers are single tokens, so the generation loop passes them as markers (by token id) and
// everything else as decoded text: a reply whose plain text happens to spell "<|channel>" stays
// text. push_rendered() splits a string at the marker spellings instead, for tests and for text
// that has no token ids.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gj::serve {

struct ParsedToolCall {
    std::string name;
    std::string arguments;  // a JSON object, serialized (OpenAI sends arguments as a string)
};

// What one push added to each part of the reply.
struct ParsedDelta {
    std::string content;
    std::string reasoning;
    std::vector<ParsedToolCall> tool_calls;  // complete calls (a call is sent once it closes)

    bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
    void append(ParsedDelta&& d);
};

enum class Marker { ChannelOpen, ChannelClose, ToolCallOpen, ToolCallClose, Quote };

// The marker a token's text spells, if any ("<|channel>", "<channel|>", "<|tool_call>",
// "<tool_call|>", "<|\"|>").
std::optional<Marker> marker_of(std::string_view token_text);

// Parses Gemma's tool-call body `call:NAME{k:v,...}` (quotes spelled <|"|>); nullopt when it is not
// one. Values: <|"|>strings<|"|>, numbers, true/false/null, {objects} and [arrays], nested.
std::optional<ParsedToolCall> parse_tool_call(std::string_view body);

class OutputParser {
  public:
    // `tools`: recognize tool calls (else their text passes through as content).
    explicit OutputParser(bool tools = true) : tools_(tools) {}

    ParsedDelta push_text(std::string_view text);
    ParsedDelta push_marker(Marker m);
    ParsedDelta push_rendered(std::string_view text);  // text with markers spelled out
    // End of the reply: an unclosed tool call comes out as content, as it was written.
    ParsedDelta finish();

    int tool_calls() const { return tool_calls_; }  // complete calls so far

  private:
    enum class State { Content, ChannelName, Reasoning, ToolCall };
    bool tools_;
    State state_ = State::Content;
    std::string call_;  // the open tool call's body so far
    int tool_calls_ = 0;
};

}  // namespace gj::serve
