#include "api/request_validation.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace deepinfer::api {
namespace {

using ::deepinfer::v1::ChatRequest;
using ::deepinfer::v1::GenerateRequest;

// The classic 1x1 grey PNG (IHDR, IDAT, IEND with correct CRCs).
std::string Png() {
  std::string out;
  EXPECT_TRUE(
      absl::Base64Unescape("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjC"
                           "B0C8AAAAASUVORK5CYII=",
                           &out));
  return out;
}

std::string Bytes(std::initializer_list<int> v) {
  std::string s;
  for (int b : v) s.push_back(static_cast<char>(b));
  return s;
}

// A structurally complete baseline JPEG, 8 wide and 16 high: SOI, APP0, DQT, SOF0, DHT, SOS,
// entropy data with a stuffed 0xFF00 and a restart marker, EOI.
std::string Jpeg() {
  std::string s = Bytes({0xFF, 0xD8});
  s += Bytes({0xFF, 0xE0, 0x00, 0x10, 'J', 'F', 'I', 'F', 0, 1, 1, 0, 0, 1, 0, 1, 0, 0});
  s += Bytes({0xFF, 0xDB, 0x00, 0x43, 0x00});
  s += std::string(64, '\x01');
  s += Bytes({0xFF, 0xC0, 0x00, 0x0B, 8, 0x00, 0x10, 0x00, 0x08, 1, 1, 0x11, 0});
  s += Bytes({0xFF, 0xC4, 0x00, 0x14, 0x00, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  s += Bytes({0xFF, 0xDA, 0x00, 0x08, 1, 1, 0x00, 0, 63, 0});
  s += Bytes({0x12, 0x34, 0xFF, 0x00, 0x56, 0xFF, 0xD0, 0x78});
  s += Bytes({0xFF, 0xD9});
  return s;
}

std::string DataUrl(absl::string_view kind, absl::string_view bytes) {
  return absl::StrCat("data:image/", kind, ";base64,", absl::Base64Escape(bytes));
}

RequestLimits Limits() {
  RequestLimits l;
  l.vocab_size = 1000;
  l.max_context_tokens = 4096;
  l.max_image_bytes = 1 << 16;
  return l;
}

// system text; user text + image (bytes) + text; assistant with no parts.
ChatRequest ValidChat() {
  ChatRequest r;
  r.set_request_id("req-1");
  auto* sys = r.add_messages();
  sys->set_role("system");
  sys->add_content()->set_text("You are terse.");
  auto* user = r.add_messages();
  user->set_role("user");
  user->set_name("bob");
  user->add_content()->set_text("Look ");
  user->add_content()->set_text("here: ");
  user->add_content()->mutable_image()->set_data(Png());
  user->add_content()->set_text("move the button");
  auto* assistant = r.add_messages();
  assistant->set_role("assistant");
  r.mutable_sampling()->set_top_p(0.9f);
  r.mutable_sampling()->set_max_tokens(16);
  return r;
}

GenerateRequest ValidGenerate() {
  GenerateRequest r;
  r.set_request_id("g-1");
  for (uint32_t t : {1u, 2u, 999u}) r.add_prompt_token_ids(t);
  r.mutable_sampling()->set_max_tokens(8);
  return r;
}

struct ChatCase {
  std::string name;
  std::function<void(ChatRequest&)> mutate;
  std::string expected_prefix;  // empty: the request stays valid
};

std::vector<ChatCase> ChatCases() {
  auto sampling = [](ChatRequest& r) { return r.mutable_sampling(); };
  const std::string png = Png();
  const std::string jpeg = Jpeg();
  return {
      {"valid", [](ChatRequest&) {}, ""},
      // request_id
      {"empty_request_id_allowed", [](ChatRequest& r) { r.clear_request_id(); }, ""},
      {"request_id_128", [](ChatRequest& r) { r.set_request_id(std::string(128, 'a')); }, ""},
      {"request_id_129", [](ChatRequest& r) { r.set_request_id(std::string(129, 'a')); },
       "request_id: expected 1..128 printable ASCII bytes; got 129 bytes"},
      {"request_id_control", [](ChatRequest& r) { r.set_request_id("a\nb"); },
       "request_id: expected 1..128 printable ASCII bytes; got \"a\\nb\" (byte 1 is 0x0a)"},
      {"request_id_non_ascii", [](ChatRequest& r) { r.set_request_id("caf\xc3\xa9"); },
       "request_id: expected 1..128 printable ASCII bytes"},
      // messages
      {"no_messages", [](ChatRequest& r) { r.clear_messages(); },
       "messages: expected at least one message; got none"},
      {"bad_role", [](ChatRequest& r) { r.mutable_messages(2)->set_role("robot"); },
       "messages[2].role: expected one of system, user, assistant, tool; got \"robot\""},
      {"empty_role", [](ChatRequest& r) { r.mutable_messages(0)->clear_role(); },
       "messages[0].role: expected one of system, user, assistant, tool; got \"\""},
      {"tool_role_ok", [](ChatRequest& r) { r.mutable_messages(0)->set_role("tool"); }, ""},
      {"empty_user_content", [](ChatRequest& r) { r.mutable_messages(1)->clear_content(); },
       "messages[1].content: expected at least one part (only an assistant message may be "
       "empty); got none"},
      {"part_not_set", [](ChatRequest& r) { r.mutable_messages(1)->add_content(); },
       "messages[1].content[4]: expected text or image; got neither"},
      {"bad_utf8_text",
       [](ChatRequest& r) { r.mutable_messages(0)->mutable_content(0)->set_text("ok\xc3("); },
       "messages[0].content[0].text: expected UTF-8 text, got an invalid byte sequence at byte 2"},
      {"overlong_utf8",
       [](ChatRequest& r) { r.mutable_messages(0)->mutable_content(0)->set_text("\xc0\xaf"); },
       "messages[0].content[0].text: expected UTF-8 text"},
      {"surrogate_utf8",
       [](ChatRequest& r) { r.mutable_messages(0)->mutable_content(0)->set_text("\xed\xa0\x80"); },
       "messages[0].content[0].text: expected UTF-8 text"},
      {"bad_utf8_name", [](ChatRequest& r) { r.mutable_messages(1)->set_name("\xff"); },
       "messages[1].name: expected UTF-8 text"},
      // images
      {"image_not_set",
       [](ChatRequest& r) { r.mutable_messages(1)->mutable_content(2)->mutable_image()->Clear(); },
       "messages[1].content[2].image: expected data or url; got neither"},
      {"image_empty",
       [](ChatRequest& r) {
         r.mutable_messages(1)->mutable_content(2)->mutable_image()->set_data("");
       },
       "messages[1].content[2].image: expected a PNG or JPEG image; got 0 bytes"},
      {"image_jpeg_ok",
       [jpeg](ChatRequest& r) {
         r.mutable_messages(1)->mutable_content(2)->mutable_image()->set_data(jpeg);
       },
       ""},
      {"image_png_url_ok",
       [png](ChatRequest& r) {
         r.mutable_messages(1)->mutable_content(2)->mutable_image()->set_url(DataUrl("png", png));
       },
       ""},
      {"image_jpeg_url_ok",
       [jpeg](ChatRequest& r) {
         r.mutable_messages(1)->mutable_content(2)->mutable_image()->set_url(DataUrl("jpeg", jpeg));
       },
       ""},
      {"image_http_url",
       [](ChatRequest& r) {
         r.mutable_messages(1)->mutable_content(2)->mutable_image()->set_url("http://x/y.png");
       },
       "messages[1].content[2].image.url: expected a data:image/png;base64, or "
       "data:image/jpeg;base64, URL (the cluster never fetches URLs); got \"http://x/y.png\""},
      {"image_file_url",
       [](ChatRequest& r) {
         r.mutable_messages(1)->mutable_content(2)->mutable_image()->set_url("file:///etc/passwd");
       },
       "messages[1].content[2].image.url: expected a data:image/png;base64,"},
      {"image_gif_data_url",
       [](ChatRequest& r) {
         r.mutable_messages(1)->mutable_content(2)->mutable_image()->set_url(
             "data:image/gif;base64,R0lGODlh");
       },
       "messages[1].content[2].image.url: expected a data:image/png;base64,"},
      {"image_bad_base64",
       [](ChatRequest& r) {
         r.mutable_messages(1)->mutable_content(2)->mutable_image()->set_url(
             "data:image/png;base64,iVBO*w0K");
       },
       "messages[1].content[2].image.url: expected valid base64 after the comma"},
      {"image_truncated_png",
       [png](ChatRequest& r) {
         r.mutable_messages(1)->mutable_content(2)->mutable_image()->set_data(
             png.substr(0, png.size() - 5));
       },
       "messages[1].content[2].image: malformed PNG: truncated"},
      {"image_png_bad_crc",
       [png](ChatRequest& r) {
         std::string bad = png;
         bad[20] ^= 1;  // inside IHDR's data
         r.mutable_messages(1)->mutable_content(2)->mutable_image()->set_data(bad);
       },
       "messages[1].content[2].image: malformed PNG: CRC mismatch in chunk IHDR"},
      {"image_truncated_jpeg",
       [jpeg](ChatRequest& r) {
         r.mutable_messages(1)->mutable_content(2)->mutable_image()->set_data(
             jpeg.substr(0, jpeg.size() - 2));
       },
       "messages[1].content[2].image: malformed JPEG: truncated: no EOI marker"},
      {"image_gif",
       [](ChatRequest& r) {
         r.mutable_messages(1)->mutable_content(2)->mutable_image()->set_data("GIF89a\x01\x00");
       },
       "messages[1].content[2].image: expected PNG or JPEG data; got GIF"},
      {"image_too_large",
       [png](ChatRequest& r) {
         r.mutable_messages(1)->mutable_content(2)->mutable_image()->set_data(
             png + std::string(1 << 16, '\0'));
       },
       "messages[1].content[2].image: expected at most 65536 bytes; got 65604 bytes"},
      {"image_url_too_large",
       [png](ChatRequest& r) {
         r.mutable_messages(1)->mutable_content(2)->mutable_image()->set_url(
             DataUrl("png", png + std::string(1 << 17, '\0')));
       },
       "messages[1].content[2].image: expected at most 65536 bytes; got about"},
      // sampling (each field's range)
      {"temperature_negative", [=](ChatRequest& r) { sampling(r)->set_temperature(-0.5f); },
       "sampling.temperature: expected >= 0, got -0.5"},
      {"temperature_nan", [=](ChatRequest& r) { sampling(r)->set_temperature(std::nanf("")); },
       "sampling.temperature: expected >= 0, got nan"},
      {"temperature_zero_greedy", [=](ChatRequest& r) { sampling(r)->set_temperature(0); }, ""},
      {"top_p_high", [=](ChatRequest& r) { sampling(r)->set_top_p(1.5f); },
       "sampling.top_p: expected (0, 1], got 1.5"},
      {"top_p_zero", [=](ChatRequest& r) { sampling(r)->set_top_p(0); },
       "sampling.top_p: expected (0, 1], got 0"},
      {"top_p_one", [=](ChatRequest& r) { sampling(r)->set_top_p(1); }, ""},
      {"top_k_minus_two", [=](ChatRequest& r) { sampling(r)->set_top_k(-2); },
       "sampling.top_k: expected -1, 0 (disabled) or >= 1, got -2"},
      {"top_k_minus_one", [=](ChatRequest& r) { sampling(r)->set_top_k(-1); }, ""},
      {"min_p_high", [=](ChatRequest& r) { sampling(r)->set_min_p(1.25f); },
       "sampling.min_p: expected [0, 1], got 1.25"},
      {"presence_low", [=](ChatRequest& r) { sampling(r)->set_presence_penalty(-2.5f); },
       "sampling.presence_penalty: expected [-2, 2], got -2.5"},
      {"frequency_high", [=](ChatRequest& r) { sampling(r)->set_frequency_penalty(3); },
       "sampling.frequency_penalty: expected [-2, 2], got 3"},
      {"repetition_negative", [=](ChatRequest& r) { sampling(r)->set_repetition_penalty(-1); },
       "sampling.repetition_penalty: expected (0, 2] (0 = unset), got -1"},
      {"repetition_high", [=](ChatRequest& r) { sampling(r)->set_repetition_penalty(2.5f); },
       "sampling.repetition_penalty: expected (0, 2] (0 = unset), got 2.5"},
      {"too_many_stops",
       [=](ChatRequest& r) {
         for (int i = 0; i < 17; ++i) sampling(r)->add_stop("x");
       },
       "sampling.stop: expected at most 16 strings, got 17"},
      {"sixteen_stops",
       [=](ChatRequest& r) {
         for (int i = 0; i < 16; ++i) sampling(r)->add_stop(std::string(256, 'x'));
       },
       ""},
      {"empty_stop",
       [=](ChatRequest& r) {
         sampling(r)->add_stop("ok");
         sampling(r)->add_stop("");
       },
       "sampling.stop[1]: expected 1..256 bytes; got 0 bytes"},
      {"long_stop", [=](ChatRequest& r) { sampling(r)->add_stop(std::string(257, 'x')); },
       "sampling.stop[0]: expected 1..256 bytes; got 257 bytes"},
      {"stop_bad_utf8", [=](ChatRequest& r) { sampling(r)->add_stop("\xe2\x82"); },
       "sampling.stop[0]: expected UTF-8 text"},
      {"stop_token_id_out_of_vocab",
       [=](ChatRequest& r) {
         sampling(r)->add_stop_token_ids(5);
         sampling(r)->add_stop_token_ids(1000);
       },
       "sampling.stop_token_ids[1]: expected a token id in [0, 1000), got 1000"},
      {"logprobs_21", [=](ChatRequest& r) { sampling(r)->set_logprobs(21); },
       "sampling.logprobs: expected 0..20, got 21"},
      {"logprobs_20", [=](ChatRequest& r) { sampling(r)->set_logprobs(20); }, ""},
      // cache_salt, priority
      {"salt_256", [](ChatRequest& r) { r.set_cache_salt(std::string(256, 's')); }, ""},
      {"salt_257", [](ChatRequest& r) { r.set_cache_salt(std::string(257, 's')); },
       "cache_salt: expected at most 256 bytes; got 257 bytes"},
      {"priority_low", [](ChatRequest& r) { r.set_priority(-101); },
       "priority: expected -100..100, got -101"},
      {"priority_high", [](ChatRequest& r) { r.set_priority(101); },
       "priority: expected -100..100, got 101"},
      {"priority_edge", [](ChatRequest& r) { r.set_priority(-100); }, ""},
  };
}

class ChatValidationTest : public ::testing::TestWithParam<ChatCase> {};

TEST_P(ChatValidationTest, NamesTheField) {
  ChatRequest request = ValidChat();
  GetParam().mutate(request);
  const absl::Status status = ValidateChatRequest(request, Limits());
  const absl::StatusOr<ChatPrompt> converted = ConvertChatMessages(request, Limits());
  if (GetParam().expected_prefix.empty()) {
    EXPECT_TRUE(status.ok()) << status;
    EXPECT_TRUE(converted.ok()) << converted.status();
    return;
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(status.message().substr(0, GetParam().expected_prefix.size()),
            GetParam().expected_prefix)
      << status.message();
  // Conversion validates exactly the same way.
  EXPECT_EQ(converted.status(), status);
}

INSTANTIATE_TEST_SUITE_P(AllFields, ChatValidationTest, ::testing::ValuesIn(ChatCases()),
                         [](const auto& info) { return info.param.name; });

struct GenerateCase {
  std::string name;
  std::function<void(GenerateRequest&)> mutate;
  std::string expected_prefix;
};

std::vector<GenerateCase> GenerateCases() {
  return {
      {"valid", [](GenerateRequest&) {}, ""},
      {"no_tokens", [](GenerateRequest& r) { r.clear_prompt_token_ids(); },
       "prompt_token_ids: expected at least one token; got none"},
      {"token_out_of_vocab",
       [](GenerateRequest& r) {
         r.add_prompt_token_ids(4);
         r.add_prompt_token_ids(1000);
       },
       "prompt_token_ids[4]: expected a token id in [0, 1000), got 1000"},
      {"request_id", [](GenerateRequest& r) { r.set_request_id(std::string(200, 'x')); },
       "request_id: expected 1..128 printable ASCII bytes; got 200 bytes"},
      {"sampling", [](GenerateRequest& r) { r.mutable_sampling()->set_top_p(1.5f); },
       "sampling.top_p: expected (0, 1], got 1.5"},
      {"salt", [](GenerateRequest& r) { r.set_cache_salt(std::string(300, 's')); },
       "cache_salt: expected at most 256 bytes; got 300 bytes"},
      {"priority", [](GenerateRequest& r) { r.set_priority(1000); },
       "priority: expected -100..100, got 1000"},
      {"fits_context_exactly",
       [](GenerateRequest& r) { r.mutable_sampling()->set_max_tokens(4093); }, ""},
      {"beyond_context", [](GenerateRequest& r) { r.mutable_sampling()->set_max_tokens(4094); },
       "sampling.max_tokens: expected prompt + max_tokens <= 4096 (the model's context), got 3 + "
       "4094 = 4097"},
      {"max_tokens_zero_fills_context",
       [](GenerateRequest& r) { r.mutable_sampling()->set_max_tokens(0); }, ""},
      {"prompt_fills_context",
       [](GenerateRequest& r) {
         r.clear_prompt_token_ids();
         for (int i = 0; i < 4096; ++i) r.add_prompt_token_ids(1);
         r.mutable_sampling()->set_max_tokens(0);
       },
       "sampling.max_tokens: 0 means up to the context, but the prompt (4096 tokens) leaves no "
       "room"},
  };
}

class GenerateValidationTest : public ::testing::TestWithParam<GenerateCase> {};

TEST_P(GenerateValidationTest, NamesTheField) {
  GenerateRequest request = ValidGenerate();
  GetParam().mutate(request);
  const absl::Status status = ValidateGenerateRequest(request, Limits());
  if (GetParam().expected_prefix.empty()) {
    EXPECT_TRUE(status.ok()) << status;
    return;
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(status.message().substr(0, GetParam().expected_prefix.size()),
            GetParam().expected_prefix)
      << status.message();
}

INSTANTIATE_TEST_SUITE_P(AllFields, GenerateValidationTest, ::testing::ValuesIn(GenerateCases()),
                         [](const auto& info) { return info.param.name; });

TEST(ConvertChatMessagesTest, BuildsTheTemplateInput) {
  ChatRequest request = ValidChat();
  request.mutable_messages(2)->add_content()->set_text("Done.");
  request.mutable_messages(2)->add_content()->set_text(" Next?");
  absl::StatusOr<ChatPrompt> prompt = ConvertChatMessages(request, Limits());
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  const nlohmann::ordered_json expected = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user",
     "content": [{"type": "text", "text": "Look here: "}, {"type": "image"},
                 {"type": "text", "text": "move the button"}],
     "name": "bob"},
    {"role": "assistant", "content": "Done. Next?"}
  ])");
  EXPECT_EQ(prompt->messages, expected) << prompt->messages.dump(2);
  // Key order is what templates see through tojson.
  EXPECT_EQ(prompt->messages.dump(), expected.dump());
  EXPECT_TRUE(prompt->add_generation_prompt);
  ASSERT_EQ(prompt->images.size(), 1u);
  EXPECT_EQ(prompt->images[0].message_index, 1);
  EXPECT_EQ(prompt->images[0].part_index, 2);
  EXPECT_EQ(prompt->images[0].format, ImageFormat::kPng);
  EXPECT_EQ(prompt->images[0].width, 1u);
  EXPECT_EQ(prompt->images[0].height, 1u);
  EXPECT_EQ(prompt->images[0].bytes, Png());
}

TEST(ConvertChatMessagesTest, EmptyAssistantHasEmptyStringAndNoNullKeys) {
  ChatRequest request = ValidChat();
  request.set_add_generation_prompt(false);
  absl::StatusOr<ChatPrompt> prompt = ConvertChatMessages(request, Limits());
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_FALSE(prompt->add_generation_prompt);
  const auto& assistant = prompt->messages[2];
  EXPECT_EQ(assistant, nlohmann::ordered_json::parse(R"({"role": "assistant", "content": ""})"));
  for (const auto& m : prompt->messages) {
    for (const auto& [key, value] : m.items()) EXPECT_FALSE(value.is_null()) << key;
  }
}

TEST(ConvertChatMessagesTest, ImagesFromUrlsAreDecodedInOrder) {
  ChatRequest request;
  auto* user = request.add_messages();
  user->set_role("user");
  user->add_content()->mutable_image()->set_url(DataUrl("jpeg", Jpeg()));
  user->add_content()->mutable_image()->set_url(DataUrl("png", Png()));
  absl::StatusOr<ChatPrompt> prompt = ConvertChatMessages(request, Limits());
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(prompt->messages[0]["content"],
            nlohmann::ordered_json::parse(R"([{"type": "image"}, {"type": "image"}])"));
  ASSERT_EQ(prompt->images.size(), 2u);
  EXPECT_EQ(prompt->images[0].format, ImageFormat::kJpeg);
  EXPECT_EQ(prompt->images[0].width, 8u);
  EXPECT_EQ(prompt->images[0].height, 16u);
  EXPECT_EQ(prompt->images[0].bytes, Jpeg());
  EXPECT_EQ(prompt->images[1].part_index, 1);
  EXPECT_EQ(prompt->images[1].bytes, Png());
}

TEST(ConvertChatMessagesTest, ChatTextBytesAreCappedBeforeAnythingElse) {
  RequestLimits limits = Limits();
  limits.max_chat_text_bytes = 10;
  ChatRequest request;
  auto* user = request.add_messages();
  user->set_role("user");
  user->add_content()->set_text("hello");
  user->add_content()->set_text("world");
  EXPECT_TRUE(ConvertChatMessages(request, limits).ok());
  // Over the cap, the part that crosses it is named even though a later field (the role of the
  // next message, invalid UTF-8 in this part) is also wrong: the cap is checked first.
  user->add_content()->set_text("!\xff");
  request.add_messages()->set_role("robot");
  absl::StatusOr<ChatPrompt> prompt = ConvertChatMessages(request, limits);
  EXPECT_EQ(prompt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(prompt.status().message(),
            "messages[0].content[2].text: expected at most 10 bytes of chat text in the whole "
            "request; got 12 by this part");
  EXPECT_EQ(ValidateChatRequest(request, limits), prompt.status());
}

TEST(ConvertChatMessagesTest, TooManyImagesNameTheFirstOneOverTheLimit) {
  RequestLimits limits = Limits();
  limits.max_images = 3;
  ChatRequest request;
  for (int m = 0; m < 2; ++m) {
    auto* user = request.add_messages();
    user->set_role("user");
    user->add_content()->mutable_image()->set_data(Png());
    user->add_content()->mutable_image()->set_data(Png());
  }
  absl::StatusOr<ChatPrompt> prompt = ConvertChatMessages(request, limits);
  EXPECT_EQ(prompt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(prompt.status().message(),
            "messages[1].content[1].image: more than 3 images in one request");
  limits.max_images = 4;
  EXPECT_TRUE(ConvertChatMessages(request, limits).ok());
}

TEST(ToEngineSamplingParamsTest, UnsetFieldsTakeTheModelDefaults) {
  GenerationDefaults defaults;
  defaults.temperature = 0.6f;
  defaults.top_p = 0.95f;
  defaults.top_k = 20;
  defaults.min_p = 0.05f;
  defaults.repetition_penalty = 1.1f;
  v1::SamplingParams s;
  s.set_max_tokens(10);
  absl::StatusOr<engine::SamplingParams> p = ToEngineSamplingParams(s, defaults, Limits(), 100);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FLOAT_EQ(p->temperature, 0.6f);
  EXPECT_FLOAT_EQ(p->top_p, 0.95f);
  EXPECT_EQ(p->top_k, 20);
  EXPECT_FLOAT_EQ(p->min_p, 0.05f);
  EXPECT_FLOAT_EQ(p->repetition_penalty, 1.1f);
  EXPECT_FALSE(p->has_seed);
  EXPECT_EQ(p->max_tokens, 10);
}

// The router forwards ResolveSampling's result; a worker with neutral defaults then computes the
// same engine parameters as the router did with the model's.
TEST(ResolveSamplingTest, ResolvedParamsMeanTheSameWhateverTheWorkersDefaults) {
  GenerationDefaults model;
  model.temperature = 0.6f;
  model.top_p = 0.95f;
  model.top_k = 20;
  model.min_p = 0.05f;
  model.repetition_penalty = 1.1f;
  v1::SamplingParams s;
  s.set_top_k(5);  // set by the client: kept
  s.add_stop("zz");
  s.set_seed(7);
  absl::StatusOr<v1::SamplingParams> r = ResolveSampling(s, model, Limits(), 100);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->has_temperature());
  EXPECT_FLOAT_EQ(r->temperature(), 0.6f);
  EXPECT_FLOAT_EQ(r->top_p(), 0.95f);
  EXPECT_EQ(r->top_k(), 5);
  EXPECT_FLOAT_EQ(r->min_p(), 0.05f);
  EXPECT_FLOAT_EQ(r->repetition_penalty(), 1.1f);
  EXPECT_EQ(r->max_tokens(), 0u);  // still "up to the context"
  EXPECT_EQ(r->stop_size(), 1);
  EXPECT_EQ(r->seed(), 7u);
  absl::StatusOr<engine::SamplingParams> at_router =
      ToEngineSamplingParams(s, model, Limits(), 100);
  absl::StatusOr<engine::SamplingParams> at_worker =
      ToEngineSamplingParams(*r, GenerationDefaults(), Limits(), 100);
  ASSERT_TRUE(at_router.ok() && at_worker.ok());
  EXPECT_FLOAT_EQ(at_worker->temperature, at_router->temperature);
  EXPECT_FLOAT_EQ(at_worker->top_p, at_router->top_p);
  EXPECT_EQ(at_worker->top_k, at_router->top_k);
  EXPECT_FLOAT_EQ(at_worker->min_p, at_router->min_p);
  EXPECT_FLOAT_EQ(at_worker->repetition_penalty, at_router->repetition_penalty);
  EXPECT_EQ(at_worker->max_tokens, at_router->max_tokens);
  EXPECT_EQ(at_worker->seed, at_router->seed);
  // Errors as ToEngineSamplingParams.
  s.set_max_tokens(static_cast<uint32_t>(Limits().max_context_tokens));
  EXPECT_EQ(ResolveSampling(s, model, Limits(), 100).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ToEngineSamplingParamsTest, SetFieldsWinEvenWhenZero) {
  GenerationDefaults defaults;
  defaults.temperature = 0.6f;
  defaults.top_k = 20;
  defaults.min_p = 0.05f;
  defaults.repetition_penalty = 1.1f;
  v1::SamplingParams s;
  s.set_temperature(0);  // greedy, explicitly
  s.set_top_p(0.5f);
  s.set_top_k(0);
  s.set_min_p(0);
  s.set_repetition_penalty(1.3f);
  s.set_presence_penalty(0.5f);
  s.set_frequency_penalty(-0.5f);
  s.set_seed(0);
  s.set_max_tokens(7);
  s.add_stop("\n\n");
  s.add_stop_token_ids(42);
  s.set_ignore_eos(true);
  s.set_logprobs(3);
  s.set_return_logprobs(true);
  absl::StatusOr<engine::SamplingParams> p = ToEngineSamplingParams(s, defaults, Limits(), 100);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->temperature, 0.0f);
  EXPECT_FLOAT_EQ(p->top_p, 0.5f);
  EXPECT_EQ(p->top_k, 0);
  EXPECT_EQ(p->min_p, 0.0f);
  EXPECT_FLOAT_EQ(p->repetition_penalty, 1.3f);
  EXPECT_FLOAT_EQ(p->presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(p->frequency_penalty, -0.5f);
  EXPECT_TRUE(p->has_seed);
  EXPECT_EQ(p->seed, 0u);
  EXPECT_EQ(p->max_tokens, 7);
  EXPECT_EQ(p->stop, std::vector<std::string>{"\n\n"});
  EXPECT_EQ(p->stop_token_ids, std::vector<int32_t>{42});
  EXPECT_TRUE(p->ignore_eos);
  EXPECT_EQ(p->logprobs, 3);
  EXPECT_TRUE(p->return_logprobs);
  EXPECT_TRUE(engine::ValidateSamplingParams(*p, 1000).ok());
}

TEST(ToEngineSamplingParamsTest, ContextCheck) {
  v1::SamplingParams s;
  // 0: up to the context.
  absl::StatusOr<engine::SamplingParams> p = ToEngineSamplingParams(s, {}, Limits(), 4000);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->max_tokens, 96);
  s.set_max_tokens(96);
  EXPECT_TRUE(ToEngineSamplingParams(s, {}, Limits(), 4000).ok());
  s.set_max_tokens(97);
  p = ToEngineSamplingParams(s, {}, Limits(), 4000);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.status().message(),
            "sampling.max_tokens: expected prompt + max_tokens <= 4096 (the model's context), "
            "got 4000 + 97 = 4097");
  s.set_max_tokens(0);
  p = ToEngineSamplingParams(s, {}, Limits(), 4096);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(p.status().message(), "sampling.max_tokens: 0 means up to"))
      << p.status();
  s.set_max_tokens(std::numeric_limits<uint32_t>::max());
  p = ToEngineSamplingParams(s, {}, Limits(), 1);
  EXPECT_TRUE(absl::StartsWith(p.status().message(), "sampling.max_tokens: expected"))
      << p.status();
}

TEST(ToEngineSamplingParamsTest, RejectsWhatValidationRejects) {
  v1::SamplingParams s;
  s.set_max_tokens(1);
  s.set_top_p(1.5f);
  absl::StatusOr<engine::SamplingParams> p = ToEngineSamplingParams(s, {}, Limits(), 1);
  EXPECT_EQ(p.status().message(), "sampling.top_p: expected (0, 1], got 1.5");
}

TEST(GenerationDefaultsTest, ParsesGenerationConfig) {
  absl::StatusOr<GenerationDefaults> d = ParseGenerationDefaults(nlohmann::json::parse(
      R"({"bos_token_id": 1, "do_sample": true, "temperature": 0.7, "top_p": 0.8,
          "top_k": 20, "repetition_penalty": 1.05, "min_p": null})"));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FLOAT_EQ(d->temperature, 0.7f);
  EXPECT_FLOAT_EQ(d->top_p, 0.8f);
  EXPECT_EQ(d->top_k, 20);
  EXPECT_EQ(d->min_p, 0.0f);
  EXPECT_FLOAT_EQ(d->repetition_penalty, 1.05f);

  d = ParseGenerationDefaults(nlohmann::json::object());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->temperature, 1.0f);
  EXPECT_EQ(d->top_k, 0);

  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"top_p": 0})", "generation_config.top_p: expected (0, 1], got 0"},
      {R"({"temperature": -1})", "generation_config.temperature: expected >= 0, got -1"},
      {R"({"temperature": "hot"})", "generation_config.temperature: expected a number; got"},
      {R"({"top_k": 2.5})", "generation_config.top_k: expected -1, 0 (disabled) or >= 1; got"},
      {R"({"min_p": 2})", "generation_config.min_p: expected [0, 1], got 2"},
      {R"({"repetition_penalty": 0})", "generation_config.repetition_penalty: expected (0, 2]"},
      {R"([1])", "generation_config: expected a JSON object"},
  };
  for (const auto& [json, message] : bad) {
    d = ParseGenerationDefaults(nlohmann::json::parse(json));
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << json;
    EXPECT_TRUE(absl::StartsWith(d.status().message(), message)) << d.status();
  }
}

