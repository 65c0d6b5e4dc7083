// Needs a GPU (tag "gpu"; tools/gpu/run_gpu_checks.sh runs it): the serving engine on the CUDA
// backend (engine/cuda/cuda_backend.h) gives transformers' greedy continuations of the trained
// demo model (models/demo/reference.json), colocated (chunked prefill, then decode steps from a
// CUDA graph) and disaggregated in both directions with the CPU engine: a CPU prefill whose host
// blocks the CUDA decode engine uploads, and a CUDA prefill whose blocks are downloaded for a CPU
// decode engine. One request at a time, so every step has the batch the end-to-end check of
// cuda_model_test.cc verifies. Also: the backend's block copies round-trip exactly.
#include "engine/cuda/cuda_backend.h"

#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/kv_copy_test_util.h"
#include "engine/llm_engine.h"
#include "engine/model.h"
#include "engine/output_collector.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device.h"
#include "nlohmann/json.hpp"

namespace deepinfer::engine {
namespace {

constexpr int kBlocks = 64;
constexpr int kBlockSize = 4;

struct Reference {
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
};

std::vector<Reference> LoadReference() {
  std::ifstream in("models/demo/reference.json");
  EXPECT_TRUE(in.good());
  const nlohmann::json ref = nlohmann::json::parse(in);
  std::vector<Reference> out;
  for (const nlohmann::json& p : ref["prompts"]) {
    out.push_back(
        {p["prompt_ids"].get<std::vector<int32_t>>(), p["output_ids"].get<std::vector<int32_t>>()});
  }
  return out;
}

EngineRequest Greedy(const std::string& id, const Reference& r) {
  EngineRequest req;
  req.request_id = id;
  req.prompt = r.prompt;
  req.sampling.temperature = 0;
  req.sampling.max_tokens = static_cast<int>(r.output.size());
  req.sampling.ignore_eos = true;
  return req;
}

EngineOptions Options(ForwardBackend* backend) {
  EngineOptions o;
  o.num_blocks = kBlocks;
  o.block_size = kBlockSize;
  o.max_batch_tokens = 7;  // prompts prefill in chunks
  o.backend = backend;
  return o;
}

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status s = kernels::CudaAvailable();
    if (!s.ok()) GTEST_SKIP() << s;
    auto host = Model::Load("models/demo", ModelOptions{2});
    ASSERT_TRUE(host.ok()) << host.status();
    host_ = *std::move(host);
    auto backend = CudaBackend::Create(*host_, kBlocks, kBlockSize, /*max_batch=*/8,
                                       /*max_context=*/kBlocks * kBlockSize);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = *std::move(backend);
  }

  std::unique_ptr<Model> host_;
  std::unique_ptr<CudaBackend> backend_;
};

TEST_F(CudaBackendTest, ColocatedEngineMatchesTransformers) {
  auto engine = LlmEngine::Create(host_.get(), Options(backend_.get()));
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_TRUE((*engine)->Start().ok());
  const std::vector<Reference> refs = LoadReference();
  for (int round = 0; round < 2; ++round) {  // the second round hits the prefix cache
    for (size_t i = 0; i < refs.size(); ++i) {
      const std::string id = "c" + std::to_string(round) + "_" + std::to_string(i);
      OutputCollector c;
      ASSERT_TRUE((*engine)->Submit(Greedy(id, refs[i]), c.Callback()).ok());
      ASSERT_TRUE(c.WaitFor(1, std::chrono::seconds(60)));
      const auto r = c.results()[id];
      EXPECT_TRUE(r.status.ok()) << r.status;
      EXPECT_EQ(r.tokens, refs[i].output) << id;
    }
  }
  EXPECT_GT(backend_->model().graph_steps(), 0);  // decode steps replayed a graph
  (*engine)->Stop();
}

