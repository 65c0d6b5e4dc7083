#include "router/openai_api.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace deepinfer::router::openai {
namespace {

using nlohmann::json;

// One token per byte: easy to check.
absl::StatusOr<std::vector<int32_t>> ByteTokenize(absl::string_view text) {
  std::vector<int32_t> ids;
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

absl::StatusOr<ParsedRequest> Chat(const std::string& body) {
  return ParseRequest(Endpoint::kChat, body, 1 << 20, ByteTokenize);
}
absl::StatusOr<ParsedRequest> Completion(const std::string& body, size_t max_prompt = 1 << 20) {
  return ParseRequest(Endpoint::kCompletion, body, max_prompt, ByteTokenize);
}

// The error a client would see for `body`.
HttpError ChatError(const std::string& body) {
  absl::StatusOr<ParsedRequest> parsed = Chat(body);
  EXPECT_FALSE(parsed.ok()) << body;
  return ErrorFromStatus(parsed.status(), Endpoint::kChat);
}

TEST(ParseRequestTest, ChatMapsMessagesAndSampling) {
  absl::StatusOr<ParsedRequest> p = Chat(R"({
    "model": "llama",
    "messages": [
      {"role": "developer", "content": "be brief"},
      {"role": "user", "name": "bob", "content": [
        {"type": "text", "text": "what is"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
      {"role": "assistant", "content": null}],
    "temperature": 0.5, "top_p": 0.9, "max_tokens": 7, "max_completion_tokens": 9,
    "stop": ["a", "b"], "seed": 42, "presence_penalty": 0.25, "frequency_penalty": -0.5,
    "logprobs": true, "top_logprobs": 3, "n": 1,
    "stream": true, "stream_options": {"include_usage": true}, "user": "ignored"})");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->model, "llama");
  EXPECT_TRUE(p->stream);
  EXPECT_TRUE(p->include_usage);
  EXPECT_TRUE(p->logprobs);
  const v1::ChatRequest& c = p->chat;
  EXPECT_EQ(c.model(), "llama");
  ASSERT_EQ(c.messages_size(), 3);
  EXPECT_EQ(c.messages(0).role(), "system");
  EXPECT_EQ(c.messages(0).content(0).text(), "be brief");
  EXPECT_EQ(c.messages(1).name(), "bob");
  ASSERT_EQ(c.messages(1).content_size(), 2);
  EXPECT_EQ(c.messages(1).content(0).text(), "what is");
  EXPECT_EQ(c.messages(1).content(1).image().url(), "data:image/png;base64,AAAA");
  EXPECT_EQ(c.messages(2).content_size(), 0);
  const v1::SamplingParams& s = c.sampling();
  EXPECT_FLOAT_EQ(s.temperature(), 0.5f);
  EXPECT_FLOAT_EQ(s.top_p(), 0.9f);
  EXPECT_EQ(s.max_tokens(), 9u);  // max_completion_tokens wins
  EXPECT_EQ(std::vector<std::string>(s.stop().begin(), s.stop().end()),
            (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(s.seed(), 42u);
  EXPECT_FLOAT_EQ(s.presence_penalty(), 0.25f);
  EXPECT_FLOAT_EQ(s.frequency_penalty(), -0.5f);
  EXPECT_TRUE(s.return_logprobs());
  EXPECT_EQ(s.logprobs(), 3u);
}

TEST(ParseRequestTest, UnsetFieldsStayUnset) {
  absl::StatusOr<ParsedRequest> p = Chat(R"({"messages": [{"role": "user", "content": "hi"}],
                                            "stop": "x", "temperature": null})");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->stream);
  EXPECT_FALSE(p->chat.sampling().has_temperature());
  EXPECT_FALSE(p->chat.sampling().has_seed());
  EXPECT_EQ(p->chat.sampling().max_tokens(), 0u);
  EXPECT_FALSE(p->chat.sampling().return_logprobs());
  ASSERT_EQ(p->chat.sampling().stop_size(), 1);
  EXPECT_EQ(p->chat.sampling().stop(0), "x");
}

TEST(ParseRequestTest, BadBodiesNameTheField) {
  struct Case {
    std::string body;
    std::string param;
    std::string message_start;
  };
  const std::string ok_messages = R"("messages": [{"role": "user", "content": "hi"}])";
  const std::vector<Case> cases = {
      {"{", "body", "body: malformed JSON"},
      {"", "body", "body: expected a JSON object"},
      {"[1]", "body", "body: expected a JSON object"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\xff\"}]}", "messages[0].content",
       "messages[0].content: invalid UTF-8"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": "
       "\"ok\"}, {\"type\": \"text\", \"text\": \"\xc3\"}]}]}",
       "messages[0].content[1].text", "messages[0].content[1].text: invalid UTF-8"},
      {"{\"stop\": [\"ok\", \"\xed\xa0\x80\"]}", "stop[1]", "stop[1]: invalid UTF-8"},
      {absl::StrCat("{", ok_messages, R"(, "temperature": "hot"})"), "temperature",
       R"(temperature: expected a number; got "hot")"},
      {absl::StrCat("{", ok_messages, R"(, "max_tokens": 1.5})"), "max_tokens",
       "max_tokens: expected an integer"},
      {absl::StrCat("{", ok_messages, R"(, "max_tokens": 0})"), "max_tokens",
       "max_tokens: expected an integer >= 1"},
      {absl::StrCat("{", ok_messages, R"(, "stop": 3})"), "stop",
       "stop: expected a string or a list of strings"},
      {absl::StrCat("{", ok_messages, R"(, "n": 2})"), "n", "n: only n = 1 is supported"},
      {absl::StrCat("{", ok_messages, R"(, "tools": [{"type": "function"}]})"), "tools",
       "tools: not supported"},
      {absl::StrCat("{", ok_messages, R"(, "response_format": {"type": "json_object"}})"),
       "response_format", "response_format: only"},
      {absl::StrCat("{", ok_messages, R"(, "top_logprobs": 2})"), "top_logprobs",
       "top_logprobs: requires logprobs: true"},
      {absl::StrCat("{", ok_messages, R"(, "stream": "yes"})"), "stream",
       "stream: expected a boolean"},
      {R"({"messages": "hi"})", "messages", "messages: expected a list of messages"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content",
       "messages[0].content: expected a string or a list of content parts"},
      {R"({"messages": [{"role": "user", "content": [{"type": "audio"}]}]})",
       "messages[0].content[0].type", "messages[0].content[0].type: expected \"text\""},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "messages[0].content[0].image_url", "messages[0].content[0].image_url: expected"},
  };
  for (const Case& c : cases) {
    const HttpError e = ChatError(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.type, "invalid_request_error");
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_TRUE(absl::StartsWith(e.message, c.message_start)) << c.body << " -> " << e.message;
  }
}

TEST(ParseRequestTest, DeeplyNestedValuesAreRefusedWithoutRecursion) {
  const int depth = 200000;
  const std::string nested = std::string(depth, '[') + std::string(depth, ']');
  for (const std::string& body :
       {"{\"temperature\": " + nested + "}", "{\"messages\": [" + nested + "]}",
        "{\"stop\": [" + nested + "]}", nested}) {
    absl::StatusOr<ParsedRequest> p = Chat(body);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(ChatError(R"({"messages": [{"role": "user", "content": "hi"}], "temperature": [[1]]})")
                .message,
            "temperature: expected a number; got a list of 1");
}

TEST(ParseRequestTest, CompletionTokenizesItsPromptWithinTheCap) {
  absl::StatusOr<ParsedRequest> p = Completion(R"({"model": "m", "prompt": "abc", "logprobs": 2,
                                                  "stop": "x"})");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(std::vector<uint32_t>(p->generate.prompt_token_ids().begin(),
                                  p->generate.prompt_token_ids().end()),
            (std::vector<uint32_t>{'a', 'b', 'c'}));
  EXPECT_TRUE(p->generate.detokenize());
  EXPECT_EQ(p->generate.sampling().max_tokens(), 16u);  // OpenAI's default for completions
  EXPECT_TRUE(p->logprobs);
  EXPECT_EQ(p->generate.sampling().logprobs(), 2u);

  p = Completion(R"({"prompt": [[5, 6]], "max_tokens": 3})");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->generate.prompt_token_ids_size(), 2);
  EXPECT_EQ(p->generate.sampling().max_tokens(), 3u);

  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({"prompt": "abcdef"})", "prompt"},
           {R"({"prompt": ["a", "b"]})", "prompt"},
           {R"({"prompt": 7})", "prompt"},
           {R"({})", "prompt"},
           {R"({"prompt": "a", "echo": true})", "echo"},
           {R"({"prompt": "a", "best_of": 2})", "best_of"},
           {R"({"prompt": "a", "logprobs": true})", "logprobs"},
       }) {
    absl::StatusOr<ParsedRequest> bad = Completion(body, /*max_prompt=*/5);
    ASSERT_FALSE(bad.ok()) << body;
    EXPECT_EQ(ErrorFromStatus(bad.status(), Endpoint::kCompletion).param, param) << body;
  }
}

