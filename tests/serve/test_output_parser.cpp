// The reply splitter: thinking channel -> reasoning, Gemma tool-call syntax -> JSON tool calls,
// the rest -> content; and stop strings over streamed text.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/serve/output_parser.h"
#include "engine/serve/stop_strings.h"

using gj::serve::Marker;
using gj::serve::OutputParser;
using gj::serve::parse_tool_call;
using gj::serve::ParsedDelta;
using gj::serve::StopStrings;

TEST(OutputParser, SplitsTheThoughtChannelFromTheAnswer) {
    OutputParser p;
    ParsedDelta d = p.push_rendered("<|channel>thought\nLet me think.<channel|>The answer is 4.");
    EXPECT_EQ(d.reasoning, "Let me think.");
    EXPECT_EQ(d.content, "The answer is 4.");
    EXPECT_TRUE(d.tool_calls.empty());
}

TEST(OutputParser, StreamsPieceByPiece) {
    OutputParser p;
    ParsedDelta all;
    all.append(p.push_marker(Marker::ChannelOpen));
    all.append(p.push_text("thou"));
    all.append(p.push_text("ght\nstep "));
    all.append(p.push_text("one"));
    all.append(p.push_marker(Marker::ChannelClose));
    all.append(p.push_text("done"));
    all.append(p.finish());
    EXPECT_EQ(all.reasoning, "step one");
    EXPECT_EQ(all.content, "done");
}

TEST(OutputParser, ParsesToolCallsIntoJsonArguments) {
    OutputParser p;
    ParsedDelta d = p.push_rendered(
        "<|tool_call>call:get_weather{location:<|\"|>Paris, FR<|\"|>,days:3,metric:true,"
        "opts:{deep:[1,2.5,<|\"|>x<|\"|>]}}<tool_call|>");
    ASSERT_EQ(d.tool_calls.size(), 1u);
    EXPECT_EQ(d.tool_calls[0].name, "get_weather");
    auto args = nlohmann::json::parse(d.tool_calls[0].arguments);
    EXPECT_EQ(args["location"], "Paris, FR");
    EXPECT_EQ(args["days"], 3);
    EXPECT_EQ(args["metric"], true);
    EXPECT_EQ(args["opts"]["deep"][1], 2.5);
    EXPECT_EQ(args["opts"]["deep"][2], "x");
    EXPECT_EQ(p.tool_calls(), 1);
    EXPECT_TRUE(d.content.empty());
}

TEST(OutputParser, TwoCallsAndTextAround) {
    OutputParser p;
    ParsedDelta d = p.push_rendered(
        "ok <|tool_call>call:a{}<tool_call|><|tool_call>call:b{s:<|\"|>{not "
        "json}<|\"|>}<tool_call|>");
    ASSERT_EQ(d.tool_calls.size(), 2u);
    EXPECT_EQ(d.tool_calls[0].arguments, "{}");
    EXPECT_EQ(nlohmann::json::parse(d.tool_calls[1].arguments)["s"], "{not json}");
    EXPECT_EQ(d.content, "ok ");
}

TEST(OutputParser, MalformedOrUnclosedCallsStayText) {
    OutputParser p;
    ParsedDelta d = p.push_rendered("<|tool_call>call:f{x:<tool_call|>");
    EXPECT_TRUE(d.tool_calls.empty());
    EXPECT_EQ(d.content, "<|tool_call>call:f{x:<tool_call|>");
    OutputParser q;
    ParsedDelta e = q.push_rendered("<|tool_call>call:f{x:1");
    e.append(q.finish());
    EXPECT_EQ(e.content, "<|tool_call>call:f{x:1");
    EXPECT_FALSE(parse_tool_call("call:{}").has_value());
    EXPECT_FALSE(parse_tool_call("nocall").has_value());
    EXPECT_FALSE(parse_tool_call("call:f{a:1} trailing").has_value());
}

TEST(OutputParser, WithoutToolsCallsPassThroughAsContent) {
    OutputParser p(/*tools=*/false);
    ParsedDelta d = p.push_rendered("<|tool_call>call:f{}<tool_call|>");
    EXPECT_TRUE(d.tool_calls.empty());
    EXPECT_EQ(d.content, "<|tool_call>call:f{}<tool_call|>");
}

TEST(StopStrings, HoldsBackOnlyWhatCouldStartAStop) {
    StopStrings s({"STOP", "xy"});
    std::string out = s.push("hello ST");
    EXPECT_EQ(out, "hello");  // the last 3 bytes could begin "STOP"
    out += s.push("OP and more");
    EXPECT_TRUE(s.matched());
    EXPECT_EQ(out, "hello ");
    EXPECT_EQ(s.push("later"), "");
}

TEST(StopStrings, FlushesTheTailAtTheEnd) {
    StopStrings s({"END"});
    std::string out = s.push("abcE");
    out += s.push("N");
    out += s.finish();
    EXPECT_FALSE(s.matched());
    EXPECT_EQ(out, "abcEN");
    StopStrings none({});
    EXPECT_EQ(none.push("abc"), "abc");
}

TEST(StopStrings, NeverSplitsAUtf8Character) {
    StopStrings s({"zzzz"});
    const std::string text = "a\xC3\xA9\xE2\x82\xAC";  // a, é, €
    std::string out = s.push(text);
    // What came out so far ends on a character boundary: the held tail starts one.
    EXPECT_NE(static_cast<unsigned char>(text[out.size()]) & 0xC0, 0x80u);
    out += s.finish();
    EXPECT_EQ(out, text);
}
