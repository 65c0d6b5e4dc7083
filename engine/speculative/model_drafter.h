// Draft-model drafter: a small checkpoint that shares the target's tokenizer (same vocabulary)
// proposes k tokens by running k single-token forward passes on its own paged KV cache.
//
// Cache. Each sequence holds a list of blocks of the drafter's KvCache and the tokens whose KV
// is in them. Propose brings that KV up to date with the context: the longest common prefix of
// the cached tokens and the context is kept (after rejected drafts the cache holds the drafts
// the target refused; they are dropped, not the whole sequence) and only the rest is computed.
// Blocks past the kept prefix go back to the free list. After a proposal of k tokens the cache
// holds the context plus d_1..d_{k-1} (d_k is never fed), so a fully accepted draft costs only
// d_k plus the target's bonus token on the next call.
//
// Reuse across requests. Release(seq) keeps a finished sequence's KV as a retired entry (when it
// covers at least one block) instead of freeing it; a sequence the drafter has not seen adopts
// the retired entry whose tokens share the longest prefix with its context (at least one block),
// so the next turn of a conversation, whose prompt extends the previous turn's prompt and answer,
// feeds the draft model only what is new, as the target's prefix cache does. An entry is adopted
// by one sequence (its blocks change owner; nothing is shared).
//
// Memory is bounded by `num_blocks` x `block_size` token slots. When a proposal needs more
// blocks than are free, retired entries are dropped first (oldest first), then the least recently
// used other sequences are evicted (their KV is recomputed from the context on their next
// proposal); a sequence that cannot fit even then gets an empty proposal (no draft, OK status).
//
// Catch-up window. A sequence not drafted for a while (the engine ran steps without drafts), or a
// new request's prompt, lags its cache by many tokens, and feeding them all costs a prefill of
// the draft model for a few steps of drafting. With `catch_up_window` W > 0 a lag of more than W
// tokens is not fed: the cache keeps what it holds and receives the context's last W tokens in
// the slots right after it, so the draft model reads its old context followed directly by the
// recent text (a jump of the skipped tokens; positions are slots, so the jump is invisible to it).
// The cache then covers the context with one gap: slot i holds context position i before the gap
// and i + gap_len from it on. Lossless all the same (the target verifies every draft); only
// acceptance can suffer, and the recent text is what a draft continues. A second skip while a
// gap exists first drops everything after the gap (one gap at most). Released sequences keep
// their gap: a retired entry matches a new context through it.
// The window applies only while at least `catch_up_window_min_sequences` sequences decode (the
// engine says how many with set_decoding before each call); with fewer, every token is fed: a
// lone request's prompt then costs the draft model a short prefill, and its drafts see the whole
// conversation. At many sequences the window pays: each catch-up is a prefill for a few steps of
// drafting, and every later round attends to the whole conversation (figures in
// docs/speculative-decoding.md).
//
// Drafts. With temperature 0 a draft token is the arg-max of the draft logits (lowest id on
// ties) and `probs` stays empty: the verifier treats it as a point mass, which keeps rejection
// sampling lossless (the softmax is NOT the distribution a greedy draft was drawn from, so
// handing it to the verifier would bias a sampled request). With temperature T > 0 the token is
// drawn from softmax(logits / T) with the drafter's own random stream and that distribution is
// returned in `probs` (rejection sampling is lossless for any p_d the token was really drawn
// from; matching the target's temperature makes acceptance high).
//
// Survival estimates. `confidence[j]` is the largest probability of the draft's softmax (at
// temperature 1 when greedy, T otherwise) at position j, known before d_j is chosen. The engine
// feeds it to DraftCalibration (budget.h): a per-bin running ratio of observed acceptance to
// confidence, fitted isotonically and clamped to [0, 1], gives the conditional acceptance c_j;
// the survival row is a_j = prod_{i<=j} c_i, and per-position acceptance rates give the prior
// row that sizes the budget without looking at the current draft.
//
// Batching. ProposeBatch drafts all sequences of a step together: one ragged forward pass
// brings every sequence's cache up to date and yields d_1, then k - 1 passes of one token per
// sequence (sequences with smaller k, or whose DraftRequest::keep_drafting declined a position,
// drop out; a round with none left is not run).
//
// Thread-safety: not thread-safe; use from one thread (the engine's scheduler thread). The
// drafter runs the draft model's Forward, so nobody else may run that model concurrently.
#ifndef DEEPINFER_ENGINE_SPECULATIVE_MODEL_DRAFTER_H_
#define DEEPINFER_ENGINE_SPECULATIVE_MODEL_DRAFTER_H_

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/speculative/budget.h"
#include "engine/speculative/drafter.h"
#include "engine/speculative/verifier.h"

