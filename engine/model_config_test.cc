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

}  // namespace
}  // namespace deepinfer::engine
