#include "kv_transfer/loopback_agent.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kv_transfer/notification_tracker.h"

namespace deepinfer::kv_transfer {
namespace {

std::unique_ptr<TransferAgent> Make(const char* name, uint64_t incarnation) {
  AgentConfig c;
  c.name = name;
  c.incarnation = incarnation;
  c.backend = Backend::kLoopback;
  auto a = CreateLoopbackAgent(c);
  EXPECT_TRUE(a.ok());
  EXPECT_TRUE((*a)->Start().ok());
  return *std::move(a);
}

std::vector<BlockDesc> Blocks(RegionId r, uint32_t n, uint64_t size) {
  std::vector<BlockDesc> out;
  for (uint32_t i = 0; i < n; ++i) out.push_back({r, i * size, size});
  return out;
}

constexpr uint32_t kN = 32;
constexpr uint64_t kB = 256;
absl::Time Later() { return absl::Now() + absl::Seconds(5); }

class LoopbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = Make("prefill", 1);
    b_ = Make("decode", 1);
    am_.assign(kN * kB, 0);
    bm_.assign(kN * kB, 0);
    ar_ = *a_->RegisterMemory(am_.data(), am_.size(), MemoryKind::kHost);
    br_ = *b_->RegisterMemory(bm_.data(), bm_.size(), MemoryKind::kHost);
    ASSERT_EQ(*a_->ImportPeer(*b_->ExportMetadata()), "decode");
    local_ = *a_->PrepareLocalDescriptors(Blocks(ar_, kN, kB));
    remote_ = *a_->PrepareRemoteDescriptors("decode", Blocks(br_, kN, kB));
  }
  std::unique_ptr<TransferAgent> a_, b_;
  std::vector<char> am_, bm_;
  RegionId ar_ = 0, br_ = 0;
  DescListId local_ = 0, remote_ = 0;
};

TEST_F(LoopbackTest, RandomWritesAndReadsAreExactAndNothingLeaks) {
  std::mt19937 rng(1);
  for (auto& c : am_) c = static_cast<char>(rng());
  HandleId h = *a_->CreateHandle(local_, remote_);
  for (int post = 0; post < 2000; ++post) {
    uint32_t l = rng() % kN, r = rng() % kN;
    std::vector<uint32_t> li{l}, ri{r};
    am_[l * kB] = static_cast<char>(post);
    ASSERT_TRUE(a_->Post(h, TransferOp::kWrite, li, ri, nullptr, Later()).ok());
    ASSERT_EQ(a_->Wait(h, Later())->state, TransferState::kDone);
    ASSERT_EQ(0, std::memcmp(&am_[l * kB], &bm_[r * kB], kB));
  }
  bm_[5 * kB] = 77;
  std::vector<uint32_t> li{0}, ri{5};
  ASSERT_TRUE(a_->Post(h, TransferOp::kRead, li, ri, nullptr, Later()).ok());
  ASSERT_EQ(a_->Wait(h, Later())->state, TransferState::kDone);
  EXPECT_EQ(am_[0], 77);
  ASSERT_TRUE(a_->ReleaseHandle(h).ok());
  ASSERT_TRUE(a_->ReleaseDescriptors(local_).ok());
  ASSERT_TRUE(a_->DeregisterMemory(ar_).ok());
  AgentCounters c = a_->counters();
  EXPECT_EQ(c.registered_regions, 0);
  EXPECT_EQ(c.handles, 0);
  EXPECT_EQ(c.in_flight_handles, 0);
  EXPECT_EQ(c.bytes_written, 2000 * kB);
  EXPECT_EQ(c.bytes_read, kB);
}

TEST_F(LoopbackTest, LayerWiseStreamingCompletesRequestOnLastLayer) {
  constexpr uint32_t kLayers = 4;
  std::vector<HandleId> handles;
  for (uint32_t l = 0; l < kLayers; ++l) handles.push_back(*a_->CreateHandle(local_, remote_));
  NotificationTracker tracker;
  NotificationTracker::Completed done;
  bool complete = false;
  for (uint32_t layer = 0; layer < kLayers; ++layer) {
    std::vector<uint32_t> idx{layer * 2, layer * 2 + 1};
    Notification n{123, layer, kLayers, ""};
    ASSERT_TRUE(a_->Post(handles[layer], TransferOp::kWrite, idx, idx, &n, Later()).ok());
    for (Notification& got : b_->DrainNotifications()) {
      EXPECT_EQ(got.sender, "prefill");
      complete = *tracker.Add(std::move(got), &done);
    }
    EXPECT_EQ(complete, layer == kLayers - 1);
  }
  EXPECT_EQ(done.parts.size(), kLayers);
}

