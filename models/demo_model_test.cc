// The trained demo models against Hugging Face transformers (models/demo/reference.json, written
// by tools/train/export_and_eval.py from transformers' bfloat16 eager run of the committed
// checkpoint):
//   - the engine's tokenizer + chat template give transformers' prompt ids;
//   - the last prompt position's logits agree within 0.1 (the bf16 tolerance of
//     engine/model_test.cc: bf16 activation roundings are reproduced, but a different f32
//     summation order can flip one and the flip propagates through the layers);
//   - greedy continuations (ignore_eos) are token-for-token identical.
// The draft is checked to load and share the target's tokenizer and vocabulary.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "engine/model.h"
#include "engine/model_assets.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace deepinfer::engine {
namespace {

using json = nlohmann::json;

constexpr char kTarget[] = "models/demo";
constexpr char kDraft[] = "models/demo-draft";
constexpr float kBf16Tolerance = 0.1f;

json ReadReference() {
  std::ifstream in(std::string(kTarget) + "/reference.json");
  EXPECT_TRUE(in.good()) << "run tools/train/export_and_eval.py";
  return json::parse(in);
}

TEST(DemoModelTest, ChatPromptsTokenizeLikeTransformers) {
  const json ref = ReadReference();
  auto assets = ModelAssets::Load(kTarget);
  ASSERT_TRUE(assets.ok()) << assets.status();
  ASSERT_EQ(ref["prompts"].size(), 2u);
  for (const json& p : ref["prompts"]) {
    nlohmann::ordered_json messages = nlohmann::ordered_json::parse(p["messages"].dump());
    auto ids = (*assets)->RenderAndTokenize(messages, /*add_generation_prompt=*/true);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, p["prompt_ids"].get<std::vector<int32_t>>()) << p["messages"].dump();
  }
}

TEST(DemoModelTest, LastLogitsAndGreedyTokensMatchTransformers) {
  const json ref = ReadReference();
  ASSERT_EQ(ref["dtype"], "bfloat16");
  auto model = Model::Load(kTarget, ModelOptions{2});
  ASSERT_TRUE(model.ok()) << model.status();
  const int vocab = (*model)->config().vocab_size;
  for (const json& p : ref["prompts"]) {
    const std::vector<int32_t> prompt = p["prompt_ids"].get<std::vector<int32_t>>();
    const std::vector<float> want_logits = p["last_logits"].get<std::vector<float>>();
    ASSERT_EQ(static_cast<int>(want_logits.size()), vocab);

    const int block = 16;
    const int blocks = static_cast<int>(prompt.size() + block - 1) / block;
    auto cache = KvCache::Create((*model)->MakeKvCacheConfig(blocks, block)).value();
    std::vector<int32_t> table(blocks);
    for (int b = 0; b < blocks; ++b) table[b] = b;
    SequenceInput in;
    in.tokens = prompt.data();
    in.num_tokens = static_cast<int64_t>(prompt.size());
    in.block_table = table.data();
    in.num_blocks = blocks;
    std::vector<float> logits;
    ASSERT_TRUE((*model)->Forward({in}, cache.get(), &logits).ok());
    ASSERT_EQ(static_cast<int>(logits.size()), vocab);
    float max_err = 0;
    for (int v = 0; v < vocab; ++v) max_err = std::max(max_err, std::fabs(logits[v] - want_logits[v]));
    EXPECT_LE(max_err, kBf16Tolerance) << "prompt of " << prompt.size() << " tokens";
    std::printf("demo: prompt %zu tokens, max |logit diff| = %.3g\n", prompt.size(), max_err);

    const std::vector<int32_t> want = p["output_ids"].get<std::vector<int32_t>>();
    SamplingParams sp;
    sp.temperature = 0;
    sp.max_tokens = static_cast<int>(want.size());
    sp.ignore_eos = true;
    GenerateOptions opts;
    opts.block_size = 4;
    opts.prefill_chunk = 7;
    auto result = GenerateOne(**model, prompt, sp, opts);
    ASSERT_TRUE(result.ok()) << result.status();
    std::vector<int32_t> got;
    for (const StepOutput& s : result->steps) got.push_back(s.token);
    EXPECT_EQ(got, want);
  }
}

TEST(DemoModelTest, DraftSharesTheTargetsTokenizerAndVocabulary) {
  auto target = ModelAssets::Load(kTarget);
  auto draft = ModelAssets::Load(kDraft);
  ASSERT_TRUE(target.ok()) << target.status();
  ASSERT_TRUE(draft.ok()) << draft.status();
  EXPECT_EQ((*draft)->config().vocab_size, (*target)->config().vocab_size);
  EXPECT_EQ((*draft)->eos_token_ids(), (*target)->eos_token_ids());
  const json ref = ReadReference();
  nlohmann::ordered_json messages =
      nlohmann::ordered_json::parse(ref["prompts"][0]["messages"].dump());
  auto a = (*target)->RenderAndTokenize(messages, true);
  auto b = (*draft)->RenderAndTokenize(messages, true);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  auto model = Model::Load(kDraft, ModelOptions{2});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE((*model)->config().HasSlidingLayers());
}

}  // namespace
}  // namespace deepinfer::engine