TEST(ErrorFromStatusTest, MapsCodesAndTranslatesFieldPaths) {
  HttpError e = ErrorFromStatus(
      absl::InvalidArgumentError("sampling.max_tokens: expected prompt + max_tokens <= 2048"),
      Endpoint::kChat);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_EQ(e.message, "max_tokens: expected prompt + max_tokens <= 2048");
  EXPECT_EQ(ErrorFromStatus(absl::InvalidArgumentError("sampling.stop[2]: expected 1..256"),
                            Endpoint::kChat)
                .param,
            "stop");
  EXPECT_EQ(ErrorFromStatus(absl::InvalidArgumentError("sampling.logprobs: expected 0..20"),
                            Endpoint::kChat)
                .param,
            "top_logprobs");
  EXPECT_EQ(ErrorFromStatus(absl::InvalidArgumentError(
                                "messages[1].content[0].image: expected PNG or JPEG data"),
                            Endpoint::kChat)
                .param,
            "messages[1].content[0].image_url");
  EXPECT_EQ(ErrorFromStatus(absl::InvalidArgumentError("prompt_token_ids[3]: expected"),
                            Endpoint::kCompletion)
                .param,
            "prompt");
  e = ErrorFromStatus(absl::InvalidArgumentError("model: unknown model \"x\"; this router serves"),
                      Endpoint::kChat);
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(e.code, "model_not_found");
  // A message that does not start with a field path keeps param null.
  EXPECT_EQ(ErrorFromStatus(absl::InvalidArgumentError("something is wrong: x"), Endpoint::kChat)
                .param,
            "");

  e = ErrorFromStatus(absl::ResourceExhaustedError("queue full"), Endpoint::kChat);
  EXPECT_EQ(e.status, 429);
  EXPECT_EQ(e.retry_after_s, 1);
  EXPECT_EQ(ErrorFromStatus(absl::UnavailableError("no decode worker"), Endpoint::kChat).status,
            503);
  e = ErrorFromStatus(absl::UnauthenticatedError("authorization: unknown API key"),
                      Endpoint::kChat);
  EXPECT_EQ(e.status, 401);
  EXPECT_EQ(e.type, "authentication_error");
  e = ErrorFromStatus(absl::PermissionDeniedError("model: tenant \"a\" may not use"),
                      Endpoint::kCompletion);
  EXPECT_EQ(e.status, 403);
  EXPECT_EQ(e.type, "permission_error");
  EXPECT_EQ(ErrorFromStatus(absl::DeadlineExceededError("late"), Endpoint::kChat).status, 504);
  EXPECT_EQ(ErrorFromStatus(absl::AlreadyExistsError("request_id: x"), Endpoint::kChat).status,
            409);
  EXPECT_EQ(ErrorFromStatus(absl::InternalError(""), Endpoint::kChat).status, 500);
  EXPECT_EQ(ErrorFromStatus(absl::InternalError(""), Endpoint::kChat).message, "INTERNAL");

  EXPECT_EQ(json::parse(ErrorBody(ErrorFromStatus(absl::InternalError(""), Endpoint::kChat))),
            json::parse(R"({"error": {"message": "INTERNAL", "type": "server_error",
                                      "param": null, "code": null}})"));
  const json parsed = json::parse(ErrorBody(ErrorFromStatus(
      absl::InvalidArgumentError("sampling.top_p: expected (0, 1], got 1.5"), Endpoint::kChat)));
  EXPECT_EQ(parsed["error"]["param"], "top_p");
  EXPECT_EQ(parsed["error"]["message"], "top_p: expected (0, 1], got 1.5");
  EXPECT_TRUE(parsed["error"]["code"].is_null());
}

