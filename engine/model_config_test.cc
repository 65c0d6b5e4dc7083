#include "engine/model_config.h"

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace deepinfer::engine {
namespace {

using json = nlohmann::json;

json Llama() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 512, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu",
    "max_position_embeddings": 256, "torch_dtype": "bfloat16", "eos_token_id": [1, 2],
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64}})");
}

TEST(ModelConfigTest, Llama3) {
  auto c = ParseModelConfig(Llama(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kLlama);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_EQ(c->rope.type, RopeType::kLlama3);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 64);
  EXPECT_EQ(c->torch_dtype, "bfloat16");
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{1, 2}));
  EXPECT_FALSE(c->HasSlidingLayers());
  EXPECT_FALSE(c->is_moe());
}

TEST(ModelConfigTest, QwenSlidingLayersFollowMaxWindowLayers) {
  json j = Llama();
  j["architectures"] = {"Qwen2ForCausalLM"};
  j["num_hidden_layers"] = 4;
  j["use_sliding_window"] = true;
  j["sliding_window"] = 8;
  j["max_window_layers"] = 2;
  auto c = ParseModelConfig(j, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->attention_bias);
  EXPECT_EQ(c->layer_attention, (std::vector<AttentionKind>{AttentionKind::kFull, AttentionKind::kFull,
                                                            AttentionKind::kSliding,
                                                            AttentionKind::kSliding}));
  j["use_sliding_window"] = false;
  EXPECT_FALSE(ParseModelConfig(j, "config.json")->HasSlidingLayers());
  j["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention", "full_attention"};
  auto explicit_types = ParseModelConfig(j, "config.json");
  ASSERT_TRUE(explicit_types.ok()) << explicit_types.status();
  EXPECT_EQ(explicit_types->layer_attention[0], AttentionKind::kSliding);
  EXPECT_EQ(explicit_types->sliding_window, 8);
}

TEST(ModelConfigTest, MistralWindowAppliesToAllLayers) {
  json j = Llama();
  j["architectures"] = {"MistralForCausalLM"};
  j["sliding_window"] = 4;
  auto c = ParseModelConfig(j, "config.json");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->layer_attention[0], AttentionKind::kSliding);
  EXPECT_EQ(c->layer_attention[1], AttentionKind::kSliding);
}

TEST(ModelConfigTest, MoeFamilies) {
  json j = Llama();
  j["architectures"] = {"MixtralForCausalLM"};
  j["num_local_experts"] = 8;
  j["num_experts_per_tok"] = 2;
  auto mixtral = ParseModelConfig(j, "config.json");
  ASSERT_TRUE(mixtral.ok()) << mixtral.status();
  EXPECT_EQ(mixtral->moe.num_experts, 8);
  EXPECT_TRUE(mixtral->moe.normalize_top_k);

  json q = Llama();
  q["architectures"] = {"Qwen2MoeForCausalLM"};
  q["num_experts"] = 4;
  q["num_experts_per_tok"] = 2;
  q["moe_intermediate_size"] = 32;
  q["shared_expert_intermediate_size"] = 64;
  q["mlp_only_layers"] = {0};
  auto qwen = ParseModelConfig(q, "config.json");
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_FALSE(qwen->moe.normalize_top_k);
  EXPECT_TRUE(qwen->moe.dense_layer[0]);
  EXPECT_FALSE(qwen->moe.dense_layer[1]);
  EXPECT_EQ(qwen->moe.shared_expert_intermediate_size, 64);
}

struct Bad {
  const char* field;
  json value;
  const char* expect;
};

