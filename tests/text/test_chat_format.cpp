// The native Gemma 4 chat renderer against golden renderings of the public Jinja template
// (tools/chat_golden.py), template-variant detection, JSON input errors, and tokenization of a
// rendered prompt.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "engine/text/chat_format.h"
#include "engine/text/tokenizer.h"
#include "tests/support/test_env.h"

using gj::chat::ChatError;
using gj::chat::ChatOptions;
using gj::chat::ChatStyle;
using gj::chat::Message;
using Json = nlohmann::ordered_json;

namespace {

std::string read_file(const std::filesystem::path& p) {
    std::ifstream f(p, std::ios::binary);
    if (!f) throw std::runtime_error("cannot read " + p.string());
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

Json read_json(const std::string& name) {
    return Json::parse(read_file(gj::test::data_dir() / "chat" / name));
}

}  // namespace

TEST(ChatFormat, MatchesPublicTemplateGoldens) {
    const Json cases = read_json("cases.json");
    const Json golden = read_json("golden.json");
    const ChatStyle style =
        ChatStyle::from_template(read_file(gj::test::data_dir() / "chat" / "gemma4.jinja"));
    ASSERT_EQ(cases.size(), golden.size()) << "golden.json is stale: run tools/chat_golden.py";
    ASSERT_GE(cases.size(), 15u);
    for (const auto& c : cases) {
        const std::string name = c["name"];
        ASSERT_TRUE(golden.contains(name)) << name << " missing: run tools/chat_golden.py";
        ChatOptions opt;
        opt.enable_thinking = c.value("enable_thinking", false);
        opt.add_generation_prompt = c.value("add_generation_prompt", true);
        if (c.contains("tools")) opt.tools = c["tools"];
        auto messages = gj::chat::messages_from_json(c["messages"]);
        EXPECT_EQ(gj::chat::render(messages, opt, style), golden[name].get<std::string>())
            << "case " << name;
    }
}

TEST(ChatFormat, StyleFromTemplate) {
    const std::string src = read_file(gj::test::data_dir() / "chat" / "gemma4.jinja");
    ChatStyle s = ChatStyle::from_template(src);
    EXPECT_TRUE(s.recognized);
    EXPECT_TRUE(s.empty_thought_when_not_thinking);
    EXPECT_FALSE(s.newline_after_think);

    // A revision without the empty thought pre-seed (like E2B's original) and with "<|think|>\n".
    std::string variant = src;
    auto at = variant.find("{{- '<|channel>thought\\n<channel|>' -}}");
    ASSERT_NE(at, std::string::npos);
    variant.erase(at, std::string("{{- '<|channel>thought\\n<channel|>' -}}").size());
    at = variant.find("'<|think|>'");
    ASSERT_NE(at, std::string::npos);
    variant.replace(at, 11, "'<|think|>\\n'");
    s = ChatStyle::from_template(variant);
    EXPECT_FALSE(s.empty_thought_when_not_thinking);
    EXPECT_TRUE(s.newline_after_think);
    std::vector<Message> m = {{"user", "hi", {}, {}}};
    EXPECT_EQ(gj::chat::render(m, {}, s), "<bos><|turn>user\nhi<turn|>\n<|turn>model\n");
    EXPECT_EQ(gj::chat::render(m, {true, true}, s),
              "<bos><|turn>system\n<|think|>\n<turn|>\n<|turn>user\nhi<turn|>\n<|turn>model\n");

    EXPECT_FALSE(ChatStyle::from_template("{{ messages }}<|im_start|>").recognized);
    EXPECT_TRUE(ChatStyle::from_template("").recognized);  // no template: built-in Gemma 4
}

TEST(ChatFormat, BadInputIsAClearError) {
    EXPECT_THROW(gj::chat::render({}, {}), ChatError);
    EXPECT_THROW(gj::chat::render({{"", "x", {}, {}}}, {}), ChatError);
    auto tools_error = [](const char* tools, const std::string& needle) {
        ChatOptions opt;
        opt.tools = Json::parse(tools);
        try {
            gj::chat::render({{"user", "x", {}, {}}}, opt);
            FAIL() << "no error for tools " << tools;
        } catch (const ChatError& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    tools_error(R"([{"function": {"description": "no name"}}])", "needs {\"function\": {\"name\"");
    tools_error(R"([{"function": {"name": "f", "parameters": {"properties": {"x": {}}}}}])",
                "tool parameter 'x' needs a 'type'");
    tools_error(R"({"function": {}})", "tools must be a JSON array");
    auto expect_error = [](const char* json, const std::string& needle) {
        try {
            gj::chat::messages_from_json(Json::parse(json));
            FAIL() << "no error for " << json;
        } catch (const ChatError& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    expect_error(R"({"role":"user"})", "array");
    expect_error(R"([1])", "message 0 is not a JSON object");
    expect_error(R"([{"role":"user","content":5}])", "'content' must be a string");
    expect_error(R"([{"role":"user","content":[{"type":"text","text":"x"}]}])", "multimodal");
    expect_error(R"([{"role":"assistant","tool_calls":[{"x":1}]}])", "needs a 'function' object");
    expect_error(R"([{"role":"assistant","tool_calls":[{"function":{"arguments":{}}}]}])",
                 "string 'name'");
    expect_error(R"([{"role":"tool","tool_responses":{}}])", "'tool_responses' must be an array");
}

TEST(ChatFormat, NonObjectPropertiesAreAChatError) {
    ChatOptions opt;
    opt.tools = Json::parse(R"([{"function": {"name": "f",
        "parameters": {"type": "object", "properties": [1, 2]}}}])");
    try {
        gj::chat::render({{"user", "x", {}, {}}}, opt);
        FAIL() << "no error for list-valued properties";
    } catch (const ChatError& e) {
        EXPECT_NE(std::string(e.what()).find("'parameters.properties' must be an object"),
                  std::string::npos)
            << e.what();
    }
    // Nested one level down, the schema's own 'properties' are checked as well.
    opt.tools = Json::parse(R"([{"function": {"name": "f", "parameters": {"type": "object",
        "properties": {"a": {"type": "array", "items": {"type": "object"}},
                       "b": {"type": "object", "properties": {"c": {"type": "string"}}}}}}}])");
    EXPECT_NO_THROW(gj::chat::render({{"user", "x", {}, {}}}, opt));
}

