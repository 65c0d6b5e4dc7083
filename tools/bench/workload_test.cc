#include "tools/bench/workload.h"

#include <set>

#include "gtest/gtest.h"

namespace deepinfer::bench {
namespace {

TEST(WorkloadTest, SameSeedSameWorkloadDifferentSeedDifferent) {
  WorkloadOptions o;
  o.kind = "chat";
  o.sessions = 20;
  auto a = GenerateWorkload(o);
  auto b = GenerateWorkload(o);
  o.seed = 2;
  auto c = GenerateWorkload(o);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ASSERT_EQ(a->size(), 20u);
  bool differs = false;
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].turns[0].instruction, (*b)[i].turns[0].instruction);
    EXPECT_EQ((*a)[i].turns[0].max_tokens, (*b)[i].turns[0].max_tokens);
    differs |= (*a)[i].turns[0].instruction != (*c)[i].turns[0].instruction;
  }
  EXPECT_TRUE(differs);
}

TEST(WorkloadTest, ChatLengthsAreLongTailedAndClamped) {
  WorkloadOptions o;
  o.sessions = 400;
  o.max_output_tokens = 300;
  auto w = GenerateWorkload(o);
  ASSERT_TRUE(w.ok());
  std::set<uint32_t> lengths;
  uint32_t longest = 0;
  for (const auto& s : *w) {
    ASSERT_EQ(s.turns.size(), 1u);
    EXPECT_GE(s.turns[0].max_tokens, 1u);
    EXPECT_LE(s.turns[0].max_tokens, 300u);
    lengths.insert(s.turns[0].max_tokens);
    longest = std::max(longest, s.turns[0].max_tokens);
  }
  EXPECT_GT(lengths.size(), 50u);  // a distribution, not a constant
  EXPECT_GT(longest, 250u);        // the tail reaches the clamp (median 100, sigma 0.8)
}

TEST(WorkloadTest, CodingSessionsShareOneContextAcrossTurns) {
  WorkloadOptions o;
  o.kind = "coding";
  o.sessions = 3;
  o.coding_turns = 5;
  o.coding_context_words = 300;
  auto w = GenerateWorkload(o);
  ASSERT_TRUE(w.ok());
  for (const auto& s : *w) {
    EXPECT_EQ(s.turns.size(), 5u);
    EXPECT_GT(s.system.size(), 300u);  // the long shared context
    for (const auto& t : s.turns) {
      EXPECT_LT(t.instruction.size(), s.system.size() / 4);  // short new instruction
      EXPECT_EQ(t.max_tokens, 64u);
    }
  }
  EXPECT_NE((*w)[0].system, (*w)[1].system);  // sessions have their own context
}

TEST(WorkloadTest, BadOptionsNameTheOption) {
  WorkloadOptions o;
  o.kind = "poetry";
  EXPECT_NE(GenerateWorkload(o).status().message().find("kind:"), std::string::npos);
  o.kind = "chat";
  o.sessions = 0;
  EXPECT_NE(GenerateWorkload(o).status().message().find("sessions:"), std::string::npos);
}

}  // namespace
}  // namespace deepinfer::bench
