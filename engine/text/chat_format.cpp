#include "engine/text/chat_format.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace gj::chat {

namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kQuote = "<|\"|>";  // Gemma's string delimiter in tool syntax

// Python's str.isspace() set, which Jinja's `trim` uses; decoded from UTF-8.
bool is_python_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// Decodes the UTF-8 character starting at s[i] (returns its length; invalid bytes count as one
// non-space character).
size_t decode_at(std::string_view s, size_t i, uint32_t& cp) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > s.size()) {
        cp = 0xFFFFFFFF;
        return 1;
    }
    cp = len == 1 ? c : c & (0x7F >> len);
    for (size_t k = 1; k < len; ++k) {
        const auto x = static_cast<unsigned char>(s[i + k]);
        if ((x & 0xC0) != 0x80) {
            cp = 0xFFFFFFFF;
            return 1;
        }
        cp = (cp << 6) | (x & 0x3F);
    }
    return len;
}

std::string trim(std::string_view s) {
    size_t begin = 0;
    while (begin < s.size()) {
        uint32_t cp;
        size_t len = decode_at(s, begin, cp);
        if (!is_python_space(cp)) break;
        begin += len;
    }
    // Walk forward remembering where the last non-space character ends.
    size_t end = begin;
    for (size_t i = begin; i < s.size();) {
        uint32_t cp;
        size_t len = decode_at(s, i, cp);
        i += len;
        if (!is_python_space(cp)) end = i;
    }
    return std::string(s.substr(begin, end - begin));
}

// The template's strip_thinking macro: of each '<channel|>'-separated part keep what precedes
// '<|channel>' (all of it when there is none), join, trim.
std::string strip_thinking(std::string_view text) {
    constexpr std::string_view open = "<|channel>", close = "<channel|>";
    std::string kept;
    size_t start = 0;
    for (;;) {
        size_t end = text.find(close, start);
        std::string_view part =
            text.substr(start, end == std::string_view::npos ? end : end - start);
        kept.append(part.substr(0, part.find(open)));
        if (end == std::string_view::npos) break;
        start = end + close.size();
    }
    return trim(kept);
}

// Python's repr() of a float, which is what Jinja prints for one.
std::string python_float(double x) {
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
    std::string sci(buf, r.ptr);  // shortest round-trip digits: [-]d[.ddd]e[+-]XX
    std::string sign;
    if (sci[0] == '-') {
        sign = "-";
        sci.erase(0, 1);
    }
    const size_t e = sci.find('e');
    std::string digits = sci.substr(0, e);
    digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
    const int exp = std::stoi(sci.substr(e + 1));
    if (exp >= -4 && exp < 16) {
        std::string out;
        if (exp < 0) {
            out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
        } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
            out = digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
        } else {
            out = digits.substr(0, static_cast<size_t>(exp) + 1) + "." +
                  digits.substr(static_cast<size_t>(exp) + 1);
        }
        return sign + out;
    }
    std::string mantissa =
        digits.size() == 1 ? digits : digits.substr(0, 1) + "." + digits.substr(1);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof exp_buf, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return sign + mantissa + exp_buf;
}

std::string ascii_lower(std::string s) {
    for (char& c : s) {
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    }
    return s;
}

// Jinja's dictsort: by key, case-insensitively, stable for keys equal up to case. `obj` is an
// object (callers check: only an object's iterators have keys).
std::vector<std::pair<std::string, const Json*>> dictsort(const Json& obj) {
    std::vector<std::pair<std::string, const Json*>> items;
    for (auto it = obj.begin(); it != obj.end(); ++it) items.emplace_back(it.key(), &it.value());
    std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) {
        return ascii_lower(a.first) < ascii_lower(b.first);
    });
    return items;
}

// The recursive writers below recurse once per level of nesting; deeper input is refused before
// it can run the stack out. `depth` is the number of objects and arrays around the value.
void check_depth(int depth, const char* what) {
    if (depth >= kMaxNesting) {
        throw ChatError(std::string(what) + " nests objects and arrays deeper than " +
                        std::to_string(kMaxNesting) + " levels");
    }
}