namespace deepinfer::engine::speculative {

struct ModelDrafterOptions {
  int num_blocks = 256;  // drafter KV blocks, >= 1
  int block_size = 16;   // tokens per block, >= 1
  uint64_t seed = 0;     // the drafter's random stream (sampled drafts)
  // > 0: a call feeds at most this many not-yet-cached context tokens per sequence; a sequence
  // with more (a new request's prompt, or one not drafted for a while) advances its cache by that
  // many and gets no draft this call, so one catch-up never stalls a step for long. 0: no limit.
  int max_catch_up = 0;
  // > 0: a sequence whose cache lags its context by more than this many tokens skips ahead: its
  // cached KV stays and only the context's last `catch_up_window` tokens are fed, at the cache
  // slots right after it (see "Catch-up window" above). 0: every context token is fed.
  int catch_up_window = 0;
  // >= 1: the window applies only while at least this many sequences decode (set_decoding).
  int catch_up_window_min_sequences = 1;
};

class ModelDrafter : public Drafter {
 public:
  // Drafts with `model` (not owned; must outlive the drafter). kInvalidArgument
  // "speculative.draft_model: ..." when its vocabulary size differs from `target_vocab_size`,
  // or for options out of range.
  static absl::StatusOr<std::unique_ptr<ModelDrafter>> Create(Model* model, int target_vocab_size,
                                                              const ModelDrafterOptions& options);
  // Loads the draft checkpoint from `dir` (the config is checked against the target's vocabulary
  // before any weight is read) and owns it. kInvalidArgument "speculative.draft_model: ..." for a
  // directory that does not load or a vocabulary of another size.
  static absl::StatusOr<std::unique_ptr<ModelDrafter>> Load(const std::string& dir,
                                                            int target_vocab_size,
                                                            const ModelDrafterOptions& options,
                                                            const ModelOptions& model_options = {});

  // Greedy proposal (temperature 0). kInvalidArgument for k < 0 or context tokens out of range;
  // an empty context gives an empty proposal.
  absl::Status Propose(int64_t seq_id, absl::Span<const int32_t> context, int k,
                       DraftProposal* out) override;
  absl::Status ProposeBatch(absl::Span<const DraftRequest> requests,
                            std::vector<DraftProposal>* out) override;
  void Release(int64_t seq_id) override;
  // Brings each request's draft KV up to date with its context except the last token (which the
  // next proposal feeds for its logits), at most `max_catch_up` tokens per sequence and call, in
  // one ragged forward pass; nothing is drafted (`k`, `temperature` and `keep_drafting` are
  // ignored). For an engine that is not drafting this step but may draft soon: a later proposal
  // then feeds only what came since, not everything since the last draft. Requests are validated
  // as by ProposeBatch (the first failure is returned; the others are still fed).
  absl::Status Feed(absl::Span<const DraftRequest> requests);
  // How many sequences the engine decodes in the step the next calls serve (> 0), for the catch-up
  // window's catch_up_window_min_sequences (Lag too); until set, or with 0, the window applies
  // whenever it is set.
  void set_decoding(int64_t n) { decoding_ = n; }

  // The draft model's cost per drafting round, for the adaptive draft length (budget.h
  // PlanDraftLength): one forward pass of n sequences x 1 token (after a context of 32 tokens,
  // logits for the new token) for each n in `batch_sizes` (each >= 1), `runs` (>= 5) times; the
  // table's StepSeconds(n, n) is the median, made monotone. Writes scratch KV into the drafter's
  // blocks, so it needs an empty cache: kFailedPrecondition when a sequence (or a retired entry)
  // is cached (call it before the first proposal). Forward errors are returned as they are.
  absl::StatusOr<CostTable> ProfileRoundCost(absl::Span<const int> batch_sizes, int runs = 5);

  // For tests and metrics.
  int64_t num_sequences() const { return static_cast<int64_t>(seqs_.size()); }
  int free_blocks() const { return static_cast<int>(free_.size()); }
  int num_blocks() const { return options_.num_blocks; }
  // Tokens of `seq_id` whose KV the drafter holds (0 for an unknown sequence).
  int64_t cached_length(int64_t seq_id) const;
  // Tokens a call would feed to bring `seq_id`'s cache up to a context of `context_length`
  // tokens that extends what it covers (skipped ones included): the uncovered rest, at most
  // catch_up_window when that applies (set_decoding); the whole context for an unknown sequence
  // (before any adoption of a retired entry). Feed stops one token short: ask with
  // context_length - 1.
  int64_t Lag(int64_t seq_id, int64_t context_length) const;
  int64_t skipped_tokens() const { return skipped_tokens_; }  // never fed (catch_up_window)
  int64_t evictions() const { return evictions_; }            // live sequences evicted for room
  // Blocks held by retired entries (reusable; dropped before anything is evicted).
  int reusable_blocks() const;
  // Context tokens whose KV a new sequence adopted from a retired entry instead of computing.
  int64_t reused_tokens() const { return reused_tokens_; }
  int64_t computed_tokens() const { return computed_tokens_; }  // tokens fed to the draft model
  const Model& model() const { return *model_; }

