#include "engine/serve/output_parser.h"

#include <array>
#include <cctype>

namespace gj::serve {

namespace {

using OJson = nlohmann::ordered_json;

constexpr std::string_view kQuote = "<|\"|>";
constexpr std::array<std::pair<std::string_view, Marker>, 5> kMarkers = {{
    {"<|channel>", Marker::ChannelOpen},
    {"<channel|>", Marker::ChannelClose},
    {"<|tool_call>", Marker::ToolCallOpen},
    {"<tool_call|>", Marker::ToolCallClose},
    {kQuote, Marker::Quote},
}};

std::string_view spelling(Marker m) {
    for (const auto& [text, marker] : kMarkers) {
        if (marker == m) return text;
    }
    return "";
}

// A recursive-descent reader of Gemma's tool-call value syntax. Keys are bare (or quoted), strings
// are between <|"|> quotes, anything else up to the next , } or ] is a bare scalar.
class ValueReader {
  public:
    explicit ValueReader(std::string_view s) : s_(s) {}

    bool value(OJson& out, int depth = 0) {
        if (depth > 64) return false;  // a reply nested this deep is not a real call
        skip_space();
        if (starts(kQuote)) return quoted(out);
        if (peek() == '{') return object(out, depth);
        if (peek() == '[') return array(out, depth);
        const size_t begin = i_;
        while (i_ < s_.size() && s_[i_] != ',' && s_[i_] != '}' && s_[i_] != ']') ++i_;
        std::string_view raw = trim(s_.substr(begin, i_ - begin));
        if (raw.empty()) return false;
        if (raw == "true" || raw == "false") {
            out = raw == "true";
        } else if (raw == "null" || raw == "None") {
            out = nullptr;
        } else {
            OJson n = OJson::parse(raw, nullptr, false);
            out = n.is_number() ? n : OJson(std::string(raw));  // unquoted text stays text
        }
        return true;
    }

    bool object(OJson& out, int depth) {
        if (peek() != '{') return false;
        ++i_;
        out = OJson::object();
        skip_space();
        if (peek() == '}') return ++i_, true;
        for (;;) {
            skip_space();
            std::string key;
            if (starts(kQuote)) {
                OJson k;
                if (!quoted(k)) return false;
                key = k.get<std::string>();
            } else {
                const size_t begin = i_;
                while (i_ < s_.size() && s_[i_] != ':' && s_[i_] != '}') ++i_;
                key = std::string(trim(s_.substr(begin, i_ - begin)));
            }
            skip_space();
            if (key.empty() || peek() != ':') return false;
            ++i_;
            OJson v;
            if (!value(v, depth + 1)) return false;
            out[key] = std::move(v);
            skip_space();
            if (peek() == ',') {
                ++i_;
                continue;
            }
            if (peek() == '}') return ++i_, true;
            return false;
        }
    }

    bool at_end() {
        skip_space();
        return i_ == s_.size();
    }
    size_t pos() const { return i_; }

  private:
    bool array(OJson& out, int depth) {
        ++i_;
        out = OJson::array();
        skip_space();
        if (peek() == ']') return ++i_, true;
        for (;;) {
            OJson v;
            if (!value(v, depth + 1)) return false;
            out.push_back(std::move(v));
            skip_space();
            if (peek() == ',') {
                ++i_;
                continue;
            }
            if (peek() == ']') return ++i_, true;
            return false;
        }
    }

    bool quoted(OJson& out) {
        i_ += kQuote.size();
        const size_t end = s_.find(kQuote, i_);
        if (end == std::string_view::npos) return false;
        out = std::string(s_.substr(i_, end - i_));
        i_ = end + kQuote.size();
        return true;
    }

    static std::string_view trim(std::string_view v) {
        while (!v.empty() && std::isspace(static_cast<unsigned char>(v.front())))
            v.remove_prefix(1);
        while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.remove_suffix(1);
        return v;
    }
    void skip_space() {
        while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
    }
    char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
    bool starts(std::string_view p) const { return s_.substr(i_).substr(0, p.size()) == p; }

