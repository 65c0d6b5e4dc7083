#include "engine/speculative/model_drafter.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "engine/model_config.h"
#include "kernels/softmax_cpu.h"

namespace deepinfer::engine::speculative {

struct ModelDrafter::Work {
  size_t index = 0;  // into requests / out
  int64_t seq_id = 0;
  SeqCache* seq = nullptr;
  absl::Span<const int32_t> context;
  int k = 0;
  float temperature = 0.0f;
  int64_t start = 0;       // context position of the first token fed (the cache covers the rest)
  int64_t slot_start = 0;  // cached tokens kept before this proposal (start less the gap)
  bool new_gap = false;    // this call skipped context (catch_up_window)
  const std::function<bool(int, float)>* keep = nullptr;  // DraftRequest::keep_drafting
  bool stopped = false;                                   // keep declined a position
  int64_t feed_end = 0;                                   // round 0 feeds context[start, feed_end)
  bool catching_up = false;  // feed_end < context size: no draft this call (max_catch_up)
};

namespace {

absl::Status CheckVocab(int draft_vocab, int target_vocab) {
  if (draft_vocab != target_vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "speculative.draft_model: vocab_size ", draft_vocab, " differs from the target model's ",
        target_vocab, " (the draft must share the target's tokenizer)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelDrafter>> ModelDrafter::Create(
    Model* model, int target_vocab_size, const ModelDrafterOptions& options) {
  if (model == nullptr) {
    return absl::InvalidArgumentError("speculative.draft_model: no model");
  }
  if (options.num_blocks < 1 || options.block_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "speculative.draft_model: drafter num_blocks and block_size must be >= 1, got ",
        options.num_blocks, " and ", options.block_size));
  }
  if (options.catch_up_window_min_sequences < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("speculative.draft_catch_up_window_min_sequences: expected >= 1, got ",
                     options.catch_up_window_min_sequences));
  }
  if (absl::Status s = CheckVocab(model->config().vocab_size, target_vocab_size); !s.ok()) {
    return s;
  }
  absl::StatusOr<std::unique_ptr<KvCache>> cache =
      KvCache::Create(model->MakeKvCacheConfig(options.num_blocks, options.block_size));
  if (!cache.ok()) return cache.status();
  return std::unique_ptr<ModelDrafter>(
      new ModelDrafter(model, nullptr, *std::move(cache), options));
}

absl::StatusOr<std::unique_ptr<ModelDrafter>> ModelDrafter::Load(
    const std::string& dir, int target_vocab_size, const ModelDrafterOptions& options,
    const ModelOptions& model_options) {
  absl::StatusOr<ModelConfig> config = LoadModelConfig(dir);
  if (!config.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("speculative.draft_model: ", config.status().message()));
  }
  if (absl::Status s = CheckVocab(config->vocab_size, target_vocab_size); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(dir, model_options);
  if (!model.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("speculative.draft_model: ", model.status().message()));
  }
  Model* raw = model->get();
  absl::StatusOr<std::unique_ptr<ModelDrafter>> drafter = Create(raw, target_vocab_size, options);
  if (!drafter.ok()) return drafter.status();
  (*drafter)->owned_ = *std::move(model);
  return drafter;
}

