#include "engine/model_assets.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace deepinfer::engine {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

absl::StatusOr<ojson> ReadJsonFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot read"));
  ojson j = ojson::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  return j;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelAssets>> ModelAssets::Load(const std::string& dir) {
  std::unique_ptr<ModelAssets> a(new ModelAssets());
  a->dir_ = dir;
  DI_ASSIGN_OR_RETURN(a->config_, LoadModelConfig(dir));
  a->architecture_ = a->config_.architecture;
  DI_ASSIGN_OR_RETURN(a->tokenizer_, tokenizer::Tokenizer::FromDirectory(dir));

  ojson tokenizer_config = ojson::object();
  const std::string tc_path = (fs::path(dir) / "tokenizer_config.json").string();
  if (fs::exists(tc_path)) {
    DI_ASSIGN_OR_RETURN(tokenizer_config, ReadJsonFile(tc_path));
    if (!tokenizer_config.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(tc_path, ": expected a JSON object"));
    }
  }
  for (const char* key : {"bos_token", "eos_token", "pad_token", "unk_token"}) {
    auto it = tokenizer_config.find(key);
    if (it == tokenizer_config.end()) continue;
    if (it->is_string()) a->template_context_[key] = *it;
    if (it->is_object() && it->contains("content")) a->template_context_[key] = (*it)["content"];
  }

  const std::string jinja = (fs::path(dir) / "chat_template.jinja").string();
  if (fs::exists(jinja)) {
    std::ifstream in(jinja);
    const std::string source((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
    auto t = ChatTemplate::Create(source);
    if (!t.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(jinja, ": ", t.status().message()));
    }
    a->chat_template_ = std::move(*t);
  } else {
    auto t = LoadChatTemplate(tokenizer_config, /*has_tools=*/false);
    if (t.ok()) {
      a->chat_template_ = std::move(*t);
    } else if (!absl::IsNotFound(t.status())) {
      return absl::InvalidArgumentError(absl::StrCat(tc_path, ": ", t.status().message()));
    }
  }

  a->eos_token_ids_.assign(a->config_.eos_token_ids.begin(), a->config_.eos_token_ids.end());
  if (auto eos = a->tokenizer_->eos_id(); eos.has_value() &&
      std::find(a->eos_token_ids_.begin(), a->eos_token_ids_.end(), *eos) ==
          a->eos_token_ids_.end()) {
    a->eos_token_ids_.push_back(*eos);
  }

  const std::string gen_path = (fs::path(dir) / "generation_config.json").string();
  if (fs::exists(gen_path)) {
    DI_ASSIGN_OR_RETURN(ojson gen, ReadJsonFile(gen_path));
    if (!gen.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(gen_path, ": expected a JSON object"));
    }
    a->generation_config_ = nlohmann::json::parse(gen.dump());
  }
  return a;
}

absl::StatusOr<std::vector<int32_t>> ModelAssets::RenderAndTokenize(
    const nlohmann::ordered_json& messages, bool add_generation_prompt) const {
  if (chat_template_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir_, ": the model has no chat template; send token ids with Generate"));
  }
  ojson context = {{"messages", messages}, {"add_generation_prompt", add_generation_prompt}};
  for (const auto& [key, value] : template_context_.items()) context[key] = value;
  DI_ASSIGN_OR_RETURN(std::string text, chat_template_->Render(context));
  return tokenizer_->Encode(text, /*add_special_tokens=*/false);
}

}  // namespace deepinfer::engine