namespace {

// `levels` arrays, one inside the other, built without recursion (nlohmann's parser is iterative).
Json nested_arrays(int levels) {
    return Json::parse(std::string(static_cast<size_t>(levels), '[') +
                       std::string(static_cast<size_t>(levels), ']'));
}

std::string render_error(const std::vector<Message>& messages, const ChatOptions& opt) {
    try {
        gj::chat::render(messages, opt);
    } catch (const ChatError& e) {
        return e.what();
    }
    return "";
}

}  // namespace

// The renderer recurses once per level: past kMaxNesting it is a ChatError, not a stack overflow
// (the server refuses such JSON when it parses a request; this is the second line). The deep
// values are moved into place, never copied: nlohmann's copy recurses too.
TEST(ChatFormat, DeepNestingIsAChatErrorNotACrash) {
    const int deep = 200000;
    std::vector<Message> call = {{"user", "x", {}, {}}, {"assistant", "", {{"f", {}}}, {}}};
    Json& args = call[1].tool_calls[0].arguments;
    args["a"] = nested_arrays(deep);
    EXPECT_NE(render_error(call, {}).find("deeper than 64 levels"), std::string::npos);

    std::vector<Message> result = {{"user", "x", {}, {}}, {"assistant", "", {}, {{"f", {}}}}};
    result[1].tool_responses[0].response["a"] = nested_arrays(deep);
    EXPECT_NE(render_error(result, {}).find("deeper than 64 levels"), std::string::npos);

    // A schema nested through 'properties' again and again.
    std::string schema;
    for (int i = 0; i < 2000; ++i) schema += R"({"type": "object", "properties": {"p": )";
    schema += R"({"type": "string"})";
    for (int i = 0; i < 2000; ++i) schema += "}}";
    ChatOptions opt;
    opt.tools = Json::parse(R"([{"function": {"name": "f", "parameters": {"type": "object",
        "properties": {"p": )" +
                            schema + "}}}}]");
    EXPECT_NE(render_error({{"user", "x", {}, {}}}, opt).find("deeper than 64 levels"),
              std::string::npos);

    // The limit itself renders: kMaxNesting levels, counting the arguments object.
    args["a"] = nested_arrays(gj::chat::kMaxNesting - 1);
    EXPECT_EQ(render_error(call, {}), "");
    args["a"] = nested_arrays(gj::chat::kMaxNesting);
    EXPECT_NE(render_error(call, {}).find("deeper than 64 levels"), std::string::npos);
}
