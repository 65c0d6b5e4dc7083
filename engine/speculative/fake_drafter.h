// A scripted Drafter for tests: proposes the continuation of a fixed "oracle" sequence (what the
// target would generate), corrupting the token at chosen draft positions, and records feedback.
//
// Thread-safety: not thread-safe.
#ifndef DEEPINFER_ENGINE_SPECULATIVE_FAKE_DRAFTER_H_
#define DEEPINFER_ENGINE_SPECULATIVE_FAKE_DRAFTER_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/speculative/drafter.h"

namespace deepinfer::engine::speculative {

class FakeDrafter : public Drafter {
 public:
  struct Feedback {
    int64_t seq_id;
    int proposed, verified, accepted;
  };

  // Proposes oracle[context.size() ...], at most k tokens and as many as the oracle has; a draft
  // position listed in `wrong_positions` gets (oracle token + 1) % vocab instead.
  FakeDrafter(std::vector<int32_t> oracle, int vocab, std::vector<int> wrong_positions = {})
      : oracle_(std::move(oracle)), vocab_(vocab), wrong_(std::move(wrong_positions)) {}

  absl::Status Propose(int64_t seq_id, absl::Span<const int32_t> context, int k,
                       DraftProposal* out) override {
    *out = DraftProposal();
    if (k < 0)
      return absl::InvalidArgumentError(absl::StrCat("fake drafter k: expected >= 0, got ", k));
    for (int j = 0; j < k && context.size() + j < oracle_.size(); ++j) {
      int32_t t = oracle_[context.size() + j];
      for (int w : wrong_) {
        if (w == j) t = (t + 1) % vocab_;
      }
      out->tokens.push_back(t);
    }
    return absl::OkStatus();
  }
  void OnVerified(int64_t seq_id, const DraftProposal& proposal, int verified,
                  int accepted) override {
    feedback_.push_back({seq_id, static_cast<int>(proposal.tokens.size()), verified, accepted});
  }
  void Release(int64_t seq_id) override { released_.push_back(seq_id); }

  const std::vector<Feedback>& feedback() const { return feedback_; }
  const std::vector<int64_t>& released() const { return released_; }

 private:
  std::vector<int32_t> oracle_;
  int vocab_;
  std::vector<int> wrong_;
  std::vector<Feedback> feedback_;
  std::vector<int64_t> released_;
};

}  // namespace deepinfer::engine::speculative

#endif  // DEEPINFER_ENGINE_SPECULATIVE_FAKE_DRAFTER_H_
