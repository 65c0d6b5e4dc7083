#include "router/openai_api.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/client_callback.h"

namespace deepinfer::router {
namespace openai {
namespace {

using json = nlohmann::json;

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// A value for an error message: scalars as JSON, containers by kind (never dumped: they may be
// nested arbitrarily deep).
std::string Shown(const json& j) {
  if (j.is_array()) return absl::StrCat("a list of ", j.size());
  if (j.is_object()) return "an object";
  std::string s = Dump(j);
  if (s.size() > 64) s = s.substr(0, 64) + "...";
  return s;
}

absl::Status WrongType(absl::string_view field, absl::string_view expected, const json& got) {
  return Invalid(field, absl::StrCat("expected ", expected, "; got ", Shown(got)));
}

// Tracks where the parser is, to name the field that holds invalid UTF-8.
class PathTracker : public json::json_sax_t {
 public:
  bool null() override { return Value(); }
  bool boolean(bool) override { return Value(); }
  bool number_integer(number_integer_t) override { return Value(); }
  bool number_unsigned(number_unsigned_t) override { return Value(); }
  bool number_float(number_float_t, const string_t&) override { return Value(); }
  bool string(string_t&) override { return Value(); }
  bool binary(binary_t&) override { return Value(); }
  bool start_object(std::size_t) override { return Push(false); }
  bool key(string_t& key) override {
    frames_.back().key = key;
    return true;
  }
  bool end_object() override { return Pop(); }
  bool start_array(std::size_t) override { return Push(true); }
  bool end_array() override { return Pop(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    reason_ = e.what();
    return false;
  }
  // The parser's reason for stopping ("" when it did not).
  const std::string& reason() const { return reason_; }

  // The path of the value being parsed when the parser stopped, e.g. "messages[1].content".
  std::string Path() const { return frames_.empty() ? "" : frames_.back().path + Child(); }

 private:
  struct Frame {
    bool array = false;
    int64_t count = 0;  // values completed or started (arrays)
    std::string key;    // the last key (objects)
    std::string path;   // this container's path
  };
  // The segment of the top frame's current child.
  std::string Child() const {
    const Frame& top = frames_.back();
    if (top.array) return absl::StrCat("[", top.count, "]");
    return top.path.empty() ? top.key : absl::StrCat(".", top.key);
  }
  bool Value() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().count;
    return true;
  }
  bool Push(bool array) {
    Frame f;
    f.array = array;
    if (!frames_.empty()) {
      f.path = frames_.back().path + Child();
      if (frames_.back().array) ++frames_.back().count;
    }
    frames_.push_back(std::move(f));
    return true;
  }
  bool Pop() {
    frames_.pop_back();
    return true;
  }
  std::vector<Frame> frames_;
  std::string reason_;
};

absl::StatusOr<json> ParseJson(absl::string_view body) {
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_discarded()) return j;
  // Parse again, tracking the path, to say where and why.
  PathTracker tracker;
  json::sax_parse(body.begin(), body.end(), &tracker);
  const std::string& reason = tracker.reason();
  if (absl::StrContains(reason, "UTF-8")) {
    std::string path = tracker.Path();
    if (path.empty()) path = "body";
    return Invalid(path, "invalid UTF-8 (JSON text must be UTF-8)");
  }
  if (body.empty()) return Invalid("body", "expected a JSON object; got an empty body");
  return Invalid("body", absl::StrCat("malformed JSON: ", reason));
}

// Field accessors: absent or null -> nullopt; the wrong type -> kInvalidArgument.
absl::StatusOr<std::optional<double>> Number(const json& o, const char* name) {
  auto it = o.find(name);
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return WrongType(name, "a number", *it);
  return it->get<double>();
}

absl::StatusOr<std::optional<int64_t>> Integer(const json& o, const char* name) {
  auto it = o.find(name);
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (it->is_number_integer()) {
    if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t{INT64_MAX}) {
      return WrongType(name, "an integer in the 64-bit range", *it);
    }
    return it->get<int64_t>();
  }
  if (it->is_number_float()) {
    const double d = it->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) {
      return static_cast<int64_t>(d);
    }
  }
  return WrongType(name, "an integer", *it);
}

absl::StatusOr<std::optional<bool>> Bool(const json& o, const char* name) {
  auto it = o.find(name);
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return WrongType(name, "a boolean", *it);
  return it->get<bool>();
}

absl::StatusOr<std::optional<std::string>> String(const json& o, const char* name,
                                                  absl::string_view path = {}) {
  auto it = o.find(name);
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) return WrongType(path.empty() ? name : path, "a string", *it);
  return it->get<std::string>();
}