TEST(Utf8Test, AcceptsWellFormedRejectsMalformed) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));  // é € 😀
  EXPECT_TRUE(IsValidUtf8("\xf4\x8f\xbf\xbf"));                           // U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\x80"));                                      // lone continuation
  EXPECT_FALSE(IsValidUtf8("\xc3"));                                      // truncated
  EXPECT_FALSE(IsValidUtf8("\xe0\x80\xaf"));                              // overlong
  EXPECT_FALSE(IsValidUtf8("\xed\xbf\xbf"));                              // surrogate
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));                          // > U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xf8\x88\x80\x80\x80"));                      // 5-byte form
}

TEST(Base64Test, StrictDecoding) {
  std::string out;
  EXPECT_TRUE(Base64Decode("aGVsbG8=", &out));
  EXPECT_EQ(out, "hello");
  EXPECT_TRUE(Base64Decode("aGVsbG8", &out));  // unpadded
  EXPECT_EQ(out, "hello");
  EXPECT_TRUE(Base64Decode("aGk=", &out));
  EXPECT_EQ(out, "hi");
  EXPECT_TRUE(Base64Decode("", &out));
  EXPECT_EQ(out, "");
  EXPECT_FALSE(Base64Decode("aGVsbG8==", &out));  // too much padding
  EXPECT_FALSE(Base64Decode("aGVs bG8=", &out));  // whitespace
  EXPECT_FALSE(Base64Decode("aGVsbG-=", &out));   // URL-safe alphabet
  EXPECT_FALSE(Base64Decode("a", &out));          // 6 bits cannot form a byte
  EXPECT_FALSE(Base64Decode("aGl=", &out));       // non-zero trailing bits
  EXPECT_FALSE(Base64Decode("aG=k", &out));       // padding in the middle
  // Round trip over every byte value.
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  EXPECT_TRUE(Base64Decode(absl::Base64Escape(all), &out));
  EXPECT_EQ(out, all);
}

