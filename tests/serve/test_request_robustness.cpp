// Hostile and mistyped request bodies: JSON nested deep enough to overflow a recursive walk,
// fields of the wrong type, numbers beyond a double, tool schemas the template cannot write. Each
// must be a 400 ApiError that names the problem (never a crash, never a 500 from an nlohmann
// exception escaping).
#include <gtest/gtest.h>

#include "engine/serve/api_error.h"
#include "engine/serve/json_depth.h"
#include "engine/serve/request.h"

using gj::serve::ApiError;
using Json = nlohmann::json;

namespace {

// The ApiError a chat body gets (status 200 and no message when it parses).
ApiError chat_error(const std::string& body) {
    try {
        (void)gj::serve::parse_chat_request(gj::serve::parse_body(body), {});
    } catch (const ApiError& e) {
        return e;
    }
    return ApiError(200, "");
}

ApiError completion_error(const std::string& body) {
    try {
        (void)gj::serve::parse_completion_request(gj::serve::parse_body(body), {});
    } catch (const ApiError& e) {
        return e;
    }
    return ApiError(200, "");
}

std::string nested_arrays(size_t levels) {
    return std::string(levels, '[') + std::string(levels, ']');
}

std::string nested_objects(size_t levels) {
    std::string s;
    for (size_t i = 0; i < levels; ++i) s += "{\"a\":";
    s += "1";
    return s + std::string(levels, '}');
}

// A JSON string literal holding `text`.
std::string quoted(const std::string& text) {
    return Json(text).dump();
}

const std::string kUser = R"({"role":"user","content":"x"})";
const std::string kCall =
    R"({"role":"assistant","tool_calls":[{"id":"c1","function":{"name":"f","arguments":"{}"}}]})";

#define EXPECT_400_NAMING(error, needle)                                                \
    do {                                                                                \
        const ApiError e_ = (error);                                                    \
        EXPECT_EQ(e_.status, 400) << e_.what();                                         \
        EXPECT_NE(std::string(e_.what()).find(needle), std::string::npos) << e_.what(); \
    } while (0)

}  // namespace

TEST(RequestDepth, TheLimitIsExact) {
    // The body object is level 1: 63 more levels parse, 64 more do not.
    const size_t inner = gj::serve::kMaxJsonDepth - 1;
    EXPECT_NO_THROW(gj::serve::parse_body("{\"x\":" + nested_arrays(inner) + "}"));
    EXPECT_THROW(gj::serve::parse_body("{\"x\":" + nested_arrays(inner + 1) + "}"), ApiError);
    EXPECT_NO_THROW(gj::serve::parse_json_depth_limited<nlohmann::ordered_json>(
        nested_objects(gj::serve::kMaxJsonDepth), "x"));
    EXPECT_THROW(gj::serve::parse_json_depth_limited<nlohmann::ordered_json>(
                     nested_objects(gj::serve::kMaxJsonDepth + 1), "x"),
                 ApiError);
}

TEST(RequestDepth, DeepBodiesAre400sNotCrashes) {
    // A tool schema nested 100000 deep (a 200 KB body).
    const ApiError schema = chat_error(
        "{\"messages\":[" + kUser +
        R"(],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object",
        "properties":{"a":{"type":"string","x":)" +
        nested_arrays(100000) + "}}}}}]}");
    EXPECT_400_NAMING(schema, "the request body nests objects and arrays deeper than the 64");
    EXPECT_EQ(schema.code, "json_too_deep");
    // Tool-call arguments given as a deep JSON object.
    EXPECT_400_NAMING(chat_error(R"({"messages":[)" + kUser +
                                 R"(,{"role":"assistant","tool_calls":[{"id":"c1","function":
        {"name":"f","arguments":)" +
                                 nested_objects(100000) + "}}]}]}"),
                      "deeper than the 64 levels");
    EXPECT_400_NAMING(completion_error(R"({"prompt":"x","stop":)" + nested_arrays(100000) + "}"),
                      "deeper than the 64 levels");
}

TEST(RequestDepth, DeepJsonInsideStringsIs400) {
    // Tool-call arguments given as a string holding deep JSON.
    EXPECT_400_NAMING(
        chat_error(R"({"messages":[)" + kUser +
                   R"(,{"role":"assistant","tool_calls":[{"id":"c1","function":{"name":"f",
                   "arguments":)" +
                   quoted(nested_objects(100000)) + "}}]}]}"),
        "messages[1].tool_calls[0]: 'arguments' nests objects and arrays deeper than the 64");
    // A tool result whose content is a JSON object nested 1.5M deep.
    const std::string deep = "{\"a\":" + nested_arrays(1500000) + "}";
    EXPECT_400_NAMING(
        chat_error(R"({"messages":[)" + kUser + "," + kCall +
                   R"(,{"role":"tool","tool_call_id":"c1","content":)" + quoted(deep) + "}]}"),
        "messages[2]: the tool result 'content' nests objects and arrays deeper");
    // Shallow JSON in those strings still renders.
    EXPECT_EQ(chat_error(R"({"messages":[)" + kUser +
                         R"(,{"role":"assistant","tool_calls":[{"id":"c1","function":{"name":"f",
                         "arguments":)" +
                         quoted("{\"a\":" + nested_arrays(62) + "}") +
                         R"(}}]},{"role":"tool","tool_call_id":"c1","content":)" +
                         quoted("{\"a\":" + nested_arrays(62) + "}") + "}]}")
                  .status,
              200);
    // Text that is not JSON stays text.
    EXPECT_EQ(chat_error(R"({"messages":[)" + kUser + "," + kCall +
                         R"(,{"role":"tool","tool_call_id":"c1","content":"[[[ not json"}]})")
                  .status,
              200);
}

TEST(RequestTypes, WrongTypedFieldsAre400sNamingTheField) {
    EXPECT_400_NAMING(
        chat_error(R"({"messages":[{"role":"user","content":[{"type":5,"text":"x"}]}]})"),
        "messages[0].content[0]: 'type' must be a string");
    EXPECT_400_NAMING(
        chat_error(R"({"messages":[{"role":"user","content":[{"type":"text","text":5}]}]})"),
        "messages[0].content[0]: 'text' must be a string");
    EXPECT_400_NAMING(chat_error(R"({"messages":[{"role":"user","content":[7]}]})"),
                      "messages[0].content[0] must be an object");
    EXPECT_400_NAMING(
        chat_error(R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})"),
        "only text content parts are supported, not 'image_url'");
    const ApiError id = chat_error(
        R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":5,
        "function":{"name":"f","arguments":"{}"}}]}]})");
    EXPECT_400_NAMING(id, "messages[1].tool_calls[0]: 'id' must be a string");
    EXPECT_EQ(id.param, "id");
    const std::string user = R"("messages":[{"role":"user","content":"x"}])";
    EXPECT_400_NAMING(chat_error("{" + user + R"(,"response_format":{"type":1}})"),
                      "'response_format.type' must be a string");
    EXPECT_400_NAMING(chat_error("{" + user + R"(,"response_format":{}})"),
                      "'response_format.type' must be a string");
    EXPECT_400_NAMING(chat_error("{" + user + R"(,"response_format":"text"})"),
                      "'response_format' must be an object");
    EXPECT_EQ(chat_error("{" + user + R"(,"response_format":{"type":"text"}})").status, 200);
    EXPECT_400_NAMING(chat_error("{" + user + R"(,"response_format":{"type":"json_object"}})"),
                      "'response_format' 'json_object': constrained");
}