#define DI_FIELD(var, expr)        \
  auto var##_or = (expr);          \
  if (!var##_or.ok()) return var##_or.status(); \
  const auto& var = *var##_or

// Present and neither null, false, an empty list nor an empty object.
bool IsSet(const json& o, const char* name) {
  auto it = o.find(name);
  if (it == o.end() || it->is_null()) return false;
  if (it->is_boolean()) return it->get<bool>();
  if (it->is_array() || it->is_object() || it->is_string()) return !it->empty();
  return true;
}

absl::Status Unsupported(const json& o, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (IsSet(o, name)) return Invalid(name, "not supported by this server");
  }
  return absl::OkStatus();
}

// The sampling fields both endpoints share.
absl::Status ParseSampling(const json& o, Endpoint endpoint, v1::SamplingParams* s,
                           ParsedRequest* out) {
  DI_FIELD(temperature, Number(o, "temperature"));
  if (temperature) s->set_temperature(static_cast<float>(*temperature));
  DI_FIELD(top_p, Number(o, "top_p"));
  if (top_p) s->set_top_p(static_cast<float>(*top_p));
  DI_FIELD(top_k, Integer(o, "top_k"));
  if (top_k) {
    if (*top_k < -1 || *top_k > std::numeric_limits<int32_t>::max()) {
      return Invalid("top_k", absl::StrCat("expected -1, 0 (disabled) or >= 1; got ", *top_k));
    }
    s->set_top_k(static_cast<int32_t>(*top_k));
  }
  DI_FIELD(min_p, Number(o, "min_p"));
  if (min_p) s->set_min_p(static_cast<float>(*min_p));
  DI_FIELD(presence, Number(o, "presence_penalty"));
  if (presence) s->set_presence_penalty(static_cast<float>(*presence));
  DI_FIELD(frequency, Number(o, "frequency_penalty"));
  if (frequency) s->set_frequency_penalty(static_cast<float>(*frequency));
  DI_FIELD(repetition, Number(o, "repetition_penalty"));
  if (repetition) s->set_repetition_penalty(static_cast<float>(*repetition));
  DI_FIELD(seed, Integer(o, "seed"));
  if (seed) s->set_seed(static_cast<uint64_t>(*seed));
  DI_FIELD(ignore_eos, Bool(o, "ignore_eos"));
  if (ignore_eos) s->set_ignore_eos(*ignore_eos);

  // max_completion_tokens (chat's current name) wins over the older max_tokens.
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    DI_FIELD(max_tokens, Integer(o, name));
    if (!max_tokens) continue;
    if (*max_tokens < 1 || *max_tokens > std::numeric_limits<uint32_t>::max()) {
      return Invalid(name, absl::StrCat("expected an integer >= 1; got ", *max_tokens));
    }
    s->set_max_tokens(static_cast<uint32_t>(*max_tokens));
  }

  if (auto it = o.find("stop"); it != o.end() && !it->is_null()) {
    if (it->is_string()) {
      s->add_stop(it->get<std::string>());
    } else if (it->is_array()) {
      for (const json& stop : *it) {
        if (!stop.is_string()) return WrongType("stop", "a string or a list of strings", *it);
        s->add_stop(stop.get<std::string>());
      }
    } else {
      return WrongType("stop", "a string or a list of strings", *it);
    }
  }
  if (auto it = o.find("stop_token_ids"); it != o.end() && !it->is_null()) {
    if (!it->is_array()) return WrongType("stop_token_ids", "a list of token ids", *it);
    for (const json& id : *it) {
      if (!id.is_number_unsigned() || id.get<uint64_t>() > UINT32_MAX) {
        return WrongType("stop_token_ids", "a list of token ids", *it);
      }
      s->add_stop_token_ids(static_cast<uint32_t>(id.get<uint64_t>()));
    }
  }

  if (endpoint == Endpoint::kChat) {
    DI_FIELD(logprobs, Bool(o, "logprobs"));
    DI_FIELD(top_logprobs, Integer(o, "top_logprobs"));
    if (top_logprobs) {
      if (!logprobs.value_or(false)) return Invalid("top_logprobs", "requires logprobs: true");
      if (*top_logprobs < 0 || *top_logprobs > 20) {
        return Invalid("top_logprobs", absl::StrCat("expected 0..20; got ", *top_logprobs));
      }
      s->set_logprobs(static_cast<uint32_t>(*top_logprobs));
    }
    out->logprobs = logprobs.value_or(false);
  } else {
    DI_FIELD(logprobs, Integer(o, "logprobs"));
    if (logprobs) {
      if (*logprobs < 0 || *logprobs > 20) {
        return Invalid("logprobs", absl::StrCat("expected 0..20; got ", *logprobs));
      }
      s->set_logprobs(static_cast<uint32_t>(*logprobs));
      out->logprobs = true;
    }
  }
  s->set_return_logprobs(out->logprobs);
  return absl::OkStatus();
}