// The template's format_argument macro.
void format_argument(const Json& v, bool escape_keys, std::string& out, int depth = 0) {
    if (v.is_structured()) check_depth(depth, "a tool call argument or tool result");
    switch (v.type()) {
        case Json::value_t::string:
            out.append(kQuote).append(v.get_ref<const std::string&>()).append(kQuote);
            return;
        case Json::value_t::boolean:
            out += v.get<bool>() ? "true" : "false";
            return;
        case Json::value_t::object: {
            out += '{';
            bool first = true;
            for (const auto& [key, value] : dictsort(v)) {
                if (!first) out += ',';
                first = false;
                if (escape_keys) {
                    out.append(kQuote).append(key).append(kQuote);
                } else {
                    out += key;
                }
                out += ':';
                format_argument(*value, escape_keys, out, depth + 1);
            }
            out += '}';
            return;
        }
        case Json::value_t::array: {
            out += '[';
            for (size_t i = 0; i < v.size(); ++i) {
                if (i) out += ',';
                format_argument(v[i], escape_keys, out, depth + 1);
            }
            out += ']';
            return;
        }
        case Json::value_t::number_integer:
            out += std::to_string(v.get<int64_t>());
            return;
        case Json::value_t::number_unsigned:
            out += std::to_string(v.get<uint64_t>());
            return;
        case Json::value_t::number_float:
            out += python_float(v.get<double>());
            return;
        case Json::value_t::null:
        case Json::value_t::discarded:
        case Json::value_t::binary:
            out += "None";  // Python's str(None)
            return;
    }
}

bool contains(std::string_view s, std::string_view what) {
    return s.find(what) != s.npos;
}

// ---- tool declarations (the template's format_function_declaration / format_parameters) -------

// Python truthiness of an optional JSON value (absent = Jinja's Undefined = false).
bool truthy(const Json* v) {
    if (!v) return false;
    switch (v->type()) {
        case Json::value_t::boolean:
            return v->get<bool>();
        case Json::value_t::number_integer:
        case Json::value_t::number_unsigned:
        case Json::value_t::number_float:
            return v->get<double>() != 0.0;
        case Json::value_t::string:
        case Json::value_t::array:
        case Json::value_t::object:
            return !v->empty();
        default:
            return false;
    }
}

const Json* member(const Json& obj, const char* key) {
    if (!obj.is_object()) return nullptr;
    auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
}

// What `{{ value }}` prints for a scalar (Python's str()).
std::string python_str(const Json* v, const std::string& what) {
    if (!v) return "";  // Undefined prints as nothing
    switch (v->type()) {
        case Json::value_t::string:
            return v->get<std::string>();
        case Json::value_t::boolean:
            return v->get<bool>() ? "True" : "False";
        case Json::value_t::number_integer:
            return std::to_string(v->get<int64_t>());
        case Json::value_t::number_unsigned:
            return std::to_string(v->get<uint64_t>());
        case Json::value_t::number_float:
            return python_float(v->get<double>());
        case Json::value_t::null:
            return "None";
        default:
            throw ChatError(what + " must be a string, number or boolean");
    }
}

std::string ascii_upper(std::string s) {
    for (char& c : s) {
        if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
    }
    return s;
}

void quoted_list(const Json& items, std::string& out) {
    bool first = true;
    for (const auto& item : items) {
        if (!first) out += ',';
        first = false;
        out.append(kQuote).append(python_str(&item, "a 'required' entry")).append(kQuote);
    }
}

void format_parameters(const Json& properties, std::string& out, int depth = 0) {
    check_depth(depth, "a tool's parameters");
    if (!properties.is_object()) {
        throw ChatError("a tool's parameter 'properties' must be an object (name -> schema)");
    }
    static const char* standard[] = {"description", "type", "properties", "required", "nullable"};
    bool found_first = false;
    for (const auto& [key, value_ptr] : dictsort(properties)) {
        if (std::find(std::begin(standard), std::end(standard), key) != std::end(standard))
            continue;
        const Json& value = *value_ptr;
        if (found_first) out += ',';
        found_first = true;
        out += key + ":{";
        bool add_comma = false;
        auto comma = [&] {
            if (add_comma) {
                out += ',';
            } else {
                add_comma = true;
            }
        };
        if (const Json* d = member(value, "description"); truthy(d)) {
            out.append("description:").append(kQuote);
            out.append(python_str(d, "parameter '" + key + "' description")).append(kQuote);
            add_comma = true;
        }
        if (truthy(member(value, "nullable"))) {
            comma();
            out += "nullable:true";
        }
        const Json* type = member(value, "type");
        if (!type || !(type->is_string() ||
                       (type->is_array() && !type->empty() && (*type)[0].is_string()))) {
            throw ChatError("tool parameter '" + key + "' needs a 'type' (a string or a list)");
        }
        const std::string upper = ascii_upper(type->is_string() ? type->get<std::string>()
                                                                : (*type)[0].get<std::string>());
        if (upper == "STRING") {
            if (const Json* e = member(value, "enum"); truthy(e)) {
                comma();
                out += "enum:";
                format_argument(*e, true, out);
            }
        } else if (upper == "OBJECT") {
            out += ",properties:{";
            if (const Json* props = member(value, "properties"); props && props->is_object()) {
                format_parameters(*props, out, depth + 1);
            } else {
                // As the template does: the schema's own keys.
                format_parameters(value, out, depth + 1);
            }
            out += '}';
            if (const Json* req = member(value, "required"); truthy(req)) {
                out += ",required:[";
                quoted_list(*req, out);
                out += ']';
            }
        } else if (upper == "ARRAY") {
            const Json* items = member(value, "items");
            if (items && items->is_object() && !items->empty()) {
                out += ",items:{";
                bool items_first = true;
                for (const auto& [item_key, item_value] : dictsort(*items)) {
                    if (item_value->is_null()) continue;
                    if (!items_first) out += ',';
                    items_first = false;
                    if (item_key == "properties") {
                        out += "properties:{";
                        if (item_value->is_object()) {
                            format_parameters(*item_value, out, depth + 1);
                        }
                        out += '}';
                    } else if (item_key == "required") {
                        out += "required:[";
                        quoted_list(*item_value, out);
                        out += ']';
                    } else if (item_key == "type") {
                        out += "type:";
                        Json upper_type;
                        if (item_value->is_string()) {
                            upper_type = ascii_upper(item_value->get<std::string>());
                        } else {
                            upper_type = Json::array();
                            for (const auto& t : *item_value) {
                                upper_type.push_back(ascii_upper(python_str(&t, "an items type")));
                            }
                        }
                        format_argument(upper_type, true, out);
                    } else {
                        out += item_key + ":";
                        format_argument(*item_value, true, out);
                    }
                }
                out += '}';
            }
        }
        comma();
        out.append("type:").append(kQuote).append(upper).append(kQuote).append("}");
    }
}