TEST(ModelConfigTest, OutOfRangeFieldsAreNamed) {
  const Bad cases[] = {
      {"hidden_size", 0, "hidden_size: expected an integer in"},
      {"num_key_value_heads", 3, "num_key_value_heads: expected a divisor"},
      {"vocab_size", "big", "vocab_size: expected an integer"},
      {"rms_norm_eps", -1.0, "rms_norm_eps: expected a number in"},
      {"hidden_act", "gelu", "hidden_act"},
      {"torch_dtype", "int8", "torch_dtype"},
      {"architectures", json::array({"GPT2LMHeadModel"}), "\"GPT2LMHeadModel\" is not supported"},
      {"rope_scaling", json::parse(R"({"rope_type":"yarn","factor":4})"), "\"yarn\" is not supported"},
      {"eos_token_id", 9999, "eos_token_id"},
      {"layer_types", json::array({"full_attention"}), "layer_types: expected a list of 2"},
  };
  for (const Bad& b : cases) {
    json j = Llama();
    j[b.field] = b.value;
    auto c = ParseModelConfig(j, "cfg/config.json");
    ASSERT_FALSE(c.ok()) << b.field;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find("cfg/config.json"), absl::string_view::npos);
    EXPECT_NE(c.status().message().find(b.expect), absl::string_view::npos) << c.status();
  }
  json missing = Llama();
  missing.erase("num_hidden_layers");
  EXPECT_NE(ParseModelConfig(missing, "c").status().message().find("num_hidden_layers: required"),
            absl::string_view::npos);
}

json Llava() {
  json text = Llama();
  text.erase("architectures");
  text.erase("torch_dtype");
  text.erase("eos_token_id");
  text["model_type"] = "qwen2";
  return json{{"architectures", {"LlavaForConditionalGeneration"}},
              {"model_type", "llava"},
              {"dtype", "float32"},
              {"eos_token_id", 7},
              {"image_token_index", 511},
              {"text_config", text},
              {"vision_config", {{"model_type", "clip_vision_model"}, {"hidden_act", "quick_gelu"}}}};
}

TEST(ModelConfigTest, LlavaTakesTheLanguageModelFromTextConfig) {
  auto c = ParseModelConfig(Llava(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "LlavaForConditionalGeneration");
  EXPECT_EQ(c->family, ModelFamily::kQwen2);
  EXPECT_TRUE(c->attention_bias);
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->vocab_size, 512);
  EXPECT_EQ(c->torch_dtype, "float32");               // inherited from the outer config
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{7}));  // likewise
  EXPECT_EQ(c->image_token_id, 511);

  json by_id = Llava();
  by_id.erase("image_token_index");
  by_id["image_token_id"] = 3;
  by_id["text_config"]["architectures"] = {"LlamaForCausalLM"};
  by_id["text_config"]["model_type"] = "something_else";  // architectures wins
  auto c2 = ParseModelConfig(by_id, "config.json");
  ASSERT_TRUE(c2.ok()) << c2.status();
  EXPECT_EQ(c2->family, ModelFamily::kLlama);
  EXPECT_EQ(c2->image_token_id, 3);

  EXPECT_EQ(ParseModelConfig(Llama(), "config.json")->image_token_id, -1);
}

TEST(ModelConfigTest, LlavaErrorsAreNamed) {
  json bad_type = Llava();
  bad_type["text_config"]["model_type"] = "gpt2";
  EXPECT_NE(ParseModelConfig(bad_type, "c").status().message().find(
                "c: text_config: model_type \"gpt2\" is not supported"),
            absl::string_view::npos)
      << ParseModelConfig(bad_type, "c").status();
  json bad_token = Llava();
  bad_token["image_token_index"] = 512;
  EXPECT_NE(ParseModelConfig(bad_token, "c").status().message().find(
                "c: image_token_index: expected an integer in [0, 511]"),
            absl::string_view::npos)
      << ParseModelConfig(bad_token, "c").status();
  json bad_text = Llava();
  bad_text["text_config"]["hidden_size"] = 0;
  EXPECT_NE(ParseModelConfig(bad_text, "c").status().message().find("c: text_config: hidden_size"),
            absl::string_view::npos);
  json not_object = Llava();
  not_object["text_config"] = 3;
  EXPECT_EQ(ParseModelConfig(not_object, "c").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ModelConfigTest, LoadsLlavaFixture) {
  auto c = LoadModelConfig("engine/testdata/vision/llava");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kQwen2);
  EXPECT_EQ(c->vocab_size, 769);
  EXPECT_EQ(c->image_token_id, 768);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{763}));
  EXPECT_EQ(c->num_layers, 2);
  EXPECT_FALSE(c->tie_word_embeddings);
}

}  // namespace
}  // namespace deepinfer::engine
