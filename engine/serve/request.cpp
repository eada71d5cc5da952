#include "engine/serve/request.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/serve/api_error.h"
#include "engine/serve/json_depth.h"

namespace gj::serve {

namespace {

using Json = nlohmann::json;
using OJson = nlohmann::ordered_json;

const Json* field(const Json& obj, const char* key) {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return nullptr;  // null means "not given", as OpenAI
    return &*it;
}

double number(const Json& obj, const char* key, double lo, double hi) {
    const Json* v = field(obj, key);
    if (!v->is_number()) throw ApiError(400, std::string("'") + key + "' must be a number", key);
    const double x = v->get<double>();
    if (!(x >= lo && x <= hi)) {
        throw ApiError(400,
                       std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + "], got " + std::to_string(x),
                       key);
    }
    return x;
}

int64_t integer(const Json& obj, const char* key, int64_t lo, int64_t hi) {
    const Json* v = field(obj, key);
    if (!v->is_number_integer()) {
        throw ApiError(400, std::string("'") + key + "' must be an integer", key);
    }
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi)) {
        throw ApiError(400, std::string("'") + key + "' is too large", key);
    }
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) {
        throw ApiError(400,
                       std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + "], got " + std::to_string(x),
                       key);
    }
    return x;
}

bool boolean(const Json& obj, const char* key) {
    const Json* v = field(obj, key);
    if (!v) return false;
    if (!v->is_boolean()) throw ApiError(400, std::string("'") + key + "' must be a boolean", key);
    return v->get<bool>();
}

std::string string_field(const Json& obj, const char* key, const std::string& where) {
    const Json* v = field(obj, key);
    if (!v) return "";
    if (!v->is_string()) throw ApiError(400, where + "'" + key + "' must be a string", key);
    return v->get<std::string>();
}

// The options both endpoints share.
GenerationParams common_params(const Json& body, const sample::SamplerParams& defaults) {
    GenerationParams g;
    g.sampling = defaults;
    g.model = string_field(body, "model", "");
    if (field(body, "temperature")) {
        g.sampling.temperature = static_cast<float>(number(body, "temperature", 0, 2));
    }
    if (field(body, "top_p")) {
        g.sampling.top_p = static_cast<float>(number(body, "top_p", 0, 1));
        if (g.sampling.top_p == 0.0f) throw ApiError(400, "'top_p' must be > 0", "top_p");
    }
    if (field(body, "top_k"))
        g.sampling.top_k = static_cast<int>(integer(body, "top_k", 0, 1 << 20));
    if (field(body, "min_p")) g.sampling.min_p = static_cast<float>(number(body, "min_p", 0, 1));
    if (field(body, "seed")) {
        // Negative seeds are accepted (some clients send -1) and used as their two's complement.
        g.sampling.seed =
            static_cast<uint64_t>(integer(body, "seed", std::numeric_limits<int64_t>::min(),
                                          std::numeric_limits<int64_t>::max()));
    }
    for (const char* key : {"frequency_penalty", "presence_penalty"}) {
        if (field(body, key) && number(body, key, -2, 2) != 0.0) {
            throw ApiError(400,
                           std::string("'") + key +
                               "' is not supported by this server (only 0); use "
                               "'repeat_penalty' for a repetition penalty",
                           key, "unsupported_parameter");
        }
    }
    if (field(body, "repeat_penalty")) {
        g.sampling.repeat_penalty = static_cast<float>(number(body, "repeat_penalty", 1e-3, 100));
    }
    if (field(body, "n") && integer(body, "n", 1, 1 << 20) != 1) {
        throw ApiError(400, "'n' must be 1: this server returns one choice per request", "n",
                       "unsupported_parameter");
    }
    if (boolean(body, "logprobs")) {
        throw ApiError(400, "'logprobs' is not supported by this server", "logprobs",
                       "unsupported_parameter");
    }
    for (const char* key : {"max_completion_tokens", "max_tokens"}) {
        if (field(body, key)) {
            g.max_tokens = static_cast<int>(integer(body, key, 0, std::numeric_limits<int>::max()));
            break;
        }
    }
    if (const Json* stop = field(body, "stop")) {
        auto add = [&](const Json& s) {
            if (!s.is_string())
                throw ApiError(400, "'stop' must be a string or a list of strings", "stop");
            if (!s.get_ref<const std::string&>().empty()) g.stop.push_back(s.get<std::string>());
        };
        if (stop->is_array()) {
            if (stop->size() > 16) throw ApiError(400, "'stop' holds at most 16 strings", "stop");
            for (const Json& s : *stop) add(s);
        } else {
            add(*stop);
        }
    }
    g.stream = boolean(body, "stream");
    if (const Json* so = field(body, "stream_options")) {
        if (!so->is_object())
            throw ApiError(400, "'stream_options' must be an object", "stream_options");
        g.include_usage = boolean(*so, "include_usage");
    }
    try {
        g.sampling.validate();
    } catch (const sample::SamplerError& e) {
        throw ApiError(400, e.what());
    }
    return g;
}

