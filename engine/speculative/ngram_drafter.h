// Prompt-lookup (n-gram) drafter: finds the longest suffix of the sequence (max_n down to min_n
// tokens) that occurred earlier in the same sequence, preferring the most recent occurrence, and
// proposes what followed it there, up to k tokens. Drafts carry no probabilities (point masses).
//
// When the continuation runs into the end of the context it continues with the tokens it has
// just proposed (a match ending at e proposes ext[e+1], ext[e+2], ... where ext is the context
// followed by the proposal), so a repeating pattern is proposed for the full k.
//
// Cost: per sequence an index of the n-grams (min_n..max_n) seen so far, keyed by a 64-bit hash
// and holding each n-gram's most recent end position. Appending a token costs O(max_n); a
// proposal costs O(max_n * max_n + k). A hash hit is checked against the tokens, so a collision
// can only hide a match, never produce a wrong one.
//
// Thread-safety: not thread-safe; use from one thread.
#ifndef DEEPINFER_ENGINE_SPECULATIVE_NGRAM_DRAFTER_H_
#define DEEPINFER_ENGINE_SPECULATIVE_NGRAM_DRAFTER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/speculative/drafter.h"

namespace deepinfer::engine::speculative {

struct NgramDrafterOptions {
  int min_n = 1;  // >= 1
  int max_n = 4;  // >= min_n, <= 64
};

class NgramDrafter : public Drafter {
 public:
  // kInvalidArgument for options out of range.
  static absl::StatusOr<std::unique_ptr<NgramDrafter>> Create(const NgramDrafterOptions& options);

  // Sets out->match_length to the matched n (0 when nothing matched and the proposal is empty).
  absl::Status Propose(int64_t seq_id, absl::Span<const int32_t> context, int k,
                       DraftProposal* out) override;
  void Release(int64_t seq_id) override;

  // Sequences with an index (for tests and metrics).
  int64_t num_sequences() const { return static_cast<int64_t>(index_.size()); }

 private:
  struct SeqIndex {
    int64_t length = 0;      // context tokens indexed
    int32_t last_token = 0;  // context[length - 1], to notice a context that was replaced
    // by_n[n - min_n]: hash of an n-gram -> most recent end position that has a successor.
    std::vector<absl::flat_hash_map<uint64_t, int64_t>> by_n;
  };

  explicit NgramDrafter(const NgramDrafterOptions& options) : options_(options) {}
  void Extend(absl::Span<const int32_t> context, SeqIndex* index) const;

  NgramDrafterOptions options_;
  absl::flat_hash_map<int64_t, SeqIndex> index_;
};

}  // namespace deepinfer::engine::speculative

#endif  // DEEPINFER_ENGINE_SPECULATIVE_NGRAM_DRAFTER_H_