v1::GenerateChunk Chunk(const std::string& text, std::vector<uint32_t> ids) {
  v1::GenerateChunk c;
  c.set_request_id("chat-1");
  c.set_text_delta(text);
  for (uint32_t id : ids) c.add_token_ids(id);
  return c;
}

v1::GenerateChunk Last(const std::string& text) {
  v1::GenerateChunk c = Chunk(text, {3});
  c.set_finish_reason(v1::FINISH_REASON_LENGTH);
  c.mutable_usage()->set_prompt_tokens(10);
  c.mutable_usage()->set_completion_tokens(3);
  c.mutable_usage()->set_cached_prompt_tokens(8);
  return c;
}

std::vector<json> Events(const std::string& sse, bool* done) {
  std::vector<json> out;
  *done = false;
  for (absl::string_view event : absl::StrSplit(sse, "\n\n", absl::SkipEmpty())) {
    EXPECT_TRUE(absl::ConsumePrefix(&event, "data: ")) << event;
    if (event == "[DONE]") {
      *done = true;
      continue;
    }
    out.push_back(json::parse(event));
  }
  return out;
}

TEST(ResponseBuilderTest, ChatStreamIsOpenAiChunks) {
  ParsedRequest request;
  request.endpoint = Endpoint::kChat;
  request.stream = true;
  request.include_usage = true;
  ResponseBuilder builder(request, "llama", 1700000000, [](uint32_t) { return std::string("t"); });
  bool done = false;
  std::vector<json> events = Events(builder.StreamEvents(Chunk("Hel", {1})), &done);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_FALSE(done);
  EXPECT_EQ(events[0]["id"], "chatcmpl-chat-1");
  EXPECT_EQ(events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(events[0]["model"], "llama");
  EXPECT_EQ(events[0]["created"], 1700000000);
  EXPECT_EQ(events[0]["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(events[0]["usage"].is_null());
  EXPECT_EQ(events[1]["choices"][0]["delta"]["content"], "Hel");
  EXPECT_TRUE(events[1]["choices"][0]["finish_reason"].is_null());
  // A chunk of tokens whose text is not complete yet sends nothing.
  EXPECT_EQ(builder.StreamEvents(Chunk("", {2})), "");
  events = Events(builder.StreamEvents(Last("lo")), &done);
  EXPECT_TRUE(done);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0]["choices"][0]["delta"]["content"], "lo");
  EXPECT_EQ(events[0]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(events[1]["choices"], json::array());
  EXPECT_EQ(events[1]["usage"], json::parse(R"({"prompt_tokens": 10, "completion_tokens": 3,
      "total_tokens": 13, "prompt_tokens_details": {"cached_tokens": 8}})"));
}

TEST(ResponseBuilderTest, NonStreamResponsesAccumulateTextAndLogprobs) {
  ParsedRequest request;
  request.endpoint = Endpoint::kCompletion;
  request.logprobs = true;
  ResponseBuilder builder(request, "llama", 5, [](uint32_t id) { return absl::StrCat("<", id, ">"); });
  v1::GenerateChunk first = Chunk("<1>", {1});
  v1::TokenLogprob* lp = first.add_logprobs();
  lp->set_token_id(1);
  lp->set_logprob(-0.5f);
  v1::TopLogprob* top = lp->add_top();
  top->set_token_id(2);
  top->set_logprob(-1.0f);
  builder.Add(first);
  v1::GenerateChunk last = Last("<3>");
  last.add_logprobs()->set_token_id(3);
  builder.Add(last);
  const json r = builder.Final();
  EXPECT_EQ(r["id"], "cmpl-chat-1");
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["choices"][0]["text"], "<1><3>");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["choices"][0]["logprobs"]["tokens"], json({"<1>", "<3>"}));
  EXPECT_EQ(r["choices"][0]["logprobs"]["text_offset"], json({0, 3}));
  EXPECT_EQ(r["choices"][0]["logprobs"]["top_logprobs"][0], json({{"<2>", -1.0}}));
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 8);
  EXPECT_EQ(r["usage"]["total_tokens"], 13);

  ParsedRequest chat;
  chat.endpoint = Endpoint::kChat;
  ResponseBuilder chat_builder(chat, "llama", 5, [](uint32_t) { return std::string(); });
  chat_builder.Add(Last("hi"));
  const json c = chat_builder.Final();
  EXPECT_EQ(c["object"], "chat.completion");
  EXPECT_EQ(c["choices"][0]["message"], json({{"role", "assistant"}, {"content", "hi"}}));
  EXPECT_TRUE(c["choices"][0]["logprobs"].is_null());
}

TEST(ResponseBuilderTest, StreamErrorEventIsOneDataLine) {
  HttpError e = ErrorFromStatus(absl::UnavailableError("decode worker gone"), Endpoint::kChat);
  const std::string event = ResponseBuilder::StreamErrorEvent(e);
  ASSERT_TRUE(absl::StartsWith(event, "data: {\"error\":"));
  ASSERT_TRUE(absl::EndsWith(event, "}\n\n"));
  EXPECT_EQ(json::parse(event.substr(6))["error"]["message"], "decode worker gone");
}

}  // namespace
}  // namespace deepinfer::router::openai
