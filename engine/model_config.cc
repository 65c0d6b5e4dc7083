#include "engine/model_config.h"

#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace deepinfer::engine {
namespace {

using json = nlohmann::json;

struct Family {
  const char* architecture;
  ModelFamily family;
};

constexpr Family kFamilies[] = {
    {"LlamaForCausalLM", ModelFamily::kLlama},     {"Qwen2ForCausalLM", ModelFamily::kQwen2},
    {"Qwen3ForCausalLM", ModelFamily::kQwen3},     {"MistralForCausalLM", ModelFamily::kMistral},
    {"MixtralForCausalLM", ModelFamily::kMixtral}, {"Qwen2MoeForCausalLM", ModelFamily::kQwen2Moe},
    {"Qwen3MoeForCausalLM", ModelFamily::kQwen3Moe},
};

class Reader {
 public:
  Reader(const json& j, absl::string_view file) : j_(j), file_(file) {}

  absl::Status Error(absl::string_view field, absl::string_view expected,
                     const json& got) const {
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ": ", field, ": expected ", expected, ", got ", got.dump()));
  }

  bool Has(const char* field) const {
    auto it = j_.find(field);
    return it != j_.end() && !it->is_null();
  }

  // Integer in [lo, hi]; `fallback` when absent (or error if required).
  absl::StatusOr<int64_t> Int(const char* field, int64_t lo, int64_t hi, bool required,
                              int64_t fallback = 0) const {
    auto it = j_.find(field);
    if (it == j_.end() || it->is_null()) {
      if (required) {
        return absl::InvalidArgumentError(
            absl::StrCat(file_, ": ", field, ": required field is missing"));
      }
      return fallback;
    }
    if (!it->is_number_integer()) return Error(field, "an integer", *it);
    const int64_t v = it->get<int64_t>();
    if (v < lo || v > hi) {
      return Error(field, absl::StrCat("an integer in [", lo, ", ", hi, "]"), *it);
    }
    return v;
  }

  absl::StatusOr<double> Num(const char* field, double lo, double hi, double fallback) const {
    auto it = j_.find(field);
    if (it == j_.end() || it->is_null()) return fallback;
    if (!it->is_number()) return Error(field, "a number", *it);
    const double v = it->get<double>();
    if (!(v >= lo && v <= hi)) return Error(field, absl::StrCat("a number in [", lo, ", ", hi, "]"), *it);
    return v;
  }

  absl::StatusOr<bool> Bool(const char* field, bool fallback) const {
    auto it = j_.find(field);
    if (it == j_.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) return Error(field, "true or false", *it);
    return it->get<bool>();
  }

 private:
  const json& j_;
  absl::string_view file_;
};

