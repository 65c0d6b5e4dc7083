// The CPU forward pass against Hugging Face transformers' outputs on the committed fixtures
// (engine/testdata/models/<arch>: tiny random-weight checkpoints + reference logits and greedy
// continuations made by tools/fixtures/make_fixtures.py).
//
// Tolerances (max |logit - reference| over every position and vocabulary entry):
//   float32 checkpoints: 1e-3 (f32 accumulation-order noise only);
//   bfloat16 checkpoints: 0.1 — each bf16 rounding is reproduced, but a different summation order
//   can flip a rounding and the flip propagates through the layers.
// Greedy continuations must be identical.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "engine/model.h"
#include "engine/safetensors.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace deepinfer::engine {
namespace {

using json = nlohmann::json;

const char* kModels[] = {"llama", "llama_bf16", "llama_tied", "qwen2",    "qwen3",
                         "mistral", "hybrid",   "mixtral",    "qwen2_moe", "qwen3_moe"};

std::string FixtureDir(const std::string& name) {
  return "engine/testdata/models/" + name;
}

class ModelFixtureTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir_ = FixtureDir(GetParam());
    ASSERT_TRUE(std::filesystem::exists(dir_ + "/config.json"))
        << "fixture " << dir_ << " missing: run tools/fixtures/make_fixtures.py";
    std::ifstream in(dir_ + "/reference.json");
    ref_ = json::parse(in);
    auto model = Model::Load(dir_, ModelOptions{2});
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    auto refs = SafetensorsFile::Open(dir_ + "/reference.safetensors");
    ASSERT_TRUE(refs.ok()) << refs.status();
    refs_ = std::move(*refs);
    tolerance_ = ref_.value("dtype", "float32") == "bfloat16" ? 0.1f : 1e-3f;
  }

  // Runs `ids` through the model in chunks of `chunk` tokens; returns logits for every position.
  std::vector<float> AllLogits(const std::vector<int32_t>& ids, int64_t chunk, int block_size) {
    const int blocks = static_cast<int>((ids.size() + block_size - 1) / block_size);
    auto cache = KvCache::Create(model_->MakeKvCacheConfig(blocks + 3, block_size)).value();
    // A reversed, offset block table: the pass must follow it, not assume contiguity.
    std::vector<int32_t> table(blocks);
    for (int b = 0; b < blocks; ++b) table[b] = blocks + 2 - b;
    std::vector<float> all, logits;
    for (int64_t pos = 0; pos < static_cast<int64_t>(ids.size()); pos += chunk) {
      SequenceInput in;
      in.tokens = ids.data() + pos;
      in.num_tokens = std::min<int64_t>(chunk, ids.size() - pos);
      in.start_position = pos;
      in.block_table = table.data();
      in.num_blocks = blocks;
      in.all_logits = true;
      EXPECT_TRUE(model_->Forward({in}, cache.get(), &logits).ok());
      all.insert(all.end(), logits.begin(), logits.end());
    }
    return all;
  }

  std::string dir_;
  json ref_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<SafetensorsFile> refs_;
  float tolerance_ = 0;
};

TEST_P(ModelFixtureTest, LogitsMatchTransformers) {
  const int vocab = model_->config().vocab_size;
  for (const json& prompt : ref_["prompts"]) {
    const std::vector<int32_t> ids = prompt["ids"].get<std::vector<int32_t>>();
    const TensorView* expected = refs_->Find(prompt["logits"].get<std::string>());
    ASSERT_NE(expected, nullptr);
    ASSERT_EQ(expected->numel(), static_cast<int64_t>(ids.size()) * vocab);
    const float* want = static_cast<const float*>(expected->data);
    const std::vector<float> got = AllLogits(ids, ids.size(), 16);
    float max_err = 0;
    for (size_t i = 0; i < got.size(); ++i) max_err = std::max(max_err, std::fabs(got[i] - want[i]));
    EXPECT_LE(max_err, tolerance_) << GetParam() << " prompt of " << ids.size() << " tokens";
    RecordProperty(std::string("max_abs_err_") + std::to_string(ids.size()), std::to_string(max_err));
    std::printf("%s: prompt %zu tokens, max |logit diff| = %.3g\n", GetParam(), ids.size(), max_err);
  }
}

TEST_P(ModelFixtureTest, ChunkedPrefillAndBlockSizesGiveTheSameLogits) {
  const json& prompt = ref_["prompts"][ref_["prompts"].size() - 1];
  const std::vector<int32_t> ids = prompt["ids"].get<std::vector<int32_t>>();
  const std::vector<float> whole = AllLogits(ids, ids.size(), 16);
  for (auto [chunk, block] : {std::pair<int64_t, int>{3, 4}, {1, 16}, {7, 1}}) {
    const std::vector<float> parts = AllLogits(ids, chunk, block);
    ASSERT_EQ(parts.size(), whole.size());
    float max_err = 0;
    for (size_t i = 0; i < parts.size(); ++i) max_err = std::max(max_err, std::fabs(parts[i] - whole[i]));
    EXPECT_LE(max_err, 1e-4f) << "chunk " << chunk << " block " << block;
  }
}

