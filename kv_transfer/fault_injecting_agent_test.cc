#include "kv_transfer/fault_injecting_agent.h"

#include <vector>

#include "gtest/gtest.h"
#include "kv_transfer/loopback_agent.h"

namespace deepinfer::kv_transfer {
namespace {

std::unique_ptr<TransferAgent> Make(const char* name) {
  AgentConfig c;
  c.name = name;
  c.incarnation = 1;
  c.backend = Backend::kLoopback;
  auto a = *CreateLoopbackAgent(c);
  EXPECT_TRUE(a->Start().ok());
  return a;
}

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    f_ = std::make_unique<FaultInjectingAgent>(Make("a"));
    b_ = Make("b");
    am_.assign(4096, 1);
    bm_.assign(4096, 0);
    ar_ = *f_->RegisterMemory(am_.data(), am_.size(), MemoryKind::kHost);
    RegionId br = *b_->RegisterMemory(bm_.data(), bm_.size(), MemoryKind::kHost);
    ASSERT_TRUE(f_->ImportPeer(*b_->ExportMetadata()).ok());
    std::vector<BlockDesc> l, r;
    for (uint32_t i = 0; i < 4; ++i) {
      l.push_back({ar_, i * 1024, 1024});
      r.push_back({br, i * 1024, 1024});
    }
    h_ = *f_->CreateHandle(*f_->PrepareLocalDescriptors(l), *f_->PrepareRemoteDescriptors("b", r));
  }
  absl::Time Later() { return absl::Now() + absl::Seconds(5); }
  std::unique_ptr<FaultInjectingAgent> f_;
  std::unique_ptr<TransferAgent> b_;
  std::vector<char> am_, bm_;
  RegionId ar_ = 0;
  HandleId h_ = 0;
  std::vector<uint32_t> all_{0, 1, 2, 3};
  Notification note_{1, 0, 1, ""};
};

TEST_F(FaultTest, DelayKeepsBuffersPinned) {
  // The delay runs on the real clock and the three refusals below must all come within it: long
  // enough that a stalled test thread cannot outlast it (it did 50 ms), short of Later().
  f_->SetCompletionDelay(absl::Seconds(1));
  ASSERT_TRUE(f_->Post(h_, TransferOp::kWrite, all_, all_, nullptr, Later()).ok());
  EXPECT_EQ(f_->Poll(h_)->state, TransferState::kInProgress);
  EXPECT_EQ(f_->DeregisterMemory(ar_).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(f_->Post(h_, TransferOp::kWrite, all_, all_, nullptr, Later()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(f_->Wait(h_, Later())->state, TransferState::kDone);
  EXPECT_TRUE(f_->DeregisterMemory(ar_).ok());
}

TEST_F(FaultTest, DroppedNotificationStillMovesData) {
  f_->SetDropNotifications(true);
  ASSERT_TRUE(f_->Post(h_, TransferOp::kWrite, all_, all_, &note_, Later()).ok());
  EXPECT_EQ(f_->Wait(h_, Later())->state, TransferState::kDone);
  EXPECT_TRUE(b_->DrainNotifications().empty());
  EXPECT_EQ(bm_[4095], 1);
}

TEST_F(FaultTest, FailAfterBytesMovesOnlyWhatFits) {
  f_->FailAfterBytes(2048 + 100);
  ASSERT_TRUE(f_->Post(h_, TransferOp::kWrite, all_, all_, &note_, Later()).ok());
  auto st = f_->Wait(h_, Later());
  EXPECT_EQ(st->status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(bm_[1024], 1);
  EXPECT_EQ(bm_[2048], 0);
  EXPECT_TRUE(b_->DrainNotifications().empty());
}

TEST_F(FaultTest, KilledPeerRefusesPostsUntilRevived) {
  f_->KillPeer("b");
  EXPECT_EQ(f_->Post(h_, TransferOp::kWrite, all_, all_, &note_, Later()).code(),
            absl::StatusCode::kUnavailable);
  f_->RevivePeer("b");
  f_->SetCompletionDelay(absl::Milliseconds(20));
  ASSERT_TRUE(f_->Post(h_, TransferOp::kWrite, all_, all_, nullptr, Later()).ok());
  f_->KillPeer("b");
  EXPECT_EQ(f_->Wait(h_, Later())->status.code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace deepinfer::kv_transfer