absl::Status ParseTokenIds(const json& j, const char* field, absl::string_view file,
                           std::vector<int>* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  out->clear();
  if (it->is_number_integer()) {
    out->push_back(it->get<int>());
    return absl::OkStatus();
  }
  if (it->is_array()) {
    for (const json& v : *it) {
      if (!v.is_number_integer()) {
        return absl::InvalidArgumentError(
            absl::StrCat(file, ": ", field, ": expected integers, got ", it->dump()));
      }
      out->push_back(v.get<int>());
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(file, ": ", field, ": expected an integer or a list, got ", it->dump()));
}

constexpr std::pair<const char*, const char*> kTextModelTypes[] = {
    {"llama", "LlamaForCausalLM"},       {"qwen2", "Qwen2ForCausalLM"},
    {"qwen3", "Qwen3ForCausalLM"},       {"mistral", "MistralForCausalLM"},
    {"mixtral", "MixtralForCausalLM"},   {"qwen2_moe", "Qwen2MoeForCausalLM"},
    {"qwen3_moe", "Qwen3MoeForCausalLM"},
};

absl::StatusOr<ModelConfig> ParseTextConfig(const json& j, absl::string_view file);

// LLaVA-style: the language model is `text_config`; the outer config adds the image token and
// supplies defaults the text config may leave out.
absl::StatusOr<ModelConfig> ParseMultimodalConfig(const json& j, absl::string_view file) {
  const std::string text_file = absl::StrCat(file, ": text_config");
  json text = j.at("text_config");
  text.erase("text_config");
  auto arch_it = text.find("architectures");
  if (arch_it == text.end() || !arch_it->is_array() || arch_it->empty()) {
    auto type_it = text.find("model_type");
    if (type_it == text.end() || !type_it->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          text_file, ": model_type: expected the language model's type, got ",
          type_it == text.end() ? "nothing" : type_it->dump()));
    }
    const std::string type = type_it->get<std::string>();
    const char* arch = nullptr;
    std::string supported;
    for (const auto& [name, architecture] : kTextModelTypes) {
      if (type == name) arch = architecture;
      absl::StrAppend(&supported, supported.empty() ? "" : ", ", name);
    }
    if (arch == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(text_file, ": model_type \"", type,
                                                     "\" is not supported (supported: ",
                                                     supported, ")"));
    }
    text["architectures"] = json::array({arch});
  }
  for (const char* key : {"torch_dtype", "dtype", "eos_token_id", "bos_token_id",
                          "tie_word_embeddings"}) {
    auto outer = j.find(key);
    auto inner = text.find(key);
    if (outer != j.end() && !outer->is_null() && (inner == text.end() || inner->is_null())) {
      text[key] = *outer;
    }
  }
  DI_ASSIGN_OR_RETURN(ModelConfig c, ParseTextConfig(text, text_file));
  c.architecture = j.at("architectures")[0].get<std::string>();
  Reader r(j, file);
  const char* image_key = r.Has("image_token_index") ? "image_token_index" : "image_token_id";
  DI_ASSIGN_OR_RETURN(int64_t image_token, r.Int(image_key, 0, c.vocab_size - 1, false, -1));
  c.image_token_id = static_cast<int>(image_token);
  return c;
}

}  // namespace

const char* ModelFamilyName(ModelFamily f) {
  for (const Family& fam : kFamilies) {
    if (fam.family == f) return fam.architecture;
  }
  return "?";
}

bool ModelConfig::HasSlidingLayers() const {
  for (AttentionKind k : layer_attention) {
    if (k == AttentionKind::kSliding) return true;
  }
  return false;
}

absl::StatusOr<ModelConfig> ParseModelConfig(const json& j, absl::string_view file) {
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": expected a JSON object"));
  }
  auto arch_it = j.find("architectures");
  if (arch_it == j.end() || !arch_it->is_array() || arch_it->empty() ||
      !(*arch_it)[0].is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": architectures: expected a non-empty list of names"));
  }
  auto text_it = j.find("text_config");
  if (text_it != j.end() && !text_it->is_null()) {
    if (!text_it->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": text_config: expected a JSON object, got ", text_it->dump()));
    }
    return ParseMultimodalConfig(j, file);
  }
  return ParseTextConfig(j, file);
}

