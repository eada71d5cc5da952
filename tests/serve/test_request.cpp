// OpenAI request parsing: the typed request for good bodies, a 400 ApiError naming the field for
// bad ones, and the tool round trip rendered the way the Gemma 4 template writes it.
#include <gtest/gtest.h>

#include "engine/serve/api_error.h"
#include "engine/serve/openai_json.h"
#include "engine/serve/request.h"

using gj::serve::ApiError;
using Json = nlohmann::json;

namespace {

gj::sample::SamplerParams defaults() {
    gj::sample::SamplerParams p;
    p.temperature = 0.5f;
    p.top_k = 10;
    return p;
}

int status_of(const std::string& body) {
    try {
        (void)gj::serve::parse_chat_request(gj::serve::parse_body(body), defaults());
    } catch (const ApiError& e) {
        return e.status;
    }
    return 200;
}

}  // namespace

TEST(ChatRequest, ParsesSamplingStopAndStreamOptions) {
    auto r = gj::serve::parse_chat_request(Json::parse(R"({
        "model": "m", "messages": [{"role": "system", "content": "be brief"},
                                   {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "temperature": 0, "top_p": 0.9, "min_p": 0.1, "seed": 42, "max_tokens": 7,
        "stop": ["a", "bb"], "stream": true, "stream_options": {"include_usage": true}})"),
                                           defaults());
    EXPECT_EQ(r.gen.sampling.temperature, 0.0f);
    EXPECT_EQ(r.gen.sampling.top_k, 10);  // the server default stays
    EXPECT_FLOAT_EQ(r.gen.sampling.top_p, 0.9f);
    EXPECT_EQ(r.gen.sampling.seed, 42u);
    EXPECT_EQ(r.gen.max_tokens, 7);
    EXPECT_EQ(r.gen.stop, (std::vector<std::string>{"a", "bb"}));
    EXPECT_TRUE(r.gen.stream);
    EXPECT_TRUE(r.gen.include_usage);
    ASSERT_EQ(r.messages.size(), 2u);
    EXPECT_EQ(r.messages[1].content, "hi");
    EXPECT_FALSE(r.options.enable_thinking);
}

TEST(ChatRequest, ThinkingOnRequest) {
    auto a = gj::serve::parse_chat_request(
        Json::parse(R"({"messages":[{"role":"user","content":"x"}],"reasoning_effort":"high"})"),
        defaults());
    EXPECT_TRUE(a.options.enable_thinking);
    auto b =
        gj::serve::parse_chat_request(Json::parse(R"({"messages":[{"role":"user","content":"x"}],
                        "chat_template_kwargs":{"enable_thinking":true}})"),
                                      defaults());
    EXPECT_TRUE(b.options.enable_thinking);
}

TEST(ChatRequest, BadRequestsAre400s) {
    EXPECT_EQ(status_of("{not json"), 400);
    EXPECT_EQ(status_of("[1,2]"), 400);
    EXPECT_EQ(status_of("{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}"), 400);
    EXPECT_EQ(status_of(R"({})"), 400);
    EXPECT_EQ(status_of(R"({"messages":[]})"), 400);
    EXPECT_EQ(status_of(R"({"messages":"hi"})"), 400);
    EXPECT_EQ(status_of(R"({"messages":[{"role":"wizard","content":"x"}]})"), 400);
    EXPECT_EQ(status_of(R"({"messages":[{"role":"user","content":""}]})"), 400);
    EXPECT_EQ(status_of(R"({"messages":[{"role":"user","content":5}]})"), 400);
    const std::string user = R"("messages":[{"role":"user","content":"x"}])";
    EXPECT_EQ(status_of("{" + user + R"(,"temperature":"hot"})"), 400);
    EXPECT_EQ(status_of("{" + user + R"(,"temperature":5})"), 400);
    EXPECT_EQ(status_of("{" + user + R"(,"max_tokens":-1})"), 400);
    EXPECT_EQ(status_of("{" + user + R"(,"max_tokens":1.5})"), 400);
    EXPECT_EQ(status_of("{" + user + R"(,"n":2})"), 400);
    EXPECT_EQ(status_of("{" + user + R"(,"frequency_penalty":0.5})"), 400);
    EXPECT_EQ(status_of("{" + user + R"(,"presence_penalty":1})"), 400);
    EXPECT_EQ(status_of("{" + user + R"(,"frequency_penalty":0})"), 200);
    EXPECT_EQ(status_of("{" + user + R"(,"response_format":{"type":"json_object"}})"), 400);
    EXPECT_EQ(status_of("{" + user + R"(,"stop":[1]})"), 400);
    EXPECT_EQ(status_of("{" + user + R"(,"stream":"yes"})"), 400);
    EXPECT_EQ(status_of("{" + user + R"(,"tools":[{"type":"function"}]})"), 400);
    EXPECT_EQ(status_of(R"({"messages":[{"role":"tool","content":"x"}]})"), 400);
}

TEST(ChatRequest, ErrorObjectHasOpenAIShape) {
    try {
        (void)gj::serve::parse_chat_request(
            Json::parse(R"({"messages":[{"role":"user","content":"x"}],"n":3})"), defaults());
        FAIL();
    } catch (const ApiError& e) {
        Json j = e.to_json();
        EXPECT_EQ(j["error"]["type"], "invalid_request_error");
        EXPECT_EQ(j["error"]["param"], "n");
        EXPECT_TRUE(j["error"]["message"].is_string());
        EXPECT_TRUE(j["error"].contains("code"));
    }
}

