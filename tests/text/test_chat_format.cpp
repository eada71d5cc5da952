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

TEST(ChatFormat, RenderedPromptTokenizesWithSpecialTokens) {
    gj::tok::Tokenizer tok(gj::tok::make_synthetic_vocab(2048, 0));
    std::vector<Message> m = {{"system", "Be brief.", {}, {}}, {"user", "Hello world", {}, {}}};
    auto ids = tok.encode(gj::chat::render(m, {}), /*add_bos=*/false);
    ASSERT_GE(ids.size(), 10u);
    EXPECT_EQ(ids[0], 2);                                   // <bos>
    EXPECT_EQ(ids[1], 105);                                 // <|turn>
    EXPECT_EQ(std::count(ids.begin(), ids.end(), 106), 2);  // two closed turns
    EXPECT_EQ(ids.back(), 101);                             // <channel|>
    EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 1);    // exactly one BOS
}