absl::Status ParseContentPart(const json& part, const std::string& path, v1::ChatMessage* m) {
  if (!part.is_object()) return WrongType(path, "a content part object", part);
  DI_FIELD(type, String(part, "type", path + ".type"));
  if (!type) return Invalid(path + ".type", "expected \"text\" or \"image_url\"; got none");
  if (*type == "text") {
    DI_FIELD(text, String(part, "text", path + ".text"));
    if (!text) return Invalid(path + ".text", "expected a string; got none");
    m->add_content()->set_text(*text);
    return absl::OkStatus();
  }
  if (*type == "image_url") {
    auto it = part.find("image_url");
    std::string url;
    if (it != part.end() && it->is_string()) {
      url = it->get<std::string>();
    } else if (it != part.end() && it->is_object()) {
      DI_FIELD(u, String(*it, "url", path + ".image_url.url"));
      if (!u) return Invalid(path + ".image_url.url", "expected a data: URL; got none");
      url = *u;
    } else {
      return Invalid(path + ".image_url", "expected {\"url\": \"data:image/...;base64,...\"}");
    }
    m->add_content()->mutable_image()->set_url(std::move(url));
    return absl::OkStatus();
  }
  return Invalid(path + ".type",
                 absl::StrCat("expected \"text\" or \"image_url\"; got ", Shown(*type)));
}

absl::Status ParseMessages(const json& o, v1::ChatRequest* chat) {
  auto it = o.find("messages");
  if (it == o.end() || it->is_null()) return Invalid("messages", "expected a list; got none");
  if (!it->is_array()) return WrongType("messages", "a list of messages", *it);
  for (size_t i = 0; i < it->size(); ++i) {
    const json& msg = (*it)[i];
    const std::string path = absl::StrCat("messages[", i, "]");
    if (!msg.is_object()) return WrongType(path, "a message object", msg);
    v1::ChatMessage* m = chat->add_messages();
    DI_FIELD(role, String(msg, "role", path + ".role"));
    // OpenAI's newer name for the system role.
    m->set_role(role.value_or("") == "developer" ? "system" : role.value_or(""));
    DI_FIELD(name, String(msg, "name", path + ".name"));
    if (name) m->set_name(*name);
    if (IsSet(msg, "tool_calls")) return Invalid(path + ".tool_calls", "not supported by this server");
    auto content = msg.find("content");
    if (content == msg.end() || content->is_null()) continue;
    if (content->is_string()) {
      m->add_content()->set_text(content->get<std::string>());
    } else if (content->is_array()) {
      for (size_t j = 0; j < content->size(); ++j) {
        DI_RETURN_IF_ERROR(ParseContentPart((*content)[j],
                                                  absl::StrCat(path, ".content[", j, "]"), m));
      }
    } else {
      return WrongType(path + ".content", "a string or a list of content parts", *content);
    }
  }
  return absl::OkStatus();
}

// Translates a field path of the router's messages into the request's own field names.
std::string ClientPath(absl::string_view path, Endpoint endpoint) {
  absl::string_view rest = path;
  if (absl::ConsumePrefix(&rest, "sampling.")) {
    if (absl::StartsWith(rest, "stop_token_ids")) return "stop_token_ids";
    if (absl::StartsWith(rest, "stop")) return "stop";
    if (rest == "logprobs") return endpoint == Endpoint::kChat ? "top_logprobs" : "logprobs";
    return std::string(rest);
  }
  if (absl::StartsWith(path, "prompt_token_ids")) return "prompt";
  if (absl::StartsWith(path, "messages[")) {
    const size_t image = path.find(".image");
    if (image != absl::string_view::npos) {
      return absl::StrCat(path.substr(0, image), ".image_url");
    }
  }
  return std::string(path);
}

}  // namespace