std::string format_function_declaration(const Json& tool) {
    const Json* fn = member(tool, "function");
    const Json* name = fn ? member(*fn, "name") : nullptr;
    if (!name || !name->is_string()) {
        throw ChatError("a tool declaration needs {\"function\": {\"name\": ...}}");
    }
    std::string out = "declaration:" + name->get<std::string>() + "{description:";
    out.append(kQuote).append(python_str(member(*fn, "description"), "a tool description"));
    out.append(kQuote);
    if (const Json* params = member(*fn, "parameters"); truthy(params)) {
        out += ",parameters:{";
        if (const Json* props = member(*params, "properties"); truthy(props)) {
            if (!props->is_object()) {
                throw ChatError("tool '" + name->get<std::string>() +
                                "': 'parameters.properties' must be an object (name -> schema)");
            }
            out += "properties:{";
            format_parameters(*props, out);
            out += "},";
        }
        if (const Json* req = member(*params, "required"); truthy(req)) {
            out += "required:[";
            quoted_list(*req, out);
            out += "],";
        }
        if (const Json* type = member(*params, "type"); truthy(type)) {
            out.append("type:").append(kQuote);
            out.append(ascii_upper(python_str(type, "the parameters type"))).append(kQuote);
            out += '}';
        }
    }
    if (const Json* response = member(*fn, "response")) {
        out += ",response:{";
        if (const Json* d = member(*response, "description"); truthy(d)) {
            out.append("description:").append(kQuote);
            out.append(python_str(d, "a response description")).append(kQuote).append(",");
        }
        const Json* type = member(*response, "type");
        if (type && ascii_upper(python_str(type, "the response type")) == "OBJECT") {
            out.append("type:").append(kQuote).append("OBJECT").append(kQuote).append("}");
        }
    }
    out += '}';
    return trim(out);
}

}  // namespace

ChatStyle ChatStyle::from_template(std::string_view src) {
    ChatStyle style;
    if (src.empty()) return style;
    style.recognized = contains(src, "<|turn>") && contains(src, "<turn|>");
    // Jinja sources spell the newline as the escape "\n" inside string literals; accept both.
    style.empty_thought_when_not_thinking = contains(src, "<|channel>thought\\n<channel|>") ||
                                            contains(src, "<|channel>thought\n<channel|>");
    style.newline_after_think = contains(src, "<|think|>\\n") || contains(src, "<|think|>\n");
    return style;
}

