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
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "engine/llava_fixture_test_util.h"
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

// GenerateWith (the path other backends take, engine/cuda) over the same model and a cache the
// caller owns gives GenerateOne's tokens; too few blocks for prompt + max_tokens is refused
// before any forward pass.
TEST_P(ModelFixtureTest, GenerateWithACallerCacheEqualsGenerateOne) {
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 9;
  sp.ignore_eos = true;
  GenerateOptions opts;
  opts.block_size = 4;
  opts.prefill_chunk = 3;
  const std::vector<int32_t> prompt = {1, 5, 7, 2, 9, 4, 4};
  auto want = GenerateOne(*model_, prompt, sp, opts);
  ASSERT_TRUE(want.ok()) << want.status();
  const int blocks = GenerateBlocks(prompt, sp, opts);
  EXPECT_EQ(blocks, 4);  // 7 + 9 = 16 tokens
  auto cache = KvCache::Create(model_->MakeKvCacheConfig(blocks, opts.block_size)).value();
  int calls = 0;
  const ForwardFn forward = [&](const std::vector<SequenceInput>& batch,
                                std::vector<float>* logits) {
    ++calls;
    return model_->Forward(batch, cache.get(), logits);
  };
  auto got = GenerateWith(model_->config(), blocks, forward, prompt, sp, opts);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->steps.size(), want->steps.size());
  for (size_t i = 0; i < got->steps.size(); ++i) EXPECT_EQ(got->steps[i].token, want->steps[i].token);
  EXPECT_EQ(calls, 3 + 8);  // prefill chunks 3 + 3 + 1, then one step per token after the first
  calls = 0;
  auto refused = GenerateWith(model_->config(), blocks - 1, forward, prompt, sp, opts);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("KV blocks"), absl::string_view::npos);
  EXPECT_EQ(calls, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelFixtureTest, ::testing::ValuesIn(kModels),
                         [](const auto& info) { return std::string(info.param); });

// The language model of a LLaVA-style checkpoint, with transformers' projected image embeddings
// overriding the placeholder tokens' input embeddings (engine/llava_fixture_test_util.h).
class LlavaModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto prompts = testing::LoadLlavaPrompts();
    ASSERT_TRUE(prompts.ok()) << prompts.status();
    prompts_ = std::move(*prompts);
  }

  // Logits for every position of `prompt`, fed in chunks of `chunk` tokens with the image rows
  // as embedding overrides (indexed by absolute position, so a chunk may split an image run).
  static std::vector<float> AllLogits(Model& model, const testing::LlavaPrompt& prompt,
                                      int64_t chunk, int block_size) {
    const int64_t n = static_cast<int64_t>(prompt.ids.size());
    const int64_t h = model.config().hidden_size;
    std::vector<const float*> rows(n, nullptr);
    for (const testing::LlavaImage& image : prompt.images) {
      for (int64_t t = 0; t < image.num_tokens; ++t) {
        rows[image.position + t] = image.embeddings.data() + t * h;
      }
    }
    const int blocks = static_cast<int>((n + block_size - 1) / block_size);
    auto cache = KvCache::Create(model.MakeKvCacheConfig(blocks, block_size)).value();
    std::vector<int32_t> table(blocks);
    std::iota(table.begin(), table.end(), 0);
    std::vector<float> all, logits;
    for (int64_t pos = 0; pos < n; pos += chunk) {
      SequenceInput in;
      in.tokens = prompt.ids.data() + pos;
      in.num_tokens = std::min<int64_t>(chunk, n - pos);
      in.start_position = pos;
      in.block_table = table.data();
      in.num_blocks = blocks;
      in.all_logits = true;
      in.embedding_override = rows.data() + pos;
      absl::Status s = model.Forward({in}, cache.get(), &logits);
      EXPECT_TRUE(s.ok()) << s;
      all.insert(all.end(), logits.begin(), logits.end());
    }
    return all;
  }

  static float MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    float max_err = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      max_err = std::max(max_err, std::fabs(a[i] - b[i]));
    }
    return max_err;
  }

  std::vector<testing::LlavaPrompt> prompts_;
};

TEST_F(LlavaModelTest, PromptLogitsWithImageEmbeddingsMatchTransformers) {
  auto model = Model::Load(testing::kLlavaDir, ModelOptions{2});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().image_token_id, 768);
  for (size_t p = 0; p < prompts_.size(); ++p) {
    const testing::LlavaPrompt& prompt = prompts_[p];
    const float whole = MaxDiff(AllLogits(**model, prompt, prompt.ids.size(), 16), prompt.logits);
    EXPECT_LE(whole, 1e-4f) << "prompt " << p;
    std::printf("llava prompt %zu: max |logit diff| = %.3g\n", p, whole);
    // Chunks of 5 tokens split every image run.
    EXPECT_LE(MaxDiff(AllLogits(**model, prompt, 5, 4), prompt.logits), 1e-4f) << "prompt " << p;
  }
  // Without the image rows the placeholder token's own embedding is used: different logits.
  testing::LlavaPrompt no_images = prompts_[0];
  no_images.images.clear();
  EXPECT_GT(MaxDiff(AllLogits(**model, no_images, no_images.ids.size(), 16), prompts_[0].logits),
            1e-2f);
}

// transformers 5 writes a multimodal checkpoint's language model as model.language_model.* and
// lm_head.*: the same tensors under those names load and give the same logits.
TEST_F(LlavaModelTest, LoadsTheTransformers5Layout) {
  namespace fs = std::filesystem;
  const char* tmp = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(tmp != nullptr ? tmp : "/tmp") / "llava_t5_layout";
  fs::create_directories(dir);
  fs::copy_file(fs::path(testing::kLlavaDir) / "config.json", dir / "config.json",
                fs::copy_options::overwrite_existing);
  std::ifstream in(fs::path(testing::kLlavaDir) / "model.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  json header = json::parse(bytes.substr(8, header_len));
  json renamed = json::object();
  for (auto& [name, value] : header.items()) {
    std::string n = name;
    if (n.rfind("language_model.model.", 0) == 0) {
      n = "model.language_model." + n.substr(strlen("language_model.model."));
    } else if (n == "language_model.lm_head.weight") {
      n = "lm_head.weight";
    }
    renamed[n] = value;
  }
  ASSERT_TRUE(renamed.contains("model.language_model.embed_tokens.weight"));
  std::string new_header = renamed.dump();
  new_header.resize((new_header.size() + 7) / 8 * 8, ' ');
  const uint64_t new_len = new_header.size();
  std::ofstream out(dir / "model.safetensors", std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&new_len), 8);
  out << new_header << bytes.substr(8 + header_len);
  out.close();
  auto model = Model::Load(dir.string(), ModelOptions{2});
  ASSERT_TRUE(model.ok()) << model.status();
  const testing::LlavaPrompt& prompt = prompts_[1];
  EXPECT_LE(MaxDiff(AllLogits(**model, prompt, prompt.ids.size(), 16), prompt.logits), 1e-4f);
}

}  // namespace
}  // namespace deepinfer::engine
