#include "engine/tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/tokenizer/internal/added_vocabulary.h"
#include "engine/tokenizer/internal/bpe_model.h"
#include "engine/tokenizer/internal/decoder.h"
#include "engine/tokenizer/internal/json_util.h"
#include "engine/tokenizer/internal/normalizer.h"
#include "engine/tokenizer/internal/pre_tokenizer.h"
#include "engine/tokenizer/internal/utf8.h"

namespace deepinfer::tokenizer {
namespace {

using internal::Json;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open \"", path, "\" for reading"));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error while reading \"", path, "\""));
  return ss.str();
}

absl::StatusOr<Json> ParseJson(absl::string_view text, absl::string_view what) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected a JSON document, found a parse error: ", e.what()));
  }
}

// Post-processing of a single sequence as two id lists around the text.
struct PostProcessing {
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;
};

absl::StatusOr<std::pair<std::string, int32_t>> TokenAndId(const Json& j, const char* key,
                                                           absl::string_view where) {
  auto it = j.find(key);
  if (it == j.end()) return internal::MissingField(where, key);
  const Json& v = *it;
  if (!v.is_array() || v.size() != 2 || !v[0].is_string() || !v[1].is_number_integer()) {
    return internal::FieldError(where, key, "a [token, id] pair", v);
  }
  const int64_t id = v[1].get<int64_t>();
  if (id < 0 || id > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": id ", id, " is out of range"));
  }
  return std::make_pair(v[0].get<std::string>(), static_cast<int32_t>(id));
}

absl::Status ParsePostProcessor(const Json& j, int depth, PostProcessing* pp) {
  if (depth > internal::kMaxNesting) {
    return absl::InvalidArgumentError("post_processor: too many nested Sequence levels");
  }
  DI_ASSIGN_OR_RETURN(const std::string type, internal::ComponentType(j, "post_processor"));
  const std::string where = absl::StrCat("post_processor \"", type, "\"");
  if (type == "ByteLevel") return absl::OkStatus();  // offsets only
  if (type == "TemplateProcessing") {
    auto single = j.find("single");
    if (single == j.end() || !single->is_array()) {
      return internal::FieldError(where, "single", "an array",
                                  single == j.end() ? Json() : *single);
    }
    auto specials = j.find("special_tokens");
    std::vector<int32_t> prefix, suffix;
    bool seen_sequence = false;
    for (const Json& piece : *single) {
      if (piece.is_object() && piece.contains("Sequence")) {
        const Json& seq = piece["Sequence"];
        if (!seq.is_object() || !seq.contains("id") || !seq["id"].is_string() ||
            seq["id"].get<std::string>() != "A" || seen_sequence) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": expected the single template to hold sequence A once, found ",
                           piece.dump().substr(0, 100)));
        }
        seen_sequence = true;
        continue;
      }
      if (!piece.is_object() || !piece.contains("SpecialToken") ||
          !piece["SpecialToken"].is_object() || !piece["SpecialToken"].contains("id") ||
          !piece["SpecialToken"]["id"].is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where,
            ": expected template pieces {\"Sequence\": ...} or {\"SpecialToken\": ...}, "
            "found ",
            piece.dump().substr(0, 100)));
      }
      const std::string name = piece["SpecialToken"]["id"].get<std::string>();
      if (specials == j.end() || !specials->is_object() || !specials->contains(name)) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": template names special token \"",
                                                       name, "\" missing from special_tokens"));
      }
      const Json& st = (*specials)[name];
      if (!st.is_object() || !st.contains("ids") || !st["ids"].is_array()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": expected special_tokens[\"", name, "\"].ids to be an array"));
      }
      std::vector<int32_t>& target = seen_sequence ? suffix : prefix;
      for (const Json& id : st["ids"]) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": expected special_tokens[\"",
                                                         name, "\"].ids to hold token ids, found ",
                                                         id.dump()));
        }
        target.push_back(static_cast<int32_t>(id.get<int64_t>()));
      }
    }
    if (!seen_sequence) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected the single template to contain sequence A"));
    }
    pp->prefix.insert(pp->prefix.begin(), prefix.begin(), prefix.end());
    pp->suffix.insert(pp->suffix.end(), suffix.begin(), suffix.end());
    return absl::OkStatus();
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    DI_ASSIGN_OR_RETURN(auto cls, TokenAndId(j, "cls", where));
    DI_ASSIGN_OR_RETURN(auto sep, TokenAndId(j, "sep", where));
    pp->prefix.insert(pp->prefix.begin(), cls.second);
    pp->suffix.push_back(sep.second);
    return absl::OkStatus();
  }
  if (type == "Sequence") {
    auto it = j.find("processors");
    if (it == j.end() || !it->is_array()) {
      return internal::FieldError(where, "processors", "an array", it == j.end() ? Json() : *it);
    }
    for (const Json& p : *it) DI_RETURN_IF_ERROR(ParsePostProcessor(p, depth + 1, pp));
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("post_processor type \"", type,
                   "\" is not supported (supported: TemplateProcessing, ByteLevel, "
                   "BertProcessing, RobertaProcessing, Sequence)"));
}