// Text of an OpenAI content value: a string, null, or a list of {"type": "text", "text"} parts.
std::string content_text(const Json& m, const std::string& where) {
    const Json* c = field(m, "content");
    if (!c) return "";
    if (c->is_string()) return c->get<std::string>();
    if (!c->is_array()) {
        throw ApiError(400, where + ": 'content' must be a string or a list of parts", "messages");
    }
    std::string out;
    for (size_t k = 0; k < c->size(); ++k) {
        const Json& part = (*c)[k];
        const std::string at = where + ".content[" + std::to_string(k) + "]";
        if (!part.is_object()) throw ApiError(400, at + " must be an object", "messages");
        const Json* type = field(part, "type");
        if (!type || !type->is_string()) {
            throw ApiError(400, at + ": 'type' must be a string", "messages");
        }
        if (type->get_ref<const std::string&>() != "text") {
            throw ApiError(400,
                           at + ": only text content parts are supported, not '" +
                               type->get<std::string>() + "'",
                           "messages");
        }
        const Json* text = field(part, "text");
        if (!text || !text->is_string()) {
            throw ApiError(400, at + ": 'text' must be a string", "messages");
        }
        out += text->get<std::string>();
    }
    return out;
}

// A tool result that is a JSON object is written as k:v pairs; anything else (other JSON, plain
// text) as one string value.
OJson tool_result(const std::string& text, const std::string& where) {
    try {
        OJson parsed = parse_json_depth_limited<OJson>(text, where + ": the tool result 'content'",
                                                       "messages");
        if (parsed.is_object()) return parsed;
    } catch (const OJson::exception&) {
        // Not JSON (or a number no double holds): plain text. A too-deep result is an ApiError,
        // which is no nlohmann exception and goes on to the client.
    }
    return OJson(text);
}

// Tool-call arguments given as a string: the JSON it holds, or the string itself when it is not
// JSON (written as is).
OJson tool_arguments(const std::string& text, const std::string& where) {
    try {
        return parse_json_depth_limited<OJson>(text, where + ": 'arguments'", "messages");
    } catch (const OJson::exception&) {
        return OJson(text);
    }
}

// A request shape none of the checks here anticipated can still make nlohmann throw (a
// type_error, say, or an invalid_iterator): the request is at fault, so it is a 400 that says
// what nlohmann found, not the 500 an unknown exception becomes.
template <class Parse>
auto json_errors_are_client_errors(Parse&& parse) -> decltype(parse()) {
    try {
        return parse();
    } catch (const Json::exception& e) {
        throw ApiError(400, std::string("the request has an unexpected shape: ") + e.what());
    }
}

}  // namespace

Json parse_body(std::string_view body) {
    Json j;
    try {
        // nlohmann's parser rejects ill-formed UTF-8 inside strings, so invalid UTF-8 lands here.
        j = parse_json_depth_limited<Json>(body, "the request body");
    } catch (const Json::parse_error& e) {
        throw ApiError(400, std::string("the request body is not valid JSON (UTF-8): ") + e.what());
    } catch (const Json::out_of_range& e) {
        // Well-formed JSON, but a number such as 1e400 that no double holds.
        throw ApiError(400,
                       std::string("the request body holds a number out of range: ") + e.what());
    } catch (const Json::exception& e) {
        throw ApiError(400, std::string("the request body could not be read as JSON: ") + e.what());
    }
    if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
    return j;
}