// One direction of disaggregation: `prefill_backend` / `decode_backend` null run on the CPU.
void RunDisaggregated(Model* host, ForwardBackend* prefill_backend,
                      ForwardBackend* decode_backend) {
  auto prefill = LlmEngine::Create(host, Options(prefill_backend)).value();
  auto decode = LlmEngine::Create(host, Options(decode_backend)).value();
  ASSERT_TRUE(prefill->Start().ok());
  ASSERT_TRUE(decode->Start().ok());
  const std::vector<Reference> refs = LoadReference();
  for (size_t i = 0; i < refs.size(); ++i) {
    const std::string id = "d" + std::to_string(i);
    const EngineRequest req = Greedy(id, refs[i]);
    std::promise<absl::StatusOr<PrefillResult>> done;
    ASSERT_TRUE(prefill
                    ->SubmitPrefill(
                        req, [&](absl::StatusOr<PrefillResult> r) { done.set_value(std::move(r)); })
                    .ok());
    absl::StatusOr<PrefillResult> pre = done.get_future().get();
    ASSERT_TRUE(pre.ok()) << pre.status();
    OutputCollector c;
    absl::StatusOr<KvReservation> res = decode->ReserveForRemotePrefill(req, c.Callback());
    ASSERT_TRUE(res.ok()) << res.status();
    CopyPrefilledBlocks(*prefill->kv_cache(), *pre, *decode->kv_cache(), *res);
    ASSERT_TRUE(prefill->ReleasePrefilled(id).ok());
    ASSERT_TRUE(decode->CompleteRemotePrefill(id, {pre->first_token, pre->first_logprob, {}}).ok());
    ASSERT_TRUE(c.WaitFor(1, std::chrono::seconds(60)));
    const auto r = c.results()[id];
    EXPECT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.tokens, refs[i].output) << id;
  }
  prefill->Stop();
  decode->Stop();
}

TEST_F(CudaBackendTest, CpuPrefillToCudaDecodeMatchesTransformers) {
  RunDisaggregated(host_.get(), nullptr, backend_.get());
}

TEST_F(CudaBackendTest, CudaPrefillToCpuDecodeMatchesTransformers) {
  RunDisaggregated(host_.get(), backend_.get(), nullptr);
}

TEST_F(CudaBackendTest, BlockCopiesRoundTripAndRefuseOtherGeometries) {
  auto a = KvCache::Create(host_->MakeKvCacheConfig(kBlocks, kBlockSize)).value();
  auto b = KvCache::Create(host_->MakeKvCacheConfig(kBlocks, kBlockSize)).value();
  std::mt19937 rng(3);
  for (void* pool : {a->k_data(), a->v_data()}) {
    auto* bytes = static_cast<unsigned char*>(pool);
    for (size_t i = 0; i < a->bytes_per_pool(); ++i) bytes[i] = static_cast<unsigned char>(rng());
  }
  // Runs of consecutive ids, a gap, a released (-1) entry.
  const std::vector<int32_t> blocks = {3, 4, 5, 9, -1, 10, 63, 0};
  ASSERT_TRUE(backend_->Upload(*a, blocks).ok());
  ASSERT_TRUE(backend_->Download(blocks, b.get()).ok());
  const size_t bytes = a->block_bytes();
  for (int l = 0; l < host_->config().num_layers; ++l) {
    for (int32_t blk : blocks) {
      if (blk < 0) continue;
      EXPECT_EQ(std::memcmp(static_cast<char*>(a->k_layer(l)) + blk * bytes,
                            static_cast<char*>(b->k_layer(l)) + blk * bytes, bytes),
                0)
          << "layer " << l << " block " << blk;
      EXPECT_EQ(std::memcmp(static_cast<char*>(a->v_layer(l)) + blk * bytes,
                            static_cast<char*>(b->v_layer(l)) + blk * bytes, bytes),
                0)
          << "layer " << l << " block " << blk;
    }
  }
  // Blocks not named stay as they were (zero).
  const auto* untouched = static_cast<const unsigned char*>(b->k_layer(0)) + 20 * bytes;
  for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(untouched[i], 0) << i;
  auto other = KvCache::Create(host_->MakeKvCacheConfig(kBlocks / 2, kBlockSize)).value();
  EXPECT_EQ(backend_->Upload(*other, {0}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->Download({kBlocks}, b.get()).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deepinfer::engine
