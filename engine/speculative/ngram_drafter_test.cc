#include "engine/speculative/ngram_drafter.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace deepinfer::engine::speculative {
namespace {

std::unique_ptr<NgramDrafter> Make(int min_n, int max_n) {
  auto d = NgramDrafter::Create({min_n, max_n});
  EXPECT_TRUE(d.ok()) << d.status();
  return *std::move(d);
}

std::vector<int32_t> Propose(NgramDrafter* d, const std::vector<int32_t>& ctx, int k,
                             int* match = nullptr, int64_t seq = 1) {
  DraftProposal p;
  EXPECT_TRUE(d->Propose(seq, ctx, k, &p).ok());
  if (match != nullptr) *match = p.match_length;
  EXPECT_TRUE(p.probs.empty());
  return p.tokens;
}

// The specification, written the slow way.
std::vector<int32_t> Reference(const std::vector<int32_t>& ctx, int min_n, int max_n, int k,
                               int* match) {
  const int len = ctx.size();
  *match = 0;
  if (k == 0) return {};
  for (int n = std::min(max_n, len - 1); n >= min_n; --n) {
    for (int end = len - 2; end >= n - 1; --end) {
      bool eq = true;
      for (int i = 0; i < n; ++i) eq = eq && ctx[end - i] == ctx[len - 1 - i];
      if (!eq) continue;
      *match = n;
      std::vector<int32_t> ext = ctx;
      std::vector<int32_t> out;
      for (int i = 0; i < k; ++i) {
        out.push_back(ext[end + 1 + i]);
        ext.push_back(out.back());
      }
      return out;
    }
  }
  return {};
}

TEST(NgramDrafterTest, RejectsBadOptions) {
  EXPECT_EQ(NgramDrafter::Create({0, 3}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NgramDrafter::Create({3, 2}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NgramDrafter::Create({1, 65}).status().code(), absl::StatusCode::kInvalidArgument);
  auto d = Make(1, 3);
  DraftProposal p;
  EXPECT_EQ(d->Propose(1, std::vector<int32_t>{1, 2}, -1, &p).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NgramDrafterTest, EmptyShortAndZeroK) {
  auto d = Make(1, 3);
  int m = -1;
  EXPECT_TRUE(Propose(d.get(), {}, 4, &m).empty());
  EXPECT_EQ(m, 0);
  EXPECT_TRUE(Propose(d.get(), {7}, 4, &m, 2).empty());
  EXPECT_TRUE(Propose(d.get(), {7, 7}, 0, &m, 3).empty());
  EXPECT_EQ(m, 0);
  EXPECT_EQ(Propose(d.get(), {7, 7}, 3, &m, 4), (std::vector<int32_t>{7, 7, 7}));
  EXPECT_EQ(m, 1);
}

TEST(NgramDrafterTest, NoMatch) {
  auto d = Make(1, 3);
  int m = -1;
  EXPECT_TRUE(Propose(d.get(), {1, 2, 3, 4, 5}, 4, &m).empty());
  EXPECT_EQ(m, 0);
  auto d2 = Make(2, 3);  // a single repeated token is too short a match
  EXPECT_TRUE(Propose(d2.get(), {1, 2, 3, 1}, 4, &m).empty());
}

TEST(NgramDrafterTest, LongestMatchWinsOverMoreRecentShorterOne) {
  auto d = Make(1, 3);
  // Suffix [1 2 3]: occurs at 0..2 (followed by 9); [2 3] alone more recently (followed by 8).
  int m = 0;
  EXPECT_EQ(Propose(d.get(), {1, 2, 3, 9, 2, 3, 8, 1, 2, 3}, 2, &m), (std::vector<int32_t>{9, 2}));
  EXPECT_EQ(m, 3);
}

TEST(NgramDrafterTest, MostRecentOccurrencePreferred) {
  auto d = Make(2, 2);
  int m = 0;
  EXPECT_EQ(Propose(d.get(), {5, 6, 1, 5, 6, 2, 5, 6}, 1, &m), (std::vector<int32_t>{2}));
  EXPECT_EQ(m, 2);
}

TEST(NgramDrafterTest, ContinuationRunsIntoItsOwnProposal) {
  auto d = Make(1, 4);
  EXPECT_EQ(Propose(d.get(), {4, 1, 2, 1, 2}, 5), (std::vector<int32_t>{1, 2, 1, 2, 1}));
}

TEST(NgramDrafterTest, IncrementalIndexMatchesReferenceOnRandomContexts) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 40; ++trial) {
    const int vocab = 2 + trial % 5;
    const int min_n = 1 + trial % 3;
    const int max_n = min_n + trial % 4;
    auto d = Make(min_n, max_n);
    std::vector<int32_t> ctx;
    for (int step = 0; step < 120; ++step) {
      // Grow by 1..3 tokens between proposals, as accepted drafts do.
      for (int g = 0, n = 1 + rng() % 3; g < n; ++g) ctx.push_back(rng() % vocab);
      const int k = rng() % 6;
      int m = -1, ref_m = -1;
      const auto got = Propose(d.get(), ctx, k, &m, trial);
      const auto want = Reference(ctx, min_n, max_n, k, &ref_m);
      ASSERT_EQ(got, want) << "trial " << trial << " step " << step;
      if (k > 0) {
        ASSERT_EQ(m, ref_m);
      }
    }
  }
}

TEST(NgramDrafterTest, ReplacedContextRebuildsAndReleaseForgets) {
  auto d = Make(1, 2);
  EXPECT_EQ(Propose(d.get(), {1, 2, 3, 1}, 2), (std::vector<int32_t>{2, 3}));
  // Same id, a different history (e.g. after preemption with Release skipped): no stale match.
  EXPECT_EQ(Propose(d.get(), {1, 9, 1}, 2), (std::vector<int32_t>{9, 1}));
  EXPECT_TRUE(Propose(d.get(), {4, 1}, 2).empty());  // shorter than what was indexed
  EXPECT_EQ(d->num_sequences(), 1);
  d->Release(1);
  EXPECT_EQ(d->num_sequences(), 0);
}

TEST(NgramDrafterTest, SequencesAreIndependent) {
  auto d = Make(1, 2);
  EXPECT_TRUE(Propose(d.get(), {1, 2}, 2, nullptr, 10).empty());
  EXPECT_TRUE(Propose(d.get(), {3, 1}, 2, nullptr, 11).empty());
  EXPECT_EQ(Propose(d.get(), {1, 2, 1}, 2, nullptr, 10), (std::vector<int32_t>{2, 1}));
}

}  // namespace
}  // namespace deepinfer::engine::speculative
