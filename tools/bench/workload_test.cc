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

TEST(WorkloadTest, MixedInterleavesLongCodingAndShortChatSessionsFromTheSeed) {
  WorkloadOptions o;
  o.kind = "mixed";
  o.sessions = 200;
  o.mixed_coding_fraction = 0.25;
  o.coding_turns = 2;
  o.coding_context_words = 800;
  o.max_input_words = 1000;
  auto w = GenerateWorkload(o);
  auto again = GenerateWorkload(o);
  ASSERT_TRUE(w.ok() && again.ok());
  int coding = 0;
  bool chat_after_coding = false;
  for (size_t i = 0; i < w->size(); ++i) {
    const SessionPlan& s = (*w)[i];
    EXPECT_EQ(s.system, (*again)[i].system);
    ASSERT_EQ(s.turns.size(), (*again)[i].turns.size());
    EXPECT_EQ(s.turns[0].instruction, (*again)[i].turns[0].instruction);
    if (s.turns.size() == 2) {
      ++coding;
      EXPECT_GT(s.system.size(), 8 * s.turns[0].instruction.size());  // long shared context
    } else {
      ASSERT_EQ(s.turns.size(), 1u);
      EXPECT_EQ(s.system, "You are a helpful assistant.");
      chat_after_coding |= coding > 0;
    }
  }
  EXPECT_GT(coding, 30);  // ~50 of 200
  EXPECT_LT(coding, 75);
  EXPECT_TRUE(chat_after_coding);  // interleaved, not one block after the other
  o.mixed_coding_fraction = 0;
  for (const auto& s : *GenerateWorkload(o)) EXPECT_EQ(s.turns.size(), 1u);
  o.mixed_coding_fraction = 1;
  for (const auto& s : *GenerateWorkload(o)) EXPECT_EQ(s.turns.size(), 2u);
}

TEST(WorkloadTest, BadOptionsNameTheOption) {
  WorkloadOptions o;
  o.kind = "poetry";
  EXPECT_NE(GenerateWorkload(o).status().message().find("kind:"), std::string::npos);
  o.kind = "chat";
  o.sessions = 0;
  EXPECT_NE(GenerateWorkload(o).status().message().find("sessions:"), std::string::npos);
  o.sessions = 1;
  o.kind = "mixed";
  o.mixed_coding_fraction = 1.5;
  EXPECT_NE(GenerateWorkload(o).status().message().find("mixed_coding_fraction:"),
            std::string::npos);
}

}  // namespace
}  // namespace deepinfer::bench
