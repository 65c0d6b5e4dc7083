// Needs a GPU (tag "gpu"; tools/gpu/run_gpu_checks.sh runs it): the CUDA forward pass against
//   - Hugging Face transformers on the trained demo model (models/demo/reference.json): the last
//     prompt position's logits within 0.1 (the bf16 tolerance of models/demo_model_test.cc) and
//     greedy continuations token for token, prefilled in chunks of 7 then decoded one token a
//     step — the end-to-end greedy check of tools/gpu;
//   - the CPU model (engine/model.h) on ragged batches (odd lengths, block boundaries, shuffled
//     block tables, contexts over one 256-key partition of the decode kernel, a sliding-window
//     model, Q/K norms, an f32 model, an f32 mixture-of-experts model): chunked prefill with logits
//     for every token, one-token decode steps (the split-K decode kernel), mixed steps where one
//     sequence verifies several tokens (the prefill kernel); logits and every written KV block
//     compared. Both backends are fed the same tokens (the CPU's argmax), so they stay in step.
// Tolerances: f32 models 2e-3 absolute on logits and KV; bf16 models 0.15 on logits (one bf16
// rounding that a different f32 summation order flips propagates through the layers) and 0.05 on
// KV values (one or two bf16 ulps).
#include "engine/cuda/cuda_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/model.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device.h"
#include "kernels/dtype.h"
#include "nlohmann/json.hpp"

namespace deepinfer::engine {
namespace {

using json = nlohmann::json;

int Argmax(const float* row, int n) {
  return static_cast<int>(std::max_element(row, row + n) - row);
}

class CudaModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status s = kernels::CudaAvailable();
    if (!s.ok()) GTEST_SKIP() << s;
  }
};

TEST_F(CudaModelTest, DemoModelMatchesTransformers) {
  std::ifstream in("models/demo/reference.json");
  ASSERT_TRUE(in.good());
  const json ref = json::parse(in);
  auto host = Model::Load("models/demo", ModelOptions{2});
  ASSERT_TRUE(host.ok()) << host.status();
  const int vocab = (*host)->config().vocab_size;
  for (const json& p : ref["prompts"]) {
    const std::vector<int32_t> prompt = p["prompt_ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> want = p["output_ids"].get<std::vector<int32_t>>();
    const std::vector<float> want_logits = p["last_logits"].get<std::vector<float>>();
    const int block = 4;
    const int blocks = static_cast<int>((prompt.size() + want.size() + block - 1) / block);
    CudaModelOptions options;
    options.num_blocks = blocks;
    options.block_size = block;
    auto model = CudaModel::Create(**host, options);
    ASSERT_TRUE(model.ok()) << model.status();
    std::vector<int32_t> table(blocks);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(7));
    std::vector<int32_t> tokens = prompt;
    std::vector<float> logits;
    // Prefill in chunks of 7: each chunk attends to the paged prefix the earlier ones wrote.
    for (size_t at = 0; at < prompt.size(); at += 7) {
      SequenceInput s;
      s.tokens = tokens.data() + at;
      s.num_tokens = static_cast<int64_t>(std::min<size_t>(7, prompt.size() - at));
      s.start_position = static_cast<int64_t>(at);
      s.block_table = table.data();
      s.num_blocks = blocks;
      ASSERT_TRUE((*model)->Forward({s}, &logits).ok());
    }
    ASSERT_EQ(static_cast<int>(logits.size()), vocab);
    float max_err = 0;
    for (int v = 0; v < vocab; ++v) {
      max_err = std::max(max_err, std::fabs(logits[v] - want_logits[v]));
    }
    EXPECT_LE(max_err, 0.1f);
    std::printf("cuda demo: prompt %zu tokens, max |logit diff| vs transformers = %.3g\n",
                prompt.size(), max_err);
    std::vector<int32_t> got;
    while (got.size() < want.size()) {
      const int32_t next = Argmax(logits.data(), vocab);
      got.push_back(next);
      tokens.push_back(next);
      SequenceInput s;
      s.tokens = &tokens.back();
      s.num_tokens = 1;
      s.start_position = static_cast<int64_t>(tokens.size()) - 1;
      s.block_table = table.data();
      s.num_blocks = blocks;
      ASSERT_TRUE((*model)->Forward({s}, &logits).ok());
    }
    EXPECT_EQ(got, want);
  }
}