TEST_F(LoopbackTest, ValidationErrorsUseTheRightCodes) {
  HandleId h = *a_->CreateHandle(local_, remote_);
  std::vector<uint32_t> one{0}, two{0, 1}, bad{kN};
  EXPECT_EQ(a_->Post(h, TransferOp::kWrite, one, two, nullptr, Later()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->Post(h, TransferOp::kWrite, bad, one, nullptr, Later()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->Post(h, TransferOp::kWrite, {}, {}, nullptr, Later()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      a_->Post(h, TransferOp::kWrite, one, one, nullptr, absl::Now() - absl::Seconds(1)).code(),
      absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(a_->PrepareLocalDescriptors({{ar_, kN * kB - 8, 16}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->PrepareRemoteDescriptors("nobody", {}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(a_->CreateHandle(remote_, local_).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->SupportsMemoryKind(MemoryKind::kCudaDevice).code(),
            absl::StatusCode::kUnimplemented);
  AgentConfig c;
  c.name = "x";
  c.backend = Backend::kLoopback;
  EXPECT_EQ(CreateLoopbackAgent(c).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->ImportPeer("garbage").status().code(), absl::StatusCode::kInvalidArgument);
}

// AllocateMemory gives memory the agent owns and registers like RegisterMemory: it moves data,
// follows the pinning rule, is counted, and is freed (under ASan: no leak) by DeregisterMemory or
// by the agent's destruction.
TEST_F(LoopbackTest, AllocatedRegionsMoveDataArePinnedAndFreed) {
  EXPECT_EQ(b_->AllocateMemory(0, MemoryKind::kHost).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b_->AllocateMemory(64, MemoryKind::kCudaDevice).status().code(),
            absl::StatusCode::kUnimplemented);
  AllocatedRegion dst = *b_->AllocateMemory(kN * kB, MemoryKind::kHost);
  ASSERT_NE(dst.base, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(dst.base) % 4096, 0u);
  EXPECT_EQ(b_->counters().registered_bytes, static_cast<int64_t>(2 * kN * kB));
  AllocatedRegion src = *a_->AllocateMemory(kN * kB, MemoryKind::kHost);
  for (uint64_t i = 0; i < kN * kB; ++i) static_cast<char*>(src.base)[i] = static_cast<char>(i);
  ASSERT_TRUE(a_->ImportPeer(*b_->ExportMetadata()).ok());  // refresh: adds the new region
  HandleId h =
      *a_->CreateHandle(*a_->PrepareLocalDescriptors(Blocks(src.region, kN, kB)),
                        *a_->PrepareRemoteDescriptors("decode", Blocks(dst.region, kN, kB)));
  std::vector<uint32_t> li{3, 5}, ri{0, 31};
  Notification note{9, 0, 1, ""};
  ASSERT_TRUE(a_->Post(h, TransferOp::kWrite, li, ri, &note, Later()).ok());
  ASSERT_EQ(a_->Wait(h, Later())->state, TransferState::kDone);
  ASSERT_TRUE(b_->WaitForNotifications(Later()));
  const char* got = static_cast<const char*>(dst.base);
  for (uint64_t i = 0; i < kB; ++i) {
    ASSERT_EQ(got[i], static_cast<char>(3 * kB + i));
    ASSERT_EQ(got[31 * kB + i], static_cast<char>(5 * kB + i));
  }
  ASSERT_TRUE(b_->DeregisterMemory(dst.region).ok());
  EXPECT_EQ(b_->counters().registered_bytes, static_cast<int64_t>(kN * kB));
  EXPECT_EQ(b_->DeregisterMemory(dst.region).code(), absl::StatusCode::kNotFound);
  // `src` stays allocated: freed when a_ is destroyed.
}

TEST_F(LoopbackTest, IncarnationsForgetAndPeerGone) {
  HandleId h = *a_->CreateHandle(local_, remote_);
  std::vector<uint32_t> one{0};
  // A restarted decode node (same name, new incarnation) invalidates old handles.
  auto b2 = Make("decode", 2);
  std::vector<char> m2(kN * kB);
  RegionId r2 = *b2->RegisterMemory(m2.data(), m2.size(), MemoryKind::kHost);
  ASSERT_TRUE(a_->ImportPeer(*b2->ExportMetadata()).ok());
  EXPECT_EQ(a_->Post(h, TransferOp::kWrite, one, one, nullptr, Later()).code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(a_->ImportPeer(*b_->ExportMetadata()).status().code(), absl::StatusCode::kAborted);
  HandleId h2 =
      *a_->CreateHandle(local_, *a_->PrepareRemoteDescriptors("decode", Blocks(r2, kN, kB)));
  ASSERT_TRUE(a_->Post(h2, TransferOp::kWrite, one, one, nullptr, Later()).ok());
  EXPECT_EQ(a_->Wait(h2, Later())->state, TransferState::kDone);
  // Peer gone.
  b2->Stop();
  ASSERT_TRUE(a_->Post(h2, TransferOp::kWrite, one, one, nullptr, Later()).ok());
  auto st = a_->Wait(h2, Later());
  EXPECT_EQ(st->status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(a_->Post(h2, TransferOp::kWrite, one, one, nullptr, Later()).code(),
            absl::StatusCode::kUnavailable);
  ASSERT_TRUE(a_->ForgetPeer("decode").ok());
  EXPECT_EQ(a_->Post(h2, TransferOp::kWrite, one, one, nullptr, Later()).code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(a_->counters().peers, 0);
}

}  // namespace
}  // namespace deepinfer::kv_transfer