TEST(RequestTypes, OutOfRangeNumbersAre400s) {
    const std::string user = R"("messages":[{"role":"user","content":"x"}])";
    for (const char* field : {"temperature", "top_p", "max_tokens", "seed", "n"}) {
        EXPECT_400_NAMING(chat_error("{" + user + ",\"" + field + "\":1e400}"),
                          "number out of range");
        EXPECT_400_NAMING(chat_error("{" + user + ",\"" + field + "\":-1e400}"),
                          "number out of range");
    }
    EXPECT_400_NAMING(completion_error(R"({"prompt":"x","temperature":1e400})"),
                      "number out of range");
    // Within a double but outside the field's range: the range check names the field.
    EXPECT_400_NAMING(chat_error("{" + user + R"(,"temperature":1e300})"), "'temperature'");
    EXPECT_400_NAMING(chat_error("{" + user + R"(,"max_tokens":1e30})"), "'max_tokens'");
    EXPECT_400_NAMING(chat_error("{" + user + R"(,"seed":99999999999999999999})"), "'seed'");
    // A tool argument string holding 1e400 is not JSON a double holds: it stays text.
    EXPECT_EQ(chat_error(R"({"messages":[{"role":"user","content":"x"},{"role":"assistant",
                         "tool_calls":[{"id":"c1","function":{"name":"f","arguments":"1e400"}}]}]})")
                  .status,
              200);
}

TEST(RequestTypes, NonObjectToolPropertiesAre400) {
    const std::string user = R"("messages":[{"role":"user","content":"x"}])";
    EXPECT_400_NAMING(chat_error("{" + user + R"(,"tools":[{"type":"function","function":{
        "name":"f","parameters":{"type":"object","properties":[1,2]}}}]})"),
                      "tool 'f': 'parameters.properties' must be an object");
    EXPECT_400_NAMING(chat_error("{" + user + R"(,"tools":[{"type":"function","function":{
        "name":"f","parameters":{"type":"object","properties":"abc"}}}]})"),
                      "'parameters.properties' must be an object");
    EXPECT_400_NAMING(chat_error("{" + user + R"(,"tools":[{"type":"function","function":{
        "name":"f","parameters":{"type":"object","properties":{"a":[1]}}}}]})"),
                      "tool parameter 'a' needs a 'type'");
}

// Whatever nlohmann still throws for a shape no check anticipated is the request's 400.
TEST(RequestTypes, NoNlohmannExceptionEscapes) {
    const std::vector<std::string> bodies = {
        R"({"messages":[{"role":"user","content":[{"type":null,"text":"x"}]}]})",
        R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":[],
            "function":{"name":"f","arguments":{"a":[1,{"b":null}]}}}]}]})",
        R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":[]}})",
        R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{
            "name":"f","description":{"x":1},"parameters":{"type":{"a":1},"required":{"a":1},
            "properties":{"a":{"type":"array","items":{"type":[1,{}],"required":5}}}}}}]})",
        R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{
            "name":"f","response":{"type":[]}}}]})",
        R"({"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":1}})",
        R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"enable_thinking":"y"}})",
    };
    for (const std::string& body : bodies) {
        try {
            (void)gj::serve::parse_chat_request(gj::serve::parse_body(body), {});
        } catch (const ApiError& e) {
            EXPECT_EQ(e.status, 400) << body << ": " << e.what();
        } catch (const std::exception& e) {
            ADD_FAILURE() << body << " escaped as " << e.what();
        }
    }
}