namespace {

absl::StatusOr<ModelConfig> ParseTextConfig(const json& j, absl::string_view file) {
  Reader r(j, file);
  ModelConfig c;
  auto arch_it = j.find("architectures");
  if (arch_it == j.end() || !arch_it->is_array() || arch_it->empty() ||
      !(*arch_it)[0].is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": architectures: expected a non-empty list of names"));
  }
  c.architecture = (*arch_it)[0].get<std::string>();
  bool known = false;
  for (const Family& fam : kFamilies) {
    if (c.architecture == fam.architecture) {
      c.family = fam.family;
      known = true;
    }
  }
  if (!known) {
    std::string supported;
    for (const Family& fam : kFamilies) absl::StrAppend(&supported, supported.empty() ? "" : ", ", fam.architecture);
    return absl::InvalidArgumentError(absl::StrCat(file, ": architecture \"", c.architecture,
                                                   "\" is not supported (supported: ",
                                                   supported, ")"));
  }
  if (j.contains("hidden_act") && j["hidden_act"] != "silu") {
    return r.Error("hidden_act", "\"silu\"", j["hidden_act"]);
  }

  DI_ASSIGN_OR_RETURN(int64_t hidden, r.Int("hidden_size", 1, 1 << 16, true));
  DI_ASSIGN_OR_RETURN(int64_t layers, r.Int("num_hidden_layers", 1, 1024, true));
  DI_ASSIGN_OR_RETURN(int64_t heads, r.Int("num_attention_heads", 1, 1024, true));
  DI_ASSIGN_OR_RETURN(int64_t kv_heads, r.Int("num_key_value_heads", 1, heads, false, heads));
  DI_ASSIGN_OR_RETURN(int64_t vocab, r.Int("vocab_size", 1, 1 << 24, true));
  const bool moe_family = c.family == ModelFamily::kMixtral ||
                          c.family == ModelFamily::kQwen2Moe || c.family == ModelFamily::kQwen3Moe;
  DI_ASSIGN_OR_RETURN(int64_t inter, r.Int("intermediate_size", 1, 1 << 20, !moe_family, 0));
  DI_ASSIGN_OR_RETURN(int64_t max_pos,
                      r.Int("max_position_embeddings", 1, int64_t{1} << 24, false, 4096));
  if (heads % kv_heads != 0) {
    return r.Error("num_key_value_heads",
                   absl::StrCat("a divisor of num_attention_heads (", heads, ")"),
                   j["num_key_value_heads"]);
  }
  int64_t head_dim_default = hidden / heads;
  DI_ASSIGN_OR_RETURN(int64_t head_dim, r.Int("head_dim", 2, 1024, false, head_dim_default));
  if (head_dim % 2 != 0) return r.Error("head_dim", "an even number", j["head_dim"]);
  if (!r.Has("head_dim") && hidden % heads != 0) {
    return r.Error("hidden_size", "a multiple of num_attention_heads (or an explicit head_dim)",
                   j["hidden_size"]);
  }
  c.hidden_size = static_cast<int>(hidden);
  c.num_layers = static_cast<int>(layers);
  c.num_heads = static_cast<int>(heads);
  c.num_kv_heads = static_cast<int>(kv_heads);
  c.head_dim = static_cast<int>(head_dim);
  c.vocab_size = static_cast<int>(vocab);
  c.intermediate_size = static_cast<int>(inter);
  c.max_position_embeddings = max_pos;
  DI_ASSIGN_OR_RETURN(double eps, r.Num("rms_norm_eps", 1e-12, 1.0, 1e-6));
  c.rms_norm_eps = static_cast<float>(eps);
  DI_ASSIGN_OR_RETURN(c.tie_word_embeddings, r.Bool("tie_word_embeddings", false));

  // RoPE: rope_theta at the top level or inside rope_parameters / rope_scaling.
  DI_ASSIGN_OR_RETURN(c.rope.theta, r.Num("rope_theta", 1.0, 1e12, 10000.0));
  const json* scaling = nullptr;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    auto it = j.find(key);
    if (it != j.end() && it->is_object()) scaling = &*it;
  }
  if (scaling != nullptr) {
    Reader s(*scaling, absl::StrCat(file, ": rope_scaling"));
    if (scaling->contains("rope_theta")) {
      DI_ASSIGN_OR_RETURN(c.rope.theta, s.Num("rope_theta", 1.0, 1e12, c.rope.theta));
    }
    std::string type = "default";
    for (const char* key : {"rope_type", "type"}) {
      auto it = scaling->find(key);
      if (it != scaling->end() && it->is_string()) type = it->get<std::string>();
    }
    if (type == "default") {
      c.rope.type = RopeType::kDefault;
    } else if (type == "linear") {
      c.rope.type = RopeType::kLinear;
      DI_ASSIGN_OR_RETURN(c.rope.factor, s.Num("factor", 1e-3, 1e6, 1.0));
    } else if (type == "llama3") {
      c.rope.type = RopeType::kLlama3;
      DI_ASSIGN_OR_RETURN(c.rope.factor, s.Num("factor", 1e-3, 1e6, 8.0));
      DI_ASSIGN_OR_RETURN(c.rope.low_freq_factor, s.Num("low_freq_factor", 1e-6, 1e6, 1.0));
      DI_ASSIGN_OR_RETURN(c.rope.high_freq_factor, s.Num("high_freq_factor", 1e-6, 1e6, 4.0));
      DI_ASSIGN_OR_RETURN(c.rope.original_max_position_embeddings,
                          s.Int("original_max_position_embeddings", 1, int64_t{1} << 24, false,
                                8192));
      if (!(c.rope.high_freq_factor > c.rope.low_freq_factor)) {
        return absl::InvalidArgumentError(absl::StrCat(
            file, ": rope_scaling.high_freq_factor: expected > low_freq_factor (",
            c.rope.low_freq_factor, "), got ", c.rope.high_freq_factor));
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          file, ": rope_scaling.rope_type: \"", type,
          "\" is not supported (supported: default, linear, llama3)"));
    }
  }

  // Attention variants per family.
  switch (c.family) {
    case ModelFamily::kQwen2:
    case ModelFamily::kQwen2Moe:
      c.attention_bias = true;  // Qwen2 always has q/k/v biases.
      break;
    case ModelFamily::kQwen3:
    case ModelFamily::kQwen3Moe: {
      c.qk_norm = true;
      DI_ASSIGN_OR_RETURN(c.attention_bias, r.Bool("attention_bias", false));
      break;
    }
    default: {
      DI_ASSIGN_OR_RETURN(c.attention_bias, r.Bool("attention_bias", false));
      break;
    }
  }
  if (j.contains("mlp_bias") && j["mlp_bias"] == true) {
    return r.Error("mlp_bias", "false (MLP biases are not supported)", j["mlp_bias"]);
  }

  // Sliding windows. Mistral/Mixtral: `sliding_window` applies to every layer when set. Qwen
  // families: only with use_sliding_window, for layers >= max_window_layers, unless an explicit
  // `layer_types` list says otherwise (newer transformers write it out).
  DI_ASSIGN_OR_RETURN(int64_t window, r.Int("sliding_window", 0, int64_t{1} << 24, false, 0));
  const bool qwen = c.family == ModelFamily::kQwen2 || c.family == ModelFamily::kQwen3 ||
                    c.family == ModelFamily::kQwen2Moe || c.family == ModelFamily::kQwen3Moe;
  c.layer_attention.assign(c.num_layers, AttentionKind::kFull);
  auto types_it = j.find("layer_types");
  if (types_it != j.end() && !types_it->is_null()) {
    if (!types_it->is_array() || static_cast<int64_t>(types_it->size()) != layers) {
      return r.Error("layer_types", absl::StrCat("a list of ", layers, " layer types"), *types_it);
    }
    for (int64_t i = 0; i < layers; ++i) {
      const json& t = (*types_it)[i];
      if (t == "full_attention") {
        c.layer_attention[i] = AttentionKind::kFull;
      } else if (t == "sliding_attention") {
        c.layer_attention[i] = AttentionKind::kSliding;
      } else {
        return r.Error(absl::StrCat("layer_types[", i, "]").c_str(),
                       "\"full_attention\" or \"sliding_attention\"", t);
      }
    }
  } else if (window > 0) {
    if (qwen) {
      DI_ASSIGN_OR_RETURN(bool use_sliding, r.Bool("use_sliding_window", false));
      DI_ASSIGN_OR_RETURN(int64_t max_window_layers,
                          r.Int("max_window_layers", 0, 1 << 20, false, layers));
      if (use_sliding) {
        for (int64_t i = max_window_layers; i < layers; ++i) {
          c.layer_attention[i] = AttentionKind::kSliding;
        }
      }
    } else {
      c.layer_attention.assign(c.num_layers, AttentionKind::kSliding);
    }
  }
  if (c.HasSlidingLayers()) {
    if (window <= 0) {
      return r.Error("sliding_window", "a positive window for sliding_attention layers",
                     j.value("sliding_window", json()));
    }
    c.sliding_window = static_cast<int>(window);
  }

  // MoE.
  if (moe_family) {
    // Mixtral writes num_local_experts, Qwen-MoE num_experts; newer transformers releases may
    // write either for either family.
    const char* experts_key = r.Has("num_local_experts") ? "num_local_experts" : "num_experts";
    DI_ASSIGN_OR_RETURN(int64_t experts, r.Int(experts_key, 1, 4096, true));
    DI_ASSIGN_OR_RETURN(int64_t top_k, r.Int("num_experts_per_tok", 1, experts, true));
    c.moe.num_experts = static_cast<int>(experts);
    c.moe.experts_per_token = static_cast<int>(top_k);
    c.moe.dense_layer.assign(c.num_layers, false);
    if (c.family == ModelFamily::kMixtral) {
      c.moe.expert_intermediate_size = c.intermediate_size;
      c.moe.normalize_top_k = true;
      if (c.intermediate_size <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(file, ": intermediate_size: required field is missing"));
      }
    } else {
      DI_ASSIGN_OR_RETURN(int64_t moe_inter, r.Int("moe_intermediate_size", 1, 1 << 20, true));
      c.moe.expert_intermediate_size = static_cast<int>(moe_inter);
      DI_ASSIGN_OR_RETURN(c.moe.normalize_top_k, r.Bool("norm_topk_prob", false));
      if (c.family == ModelFamily::kQwen2Moe) {
        DI_ASSIGN_OR_RETURN(int64_t shared,
                            r.Int("shared_expert_intermediate_size", 0, 1 << 20, false, 0));
        c.moe.shared_expert_intermediate_size = static_cast<int>(shared);
      }
      DI_ASSIGN_OR_RETURN(int64_t step, r.Int("decoder_sparse_step", 1, 1 << 20, false, 1));
      std::vector<int> mlp_only;
      DI_RETURN_IF_ERROR(ParseTokenIds(j, "mlp_only_layers", file, &mlp_only));
      for (int64_t i = 0; i < layers; ++i) {
        bool dense = ((i + 1) % step) != 0;
        for (int l : mlp_only) dense = dense || l == i;
        c.moe.dense_layer[i] = dense;
        if (dense && c.intermediate_size <= 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              file, ": intermediate_size: required for dense layer ", i));
        }
      }
    }
  }

  auto dtype_it = j.find("torch_dtype");
  if (dtype_it == j.end() || dtype_it->is_null()) dtype_it = j.find("dtype");
  if (dtype_it != j.end() && dtype_it->is_string()) {
    const std::string d = dtype_it->get<std::string>();
    if (d != "float32" && d != "bfloat16" && d != "float16") {
      return r.Error("torch_dtype", "float32, bfloat16 or float16", *dtype_it);
    }
    c.torch_dtype = d;
  }
  std::vector<int> bos;
  DI_RETURN_IF_ERROR(ParseTokenIds(j, "bos_token_id", file, &bos));
  if (!bos.empty()) c.bos_token_id = bos[0];
  DI_RETURN_IF_ERROR(ParseTokenIds(j, "eos_token_id", file, &c.eos_token_ids));
  for (int id : c.eos_token_ids) {
    if (id < 0 || id >= c.vocab_size) {
      return r.Error("eos_token_id", absl::StrCat("ids in [0, ", c.vocab_size, ")"),
                     j["eos_token_id"]);
    }
  }
  return c;
}

}  // namespace

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string path = (fs::path(dir) / "config.json").string();
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot read"));
  const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  DI_ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(j, path));
  const std::string gen_path = (fs::path(dir) / "generation_config.json").string();
  std::ifstream gen_in(gen_path);
  if (gen_in) {
    const json g = json::parse(gen_in, nullptr, /*allow_exceptions=*/false);
    if (g.is_discarded() || !g.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(gen_path, ": not a valid JSON object"));
    }
    std::vector<int> eos;
    DI_RETURN_IF_ERROR(ParseTokenIds(g, "eos_token_id", gen_path, &eos));
    for (int id : eos) {
      if (id < 0 || id >= config.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(gen_path, ": eos_token_id: expected ids in [0, ",
                                                       config.vocab_size, "), got ", id));
      }
    }
    if (!eos.empty()) config.eos_token_ids = eos;
  }
  return config;
}

}  // namespace deepinfer::engine