// A token named in tokenizer_config.json: a string, {"content": ...}, or null.
std::optional<std::string> ConfigToken(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  return std::nullopt;
}

std::optional<bool> ConfigBool(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || !it->is_boolean()) return std::nullopt;
  return it->get<bool>();
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(
    absl::string_view tokenizer_json, absl::string_view tokenizer_config_json) {
  DI_ASSIGN_OR_RETURN(const Json j, ParseJson(tokenizer_json, "tokenizer.json"));
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.json: expected an object at the top level, found ", j.type_name()));
  }
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  // nlohmann::json reports type mismatches by throwing; the accessors below check types first,
  // and this catch turns anything they missed into a Status.
  try {
    for (const char* key : {"truncation", "padding"}) {
      auto it = j.find(key);
      if (it != j.end() && !it->is_null()) {
        return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: \"", key,
                                                       "\" is not supported (expected null, found ",
                                                       it->dump().substr(0, 100), ")"));
      }
    }
    auto model = j.find("model");
    if (model == j.end()) return internal::MissingField("tokenizer.json", "model");
    DI_ASSIGN_OR_RETURN(t->model_, internal::BpeModel::FromJson(*model));
    auto normalizer = j.find("normalizer");
    if (normalizer != j.end() && !normalizer->is_null()) {
      DI_ASSIGN_OR_RETURN(t->normalizer_, internal::ParseNormalizer(*normalizer));
    }
    auto pre = j.find("pre_tokenizer");
    if (pre != j.end() && !pre->is_null()) {
      DI_ASSIGN_OR_RETURN(t->pre_tokenizer_, internal::ParsePreTokenizer(*pre));
    }
    auto decoder = j.find("decoder");
    if (decoder != j.end() && !decoder->is_null()) {
      DI_ASSIGN_OR_RETURN(t->decoder_, internal::ParseDecoder(*decoder));
    } else {
      t->decoder_ = internal::NewSpaceJoinDecoder();
    }
    PostProcessing pp;
    auto post = j.find("post_processor");
    if (post != j.end() && !post->is_null()) {
      DI_RETURN_IF_ERROR(ParsePostProcessor(*post, 0, &pp));
    }
    std::vector<internal::AddedToken> added_tokens;
    auto added = j.find("added_tokens");
    if (added != j.end()) {
      DI_ASSIGN_OR_RETURN(added_tokens, internal::ParseAddedTokens(*added));
    }
    DI_ASSIGN_OR_RETURN(t->added_, internal::AddedVocabulary::Create(added_tokens, *t->model_,
                                                                     t->normalizer_.get()));
    int32_t limit = t->model_->id_limit();
    for (int32_t id : t->added_->Ids()) {
      limit = std::max(limit, id + 1);
      if (t->added_->FindById(id)->special) t->special_ids_.push_back(id);
    }
    t->vocab_size_ = limit;
    for (const std::vector<int32_t>* list : {&pp.prefix, &pp.suffix}) {
      for (int32_t id : *list) {
        if (t->DecoderInput(id) == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat("post_processor: special token id ", id, " is not in the vocabulary"));
        }
      }
    }
    t->post_prefix_ = std::move(pp.prefix);
    t->post_suffix_ = std::move(pp.suffix);

    if (!tokenizer_config_json.empty()) {
      DI_ASSIGN_OR_RETURN(const Json config,
                          ParseJson(tokenizer_config_json, "tokenizer_config.json"));
      if (!config.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer_config.json: expected an object at the top level, found ",
                         config.type_name()));
      }
      if (auto bos = ConfigToken(config, "bos_token")) t->bos_id_ = t->TokenToId(*bos);
      if (auto eos = ConfigToken(config, "eos_token")) t->eos_id_ = t->TokenToId(*eos);
      t->add_bos_token_ = ConfigBool(config, "add_bos_token");
      t->add_eos_token_ = ConfigBool(config, "add_eos_token");
    }
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.json: unexpected structure: ", e.what()));
  }
  return t;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(
    const std::string& tokenizer_json_path) {
  DI_ASSIGN_OR_RETURN(const std::string text, ReadFile(tokenizer_json_path));
  auto t = FromJson(text);
  if (!t.ok()) {
    return absl::Status(t.status().code(),
                        absl::StrCat(tokenizer_json_path, ": ", t.status().message()));
  }
  return t;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromDirectory(const std::string& dir) {
  const std::string json_path = absl::StrCat(dir, "/tokenizer.json");
  DI_ASSIGN_OR_RETURN(const std::string text, ReadFile(json_path));
  std::string config;
  const std::string config_path = absl::StrCat(dir, "/tokenizer_config.json");
  if (std::ifstream(config_path).good()) {
    DI_ASSIGN_OR_RETURN(config, ReadFile(config_path));
  }
  auto t = FromJson(text, config);
  if (!t.ok()) {
    return absl::Status(t.status().code(), absl::StrCat(dir, ": ", t.status().message()));
  }
  return t;
}

absl::Status Tokenizer::EncodeSegment(absl::string_view text, bool at_origin,
                                      std::vector<int32_t>* ids) const {
  if (pre_tokenizer_ == nullptr) return model_->Tokenize(text, ids);
  std::vector<internal::PreToken> pieces;
  pieces.push_back(internal::PreToken{std::string(text), at_origin});
  DI_RETURN_IF_ERROR(pre_tokenizer_->PreTokenize(&pieces));
  for (const internal::PreToken& piece : pieces)
    DI_RETURN_IF_ERROR(model_->Tokenize(piece.text, ids));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(absl::string_view text,
                                                       bool add_special_tokens) const {
  DI_RETURN_IF_ERROR(internal::ValidateUtf8(text));
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  if (add_special_tokens) ids = post_prefix_;
  std::vector<internal::AddedVocabulary::Segment> raw, normalized;
  DI_RETURN_IF_ERROR(added_->Split(text, /*normalized_set=*/false, &raw));
  std::string buffer;
  for (const auto& seg : raw) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    buffer.assign(text.data() + seg.begin, seg.end - seg.begin);
    if (normalizer_ != nullptr) DI_RETURN_IF_ERROR(normalizer_->Normalize(&buffer));
    normalized.clear();
    DI_RETURN_IF_ERROR(added_->Split(buffer, /*normalized_set=*/true, &normalized));
    for (const auto& sub : normalized) {
      if (sub.id >= 0) {
        ids.push_back(sub.id);
        continue;
      }
      DI_RETURN_IF_ERROR(
          EncodeSegment(absl::string_view(buffer).substr(sub.begin, sub.end - sub.begin),
                        seg.begin == 0 && sub.begin == 0, &ids));
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), post_suffix_.begin(), post_suffix_.end());
  return ids;
}

const std::string* Tokenizer::DecoderInput(int32_t id) const {
  if (const std::string* s = added_->DecodeForm(id)) return s;
  return model_->IdToToken(id);
}

absl::StatusOr<std::string> Tokenizer::Decode(const std::vector<int32_t>& ids,
                                              bool skip_special_tokens) const {
  internal::DecodeStream stream(*decoder_);
  std::string out;
  for (int32_t id : ids) {
    const std::string* token = DecoderInput(id);
    if (token == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("expected token ids in the vocabulary (below ",
                                                     vocab_size_, "), found id ", id));
    }
    if (skip_special_tokens && added_->IsSpecialContent(*token)) continue;
    DI_RETURN_IF_ERROR(stream.PushToken(*token, &out));
  }
  DI_RETURN_IF_ERROR(stream.Finish(&out));
  return out;
}

std::optional<int32_t> Tokenizer::TokenToId(absl::string_view token) const {
  if (auto id = added_->TokenToId(token)) return id;
  return model_->TokenToId(token);
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  if (const internal::AddedToken* t = added_->FindById(id)) return t->content;
  if (const std::string* s = model_->IdToToken(id)) return *s;
  return std::nullopt;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  const internal::AddedToken* t = added_->FindById(id);
  return t != nullptr && t->special;
}

}  // namespace deepinfer::tokenizer
