// Drafters for speculative decoding: something that guesses the next few tokens of a sequence
// cheaply, so the target model can check several tokens in one forward pass (verifier.h).
//
// Implementations: prompt lookup / n-gram (ngram_drafter.h); a small draft model sharing the
// target's tokenizer, and MTP heads, plug in behind the same interface. A drafter that cannot
// give probabilities leaves `DraftProposal::probs` empty and its tokens are treated as point
// masses by the verifier, which is lossless for any drafter whose choice does not look at the
// target's random draws.
//
// Thread-safety: a Drafter is used from one thread (the engine's scheduler thread); methods are
// not thread-safe unless an implementation says otherwise.
#ifndef DEEPINFER_ENGINE_SPECULATIVE_DRAFTER_H_
#define DEEPINFER_ENGINE_SPECULATIVE_DRAFTER_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace deepinfer::engine::speculative {

struct DraftProposal {
  // Proposed continuation, at most the `k` asked for; empty when the drafter has no guess.
  std::vector<int32_t> tokens;
  // Either empty (point masses) or tokens.size() * vocab_size values: row j is the draft's
  // (processed, normalised) distribution from which tokens[j] was chosen.
  std::vector<float> probs;
  // Per token, a confidence known before the token was chosen (for a draft model: the largest
  // probability of row j), fed to DraftCalibration (budget.h). Empty for drafters without one.
  std::vector<float> confidence;
  // n-gram drafters: length of the suffix that matched (0 for other drafters); keys
  // NgramSurvivalStats (budget.h).
  int match_length = 0;
};

// One sequence's request in a batched proposal (Drafter::ProposeBatch).
struct DraftRequest {
  int64_t seq_id = 0;
  absl::Span<const int32_t> context;
  int k = 0;
  // The request's sampling temperature: 0 (greedy) or > 0. A drafter that samples its drafts
  // (a draft model) draws from its distribution at this temperature and returns it in `probs`;
  // at 0 it proposes its arg-max as point masses. Drafters without a distribution ignore it.
  float temperature = 0.0f;
  // Optional early stop (drafters with a confidence: a draft model). Before choosing token j (j =
  // 0, 1, ...) the drafter calls keep_drafting(j, confidence of position j's distribution); false
  // ends this request's draft with tokens 0..j-1 (token j is not chosen nor returned). The decision
  // uses only what is known before d_j is chosen, so verifying exactly the drafted tokens keeps
  // rejection sampling lossless. Unset: draft k tokens. Drafters without a confidence ignore it.
  std::function<bool(int position, float confidence)> keep_drafting;
};

class Drafter {
 public:
  virtual ~Drafter() = default;

  // Proposes up to `k` (>= 0) tokens that continue `context` (the sequence's prompt and accepted
  // output, in order). `seq_id` names the sequence so a drafter may keep per-sequence state;
  // between calls for one seq_id the context only grows by appending (after a rollback or
  // preemption call Release first). Clears `out` first. kInvalidArgument for k < 0.
  virtual absl::Status Propose(int64_t seq_id, absl::Span<const int32_t> context, int k,
                               DraftProposal* out) = 0;

  // Proposals for several sequences at once (out[i] for requests[i]; `out` is resized). A
  // failure for one request leaves its proposal empty; the returned status is the first failure.
  // The default proposes one at a time; a draft model batches its forward passes.
  virtual absl::Status ProposeBatch(absl::Span<const DraftRequest> requests,
                                    std::vector<DraftProposal>* out) {
    out->assign(requests.size(), DraftProposal());
    absl::Status first = absl::OkStatus();
    for (size_t i = 0; i < requests.size(); ++i) {
      absl::Status s = Propose(requests[i].seq_id, requests[i].context, requests[i].k, &(*out)[i]);
      if (!s.ok()) {
        (*out)[i] = DraftProposal();
        if (first.ok()) first = s;
      }
    }
    return first;
  }

  // Feedback after verification: of `proposal`'s tokens the first `verified` were checked by the
  // target and the first `accepted` (<= verified) of those were accepted.
  virtual void OnVerified(int64_t seq_id, const DraftProposal& proposal, int verified,
                          int accepted) {}

  // Forgets the sequence's state (finished, aborted or preempted).
  virtual void Release(int64_t seq_id) {}
};

}  // namespace deepinfer::engine::speculative

#endif  // DEEPINFER_ENGINE_SPECULATIVE_DRAFTER_H_