namespace {

std::vector<chat::Message> openai_messages(const Json& messages) {
    if (!messages.is_array()) throw ApiError(400, "'messages' must be an array", "messages");
    if (messages.empty()) throw ApiError(400, "'messages' must not be empty", "messages");
    std::vector<chat::Message> out;
    // The assistant turn the following tool messages answer, and its calls' ids -> names.
    long open_call_turn = -1;
    std::vector<std::pair<std::string, std::string>> call_names;
    for (size_t i = 0; i < messages.size(); ++i) {
        const Json& m = messages[i];
        const std::string where = "messages[" + std::to_string(i) + "]";
        if (!m.is_object()) throw ApiError(400, where + " must be an object", "messages");
        const Json* role_v = field(m, "role");
        if (!role_v || !role_v->is_string()) {
            throw ApiError(400, where + " needs a string 'role'", "messages");
        }
        const std::string role = role_v->get<std::string>();
        const std::string text = content_text(m, where);
        if (role == "tool") {
            if (open_call_turn < 0) {
                throw ApiError(400,
                               where +
                                   ": a 'tool' message must follow an assistant message with "
                                   "'tool_calls'",
                               "messages");
            }
            const std::string id = string_field(m, "tool_call_id", where + ": ");
            std::string name = string_field(m, "name", where + ": ");
            for (const auto& [call_id, call_name] : call_names) {
                if (name.empty() && call_id == id) name = call_name;
            }
            if (name.empty() && call_names.size() == 1) name = call_names[0].second;
            chat::ToolResponse r;
            if (!name.empty()) r.name = name;
            r.response = tool_result(text, where);
            out[static_cast<size_t>(open_call_turn)].tool_responses.push_back(std::move(r));
            continue;
        }
        if (role != "system" && role != "developer" && role != "user" && role != "assistant") {
            throw ApiError(400,
                           where + ": unknown role '" + role +
                               "' (system, developer, user, assistant or tool)",
                           "messages");
        }
        if ((role == "system" || role == "developer") && i != 0) {
            // The template writes only a leading system message into the system turn.
            throw ApiError(400, where + ": a system message must be the first message", "messages");
        }
        chat::Message msg;
        msg.role = role;
        msg.content = text;
        open_call_turn = -1;
        call_names.clear();
        if (const Json* calls = field(m, "tool_calls"); calls && role == "assistant") {
            if (!calls->is_array())
                throw ApiError(400, where + ": 'tool_calls' must be an array", "messages");
            for (size_t k = 0; k < calls->size(); ++k) {
                const Json& call = (*calls)[k];
                const std::string at = where + ".tool_calls[" + std::to_string(k) + "]";
                const Json* fn = call.is_object() ? field(call, "function") : nullptr;
                if (!fn || !fn->is_object() || !fn->contains("name") ||
                    !(*fn)["name"].is_string()) {
                    throw ApiError(400, at + " needs {\"function\": {\"name\"}}", "messages");
                }
                chat::ToolCall tc;
                tc.name = (*fn)["name"].get<std::string>();
                if (const Json* args = field(*fn, "arguments")) {
                    // The body's own depth limit already bounds arguments given as JSON.
                    tc.arguments = args->is_string() ? tool_arguments(args->get<std::string>(), at)
                                                     : OJson::parse(args->dump());
                }
                call_names.emplace_back(string_field(call, "id", at + ": "), tc.name);
                msg.tool_calls.push_back(std::move(tc));
            }
            if (!msg.tool_calls.empty()) open_call_turn = static_cast<long>(out.size());
        }
        if (role != "assistant" && text.empty()) {
            throw ApiError(400, where + ": 'content' must not be empty", "messages");
        }
        out.push_back(std::move(msg));
    }
    return out;
}

ChatRequest chat_request(const Json& body, const sample::SamplerParams& defaults) {
    ChatRequest r;
    if (!field(body, "messages")) throw ApiError(400, "'messages' is required", "messages");
    r.messages = openai_messages(body["messages"]);
    r.gen = common_params(body, defaults);
    if (const Json* rf = field(body, "response_format")) {
        if (!rf->is_object()) {
            throw ApiError(400, "'response_format' must be an object", "response_format");
        }
        const Json* type = field(*rf, "type");
        if (!type || !type->is_string()) {
            throw ApiError(400, "'response_format.type' must be a string", "response_format");
        }
        if (type->get_ref<const std::string&>() != "text") {
            throw ApiError(400,
                           "'response_format' '" + type->get<std::string>() +
                               "': constrained (JSON) decoding is not implemented yet; only "
                               "{\"type\": \"text\"}",
                           "response_format", "unsupported_parameter");
        }
    }
    if (const Json* effort = field(body, "reasoning_effort")) {
        if (!effort->is_string())
            throw ApiError(400, "'reasoning_effort' must be a string", "reasoning_effort");
        const std::string e = effort->get<std::string>();
        if (e != "none" && e != "minimal" && e != "low" && e != "medium" && e != "high") {
            throw ApiError(400, "'reasoning_effort' must be none, minimal, low, medium or high",
                           "reasoning_effort");
        }
        // Gemma 4 thinks or does not; it has no budget levels.
        r.options.enable_thinking = e != "none";
    }
    if (const Json* kw = field(body, "chat_template_kwargs")) {
        if (!kw->is_object())
            throw ApiError(400, "'chat_template_kwargs' must be an object", "chat_template_kwargs");
        if (field(*kw, "enable_thinking"))
            r.options.enable_thinking = boolean(*kw, "enable_thinking");
    }
    // tool_choice: "auto" (the model decides), "none" (it is not told about the tools),
    // "required" (its reply opens with a call) or {"type": "function", "function": {"name"}} (its
    // reply opens with a call of that function). The last two force the reply's first tokens:
    // Gemma 4 writes a call as <|tool_call>call:NAME{...}<tool_call|>, so once the prompt ends
    // with the call's opening the model can only go on with the call (reply_prefix).
    std::string tool_choice = "auto", forced_name;
    if (const Json* tc = field(body, "tool_choice")) {
        if (tc->is_string()) {
            tool_choice = tc->get<std::string>();
            if (tool_choice != "auto" && tool_choice != "none" && tool_choice != "required") {
                throw ApiError(400, "'tool_choice' must be auto, none, required or a function",
                               "tool_choice");
            }
        } else if (tc->is_object()) {
            const Json* fn = field(*tc, "function");
            const Json* type = field(*tc, "type");
            if ((type && (!type->is_string() || type->get<std::string>() != "function")) || !fn ||
                !fn->is_object() || !field(*fn, "name") || !(*fn)["name"].is_string()) {
                throw ApiError(400,
                               "'tool_choice' as an object must be {\"type\": \"function\", "
                               "\"function\": {\"name\": ...}}",
                               "tool_choice");
            }
            tool_choice = "function";
            forced_name = (*fn)["name"].get<std::string>();
        } else {
            throw ApiError(400, "'tool_choice' must be a string or an object", "tool_choice");
        }
    }
    const Json* tools = field(body, "tools");
    if (tools) {
        if (!tools->is_array()) throw ApiError(400, "'tools' must be an array", "tools");
        for (const Json& t : *tools) {
            if (!t.is_object() || !t.contains("function") || !t["function"].is_object() ||
                !t["function"].contains("name") || !t["function"]["name"].is_string()) {
                throw ApiError(400,
                               "each tool needs {\"type\": \"function\", \"function\": {\"name\"}}",
                               "tools");
            }
        }
        // tool_choice "none": the model is not told about the tools at all. The body's depth
        // limit bounds the recursion of dump() here and of the rendering below.
        if (tool_choice != "none") r.options.tools = OJson::parse(tools->dump());
    }
    if (tool_choice == "required" || tool_choice == "function") {
        if (!tools || tools->empty()) {
            throw ApiError(
                400,
                "'tool_choice' " +
                    std::string(tool_choice == "required" ? "\"required\"" : "naming a function") +
                    " needs 'tools'",
                "tool_choice");
        }
        if (tool_choice == "function") {
            const bool declared = std::any_of(tools->begin(), tools->end(), [&](const Json& t) {
                return t["function"]["name"].get<std::string>() == forced_name;
            });
            if (!declared) {
                throw ApiError(
                    400, "'tool_choice' names '" + forced_name + "', which is not one of 'tools'",
                    "tool_choice");
            }
            r.reply_prefix = "<|tool_call>call:" + forced_name + "{";
        } else {
            r.reply_prefix = "<|tool_call>call:";
        }
    }
    // Render once here so a tool declaration the template cannot write is this request's 400.
    try {
        (void)chat::render(r.messages, r.options);
    } catch (const chat::ChatError& e) {
        throw ApiError(400, e.what(), "messages");
    }
    return r;
}

CompletionRequest completion_request(const Json& body, const sample::SamplerParams& defaults) {
    CompletionRequest r;
    const Json* p = field(body, "prompt");
    if (!p) throw ApiError(400, "'prompt' is required", "prompt");
    if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) p = &(*p)[0];
    if (!p->is_string()) {
        throw ApiError(400, "'prompt' must be a string (or a list of one string)", "prompt");
    }
    r.prompt = p->get<std::string>();
    if (r.prompt.empty()) throw ApiError(400, "'prompt' must not be empty", "prompt");
    if (boolean(body, "echo"))
        throw ApiError(400, "'echo' is not supported", "echo", "unsupported_parameter");
    if (field(body, "suffix"))
        throw ApiError(400, "'suffix' is not supported", "suffix", "unsupported_parameter");
    r.gen = common_params(body, defaults);
    return r;
}

}  // namespace

std::vector<chat::Message> messages_from_openai(const Json& messages) {
    return json_errors_are_client_errors([&] { return openai_messages(messages); });
}

ChatRequest parse_chat_request(const Json& body, const sample::SamplerParams& defaults) {
    return json_errors_are_client_errors([&] { return chat_request(body, defaults); });
}

CompletionRequest parse_completion_request(const Json& body,
                                           const sample::SamplerParams& defaults) {
    return json_errors_are_client_errors([&] { return completion_request(body, defaults); });
}

}  // namespace gj::serve