    std::string_view s_;
    size_t i_ = 0;
};

}  // namespace

void ParsedDelta::append(ParsedDelta&& d) {
    content += d.content;
    reasoning += d.reasoning;
    for (auto& c : d.tool_calls) tool_calls.push_back(std::move(c));
}

std::optional<Marker> marker_of(std::string_view token_text) {
    for (const auto& [text, marker] : kMarkers) {
        if (text == token_text) return marker;
    }
    return std::nullopt;
}

std::optional<ParsedToolCall> parse_tool_call(std::string_view body) {
    constexpr std::string_view prefix = "call:";
    if (body.substr(0, prefix.size()) != prefix) return std::nullopt;
    const size_t brace = body.find('{');
    if (brace == std::string_view::npos) return std::nullopt;
    ParsedToolCall call;
    call.name = std::string(body.substr(prefix.size(), brace - prefix.size()));
    if (call.name.empty()) return std::nullopt;
    ValueReader r(body.substr(brace));
    OJson args;
    if (!r.object(args, 0) || !r.at_end()) return std::nullopt;
    call.arguments = args.dump(-1, ' ', false, OJson::error_handler_t::replace);
    return call;
}

ParsedDelta OutputParser::push_text(std::string_view text) {
    ParsedDelta d;
    switch (state_) {
        case State::Content:
            d.content.append(text);
            break;
        case State::ChannelName: {
            // "<|channel>thought\n": the channel's name runs to the first newline and is not
            // part of the reasoning.
            const size_t nl = text.find('\n');
            if (nl == std::string_view::npos) break;
            state_ = State::Reasoning;
            d.reasoning.append(text.substr(nl + 1));
            break;
        }
        case State::Reasoning:
            d.reasoning.append(text);
            break;
        case State::ToolCall:
            call_.append(text);
            break;
    }
    return d;
}

ParsedDelta OutputParser::push_marker(Marker m) {
    ParsedDelta d;
    if (state_ == State::ToolCall) {
        if (m == Marker::ToolCallClose) {
            state_ = State::Content;
            if (auto call = parse_tool_call(call_)) {
                d.tool_calls.push_back(std::move(*call));
                ++tool_calls_;
            } else {  // not a call after all: keep what the model wrote
                d.content.append(spelling(Marker::ToolCallOpen)).append(call_);
                d.content.append(spelling(Marker::ToolCallClose));
            }
            call_.clear();
        } else {
            call_.append(spelling(m));
        }
        return d;
    }
    switch (m) {
        case Marker::ChannelOpen:
            if (state_ == State::Content) {
                state_ = State::ChannelName;
                return d;
            }
            break;
        case Marker::ChannelClose:
            if (state_ == State::ChannelName || state_ == State::Reasoning) {
                state_ = State::Content;
                return d;
            }
            break;
        case Marker::ToolCallOpen:
            if (tools_ && state_ == State::Content) {
                state_ = State::ToolCall;
                return d;
            }
            break;
        default:
            break;
    }
    return push_text(spelling(m));  // a marker out of place is text
}

ParsedDelta OutputParser::push_rendered(std::string_view text) {
    ParsedDelta d;
    size_t i = 0;
    while (i < text.size()) {
        size_t next = std::string_view::npos;
        Marker which = Marker::Quote;
        size_t len = 0;
        for (const auto& [spell, marker] : kMarkers) {
            const size_t at = text.find(spell, i);
            if (at < next) next = at, which = marker, len = spell.size();
        }
        d.append(push_text(text.substr(i, next == std::string_view::npos ? next : next - i)));
        if (next == std::string_view::npos) break;
        d.append(push_marker(which));
        i = next + len;
    }
    return d;
}

ParsedDelta OutputParser::finish() {
    ParsedDelta d;
    if (state_ == State::ToolCall) {
        d.content.append(spelling(Marker::ToolCallOpen)).append(call_);
        call_.clear();
    }
    state_ = State::Content;
    return d;
}

}  // namespace gj::serve