absl::StatusOr<ParsedRequest> ParseRequest(Endpoint endpoint, absl::string_view body,
                                           size_t max_prompt_bytes, const Tokenize& tokenize) {
  DI_FIELD(o, ParseJson(body));
  if (!o.is_object()) return WrongType("body", "a JSON object", o);
  ParsedRequest out;
  out.endpoint = endpoint;
  DI_FIELD(model, String(o, "model"));
  out.model = model.value_or("");
  DI_FIELD(n, Integer(o, "n"));
  if (n && *n != 1) return Invalid("n", absl::StrCat("only n = 1 is supported; got ", *n));
  DI_FIELD(stream, Bool(o, "stream"));
  out.stream = stream.value_or(false);
  if (auto it = o.find("stream_options"); it != o.end() && !it->is_null()) {
    if (!it->is_object()) return WrongType("stream_options", "an object", *it);
    DI_FIELD(usage, Bool(*it, "include_usage"));
    out.include_usage = usage.value_or(false);
  }
  DI_FIELD(priority, Integer(o, "priority"));
  DI_FIELD(cache_salt, String(o, "cache_salt"));
  if (priority && (*priority < INT32_MIN || *priority > INT32_MAX)) {
    return Invalid("priority", absl::StrCat("expected -100..100; got ", *priority));
  }
  DI_RETURN_IF_ERROR(Unsupported(o, {"logit_bias", "audio", "prediction",
                                           "web_search_options", "functions", "function_call"}));
  if (endpoint == Endpoint::kChat) {
    DI_RETURN_IF_ERROR(Unsupported(o, {"tools"}));
    if (auto it = o.find("tool_choice");
        it != o.end() && !it->is_null() && !(it->is_string() && *it == "none")) {
      return Invalid("tool_choice", "not supported by this server (only \"none\")");
    }
    if (auto it = o.find("response_format"); it != o.end() && !it->is_null()) {
      if (!it->is_object() || it->value("type", json("")) != "text") {
        return Invalid("response_format", "only {\"type\": \"text\"} is supported");
      }
    }
    if (auto it = o.find("modalities"); it != o.end() && !it->is_null()) {
      if (*it != json::array({"text"})) return Invalid("modalities", "only [\"text\"] is supported");
    }
    v1::ChatRequest& chat = out.chat;
    chat.set_model(out.model);
    DI_RETURN_IF_ERROR(ParseMessages(o, &chat));
    DI_RETURN_IF_ERROR(ParseSampling(o, endpoint, chat.mutable_sampling(), &out));
    DI_FIELD(add_generation_prompt, Bool(o, "add_generation_prompt"));
    if (add_generation_prompt) chat.set_add_generation_prompt(*add_generation_prompt);
    if (priority) chat.set_priority(static_cast<int32_t>(*priority));
    if (cache_salt) chat.set_cache_salt(*cache_salt);
    return out;
  }
  DI_FIELD(best_of, Integer(o, "best_of"));
  if (best_of && *best_of != 1) {
    return Invalid("best_of", absl::StrCat("only best_of = 1 is supported; got ", *best_of));
  }
  DI_RETURN_IF_ERROR(Unsupported(o, {"echo", "suffix"}));
  v1::GenerateRequest& gen = out.generate;
  gen.set_model(out.model);
  gen.set_detokenize(true);
  auto prompt = o.find("prompt");
  if (prompt == o.end() || prompt->is_null()) return Invalid("prompt", "expected a string; got none");
  const json* p = &*prompt;
  // One prompt: a string, a list of token ids, or a list holding exactly one of those.
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
  if (p->is_string()) {
    const std::string& text = p->get_ref<const std::string&>();
    if (text.size() > max_prompt_bytes) {
      return Invalid("prompt", absl::StrCat("expected at most ", max_prompt_bytes, " bytes; got ",
                                            text.size()));
    }
    absl::StatusOr<std::vector<int32_t>> ids = tokenize(text);
    if (!ids.ok()) return Invalid("prompt", ids.status().message());
    gen.mutable_prompt_token_ids()->Add(ids->begin(), ids->end());
  } else if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
    for (const json& id : *p) {
      if (!id.is_number_unsigned() || id.get<uint64_t>() > UINT32_MAX) {
        return WrongType("prompt", "a string or a list of token ids", id);
      }
      gen.add_prompt_token_ids(static_cast<uint32_t>(id.get<uint64_t>()));
    }
  } else if (p->is_array() && p->size() > 1) {
    return Invalid("prompt", "only one prompt per request is supported (n = 1)");
  } else {
    return WrongType("prompt", "a string or a list of token ids", *p);
  }
  DI_RETURN_IF_ERROR(ParseSampling(o, endpoint, gen.mutable_sampling(), &out));
  // OpenAI's completions default is 16 tokens.
  if (gen.sampling().max_tokens() == 0) gen.mutable_sampling()->set_max_tokens(16);
  if (priority) gen.set_priority(static_cast<int32_t>(*priority));
  if (cache_salt) gen.set_cache_salt(*cache_salt);
  return out;
}