 private:
  struct SeqCache {
    std::vector<int32_t> tokens;  // tokens whose KV is cached, in slot order
    std::vector<int32_t> blocks;  // drafter block ids covering `tokens`
    uint64_t last_used = 0;
    // The skipped context (catch_up_window): slot i holds context position i for i < gap_at,
    // i + gap_len from gap_at on. gap_at < 0: no gap (slot i is position i).
    int64_t gap_at = -1;
    int64_t gap_len = 0;
    void DropGap() {
      gap_at = -1;
      gap_len = 0;
    }
  };
  // How much of `context` `seq` holds: its first `slots` cached tokens agree with the context's
  // positions they stand for, up to context position `covered` (slots + gap_len past the gap).
  struct Match {
    int64_t slots = 0;
    int64_t covered = 0;
  };
  static Match MatchContext(const SeqCache& seq, absl::Span<const int32_t> context);
  // Retired entries kept at most (each new sequence scans them once for its prefix).
  static constexpr size_t kMaxRetired = 1024;
  // One request's working state during ProposeBatch.
  struct Work;

  ModelDrafter(Model* model, std::unique_ptr<Model> owned, std::unique_ptr<KvCache> cache,
               const ModelDrafterOptions& options);
  // ProposeBatch, or with `feed_only` Feed (`out` then stays empty proposals).
  absl::Status Run(absl::Span<const DraftRequest> requests, bool feed_only,
                   std::vector<DraftProposal>* out);
  // Run's parts: the valid requests as work (their sequences appended to `pinned`; the first
  // invalid one's error in `*first`); one work item's cache matched to its context and its blocks
  // reserved (false: nothing to feed, or no room); the forward rounds over the prepared items
  // (on a forward error their KV is rolled back and the error returned).
  std::vector<Work> CollectWork(absl::Span<const DraftRequest> requests, bool feed_only,
                                std::vector<int64_t>* pinned, absl::Status* first);
  bool PrepareWork(Work* work, bool feed_only, const std::vector<int64_t>& pinned);
  absl::Status RunRounds(std::vector<Work>* ready, std::vector<DraftProposal>* out);
  // Gives `seq` (no cached tokens) the retired entry sharing the longest prefix (>= one block)
  // with `context`, if any.
  void Adopt(absl::Span<const int32_t> context, SeqCache* seq);
  // Frees the blocks of the oldest retired entry (there must be one) and forgets it.
  void DropOldestRetired();
  // Shrinks `seq` to its first `length` tokens, returning blocks no longer needed.
  void Truncate(SeqCache* seq, int64_t length);
  // Grows `seq`'s blocks to cover `positions` tokens, evicting LRU sequences not in `pinned`
  // (by id). False (nothing changed) when the blocks cannot be found.
  bool Reserve(int64_t seq_id, SeqCache* seq, int64_t positions,
               const std::vector<int64_t>& pinned);
  // Fills probs/confidence for one logits row and picks the token; -1 (nothing appended) when
  // `keep` (may be null) declines `position` (asked before the draw).
  int32_t Choose(const float* logits, float temperature, bool keep_probs,
                 const std::function<bool(int, float)>* keep, int position, DraftProposal* out);

  Model* const model_;
  std::unique_ptr<Model> owned_;
  std::unique_ptr<KvCache> cache_;
  // Whether the catch-up window applies now (catch_up_window_min_sequences, set_decoding).
  bool WindowApplies() const {
    return options_.catch_up_window > 0 &&
           (decoding_ <= 0 || decoding_ >= options_.catch_up_window_min_sequences);
  }
  const ModelDrafterOptions options_;
  int64_t decoding_ = 0;  // set_decoding; 0: not said
  const int vocab_;
  std::vector<int32_t> free_;
  absl::node_hash_map<int64_t, SeqCache> seqs_;  // node map: pointers stay valid
  std::list<SeqCache> retired_;                  // released sequences' KV, oldest first
  uint64_t clock_ = 0;
  SpecRng rng_;
  int64_t evictions_ = 0;
  int64_t computed_tokens_ = 0;
  int64_t reused_tokens_ = 0;
  int64_t skipped_tokens_ = 0;
  std::vector<float> logits_;    // workspace
  std::vector<double> weights_;  // workspace
};

}  // namespace deepinfer::engine::speculative

#endif  // DEEPINFER_ENGINE_SPECULATIVE_MODEL_DRAFTER_H_