TEST(InspectImageTest, FormatsAndSizes) {
  absl::StatusOr<ImageHeader> png = InspectImage(Png());
  ASSERT_TRUE(png.ok()) << png.status();
  EXPECT_EQ(png->format, ImageFormat::kPng);
  absl::StatusOr<ImageHeader> jpeg = InspectImage(Jpeg());
  ASSERT_TRUE(jpeg.ok()) << jpeg.status();
  EXPECT_EQ(jpeg->format, ImageFormat::kJpeg);
  EXPECT_EQ(jpeg->width, 8u);
  EXPECT_EQ(jpeg->height, 16u);
  // Bytes after IEND / EOI are ignored, as decoders do.
  EXPECT_TRUE(InspectImage(Png() + "trailer").ok());
  EXPECT_TRUE(InspectImage(Jpeg() + "trailer").ok());
}

TEST(InspectImageTest, EveryTruncationIsRejected) {
  for (const std::string& image : {Png(), Jpeg()}) {
    for (size_t n = 0; n < image.size(); ++n) {
      EXPECT_FALSE(InspectImage(image.substr(0, n)).ok()) << n << " of " << image.size();
    }
  }
}

TEST(InspectImageTest, RejectsMalformedStructure) {
  // PNG whose first chunk is not IHDR.
  std::string png = Png();
  png[12] = 'X';
  EXPECT_TRUE(absl::StrContains(InspectImage(png).status().message(), "malformed PNG"));
  // JPEG with a scan before any frame header: drop SOF0 (13 bytes after DQT).
  std::string jpeg = Jpeg();
  const size_t sof = jpeg.find(Bytes({0xFF, 0xC0}));
  jpeg.erase(sof, 13);
  EXPECT_EQ(InspectImage(jpeg).status().message(), "malformed JPEG: scan before any frame header");
  // JPEG with a zero width.
  jpeg = Jpeg();
  jpeg[sof + 7] = 0;
  jpeg[sof + 8] = 0;
  EXPECT_EQ(InspectImage(jpeg).status().message(), "malformed JPEG: size 0x16");
  // WebP and unknown data.
  EXPECT_EQ(
      InspectImage(std::string("RIFF\x10\0\0\0WEBPVP8 ", 16)).status().message().substr(0, 37),
      "expected PNG or JPEG data; got WebP (");
  EXPECT_EQ(InspectImage("hello").status().message(),
            "expected PNG or JPEG data; got unknown data (5 bytes)");
}

}  // namespace
}  // namespace deepinfer::api