HttpError ErrorFromStatus(const absl::Status& status, Endpoint endpoint) {
  HttpError e;
  e.message = std::string(status.message());
  e.type = "invalid_request_error";
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument: {
      e.status = 400;
      const size_t colon = e.message.find(": ");
      if (colon != std::string::npos && e.message.find(' ') > colon) {
        absl::string_view field = absl::string_view(e.message).substr(0, colon);
        if (field == "model" && absl::StrContains(e.message, "unknown model")) {
          e.status = 404;
          e.code = "model_not_found";
          e.param = "model";
          break;
        }
        e.param = ClientPath(field, endpoint);
        e.message = absl::StrCat(e.param, e.message.substr(colon));
      }
      break;
    }
    case absl::StatusCode::kUnauthenticated:
      e.status = 401;
      e.type = "authentication_error";
      e.code = "invalid_api_key";
      break;
    case absl::StatusCode::kPermissionDenied:
      e.status = 403;
      e.type = "permission_error";
      e.code = "permission_denied";
      break;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      e.status = 400;
      break;
    case absl::StatusCode::kNotFound:
      e.status = 404;
      break;
    case absl::StatusCode::kAlreadyExists:
      e.status = 409;
      break;
    case absl::StatusCode::kResourceExhausted:
      e.status = 429;
      e.type = "rate_limit_error";
      e.code = "resource_exhausted";
      e.retry_after_s = 1;
      break;
    case absl::StatusCode::kUnavailable:
      e.status = 503;
      e.type = "service_unavailable";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      e.status = 504;
      e.type = "timeout";
      break;
    case absl::StatusCode::kCancelled:
      e.status = 499;
      e.type = "cancelled";
      break;
    default:
      e.status = 500;
      e.type = "server_error";
      break;
  }
  if (e.message.empty()) e.message = absl::StatusCodeToString(status.code());
  return e;
}

std::string Dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string ErrorBody(const HttpError& error) {
  json e = {{"message", error.message},
            {"type", error.type},
            {"param", error.param.empty() ? json(nullptr) : json(error.param)},
            {"code", error.code.empty() ? json(nullptr) : json(error.code)}};
  return Dump(json{{"error", std::move(e)}}) + "\n";
}

std::string FinishReasonName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_UNSPECIFIED: return "";
    case v1::FINISH_REASON_STOP:
    case v1::FINISH_REASON_STOP_STRING: return "stop";
    case v1::FINISH_REASON_LENGTH: return "length";
    case v1::FINISH_REASON_ABORTED: return "abort";
    default: return "error";
  }
}

v1::GenerateChunk ToGenerateChunk(v1::ChatChunk& in) {
  v1::GenerateChunk out;
  out.set_request_id(std::move(*in.mutable_request_id()));
  out.mutable_token_ids()->Swap(in.mutable_token_ids());
  out.set_text_delta(std::move(*in.mutable_text_delta()));
  out.mutable_logprobs()->Swap(in.mutable_logprobs());
  out.set_finish_reason(in.finish_reason());
  if (in.has_usage()) out.mutable_usage()->Swap(in.mutable_usage());
  out.set_matched_stop(std::move(*in.mutable_matched_stop()));
  return out;
}

ResponseBuilder::ResponseBuilder(const ParsedRequest& request, std::string model, int64_t created,
                                 TokenText token_text)
    : endpoint_(request.endpoint),
      include_usage_(request.include_usage),
      logprobs_(request.logprobs),
      model_(std::move(model)),
      created_(created),
      token_text_(std::move(token_text)) {
  logprobs_acc_ = endpoint_ == Endpoint::kChat
                      ? json{{"content", json::array()}}
                      : json{{"tokens", json::array()},
                             {"token_logprobs", json::array()},
                             {"top_logprobs", json::array()},
                             {"text_offset", json::array()}};
}

std::string ResponseBuilder::Id(const v1::GenerateChunk& chunk) const {
  return absl::StrCat(endpoint_ == Endpoint::kChat ? "chatcmpl-" : "cmpl-", chunk.request_id());
}

json ResponseBuilder::Usage(const v1::Usage& u) const {
  return {{"prompt_tokens", u.prompt_tokens()},
          {"completion_tokens", u.completion_tokens()},
          {"total_tokens", u.prompt_tokens() + u.completion_tokens()},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_prompt_tokens()}}}};
}

