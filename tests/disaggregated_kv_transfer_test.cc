// The disaggregated data path without the servers: a prefill engine and a decode engine in one
// process, each with its KV pools allocated by its own kv_transfer agent (loopback backend).
// The prefill engine computes the prompt and holds its blocks; its agent writes them layer by
// layer into the blocks the decode engine reserved (skipping the decode engine's own cached
// prefix), one post per layer with a notification; when all layers have landed the decode engine
// continues. Greedy outputs must equal the single-engine reference, and nothing may leak.
#include <future>
#include <map>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "engine/llm_engine.h"
#include "gtest/gtest.h"
#include "kv_transfer/agent_factory.h"
#include "kv_transfer/notification_tracker.h"

namespace deepinfer {
namespace {

using engine::EngineOptions;
using engine::EngineOutput;
using engine::EngineRequest;
using engine::KvReservation;
using engine::LlmEngine;
using engine::PrefillResult;
using kv_transfer::BlockDesc;
using kv_transfer::TransferAgent;

struct Node {
  std::unique_ptr<TransferAgent> agent;
  kv_transfer::RegionId k_region = 0, v_region = 0;
  std::unique_ptr<LlmEngine> engine;
};

// Descriptor i covers (pool, layer, block) with i = (pool * layers + layer) * blocks + block.
std::vector<BlockDesc> Descriptors(const Node& n, int layers, int blocks, size_t block_bytes) {
  std::vector<BlockDesc> out;
  for (int pool = 0; pool < 2; ++pool) {
    for (int l = 0; l < layers; ++l) {
      for (int b = 0; b < blocks; ++b) {
        out.push_back({pool == 0 ? n.k_region : n.v_region,
                       (static_cast<uint64_t>(l) * blocks + b) * block_bytes, block_bytes});
      }
    }
  }
  return out;
}

class DisaggregatedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto model = engine::Model::Load("engine/testdata/models/llama", engine::ModelOptions{2});
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    for (auto [node, name] : {std::pair<Node*, const char*>{&prefill_, "prefill-0"},
                              {&decode_, "decode-0"}}) {
      kv_transfer::AgentConfig config;
      config.name = name;
      config.incarnation = 1;
      config.backend = kv_transfer::Backend::kLoopback;
      auto agent = kv_transfer::CreateTransferAgent(config);
      ASSERT_TRUE(agent.ok()) << agent.status();
      node->agent = std::move(*agent);
      ASSERT_TRUE(node->agent->Start().ok());
      EngineOptions o;
      o.num_blocks = kBlocks;
      o.block_size = 4;
      o.kv_memory = [node](size_t bytes) -> absl::StatusOr<std::pair<void*, void*>> {
        auto k = node->agent->AllocateMemory(bytes, kv_transfer::MemoryKind::kHost);
        if (!k.ok()) return k.status();
        auto v = node->agent->AllocateMemory(bytes, kv_transfer::MemoryKind::kHost);
        if (!v.ok()) return v.status();
        node->k_region = k->region;
        node->v_region = v->region;
        return std::make_pair(k->base, v->base);
      };
      auto e = LlmEngine::Create(model_.get(), o);
      ASSERT_TRUE(e.ok()) << e.status();
      node->engine = std::move(*e);
      ASSERT_TRUE(node->engine->Start().ok());
    }
    // Metadata exchange (the cluster does this over gRPC at registration).
    auto decode_blob = decode_.agent->ExportMetadata();
    ASSERT_TRUE(decode_blob.ok());
    auto peer = prefill_.agent->ImportPeer(*decode_blob);
    ASSERT_TRUE(peer.ok()) << peer.status();
    peer_ = *peer;
    const int layers = model_->config().num_layers;
    const size_t block_bytes = prefill_.engine->kv_cache()->block_bytes();
    auto local = prefill_.agent->PrepareLocalDescriptors(Descriptors(prefill_, layers, kBlocks, block_bytes));
    auto remote = prefill_.agent->PrepareRemoteDescriptors(peer_, Descriptors(decode_, layers, kBlocks, block_bytes));
    ASSERT_TRUE(local.ok() && remote.ok());
    for (int l = 0; l < layers; ++l) {
      auto h = prefill_.agent->CreateHandle(*local, *remote);
      ASSERT_TRUE(h.ok());
      layer_handles_.push_back(*h);
    }
  }

  void TearDown() override {
    for (Node* n : {&prefill_, &decode_}) {
      if (n->engine) n->engine->Stop();
    }
  }

  static constexpr int kBlocks = 64;
  std::unique_ptr<engine::Model> model_;
  Node prefill_, decode_;
  std::string peer_;
  std::vector<kv_transfer::HandleId> layer_handles_;
};