TEST_P(ModelFixtureTest, GreedyContinuationsMatchTransformers) {
  for (const json& g : ref_["greedy"]) {
    const std::vector<int32_t> prompt = g["prompt_ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> want = g["output_ids"].get<std::vector<int32_t>>();
    SamplingParams sp;
    sp.temperature = 0;
    sp.max_tokens = static_cast<int>(want.size());
    sp.ignore_eos = true;
    GenerateOptions opts;
    opts.block_size = 4;
    opts.prefill_chunk = 5;
    auto result = GenerateOne(*model_, prompt, sp, opts);
    ASSERT_TRUE(result.ok()) << result.status();
    std::vector<int32_t> got;
    for (const StepOutput& s : result->steps) got.push_back(s.token);
    EXPECT_EQ(got, want) << GetParam();
  }
}

// A ragged batch mixing a prefill chunk of one sequence with decode tokens of others gives the
// same logits as running each sequence alone.
TEST_P(ModelFixtureTest, MixedBatchEqualsSequencesAlone) {
  const int vocab = model_->config().vocab_size;
  std::vector<std::vector<int32_t>> seqs;
  for (const json& prompt : ref_["prompts"]) seqs.push_back(prompt["ids"].get<std::vector<int32_t>>());
  ASSERT_GE(seqs.size(), 2u);
  const int block = 4;
  const int per_seq_blocks = 64;
  auto cache = KvCache::Create(model_->MakeKvCacheConfig(per_seq_blocks * seqs.size(), block)).value();
  std::vector<std::vector<int32_t>> tables(seqs.size());
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (int b = 0; b < per_seq_blocks; ++b) tables[s].push_back(b * seqs.size() + s);  // interleaved
  }
  // Step 1: every sequence but the first prefills all but its last token; the first prefills
  // its first 2 tokens only.
  // Step 2 (the mixed batch): seq 0 prefills the rest of its prompt minus one token (a chunk),
  // the others decode their last prompt token; all want logits for every new token.
  std::vector<float> logits;
  std::vector<SequenceInput> step1;
  std::vector<int64_t> done(seqs.size());
  for (size_t s = 0; s < seqs.size(); ++s) {
    SequenceInput in;
    in.tokens = seqs[s].data();
    in.num_tokens = s == 0 ? 2 : seqs[s].size() - 1;
    in.block_table = tables[s].data();
    in.num_blocks = per_seq_blocks;
    done[s] = in.num_tokens;
    step1.push_back(in);
  }
  ASSERT_TRUE(model_->Forward(step1, cache.get(), &logits).ok());
  std::vector<SequenceInput> step2;
  for (size_t s = 0; s < seqs.size(); ++s) {
    SequenceInput in;
    in.tokens = seqs[s].data() + done[s];
    in.num_tokens = seqs[s].size() - done[s];
    in.start_position = done[s];
    in.block_table = tables[s].data();
    in.num_blocks = per_seq_blocks;
    in.all_logits = true;
    step2.push_back(in);
  }
  ASSERT_TRUE(model_->Forward(step2, cache.get(), &logits).ok());
  int64_t row = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const std::vector<float> alone = AllLogits(seqs[s], seqs[s].size(), 16);
    for (int64_t t = done[s]; t < static_cast<int64_t>(seqs[s].size()); ++t, ++row) {
      float max_err = 0;
      for (int v = 0; v < vocab; ++v) {
        max_err = std::max(max_err, std::fabs(logits[row * vocab + v] - alone[t * vocab + v]));
      }
      EXPECT_LE(max_err, 1e-4f) << "sequence " << s << " position " << t;
    }
  }
}

TEST_P(ModelFixtureTest, BadInputsAreRejectedNotCrashed) {
  auto cache = KvCache::Create(model_->MakeKvCacheConfig(2, 4)).value();
  std::vector<float> logits;
  const int32_t table[2] = {0, 1};
  const int32_t bad_token[1] = {model_->config().vocab_size};
  SequenceInput in;
  in.tokens = bad_token;
  in.num_tokens = 1;
  in.block_table = table;
  in.num_blocks = 2;
  absl::Status s = model_->Forward({in}, cache.get(), &logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("token[0]"), absl::string_view::npos) << s;
  const int32_t ok_token[1] = {0};
  in.tokens = ok_token;
  in.start_position = 8;  // needs 3 blocks
  s = model_->Forward({in}, cache.get(), &logits);
  EXPECT_NE(s.message().find("block_table"), absl::string_view::npos) << s;
  SamplingParams sp;
  sp.max_tokens = static_cast<int>(model_->config().max_position_embeddings);
  auto r = GenerateOne(*model_, {0, 1}, sp, GenerateOptions());
  EXPECT_NE(r.status().message().find("sampling.max_tokens"), absl::string_view::npos);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelFixtureTest, ::testing::ValuesIn(kModels),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace deepinfer::engine
