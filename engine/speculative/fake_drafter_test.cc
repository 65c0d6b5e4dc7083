#include "engine/speculative/fake_drafter.h"

#include "gtest/gtest.h"

namespace deepinfer::engine::speculative {
namespace {

TEST(FakeDrafterTest, ProposesTheOracleWithCorruptionsAndRecordsFeedback) {
  FakeDrafter d({1, 2, 3, 4, 5}, 8, {1});
  DraftProposal p;
  ASSERT_TRUE(d.Propose(7, std::vector<int32_t>{1, 2}, 4, &p).ok());
  EXPECT_EQ(p.tokens, (std::vector<int32_t>{3, 5, 5}));  // oracle 3 4 5, position 1 corrupted
  EXPECT_TRUE(p.probs.empty());
  d.OnVerified(7, p, 2, 1);
  ASSERT_EQ(d.feedback().size(), 1u);
  EXPECT_EQ(d.feedback()[0].proposed, 3);
  EXPECT_EQ(d.feedback()[0].accepted, 1);
  d.Release(7);
  EXPECT_EQ(d.released(), (std::vector<int64_t>{7}));
  EXPECT_EQ(d.Propose(7, {}, -1, &p).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deepinfer::engine::speculative