TEST(ChatRequest, ToolRoundTripRendersLikeTheGemmaTemplate) {
    auto r = gj::serve::parse_chat_request(Json::parse(R"({
        "messages": [
          {"role": "user", "content": "weather in Paris?"},
          {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
          {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\":21}"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "w",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}}]})"),
                                           defaults());
    const std::string text = gj::chat::render(r.messages, r.options);
    EXPECT_NE(text.find("<|tool>declaration:get_weather{"), std::string::npos) << text;
    EXPECT_NE(
        text.find("<|turn>model\n<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>"
                  "<|tool_response>response:get_weather{temp:21}<tool_response|>"),
        std::string::npos)
        << text;
    // The model continues its own turn after the tool's result: no new turn is opened.
    EXPECT_EQ(text.find("<|turn>model", text.find("<tool_response|>")), std::string::npos) << text;
}

TEST(ChatRequest, ToolChoiceNoneHidesTheTools) {
    auto r = gj::serve::parse_chat_request(Json::parse(R"({
        "messages": [{"role": "user", "content": "x"}], "tool_choice": "none",
        "tools": [{"type": "function", "function": {"name": "f"}}]})"),
                                           defaults());
    EXPECT_TRUE(r.options.tools.empty());
}

// tool_choice "required" or a named function: the reply is made to begin with the call's opening
// (the prompt ends with it); a name that is not a declared tool, or either form without tools, is
// the request's 400.
TEST(ChatRequest, ToolChoiceRequiredOrNamedForcesTheCallsOpening) {
    const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
    const std::string tools = R"("tools": [{"type": "function", "function": {"name": "f"}},
                                           {"type": "function", "function": {"name": "get_w"}}])";
    auto parse = [&](const std::string& rest) {
        return gj::serve::parse_chat_request(Json::parse("{" + msgs + ", " + rest + "}"),
                                             defaults());
    };
    EXPECT_EQ(parse(tools).reply_prefix, "");
    EXPECT_EQ(parse(tools + R"(, "tool_choice": "auto")").reply_prefix, "");
    EXPECT_EQ(parse(tools + R"(, "tool_choice": "none")").reply_prefix, "");
    const auto req = parse(tools + R"(, "tool_choice": "required")");
    EXPECT_EQ(req.reply_prefix, "<|tool_call>call:");
    EXPECT_EQ(req.options.tools.size(), 2u);
    EXPECT_EQ(
        parse(tools + R"(, "tool_choice": {"type": "function", "function": {"name": "get_w"}})")
            .reply_prefix,
        "<|tool_call>call:get_w{");
    for (const std::string& bad :
         {tools + R"(, "tool_choice": {"type": "function", "function": {"name": "g"}})",
          tools + R"(, "tool_choice": {"type": "function", "function": {}})",
          tools + R"(, "tool_choice": {"type": "code", "function": {"name": "f"}})",
          tools + R"(, "tool_choice": {"function": "f"})",
          std::string(R"("tool_choice": "required")"),
          std::string(R"("tools": [], "tool_choice": "required")"),
          std::string(R"("tool_choice": {"type": "function", "function": {"name": "f"}})")}) {
        SCOPED_TRACE(bad);
        try {
            parse(bad);
            ADD_FAILURE() << "accepted";
        } catch (const ApiError& e) {
            EXPECT_EQ(e.status, 400);
            EXPECT_EQ(e.param, "tool_choice") << e.what();
        }
    }
}

TEST(CompletionRequest, ParsesPrompt) {
    auto r = gj::serve::parse_completion_request(
        Json::parse(R"({"prompt":["abc"],"max_tokens":3})"), defaults());
    EXPECT_EQ(r.prompt, "abc");
    EXPECT_EQ(r.gen.max_tokens, 3);
    EXPECT_THROW(gj::serve::parse_completion_request(Json::parse(R"({"prompt":7})"), defaults()),
                 ApiError);
}

TEST(OpenAIJson, ChunksAndSseFraming) {
    gj::serve::ResponseMeta meta{"chatcmpl-1", 100, "tiny"};
    gj::serve::ParsedDelta d;
    d.reasoning = "hmm";
    d.content = "hi";
    d.tool_calls.push_back({"f", "{\"a\":1}"});
    int index = 0;
    Json deltas = gj::serve::chat_deltas(meta, d, index);
    ASSERT_EQ(deltas.size(), 3u);
    EXPECT_EQ(deltas[0]["reasoning_content"], "hmm");
    EXPECT_EQ(deltas[1]["content"], "hi");
    EXPECT_EQ(deltas[2]["tool_calls"][0]["index"], 0);
    EXPECT_EQ(deltas[2]["tool_calls"][0]["function"]["arguments"], "{\"a\":1}");
    EXPECT_EQ(index, 1);
    Json chunk = gj::serve::chat_chunk(meta, deltas[1]);
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
    const std::string sse = gj::serve::sse_data(chunk);
    EXPECT_EQ(sse.substr(0, 6), "data: ");
    EXPECT_EQ(sse.substr(sse.size() - 2), "\n\n");
    EXPECT_EQ(sse.find('\n'), sse.size() - 2);  // one line: JSON never holds a raw newline
    Json full = gj::serve::chat_completion(meta, d, gj::serve::Finish::ToolCalls, {5, 3, 0});
    EXPECT_EQ(full["choices"][0]["finish_reason"], "tool_calls");
    EXPECT_EQ(full["choices"][0]["message"]["tool_calls"][0]["type"], "function");
    EXPECT_EQ(full["usage"]["total_tokens"], 8);
    gj::serve::ParsedDelta only_calls;
    only_calls.tool_calls.push_back({"f", "{}"});
    EXPECT_TRUE(gj::serve::chat_message(meta, only_calls)["content"].is_null());
}