ModelDrafter::ModelDrafter(Model* model, std::unique_ptr<Model> owned,
                           std::unique_ptr<KvCache> cache, const ModelDrafterOptions& options)
    : model_(model),
      owned_(std::move(owned)),
      cache_(std::move(cache)),
      options_(options),
      vocab_(model->config().vocab_size),
      rng_(options.seed) {
  free_.reserve(options.num_blocks);
  // Hand out low block ids first.
  for (int b = options.num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int64_t ModelDrafter::cached_length(int64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? 0 : static_cast<int64_t>(it->second.tokens.size());
}

int64_t ModelDrafter::Lag(int64_t seq_id, int64_t context_length) const {
  int64_t covered = 0;
  auto it = seqs_.find(seq_id);
  if (it != seqs_.end()) {
    const SeqCache& seq = it->second;
    const int64_t n = static_cast<int64_t>(seq.tokens.size());
    // A gap with no slot after it covers nothing past it (MatchContext).
    covered = seq.gap_at >= 0 && n > seq.gap_at ? n + seq.gap_len : n;
  }
  int64_t lag = std::max<int64_t>(context_length - covered, 0);
  if (WindowApplies()) lag = std::min<int64_t>(lag, options_.catch_up_window);
  return lag;
}

ModelDrafter::Match ModelDrafter::MatchContext(const SeqCache& seq,
                                               absl::Span<const int32_t> context) {
  const int64_t n = static_cast<int64_t>(seq.tokens.size());
  const int64_t len = static_cast<int64_t>(context.size());
  const int64_t before_gap = seq.gap_at < 0 ? n : std::min(seq.gap_at, n);
  int64_t i = 0;
  while (i < before_gap && i < len && seq.tokens[i] == context[i]) ++i;
  Match m;
  m.slots = m.covered = i;
  if (seq.gap_at < 0 || i < seq.gap_at) return m;
  // Past the gap slot j stands for context position j + gap_len. A gap with no agreeing slot
  // after it covers nothing: the skipped text was never seen, and only a slot that agrees past it
  // shows that this context continues the one that was skipped.
  int64_t j = seq.gap_at;
  while (j < n && j + seq.gap_len < len && seq.tokens[j] == context[j + seq.gap_len]) ++j;
  if (j > seq.gap_at) {
    m.slots = j;
    m.covered = j + seq.gap_len;
  }
  return m;
}

int ModelDrafter::reusable_blocks() const {
  int n = 0;
  for (const SeqCache& r : retired_) n += static_cast<int>(r.blocks.size());
  return n;
}

void ModelDrafter::Adopt(absl::Span<const int32_t> context, SeqCache* seq) {
  Truncate(seq, 0);
  const int64_t len = static_cast<int64_t>(context.size());
  auto best = retired_.end();
  int64_t best_covered = 0;
  int64_t best_slots = 0;
  for (auto it = retired_.begin(); it != retired_.end(); ++it) {
    const Match m = MatchContext(*it, context);
    // Less than a block of agreeing KV is not worth an entry.
    if (m.slots >= options_.block_size && m.covered > best_covered) {
      best = it;
      best_covered = m.covered;
      best_slots = m.slots;
    }
  }
  if (best == retired_.end()) return;
  seq->tokens = std::move(best->tokens);
  seq->blocks = std::move(best->blocks);
  seq->gap_at = best->gap_at;
  seq->gap_len = best->gap_len;
  retired_.erase(best);
  reused_tokens_ += std::min(best_slots, len - 1);  // the last context token is fed again
}

void ModelDrafter::DropOldestRetired() {
  free_.insert(free_.end(), retired_.front().blocks.begin(), retired_.front().blocks.end());
  retired_.pop_front();
}

void ModelDrafter::Truncate(SeqCache* seq, int64_t length) {
  if (static_cast<int64_t>(seq->tokens.size()) > length) seq->tokens.resize(length);
  if (seq->gap_at >= 0 && length <= seq->gap_at) seq->DropGap();  // nothing past it is left
  const int64_t bs = options_.block_size;
  const size_t keep = static_cast<size_t>((length + bs - 1) / bs);
  while (seq->blocks.size() > keep) {
    free_.push_back(seq->blocks.back());
    seq->blocks.pop_back();
  }
}

bool ModelDrafter::Reserve(int64_t seq_id, SeqCache* seq, int64_t positions,
                           const std::vector<int64_t>& pinned) {
  const int64_t bs = options_.block_size;
  const int64_t need = (positions + bs - 1) / bs - static_cast<int64_t>(seq->blocks.size());
  if (need <= 0) return true;
  if (need > options_.num_blocks) return false;
  while (static_cast<int64_t>(free_.size()) < need) {
    if (!retired_.empty()) {
      DropOldestRetired();  // retired entries go first, oldest first
      continue;
    }
    // Evict the least recently used sequence that is not part of the current proposal.
    auto victim = seqs_.end();
    for (auto it = seqs_.begin(); it != seqs_.end(); ++it) {
      if (it->first == seq_id || it->second.blocks.empty()) continue;
      if (std::find(pinned.begin(), pinned.end(), it->first) != pinned.end()) continue;
      if (victim == seqs_.end() || it->second.last_used < victim->second.last_used) victim = it;
    }
    if (victim == seqs_.end()) return false;
    free_.insert(free_.end(), victim->second.blocks.begin(), victim->second.blocks.end());
    seqs_.erase(victim);
    ++evictions_;
  }
  for (int64_t i = 0; i < need; ++i) {
    seq->blocks.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

int32_t ModelDrafter::Choose(const float* logits, float temperature, bool keep_probs,
                             const std::function<bool(int, float)>* keep, int position,
                             DraftProposal* out) {
  const float inv_t = temperature > 0.0f ? 1.0f / temperature : 1.0f;
  const int32_t best = static_cast<int32_t>(kernels::ArgMaxCpu(logits, vocab_));
  const float max_logit = logits[best];
  double total = 0.0;
  if (temperature <= 0.0f) {
    // Greedy: only the normaliser (the confidence) is needed, not each token's weight.
    total = kernels::SumExpCpu(logits, vocab_, max_logit);
  } else {
    weights_.resize(vocab_);
    for (int v = 0; v < vocab_; ++v) {
      weights_[v] = std::exp(static_cast<double>((logits[v] - max_logit) * inv_t));
      total += weights_[v];
    }
  }
  // The arg-max has weight 1: its probability is the largest.
  const float confidence = static_cast<float>(1.0 / total);
  // Asked before the token is drawn: the answer never depends on it.
  if (keep != nullptr && !(*keep)(position, confidence)) return -1;
  out->confidence.push_back(confidence);
  if (temperature <= 0.0f) return best;
  int32_t token = best;
  double u = rng_.Uniform() * total;
  for (int v = 0; v < vocab_; ++v) {
    u -= weights_[v];
    if (u < 0.0 && weights_[v] > 0.0) {
      token = v;
      break;
    }
  }
  if (keep_probs) {
    const size_t base = out->probs.size();
    out->probs.resize(base + vocab_);
    for (int v = 0; v < vocab_; ++v) out->probs[base + v] = static_cast<float>(weights_[v] / total);
  }
  return token;
}

absl::Status ModelDrafter::Propose(int64_t seq_id, absl::Span<const int32_t> context, int k,
                                   DraftProposal* out) {
  DraftRequest request;
  request.seq_id = seq_id;
  request.context = context;
  request.k = k;
  std::vector<DraftProposal> proposals;
  absl::Status s = ProposeBatch(absl::MakeConstSpan(&request, 1), &proposals);
  *out = std::move(proposals[0]);
  return s;
}

absl::Status ModelDrafter::ProposeBatch(absl::Span<const DraftRequest> requests,
                                        std::vector<DraftProposal>* out) {
  return Run(requests, /*feed_only=*/false, out);
}

absl::Status ModelDrafter::Feed(absl::Span<const DraftRequest> requests) {
  std::vector<DraftProposal> unused;
  return Run(requests, /*feed_only=*/true, &unused);
}

absl::Status ModelDrafter::Run(absl::Span<const DraftRequest> requests, bool feed_only,
                               std::vector<DraftProposal>* out) {
  out->assign(requests.size(), DraftProposal());
  absl::Status first = absl::OkStatus();
  ++clock_;
  std::vector<int64_t> pinned;
  std::vector<Work> work = CollectWork(requests, feed_only, &pinned, &first);
  std::vector<Work> ready;
  for (Work& w : work) {
    if (PrepareWork(&w, feed_only, pinned)) ready.push_back(w);
  }
  if (ready.empty()) return first;
  absl::Status fed = RunRounds(&ready, out);
  if (!fed.ok() && first.ok()) first = std::move(fed);
  return first;
}

std::vector<ModelDrafter::Work> ModelDrafter::CollectWork(absl::Span<const DraftRequest> requests,
                                                          bool feed_only,
                                                          std::vector<int64_t>* pinned,
                                                          absl::Status* first) {
  auto fail = [&](absl::Status s) {
    if (first->ok()) *first = std::move(s);
  };
  // Validate and pin the sequences of this proposal (they are never evicted for one another).
  std::vector<Work> work;
  absl::flat_hash_set<int64_t> seen;
  for (size_t i = 0; i < requests.size(); ++i) {
    const DraftRequest& r = requests[i];
    if (r.k < 0) {
      fail(absl::InvalidArgumentError(absl::StrCat("draft model k: expected >= 0, got ", r.k)));
      continue;
    }
    if (!seen.insert(r.seq_id).second) {
      fail(absl::InvalidArgumentError(
          absl::StrCat("draft model: sequence ", r.seq_id, " appears twice in one batch")));
      continue;
    }
    bool in_range = true;
    for (size_t t = 0; t < r.context.size() && in_range; ++t) {
      if (r.context[t] < 0 || r.context[t] >= vocab_) {
        fail(absl::InvalidArgumentError(absl::StrCat("draft model context[", t, "]: expected < ",
                                                     vocab_, ", got ", r.context[t])));
        in_range = false;
      }
    }
    // Feeding stops before the last context token (the next proposal feeds it for its logits),
    // so a context of one token has nothing to feed.
    if (!in_range || r.context.empty() || (feed_only ? r.context.size() < 2 : r.k == 0)) continue;
    Work w;
    w.index = i;
    w.seq_id = r.seq_id;
    w.context = r.context;
    w.k = feed_only ? 1 : r.k;  // one round: round 0 feeds, nothing is drawn
    w.temperature = r.temperature;
    if (r.keep_drafting) w.keep = &r.keep_drafting;
    work.push_back(w);
    pinned->push_back(r.seq_id);
  }
  return work;
}

bool ModelDrafter::PrepareWork(Work* work, bool feed_only, const std::vector<int64_t>& pinned) {
  // Keep the cached prefix the context still agrees with (rejected drafts are dropped; at least
  // the last context token is fed again so that its logits come out), then reserve blocks for
  // the context and the k - 1 drafts that will be fed.
  Work& w = *work;
  SeqCache& seq = seqs_[w.seq_id];
  seq.last_used = clock_;
  if (seq.tokens.empty() && !retired_.empty()) Adopt(w.context, &seq);
  const int64_t len = static_cast<int64_t>(w.context.size());
  const Match m = MatchContext(seq, w.context);
  int64_t slots = m.slots;
  int64_t covered = m.covered;
  if (covered > len - 1) {
    // At least the last context token is fed again, for its logits.
    const int64_t back = covered - (len - 1);
    slots -= back;
    covered -= back;
  }
  // Drops a gap with nothing left after it: the cache then covers exactly its slots.
  Truncate(&seq, slots);
  if (seq.gap_at < 0) covered = slots;
  const int64_t end = feed_only ? len - 1 : len;
  if (covered >= end) return false;  // feeding only: already up to date
  if (WindowApplies() && end - covered > options_.catch_up_window) {
    // Skip to the last catch_up_window tokens; one gap at most, so what came after an earlier
    // one goes first.
    if (seq.gap_at >= 0) {
      slots = seq.gap_at;
      Truncate(&seq, slots);
    }
    const int64_t from = end - options_.catch_up_window;
    skipped_tokens_ += from - covered;
    covered = from;
    seq.gap_at = slots;
    seq.gap_len = from - slots;
    w.new_gap = true;
  }
  w.start = covered;
  w.slot_start = slots;
  w.feed_end = end;
  if (options_.max_catch_up > 0 && end - w.start > options_.max_catch_up) {
    w.feed_end = w.start + options_.max_catch_up;
  }
  // Feeding only stops after round 0 as a catching-up proposal does.
  w.catching_up = feed_only || w.feed_end < len;
  const int64_t fed_slots = slots + (w.feed_end - w.start);
  const int64_t positions = w.catching_up ? fed_slots : fed_slots + w.k - 1;
  if (!Reserve(w.seq_id, &seq, positions, pinned)) {
    if (w.new_gap) seq.DropGap();  // nothing fed after it
    return false;                  // no room: no draft
  }
  w.seq = &seq;
  return true;
}

absl::Status ModelDrafter::RunRounds(std::vector<Work>* ready_work,
                                     std::vector<DraftProposal>* out) {
  std::vector<Work>& ready = *ready_work;
  // Round 0 feeds each sequence's uncached context; round r >= 1 feeds draft r.
  std::vector<SequenceInput> inputs;
  std::vector<Work*> active;
  std::vector<int32_t> fed(ready.size());
  int max_k = 0;
  for (const Work& w : ready) max_k = std::max(max_k, w.k);
  for (int round = 0; round < max_k; ++round) {
    inputs.clear();
    active.clear();
    for (size_t i = 0; i < ready.size(); ++i) {
      Work& w = ready[i];
      if (round >= w.k || w.stopped) continue;
      const int64_t len = static_cast<int64_t>(w.context.size());
      SequenceInput in;
      if (round == 0) {
        in.tokens = w.context.data() + w.start;
        in.num_tokens = w.feed_end - w.start;
        in.start_position = w.slot_start;
      } else {
        fed[i] = (*out)[w.index].tokens.back();
        in.tokens = &fed[i];
        in.num_tokens = 1;
        in.start_position = w.slot_start + (len - w.start) + round - 1;
      }
      in.block_table = w.seq->blocks.data();
      in.num_blocks = static_cast<int64_t>(w.seq->blocks.size());
      inputs.push_back(in);
      active.push_back(&w);
    }
    if (inputs.empty()) break;  // every draft stopped early
    absl::Status s = model_->Forward(inputs, cache_.get(), &logits_);
    if (!s.ok()) {
      // KV written by this proposal may be partial: keep only what was valid before it.
      for (Work& w : ready) {
        Truncate(w.seq, w.slot_start);
        if (w.new_gap) w.seq->DropGap();  // nothing valid after it
        (*out)[w.index] = DraftProposal();
      }
      return s;
    }
    for (size_t j = 0; j < active.size(); ++j) {
      Work& w = *active[j];
      computed_tokens_ += inputs[j].num_tokens;
      if (round == 0) {
        w.seq->tokens.insert(w.seq->tokens.end(), w.context.begin() + w.start,
                             w.context.begin() + w.feed_end);
        if (w.catching_up) {
          w.stopped = true;  // the rest of the context comes in later calls
          continue;
        }
      } else {
        w.seq->tokens.push_back(*inputs[j].tokens);
      }
      DraftProposal& p = (*out)[w.index];
      const bool sampled = w.temperature > 0.0f;
      const int32_t token =
          Choose(logits_.data() + j * vocab_, w.temperature, sampled, w.keep, round, &p);
      if (token < 0) {
        w.stopped = true;  // its cache holds the context and the drafts fed so far
        continue;
      }
      p.tokens.push_back(token);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CostTable> ModelDrafter::ProfileRoundCost(absl::Span<const int> batch_sizes,
                                                         int runs) {
  if (!seqs_.empty() || !retired_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("draft model profile: expected an empty cache, got ", seqs_.size(),
                     " sequences and ", retired_.size(), " retired entries"));
  }
  constexpr int64_t kContext = 32;
  const int64_t per_blocks = (kContext + 1 + options_.block_size - 1) / options_.block_size;
  std::vector<int32_t> tokens;
  std::vector<int32_t> tables;
  std::vector<SequenceInput> batch;
  auto run = [&](int n, int) -> absl::StatusOr<double> {
    if (n < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("draft model profile batch size: expected >= 1, got ", n));
    }
    // Scratch blocks, shared round-robin when the cache is smaller than the batch: only the
    // time is kept.
    tokens.resize(n);
    tables.resize(static_cast<size_t>(n) * per_blocks);
    for (int i = 0; i < n; ++i) tokens[i] = (i * 131 + 7) % vocab_;
    for (size_t i = 0; i < tables.size(); ++i) {
      tables[i] = static_cast<int32_t>(i % options_.num_blocks);
    }
    batch.assign(n, SequenceInput());
    for (int i = 0; i < n; ++i) {
      batch[i].tokens = &tokens[i];
      batch[i].num_tokens = 1;
      batch[i].start_position = kContext;
      batch[i].block_table = tables.data() + i * per_blocks;
      batch[i].num_blocks = per_blocks;
    }
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status s = model_->Forward(batch, cache_.get(), &logits_);
    if (!s.ok()) return s;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<std::pair<int, int>> shapes;
  for (int n : batch_sizes) shapes.emplace_back(n, n);
  // ProfileCostTable warms each shape (buffers, rope tables, caches) before measuring it.
  return ProfileCostTable(run, shapes, runs);
}

void ModelDrafter::Release(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  SeqCache& seq = it->second;
  // Only whole blocks of valid tokens are worth keeping (reserved draft slots past them are not).
  const int64_t bs = options_.block_size;
  const int64_t keep = static_cast<int64_t>(seq.tokens.size()) / bs * bs;
  if (keep > 0) {
    Truncate(&seq, keep);
    retired_.push_back(std::move(seq));
    if (retired_.size() > kMaxRetired) DropOldestRetired();
  } else {
    free_.insert(free_.end(), seq.blocks.begin(), seq.blocks.end());
  }
  seqs_.erase(it);
}

}  // namespace deepinfer::engine::speculative
