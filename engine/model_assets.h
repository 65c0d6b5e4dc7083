// Everything about a Hugging Face model directory except its weights: config, tokenizer, chat
// template (with the context transformers passes to it), EOS ids and generation_config.json.
// The router loads this (it tokenizes and templates but never runs the model); nodes load it
// beside the weights so their engines detokenize and match stop strings.
//
// Thread-safety: immutable after Load; every accessor and the objects it returns are safe to use
// from any number of threads.
#ifndef DEEPINFER_ENGINE_MODEL_ASSETS_H_
#define DEEPINFER_ENGINE_MODEL_ASSETS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/chat_template/chat_template.h"
#include "engine/model_config.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace deepinfer::engine {

class ModelAssets {
 public:
  // Reads <dir>/config.json, tokenizer.json (+ tokenizer_config.json), the chat template
  // (chat_template.jinja, else tokenizer_config.json's chat_template; a model without one loads
  // with chat_template() == nullptr) and generation_config.json (absent -> empty object).
  // kNotFound / kInvalidArgument naming the file otherwise.
  static absl::StatusOr<std::unique_ptr<ModelAssets>> Load(const std::string& dir);

  ModelAssets(const ModelAssets&) = delete;
  ModelAssets& operator=(const ModelAssets&) = delete;

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const tokenizer::Tokenizer& tokenizer() const { return *tokenizer_; }
  // Null when the model has no chat template (Chat requests are then refused).
  const ChatTemplate* chat_template() const { return chat_template_.get(); }
  // bos_token / eos_token / pad_token / unk_token from tokenizer_config.json, as transformers
  // adds them to every render.
  const nlohmann::ordered_json& template_context() const { return template_context_; }
  // config's eos ids plus the tokenizer's eos token, without duplicates.
  const std::vector<int32_t>& eos_token_ids() const { return eos_token_ids_; }
  // generation_config.json (an empty object when the file is absent).
  const nlohmann::json& generation_config() const { return generation_config_; }
  // config.json "architectures"[0], or "" when absent.
  const std::string& architecture() const { return architecture_; }

  // Renders `messages` (a JSON array, see ChatTemplate) with the template context and tokenizes
  // the text without adding special tokens (the template writes them). kFailedPrecondition when
  // the model has no chat template; the template's own errors as ChatTemplate::Render gives them.
  absl::StatusOr<std::vector<int32_t>> RenderAndTokenize(const nlohmann::ordered_json& messages,
                                                         bool add_generation_prompt) const;

 private:
  ModelAssets() = default;

  std::string dir_;
  ModelConfig config_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<ChatTemplate> chat_template_;
  nlohmann::ordered_json template_context_ = nlohmann::ordered_json::object();
  std::vector<int32_t> eos_token_ids_;
  nlohmann::json generation_config_ = nlohmann::json::object();
  std::string architecture_;
};

}  // namespace deepinfer::engine

#endif  // DEEPINFER_ENGINE_MODEL_ASSETS_H_