json ResponseBuilder::Logprobs(const v1::GenerateChunk& chunk, int64_t* text_offset) const {
  if (endpoint_ == Endpoint::kChat) {
    json content = json::array();
    for (const v1::TokenLogprob& lp : chunk.logprobs()) {
      const std::string token = token_text_(lp.token_id());
      json top = json::array();
      for (const v1::TopLogprob& t : lp.top()) {
        const std::string alt = token_text_(t.token_id());
        top.push_back({{"token", alt},
                       {"logprob", t.logprob()},
                       {"bytes", std::vector<uint8_t>(alt.begin(), alt.end())}});
      }
      content.push_back({{"token", token},
                         {"logprob", lp.logprob()},
                         {"bytes", std::vector<uint8_t>(token.begin(), token.end())},
                         {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}};
  }
  json out = {{"tokens", json::array()},
              {"token_logprobs", json::array()},
              {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  for (const v1::TokenLogprob& lp : chunk.logprobs()) {
    const std::string token = token_text_(lp.token_id());
    out["tokens"].push_back(token);
    out["token_logprobs"].push_back(lp.logprob());
    json top = json::object();
    for (const v1::TopLogprob& t : lp.top()) top[token_text_(t.token_id())] = t.logprob();
    out["top_logprobs"].push_back(std::move(top));
    out["text_offset"].push_back(*text_offset);
    *text_offset += static_cast<int64_t>(token.size());
  }
  return out;
}

std::string ResponseBuilder::StreamEvents(const v1::GenerateChunk& chunk) {
  std::string events;
  auto emit = [&](const json& j) { absl::StrAppend(&events, "data: ", Dump(j), "\n\n"); };
  const std::string finish = FinishReasonName(chunk.finish_reason());
  const bool last = !finish.empty();
  json base = {{"id", Id(chunk)},
               {"object", endpoint_ == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
               {"created", created_},
               {"model", model_}};
  auto with_choice = [&](json choice) {
    json j = base;
    j["choices"] = json::array({std::move(choice)});
    if (include_usage_) j["usage"] = nullptr;
    return j;
  };
  json logprobs = nullptr;
  if (logprobs_ && chunk.logprobs_size() > 0) logprobs = Logprobs(chunk, &text_offset_);
  if (endpoint_ == Endpoint::kChat) {
    if (!role_sent_) {
      role_sent_ = true;
      emit(with_choice({{"index", 0},
                        {"delta", {{"role", "assistant"}, {"content", ""}}},
                        {"logprobs", nullptr},
                        {"finish_reason", nullptr}}));
    }
    if (!chunk.text_delta().empty() || !logprobs.is_null() || last) {
      json delta = json::object();
      if (!chunk.text_delta().empty()) delta["content"] = chunk.text_delta();
      emit(with_choice({{"index", 0},
                        {"delta", std::move(delta)},
                        {"logprobs", std::move(logprobs)},
                        {"finish_reason", last ? json(finish) : json(nullptr)}}));
    }
  } else if (!chunk.text_delta().empty() || !logprobs.is_null() || last) {
    emit(with_choice({{"text", chunk.text_delta()},
                      {"index", 0},
                      {"logprobs", std::move(logprobs)},
                      {"finish_reason", last ? json(finish) : json(nullptr)}}));
  }
  if (last) {
    if (include_usage_) {
      json j = base;
      j["choices"] = json::array();
      j["usage"] = Usage(chunk.usage());
      emit(j);
    }
    events += "data: [DONE]\n\n";
  }
  return events;
}

void ResponseBuilder::Add(const v1::GenerateChunk& chunk) {
  if (id_.empty()) id_ = Id(chunk);
  text_ += chunk.text_delta();
  if (logprobs_ && chunk.logprobs_size() > 0) {
    json lp = Logprobs(chunk, &text_offset_);
    for (auto& [key, values] : lp.items()) {
      for (json& v : values) logprobs_acc_[key].push_back(std::move(v));
    }
  }
  if (chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
    finish_reason_ = FinishReasonName(chunk.finish_reason());
    usage_ = chunk.usage();
  }
}

json ResponseBuilder::Final() const {
  json choice;
  if (endpoint_ == Endpoint::kChat) {
    choice = {{"index", 0},
              {"message", {{"role", "assistant"}, {"content", text_}}},
              {"logprobs", logprobs_ ? logprobs_acc_ : json(nullptr)},
              {"finish_reason", finish_reason_}};
  } else {
    choice = {{"text", text_},
              {"index", 0},
              {"logprobs", logprobs_ ? logprobs_acc_ : json(nullptr)},
              {"finish_reason", finish_reason_}};
  }
  return {{"id", id_},
          {"object", endpoint_ == Endpoint::kChat ? "chat.completion" : "text_completion"},
          {"created", created_},
          {"model", model_},
          {"choices", json::array({std::move(choice)})},
          {"usage", Usage(usage_.value_or(v1::Usage()))}};
}

std::string ResponseBuilder::StreamErrorEvent(const HttpError& error) {
  std::string body = ErrorBody(error);
  while (!body.empty() && body.back() == '\n') body.pop_back();
  return absl::StrCat("data: ", body, "\n\n");
}

}  // namespace openai

namespace {

using nlohmann::json;

const HttpHeaders kJson = {{"Content-Type", "application/json"}};

void RespondError(HttpResponder& responder, const openai::HttpError& error) {
  HttpHeaders headers = kJson;
  if (error.retry_after_s > 0) headers.emplace_back("Retry-After", absl::StrCat(error.retry_after_s));
  responder.Respond(error.status, std::move(headers), openai::ErrorBody(error));
}

void RespondError(HttpResponder& responder, int status, std::string message,
                  std::string type = "invalid_request_error") {
  openai::HttpError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  RespondError(responder, e);
}

// Lets the HTTP side cancel a call whose reactor may already be gone.
struct CancelHandle {
  absl::Mutex mu;
  grpc::ClientContext* context ABSL_GUARDED_BY(mu) = nullptr;
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  void Cancel() {
    absl::MutexLock lock(&mu);
    cancelled = true;
    if (context != nullptr) context->TryCancel();
  }
};

// One call to Chat or Generate, relayed to one HTTP response. Deletes itself in OnDone. A hold
// keeps OnDone from running while a chunk is being written: reads and writes alternate, and the
// hold is released only after the last read.
template <typename Chunk>
class RelayCall final : public grpc::ClientReadReactor<Chunk> {
 public:
  RelayCall(openai::ParsedRequest request, std::shared_ptr<HttpResponder> responder,
            std::string model, openai::TokenText token_text, std::atomic<int>* in_flight)
      : request_(std::move(request)),
        responder_(std::move(responder)),
        builder_(request_, std::move(model), absl::ToUnixSeconds(absl::Now()),
                 std::move(token_text)),
        in_flight_(in_flight),
        cancel_(std::make_shared<CancelHandle>()) {
    ++*in_flight_;
    absl::MutexLock lock(&cancel_->mu);
    cancel_->context = &context_;
  }

  grpc::ClientContext* context() { return &context_; }
  const openai::ParsedRequest& request() const { return request_; }
  // The HTTP Authorization header, forwarded as the call's `authorization` metadata. A value
  // gRPC cannot carry (not printable ASCII) is forwarded as one no key matches, so the call is
  // refused as unauthenticated instead of failing inside gRPC.
  void SetAuthorization(const std::string& authorization) {
    if (authorization.empty()) return;
    const bool printable = std::all_of(authorization.begin(), authorization.end(),
                                       [](char c) { return c >= 0x20 && c <= 0x7e; });
    context_.AddMetadata("authorization", printable ? authorization : "invalid");
  }

  void Start() {
    responder_->OnClientGone([cancel = cancel_] { cancel->Cancel(); });
    this->AddHold();
    this->StartRead(&chunk_);
    this->StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      this->RemoveHold();
      return;
    }
    v1::GenerateChunk chunk = Convert(chunk_);
    if (!request_.stream) {
      builder_.Add(chunk);
      this->StartRead(&chunk_);
      return;
    }
    if (!stream_started_) {
      stream_started_ = true;
      responder_->StartStream(200, {{"Content-Type", "text/event-stream"},
                                    {"Cache-Control", "no-cache"}});
    }
    std::string events = builder_.StreamEvents(chunk);
    if (events.empty()) {
      this->StartRead(&chunk_);
      return;
    }
    responder_->Write(std::move(events), [this](bool written) {
      if (!written) cancel_->Cancel();
      this->StartRead(&chunk_);
    });
  }

  void OnDone(const grpc::Status& status) override {
    {
      absl::MutexLock lock(&cancel_->mu);
      cancel_->context = nullptr;
    }
    if (status.ok()) {
      if (request_.stream) {
        responder_->EndStream();
      } else {
        responder_->Respond(200, kJson, openai::Dump(builder_.Final()) + "\n");
      }
    } else {
      openai::HttpError error = openai::ErrorFromStatus(
          absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message()),
          request_.endpoint);
      const auto& trailers = context_.GetServerTrailingMetadata();
      if (auto it = trailers.find("retry-after"); it != trailers.end() && error.status == 429) {
        int seconds = 0;
        if (absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &seconds) &&
            seconds > 0) {
          error.retry_after_s = seconds;
        }
      }
      if (stream_started_) {
        responder_->Write(openai::ResponseBuilder::StreamErrorEvent(error), nullptr);
        responder_->EndStream();
      } else {
        RespondError(*responder_, error);
      }
    }
    --*in_flight_;
    delete this;
  }

 private:
  static v1::GenerateChunk Convert(v1::ChatChunk& chunk) { return openai::ToGenerateChunk(chunk); }
  static v1::GenerateChunk Convert(v1::GenerateChunk& chunk) { return std::move(chunk); }

  const openai::ParsedRequest request_;
  const std::shared_ptr<HttpResponder> responder_;
  openai::ResponseBuilder builder_;
  std::atomic<int>* const in_flight_;
  const std::shared_ptr<CancelHandle> cancel_;
  grpc::ClientContext context_;
  Chunk chunk_;
  bool stream_started_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<OpenAiApi>> OpenAiApi::Create(std::shared_ptr<grpc::Channel> channel,
                                                             OpenAiApiOptions options) {
  if (channel == nullptr) return absl::InvalidArgumentError("channel: expected non-null");
  if (options.model_id.empty()) return absl::InvalidArgumentError("model_id: expected non-empty");
  if (!options.tokenize || !options.token_text || !options.list_models) {
    return absl::InvalidArgumentError("tokenize, token_text and list_models: expected set");
  }
  return std::unique_ptr<OpenAiApi>(new OpenAiApi(std::move(channel), std::move(options)));
}

OpenAiApi::OpenAiApi(std::shared_ptr<grpc::Channel> channel, OpenAiApiOptions options)
    : options_(std::move(options)), stub_(v1::Inference::NewStub(channel)) {}

bool OpenAiApi::WaitIdle(absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  while (in_flight_.load() > 0) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

void OpenAiApi::Handle(HttpRequest request, std::shared_ptr<HttpResponder> responder) {
  const std::string& path = request.path;
  if (absl::StartsWith(path, "/v1/") && options_.authorize) {
    if (absl::Status s = options_.authorize(request); !s.ok()) {
      RespondError(*responder, openai::ErrorFromStatus(s, openai::Endpoint::kChat));
      return;
    }
  }
  auto method_is = [&](absl::string_view method) {
    if (request.method == method) return true;
    openai::HttpError e;
    e.status = 405;
    e.type = "invalid_request_error";
    e.message = absl::StrCat(request.method, " ", path, ": expected ", method);
    RespondError(*responder, e);
    return false;
  };
  if (path == "/v1/chat/completions") {
    if (method_is("POST")) Completions(openai::Endpoint::kChat, request, std::move(responder));
  } else if (path == "/v1/completions") {
    if (method_is("POST")) Completions(openai::Endpoint::kCompletion, request, std::move(responder));
  } else if (path == "/v1/models") {
    if (!method_is("GET")) return;
    json data = json::array();
    const v1::ListModelsResponse models = options_.list_models();
    for (const v1::ModelInfo& m : models.models()) {
      data.push_back({{"id", m.id()},
                      {"object", "model"},
                      {"created", 0},
                      {"owned_by", "deepinfer"},
                      {"max_model_len", m.max_context_tokens()},
                      {"supports_images", m.supports_images()}});
    }
    responder->Respond(200, kJson, openai::Dump(json{{"object", "list"}, {"data", data}}) + "\n");
  } else if (path == "/metrics" && options_.metrics) {
    if (method_is("GET")) {
      responder->Respond(200, {{"Content-Type", "text/plain; version=0.0.4; charset=utf-8"}},
                         options_.metrics());
    }
  } else if (path == "/healthz" && options_.healthy) {
    if (!method_is("GET")) return;
    const bool ok = options_.healthy();
    responder->Respond(ok ? 200 : 503, {{"Content-Type", "text/plain"}},
                       ok ? "ok\n" : "not serving\n");
  } else {
    RespondError(*responder, 404, absl::StrCat("no such endpoint: ", request.method, " ", path));
  }
}

void OpenAiApi::Completions(openai::Endpoint endpoint, const HttpRequest& request,
                            std::shared_ptr<HttpResponder> responder) {
  absl::StatusOr<openai::ParsedRequest> parsed =
      openai::ParseRequest(endpoint, request.body, options_.max_prompt_bytes, options_.tokenize);
  if (!parsed.ok()) {
    RespondError(*responder, openai::ErrorFromStatus(parsed.status(), endpoint));
    return;
  }
  if (!parsed->model.empty() && parsed->model != options_.model_id) {
    openai::HttpError e;
    e.status = 404;
    e.type = "invalid_request_error";
    e.param = "model";
    e.code = "model_not_found";
    e.message = absl::StrCat("model: the model \"", parsed->model,
                             "\" does not exist; this server serves \"", options_.model_id, "\"");
    RespondError(*responder, e);
    return;
  }
  const std::string model = options_.model_id;
  if (endpoint == openai::Endpoint::kChat) {
    auto* call = new RelayCall<v1::ChatChunk>(std::move(*parsed), std::move(responder), model,
                                              options_.token_text, &in_flight_);
    call->SetAuthorization(request.Header("Authorization"));
    stub_->async()->Chat(call->context(), &call->request().chat, call);
    call->Start();
  } else {
    auto* call = new RelayCall<v1::GenerateChunk>(std::move(*parsed), std::move(responder), model,
                                                  options_.token_text, &in_flight_);
    call->SetAuthorization(request.Header("Authorization"));
    stub_->async()->Generate(call->context(), &call->request().generate, call);
    call->Start();
  }
}

}  // namespace deepinfer::router