std::string render(const std::vector<Message>& messages, const ChatOptions& options,
                   const ChatStyle& style) {
    if (messages.empty()) throw ChatError("cannot render an empty conversation");
    for (size_t i = 0; i < messages.size(); ++i) {
        if (messages[i].role.empty()) {
            throw ChatError("message " + std::to_string(i) + " has no role");
        }
    }
    std::string out = "<bos>";
    size_t first = 0;
    const bool leading_system = messages[0].role == "system" || messages[0].role == "developer";
    if (!options.tools.is_array()) throw ChatError("tools must be a JSON array");
    const bool has_tools = !options.tools.empty();
    if (options.enable_thinking || leading_system || has_tools) {
        out += "<|turn>system\n";
        if (options.enable_thinking) out += style.newline_after_think ? "<|think|>\n" : "<|think|>";
        if (leading_system) {
            out += trim(messages[0].content);
            first = 1;
        }
        for (const Json& tool : options.tools) {
            out += "<|tool>" + format_function_declaration(tool) + "<tool|>";
        }
        out += "<turn|>\n";
    }

    bool last_was_tool_response = false;
    for (size_t i = first; i < messages.size(); ++i) {
        const Message& m = messages[i];
        const std::string role = m.role == "assistant" ? "model" : m.role;
        out += "<|turn>" + role + "\n";
        for (const ToolCall& call : m.tool_calls) {
            out += "<|tool_call>call:" + call.name + "{";
            if (call.arguments.is_object()) {
                bool first_arg = true;
                for (const auto& [key, value] : dictsort(call.arguments)) {
                    if (!first_arg) out += ',';
                    first_arg = false;
                    out += key + ":";
                    format_argument(*value, false, out, 1);
                }
            } else if (call.arguments.is_string()) {
                out += call.arguments.get_ref<const std::string&>();
            }
            out += "}<tool_call|>";
        }
        for (const ToolResponse& r : m.tool_responses) {
            out += "<|tool_response>response:" + r.name + "{";
            if (r.response.is_object()) {
                bool first_key = true;
                for (const auto& [key, value] : dictsort(r.response)) {
                    if (!first_key) out += ',';
                    first_key = false;
                    out += key + ":";
                    format_argument(*value, false, out, 1);
                }
            } else {
                out += "value:";
                format_argument(r.response, false, out);
            }
            out += "}<tool_response|>";
        }
        out += role == "model" ? strip_thinking(m.content) : trim(m.content);
        // A turn that only carries tool responses stays open: the model continues it.
        if (m.tool_responses.empty() || !m.content.empty()) out += "<turn|>\n";
        last_was_tool_response = !m.tool_responses.empty();
    }

    if (options.add_generation_prompt) {
        if (!last_was_tool_response) out += "<|turn>model\n";
        if (!options.enable_thinking && style.empty_thought_when_not_thinking) {
            out += "<|channel>thought\n<channel|>";
        }
    }
    return out;
}

std::vector<Message> messages_from_json(const Json& j) {
    if (!j.is_array()) throw ChatError("a conversation must be a JSON array of messages");
    std::vector<Message> out;
    for (size_t i = 0; i < j.size(); ++i) {
        const Json& m = j[i];
        const std::string where = "message " + std::to_string(i);
        if (!m.is_object()) throw ChatError(where + " is not a JSON object");
        auto str = [&](const Json& obj, const char* key, const std::string& ctx) -> std::string {
            auto it = obj.find(key);
            if (it == obj.end() || it->is_null()) return "";
            if (!it->is_string()) throw ChatError(ctx + ": '" + key + "' must be a string");
            return it->get<std::string>();
        };
        Message msg;
        msg.role = str(m, "role", where);
        if (auto it = m.find("content"); it != m.end() && it->is_array()) {
            throw ChatError(where + ": list-valued (multimodal) content is not supported");
        }
        msg.content = str(m, "content", where);
        if (auto it = m.find("tool_calls"); it != m.end() && !it->is_null()) {
            if (!it->is_array()) throw ChatError(where + ": 'tool_calls' must be an array");
            for (size_t k = 0; k < it->size(); ++k) {
                const std::string ctx = where + " tool_calls[" + std::to_string(k) + "]";
                const Json& call = (*it)[k];
                if (!call.is_object() || !call.contains("function") ||
                    !call["function"].is_object()) {
                    throw ChatError(ctx + " needs a 'function' object");
                }
                const Json& fn = call["function"];
                if (!fn.contains("name") || !fn["name"].is_string()) {
                    throw ChatError(ctx + ": the function needs a string 'name'");
                }
                ToolCall tc{fn["name"].get<std::string>(), fn.value("arguments", Json())};
                msg.tool_calls.push_back(std::move(tc));
            }
        }
        if (auto it = m.find("tool_responses"); it != m.end() && !it->is_null()) {
            if (!it->is_array()) throw ChatError(where + ": 'tool_responses' must be an array");
            for (size_t k = 0; k < it->size(); ++k) {
                const std::string ctx = where + " tool_responses[" + std::to_string(k) + "]";
                const Json& r = (*it)[k];
                if (!r.is_object()) throw ChatError(ctx + " is not a JSON object");
                // The template writes an absent name as "unknown" (Jinja's default filter).
                std::string name = r.contains("name") ? str(r, "name", ctx) : "unknown";
                msg.tool_responses.push_back({std::move(name), r.value("response", Json())});
            }
        }
        out.push_back(std::move(msg));
    }
    return out;
}

}  // namespace gj::chat