TEST_F(DisaggregatedTest, LayerWiseTransferIntoReservedBlocksGivesReferenceOutputs) {
  const int layers = model_->config().num_layers;
  std::vector<std::vector<int32_t>> prompts = {{760, 39, 68, 410, 78, 311, 268, 624, 5, 9, 44},
                                               {760, 39, 68, 410, 78, 311, 268, 624, 7}};
  int64_t decode_cached = 0;
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      engine::SamplingParams sp;
      sp.temperature = 0;
      sp.max_tokens = 10;
      sp.ignore_eos = true;
      auto ref = engine::GenerateOne(*model_, prompts[i], sp, engine::GenerateOptions());
      ASSERT_TRUE(ref.ok());
      std::vector<int32_t> want;
      for (const auto& s : ref->steps) want.push_back(s.token);

      const std::string id = "r" + std::to_string(round) + "-" + std::to_string(i);
      EngineRequest req;
      req.request_id = id;
      req.prompt = prompts[i];
      req.sampling = sp;
      // Decode node first reserves the destination (the request path of DESIGN.md).
      std::promise<void> finished;
      std::vector<int32_t> got;
      auto reservation = decode_.engine->ReserveForRemotePrefill(req, [&](const EngineOutput& o) {
        for (const auto& s : o.new_tokens) got.push_back(s.token);
        if (o.finished) finished.set_value();
      });
      ASSERT_TRUE(reservation.ok()) << reservation.status();
      decode_cached += reservation->cached_tokens;
      // Prefill node computes and holds the prompt's blocks.
      std::promise<absl::StatusOr<PrefillResult>> done;
      ASSERT_TRUE(prefill_.engine->SubmitPrefill(req, [&](absl::StatusOr<PrefillResult> r) {
        done.set_value(std::move(r));
      }).ok());
      absl::StatusOr<PrefillResult> pre = done.get_future().get();
      ASSERT_TRUE(pre.ok()) << pre.status();
      // Layer by layer: the blocks the decode node lacks, K and V, one post per layer.
      const int64_t skip = reservation->cached_tokens / reservation->block_size;
      for (int l = 0; l < layers; ++l) {
        std::vector<uint32_t> src, dst;
        for (int pool = 0; pool < 2; ++pool) {
          for (size_t b = skip; b < reservation->block_ids.size(); ++b) {
            src.push_back((pool * layers + l) * kBlocks + pre->block_ids[b]);
            dst.push_back((pool * layers + l) * kBlocks + reservation->block_ids[b]);
          }
        }
        kv_transfer::Notification n;
        n.request_id = static_cast<uint64_t>(round * 100 + i + 1);
        n.seq = l;
        n.total = layers;
        ASSERT_TRUE(prefill_.agent
                        ->Post(layer_handles_[l], kv_transfer::TransferOp::kWrite, src, dst, &n,
                               absl::Now() + absl::Seconds(10))
                        .ok());
      }
      for (kv_transfer::HandleId h : layer_handles_) {
        auto st = prefill_.agent->Wait(h, absl::Now() + absl::Seconds(10));
        ASSERT_TRUE(st.ok() && st->state == kv_transfer::TransferState::kDone);
      }
      ASSERT_TRUE(prefill_.engine->ReleasePrefilled(id).ok());
      // Decode node: all layers' notifications arrived -> the KV is there.
      kv_transfer::NotificationTracker tracker;
      int complete = 0;
      while (complete == 0) {
        ASSERT_TRUE(decode_.agent->WaitForNotifications(absl::Now() + absl::Seconds(10)));
        for (auto& note : decode_.agent->DrainNotifications()) {
          kv_transfer::NotificationTracker::Completed c;
          absl::StatusOr<bool> all_landed = tracker.Add(std::move(note), &c);
          ASSERT_TRUE(all_landed.ok()) << all_landed.status();
          if (*all_landed) ++complete;
        }
      }
      ASSERT_TRUE(decode_.engine
                      ->CompleteRemotePrefill(id, {pre->first_token, pre->first_logprob, {}})
                      .ok());
      finished.get_future().wait();
      EXPECT_EQ(got, want) << id;
    }
  }
  EXPECT_GT(decode_cached, 0);  // round 2: the decode node's own prefix cache
  const kv_transfer::AgentCounters c = prefill_.agent->counters();
  EXPECT_EQ(c.in_flight_handles, 0);
  EXPECT_EQ(c.posts_failed, 0u);
  EXPECT_GT(c.bytes_written, 0u);
  for (Node* n : {&prefill_, &decode_}) {
    engine::EngineStats s;
    for (int i = 0; i < 200; ++i) {
      s = n->engine->GetStats();
      if (s.blocks.used_blocks == 0) break;
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_EQ(s.blocks.used_blocks, 0);
  }
}

}  // namespace
}  // namespace deepinfer