struct Fixture {
  const char* dir;
  float logit_tol;
  float kv_tol;
};

class CudaModelVsCpuTest : public CudaModelTest, public ::testing::WithParamInterface<Fixture> {};

TEST_P(CudaModelVsCpuTest, RaggedBatchesMatchTheCpuModel) {
  const Fixture f = GetParam();
  auto host = Model::Load(f.dir, ModelOptions{2});
  ASSERT_TRUE(host.ok()) << host.status();
  const ModelConfig& c = (*host)->config();
  const int vocab = c.vocab_size;
  const int block = 4;
  const std::vector<int> prompt_lens = {5, 17, 300};
  const int generate = 12;
  int blocks_per_seq = 0;
  for (int n : prompt_lens)
    blocks_per_seq = std::max(blocks_per_seq, (n + generate + 8 + block - 1) / block);
  const int num_blocks = blocks_per_seq * static_cast<int>(prompt_lens.size());
  CudaModelOptions options;
  options.num_blocks = num_blocks;
  options.block_size = block;
  auto gpu = CudaModel::Create(**host, options);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  // The same model replaying decode steps from CUDA graphs (3 sequences: the bucket of 4, one
  // padding sequence); its own KV pools, fed the same steps.
  CudaModelOptions graph_options = options;
  graph_options.graph_max_batch = 4;
  graph_options.graph_max_blocks_per_seq = 0;  // set below
  std::unique_ptr<CudaModel> graphed;
  auto cpu_cache = KvCache::Create((*host)->MakeKvCacheConfig(num_blocks, block)).value();
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(11));
  graph_options.graph_max_blocks_per_seq = blocks_per_seq;
  {
    auto g = CudaModel::Create(**host, graph_options);
    ASSERT_TRUE(g.ok()) << g.status();
    graphed = *std::move(g);
  }
  const int n = static_cast<int>(prompt_lens.size());
  std::vector<std::vector<int32_t>> tables(n), tokens(n);
  std::mt19937 rng(5);
  for (int s = 0; s < n; ++s) {
    tables[s].assign(ids.begin() + s * blocks_per_seq, ids.begin() + (s + 1) * blocks_per_seq);
    for (int t = 0; t < prompt_lens[s]; ++t)
      tokens[s].push_back(static_cast<int32_t>(rng() % vocab));
  }
  std::vector<int64_t> done(n, 0);  // tokens in the cache
  float worst = 0;
  // Runs one step: `counts[s]` new tokens of sequence s (0: not in the batch), every token's
  // logits for `all`; compares logits and appends the CPU's argmax where the sequence is at its
  // end.
  auto step = [&](const std::vector<int>& counts, const std::vector<bool>& all,
                  const std::string& what) {
    std::vector<SequenceInput> batch;
    std::vector<int> which;
    for (int s = 0; s < n; ++s) {
      if (counts[s] == 0) continue;
      SequenceInput in;
      in.tokens = tokens[s].data() + done[s];
      in.num_tokens = counts[s];
      in.start_position = done[s];
      in.block_table = tables[s].data();
      in.num_blocks = blocks_per_seq;
      in.all_logits = all[s];
      batch.push_back(in);
      which.push_back(s);
    }
    std::vector<float> want, got;
    ASSERT_TRUE((*host)->Forward(batch, cpu_cache.get(), &want).ok());
    const absl::Status st = (*gpu)->Forward(batch, &got);
    ASSERT_TRUE(st.ok()) << what << ": " << st;
    ASSERT_EQ(got.size(), want.size()) << what;
    float err = 0;
    for (size_t i = 0; i < want.size(); ++i) err = std::max(err, std::fabs(got[i] - want[i]));
    EXPECT_LE(err, f.logit_tol) << what;
    worst = std::max(worst, err);
    std::vector<float> replayed;
    const absl::Status gs = graphed->Forward(batch, &replayed);
    ASSERT_TRUE(gs.ok()) << what << " (graphs): " << gs;
    ASSERT_EQ(replayed.size(), want.size()) << what;
    float graph_err = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      graph_err = std::max(graph_err, std::fabs(replayed[i] - want[i]));
    }
    EXPECT_LE(graph_err, f.logit_tol) << what << " (graphs)";
    size_t row = 0;
    for (size_t b = 0; b < batch.size(); ++b) {
      const int s = which[b];
      row += batch[b].all_logits ? batch[b].num_tokens : 1;
      done[s] += batch[b].num_tokens;
      if (done[s] == static_cast<int64_t>(tokens[s].size())) {
        tokens[s].push_back(Argmax(want.data() + (row - 1) * vocab, vocab));
      }
    }
  };
  // Chunked prefill: 8-token chunks for the first two sequences, one long chunk for the third,
  // every token's logits for the second.
  step({5, 8, 300}, {false, true, false}, "prefill 1");
  step({0, 8, 0}, {false, true, false}, "prefill 2");
  step({0, 1, 0}, {false, false, false}, "prefill 3");
  // Decode steps (the decode kernel; the third sequence's context spans two partitions).
  for (int i = 0; i < generate / 2; ++i) step({1, 1, 1}, {false, false, false}, "decode");
  // Mixed: the first sequence appends 3 drafted tokens (verification, every logit), the others
  // decode one (the prefill kernel, queries of 3 and 1 rows).
  for (int i = 0; i < 3; ++i) {
    tokens[0].push_back(static_cast<int32_t>(rng() % vocab));
    tokens[0].push_back(static_cast<int32_t>(rng() % vocab));
    step({3, 1, 1}, {true, false, false}, "verify");
  }
  for (int i = 0; i < generate / 2; ++i) step({1, 1, 1}, {false, false, false}, "decode 2");
  std::printf("cuda vs cpu %s: worst |logit diff| %.3g; %lld steps replayed from %d graphs\n",
              f.dir, worst, static_cast<long long>(graphed->graph_steps()),
              graphed->graphs_captured());
  if (!c.is_moe()) {
    // Every one-token step: the last prompt token of the second sequence alone (bucket 1), then
    // the decode steps of all three (bucket 4).
    EXPECT_EQ(graphed->graph_steps(), 1 + generate);
    EXPECT_EQ(graphed->graphs_captured(), 2);
  } else {
    EXPECT_EQ(graphed->graph_steps(), 0);  // MoE layers sync with the host: eager
  }
  // Every block a sequence wrote, K and V of every layer.
  const size_t elems = static_cast<size_t>(block) * c.num_kv_heads * c.head_dim;
  const kernels::DType dt = (*host)->activation_dtype();
  std::vector<uint8_t> bytes(elems * kernels::DTypeSize(dt));
  float kv_err = 0;
  for (int s = 0; s < n; ++s) {
    for (int64_t b = 0; b * block < done[s]; ++b) {
      const int id = tables[s][b];
      const int64_t valid =
          std::min<int64_t>(block, done[s] - b * block) * c.num_kv_heads * c.head_dim;
      for (int layer = 0; layer < c.num_layers; ++layer) {
        for (bool value : {false, true}) {
          ASSERT_TRUE((*gpu)->ReadBlock(layer, value, id, bytes.data()).ok());
          const void* base = value ? cpu_cache->v_layer(layer) : cpu_cache->k_layer(layer);
          for (int64_t i = 0; i < valid; ++i) {
            const float want = kernels::LoadAsF32(base, dt, id * cpu_cache->block_elements() + i);
            kv_err = std::max(kv_err, std::fabs(kernels::LoadAsF32(bytes.data(), dt, i) - want));
          }
        }
      }
    }
  }
  EXPECT_LE(kv_err, f.kv_tol);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaModelVsCpuTest,
                         ::testing::Values(Fixture{"models/demo", 0.15f, 0.05f},
                                           Fixture{"models/demo-draft", 0.15f, 0.05f},
                                           Fixture{"engine/testdata/models/qwen3", 2e-3f, 2e-3f},
                                           Fixture{"engine/testdata/models/qwen3_moe", 2e-3f,
                                                   2e-3f}));

}  // namespace
}  // namespace deepinfer::engine
