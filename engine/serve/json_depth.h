// The nesting limit on JSON a client sends. nlohmann's parser is iterative, but dumping, copying
// and rendering a value recurse once per level: a 200 KB body of "[[[[..." parses fine and then
// overflows the stack of the thread handling it, taking the whole server down. So every JSON text
// that comes from a request (the body, and the strings read as JSON later: tool-call arguments,
// tool results) is parsed here, and nesting past the limit is refused while parsing, before
// anything recurses over the value.
#pragma once

#include <string>
#include <string_view>

namespace gj::serve {

// Levels of objects and arrays (the outermost is level 1): deep enough for any real tool schema,
// shallow enough for every recursive walk of the value.
constexpr int kMaxJsonDepth = 64;

// Parses `text` as J (nlohmann::json or nlohmann::ordered_json). Nesting deeper than
// kMaxJsonDepth is ApiError(400) saying that `what` is nested too deep, with `param` as its
// field. Malformed JSON throws nlohmann's parse_error and a number beyond a double's range its
// out_of_range: whether those are errors is the caller's call.
template <class J>
J parse_json_depth_limited(std::string_view text, const std::string& what,
                           const std::string& param = "");

}  // namespace gj::serve
