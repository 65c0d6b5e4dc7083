#include "engine/llm_engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "engine/block_hash.h"
#include "engine/chat_template/chat_template.h"
#include "engine/speculative/budget.h"
#include "engine/speculative/drafter.h"
#include "engine/speculative/model_drafter.h"
#include "engine/speculative/ngram_drafter.h"
#include "engine/speculative/verifier.h"
#include "kernels/cpu_features.h"
#include "kernels/linear_cpu.h"
#include "spdlog/spdlog.h"

namespace deepinfer::engine {
namespace {

using Clock = std::chrono::steady_clock;

int64_t Micros(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration_cast<std::chrono::microseconds>(to - from).count();
}

double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// Adaptive speculative decoding: weight of each step's overhead sample in the running average.
constexpr double kOverheadWeight = 0.1;
// ... and the most a sample counts for, as a multiple of the average (or of a floor): a step the
// OS descheduled for tens of milliseconds then moves it by at most 30% (0.1 x 3), where it made
// drafting look hundreds of times dearer, and only drafting steps (none, then) would have brought
// it back. A lasting change (a slower machine) is still followed, a bounded step at a time.
constexpr double kOutlierFactor = 4.0;

double BoundedEmaStep(double ema, double sample, double floor) {
  return ema + kOverheadWeight * (std::min(sample, kOutlierFactor * std::max(ema, floor)) - ema);
}
// Every this many epochs of the mode selector, its measured rates go to the log.
constexpr int64_t kSelectorLogEpochs = 64;
// A draft model drafts a longer draft (or any) only when the plan expects it to beat the best
// shorter one by this much: a near tie is decided by estimation noise, and drafts are paid for.
constexpr double kDraftLengthMinGain = 0.03;

}  // namespace

struct LlmEngine::Sequence {
  enum class State { kWaiting, kRunning, kAwaitingKv, kHeld, kFinished };
  uint64_t id = 0;
  std::string request_id;
  std::vector<int32_t> tokens;  // prompt + generated
  int64_t prompt_len = 0;       // original prompt
  // Multimodal prompts: the images (their data keeps `embedding_rows` valid), the same runs for
  // hashing, where the last run ends, and per prompt position the image row replacing its
  // embedding (null elsewhere; empty without images or without their data).
  std::vector<ImageEmbeddings> images;
  std::vector<ImageSpan> image_spans;
  int64_t images_end = 0;
  std::vector<const float*> embedding_rows;
  SamplingParams sampling;
  std::unique_ptr<Sampler> sampler;  // without speculative decoding
  // With speculative decoding: samples and verifies instead of `sampler` (same distribution and
  // penalty history; its own random stream).
  std::unique_ptr<speculative::Verifier> verifier;
  // Drafts chosen for the step being planned (Draft -> Schedule's plan).
  std::vector<int32_t> draft;
  int draft_match = 0;
  std::vector<float> draft_probs;       // empty (point masses) or draft.size() x vocab
  std::vector<float> draft_confidence;  // draft model: per token, for DraftCalibration
  OutputCallback on_output;
  int priority = 0;
  uint64_t arrival = 0;
  uint64_t root_hash = 0;
  State state = State::kWaiting;

  bool has_blocks = false;
  int64_t computed = 0;                // tokens whose KV is in the cache
  int64_t scheduled_end = 0;           // tokens whose KV will be there after planned steps
  int pending_samples = 0;             // in-flight or planned steps that sample for it
  int in_flight = 0;                   // submitted steps that reference its blocks
  std::vector<uint64_t> block_hashes;  // chain over its committed full blocks
  bool preempt_requested = false;
  uint64_t epoch = 0;  // bumped by each preemption: plans made before it are void

  RequestUsage usage;
  std::unique_ptr<TextStream> text;
  Clock::time_point last_token_at;
  int64_t itl_sum_us = 0;
  bool counted_cache = false;
  Clock::time_point arrived;
  bool scheduled_once = false;
  bool first_token_seen = false;
  bool aborted = false;
  bool abort_pending = false;  // aborted while awaiting KV or held: ends on the caller's call
  bool prefill_only = false;
  PrefillCallback prefill_done;

  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
};

struct LlmEngine::Planned {
  Sequence* seq = nullptr;
  uint64_t epoch = 0;
  int64_t start = 0;
  int64_t count = 0;
  bool sample = false;
  std::vector<int32_t> draft;  // speculative tokens after the one known input token
  int draft_match = 0;         // the n-gram drafter's match length for them
  std::vector<float> draft_probs;       // as Sequence::draft_probs, for these drafts
  std::vector<float> draft_confidence;  // as Sequence::draft_confidence
  std::vector<int32_t> table;
  std::vector<int32_t> input;
  std::vector<const float*> embedding_rows;  // per input token, or empty (no image rows)
  SampleResult result;
  speculative::VerifyResult verify;  // with a draft: the emitted tokens instead of `result`
};

struct LlmEngine::Step {
  std::vector<Planned> items;
  absl::Status status;
  double forward_seconds = 0.0;
  Clock::time_point done_at;
  bool external = false;  // a token computed elsewhere (remote prefill): not a step of ours
  // Adaptive speculative decoding: the step's period (from the previous step's Process, or
  // from Schedule after an idle engine, through its own Process) is compared with its
  // prediction (cost table + predicted drafting) to learn the per-step overhead.
  bool spec_timed = false;
  Clock::time_point spec_start;
  double spec_draft_predicted = 0.0;
  double spec_draft_model_seconds = 0.0;  // measured drafting time of a draft model
  double spec_draft_seconds = 0.0;        // measured drafting time, any drafter
  // Ran on the executor while the next step was scheduled: then spec_start is where its period
  // began (the previous step's processing end) and its overhead feeds the overlap estimate.
  bool spec_overlapped = false;
  // For the measured check (speculative::DraftingRateCheck): decoding sequences when planned, and
  // whether the plan drafted (1), did not (0) or the step is not compared (-1: a probe).
  int spec_decoding = 0;
  int spec_drafting = -1;
  // The mode selector's mode for the step (-1: none), whether it is measured, and the decoding
  // sequences when it was planned.
  int spec_mode = -1;
  bool spec_mode_measured = false;
  // The draft model caught up on a whole prompt in this step (a new request, or one whose draft
  // KV was evicted): a cost every drafting mode and the upkeep pay once per request, left out of
  // the selector's comparison of modes, where whichever epoch met the arrival paid all of it.
  bool spec_prompt_catch_up = false;
  // The step also computes prompt tokens (a prefill chunk beside the decodes: a node that
  // prefills locally, a recompute after preemption). Its period is mostly the prompt's, and
  // whichever mode's step met it would pay for it in the selector's comparison (a trial's early
  // stop cuts short a challenger that met one, not an incumbent): left out as well.
  bool spec_prompt_tokens = false;
  // Time this step spent feeding a draft model while drafting nothing (UpkeepDrafter).
  double spec_upkeep_seconds = 0.0;
  // Of the drafting and upkeep time, what the draft model spent catching up beyond a steady
  // round (the selector's catch-up charge).
  double spec_catch_up_seconds = 0.0;
  // Whether the selector counts this step (a measured step of its mode, no prompt catch-up, no
  // prompt tokens).
  bool SelectorMeasured() const {
    return spec_mode_measured && !spec_prompt_catch_up && !spec_prompt_tokens;
  }
  int spec_mode_decoding = 0;
};

absl::StatusOr<std::unique_ptr<LlmEngine>> LlmEngine::Create(Model* model,
                                                             const EngineOptions& options) {
  if (options.num_blocks <= 0 || options.block_size <= 0 || options.max_batch_tokens <= 0 ||
      options.max_running <= 0 || options.max_waiting <= 0) {
    return absl::InvalidArgumentError(
        "engine options: num_blocks, block_size, max_batch_tokens, max_running and max_waiting "
        "must be positive");
  }
  const KvCacheConfig kv = model->MakeKvCacheConfig(options.num_blocks, options.block_size);
  std::unique_ptr<KvCache> cache;
  if (options.kv_memory) {
    DI_ASSIGN_OR_RETURN(auto pools, options.kv_memory(KvCache::PoolBytes(kv)));
    DI_ASSIGN_OR_RETURN(cache, KvCache::CreateOnMemory(kv, pools.first, pools.second));
  } else {
    DI_ASSIGN_OR_RETURN(cache, KvCache::Create(kv));
  }
  if (options.backend != nullptr) {
    DI_RETURN_IF_ERROR(CheckSameKvGeometry(options.backend->kv_config(), kv, "backend"));
  }
  const SpecOptions& so = options.speculative;
  std::unique_ptr<speculative::Drafter> drafter;
  speculative::ModelDrafter* model_drafter = nullptr;  // drafter, when it is a draft model
  if (so.enabled) {
    if (so.drafter != "ngram" && so.drafter != "draft_model") {
      return absl::InvalidArgumentError(absl::StrCat(
          "speculative.drafter: expected \"ngram\" or \"draft_model\", got \"", so.drafter, "\""));
    }
    if (so.num_speculative_tokens < 1 || so.num_speculative_tokens > 64) {
      return absl::InvalidArgumentError(absl::StrCat(
          "speculative.num_speculative_tokens: expected [1, 64], got ", so.num_speculative_tokens));
    }
    if (so.select_max_length < 0 || so.select_max_length > so.num_speculative_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("speculative.select_max_length: expected [0, num_speculative_tokens = ",
                       so.num_speculative_tokens, "], got ", so.select_max_length));
    }
    if (so.adaptive && so.profile_runs < 5) {
      return absl::InvalidArgumentError(
          absl::StrCat("speculative.profile_runs: expected >= 5, got ", so.profile_runs));
    }
    if (so.adaptive && so.profile_edge_requests < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "speculative.profile_edge_requests: expected >= 0, got ", so.profile_edge_requests));
    }
    if (so.adaptive && so.profile_context < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("speculative.profile_context: expected >= 1, got ", so.profile_context));
    }
    if (so.probe_interval < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("speculative.probe_interval: expected >= 0, got ", so.probe_interval));
    }
    if (!(so.draft_stop_extend >= 0.0 && so.draft_stop_extend < 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "speculative.draft_stop_extend: expected [0, 1), got ", so.draft_stop_extend));
    }
    if (so.draft_stop_extend_min_decoding < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("speculative.draft_stop_extend_min_decoding: expected >= 1, got ",
                       so.draft_stop_extend_min_decoding));
    }
    if (so.drafter == "draft_model") {
      if (so.draft_model_path.empty()) {
        return absl::InvalidArgumentError(
            "speculative.draft_model_path: required with drafter \"draft_model\"");
      }
      if (so.draft_num_blocks < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "speculative.draft_num_blocks: expected >= 0 (0: the target's num_blocks), got ",
            so.draft_num_blocks));
      }
      speculative::ModelDrafterOptions mo;
      mo.num_blocks = so.draft_num_blocks > 0 ? so.draft_num_blocks : options.num_blocks;
      mo.block_size = options.block_size;
      mo.seed = options.hash_seed ^ 0x5eedd4a7ULL;
      mo.max_catch_up = std::max(so.draft_catch_up_tokens, 0);
      if (so.draft_catch_up_window < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "speculative.draft_catch_up_window: expected >= 0 (0: feed every token), got ",
            so.draft_catch_up_window));
      }
      mo.catch_up_window = so.draft_catch_up_window;
      mo.catch_up_window_min_sequences = so.draft_catch_up_window_min_sequences;
      absl::StatusOr<std::unique_ptr<speculative::ModelDrafter>> loaded =
          speculative::ModelDrafter::Load(so.draft_model_path, model->config().vocab_size, mo,
                                          ModelOptions{so.draft_threads});
      if (!loaded.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "speculative.draft_model_path: \"", so.draft_model_path,
            "\": ", absl::StripPrefix(loaded.status().message(), "speculative.draft_model: ")));
      }
      model_drafter = loaded->get();
      drafter = std::move(*loaded);
    } else {
      absl::StatusOr<std::unique_ptr<speculative::NgramDrafter>> ngram =
          speculative::NgramDrafter::Create({so.min_n, so.max_n});
      if (!ngram.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("speculative: ", ngram.status().message()));
      }
      drafter = std::move(*ngram);
    }
  }
  std::unique_ptr<LlmEngine> engine(new LlmEngine(model, options, std::move(cache)));
  if (so.enabled) {
    engine->drafter_ = std::move(drafter);
    engine->model_drafter_ = model_drafter;
    engine->survival_ = std::make_unique<speculative::NgramSurvivalStats>(
        /*max_match_length=*/so.max_n,
        speculative::SurvivalOptions{/*max_positions=*/so.num_speculative_tokens});
    if (so.drafter == "draft_model") {
      speculative::CalibrationOptions co;
      co.positions.max_positions = so.num_speculative_tokens;
      engine->calibration_ = std::make_unique<speculative::DraftCalibration>(co);
    }
    if (so.adaptive) {
      absl::Status profiled = absl::OkStatus();
      if (so.cost_table != nullptr) {
        engine->cost_ = std::make_unique<speculative::CostTable>(*so.cost_table);
      } else {
        profiled = engine->ProfileCost();
      }
      if (!profiled.ok()) {
        spdlog::warn("speculative: no cost table ({}); verifying every draft token",
                     profiled.ToString());
        engine->cost_.reset();
      } else if (engine->cost_->IsFlat()) {
        spdlog::warn("speculative: cost table is flat ({}); verifying every draft token",
                     engine->cost_->DebugString());
      } else {
        spdlog::info("speculative: adaptive verification with cost table {}{}",
                     engine->cost_context_ > 0
                         ? absl::StrCat("(profiled at ", engine->cost_context_, " cached tokens) ")
                         : std::string(),
                     engine->cost_->DebugString());
      }
      if (model_drafter != nullptr) {
        // The draft model's cost per round, for choosing the draft length (one pass of n
        // sequences x 1 token, n up to the running batch).
        if (so.draft_cost_table != nullptr) {
          engine->draft_cost_ = std::make_unique<speculative::CostTable>(*so.draft_cost_table);
        } else {
          std::vector<int> sizes;
          const int most = std::min(options.max_running, 256);
          for (int n = 1; n < most; n *= 2) sizes.push_back(n);
          sizes.push_back(most);
          absl::StatusOr<speculative::CostTable> draft =
              model_drafter->ProfileRoundCost(sizes, so.profile_runs);
          if (draft.ok()) {
            engine->draft_cost_ = std::make_unique<speculative::CostTable>(*std::move(draft));
          } else {
            spdlog::warn("speculative: draft model not profiled ({}); drafting counted as free",
                         draft.status().ToString());
          }
        }
        if (engine->draft_cost_ != nullptr) {
          spdlog::info("speculative: draft model round cost {}",
                       engine->draft_cost_->DebugString());
        }
      }
      const bool active = engine->cost_ != nullptr && !engine->cost_->IsFlat();
      std::vector<int> lengths;  // the selector's fixed draft lengths, ascending
      if (active && so.select_mode) {
        // The plan first, then none, then fixed lengths 1, 2, 4, ... up to select_max_length
        // (default k; the order in which a new bucket tries them), with the length whose one
        // sequence fills a pass of the projections (SpecOptions::select_max_length).
        const int longest =
            so.select_max_length > 0 ? so.select_max_length : so.num_speculative_tokens;
        for (int l = 1; l < longest; l *= 2) lengths.push_back(l);
        lengths.push_back(longest);
        const int fill_pass = engine->RowsPerPass() - 1;
        if (fill_pass > 1 && fill_pass < longest &&
            std::find(lengths.begin(), lengths.end(), fill_pass) == lengths.end()) {
          lengths.insert(std::upper_bound(lengths.begin(), lengths.end(), fill_pass), fill_pass);
        }
        std::vector<int> modes = {speculative::DraftModeSelector::kPlan, 0};
        modes.insert(modes.end(), lengths.begin(), lengths.end());
        absl::StatusOr<speculative::DraftModeSelector> selector =
            speculative::DraftModeSelector::Create(std::move(modes), so.select_options);
        if (!selector.ok()) return selector.status();
        engine->selector_.emplace(*std::move(selector));
      }
      std::lock_guard<std::mutex> lock(engine->mu_);
      engine->stats_.spec_adaptive_active = active;
      engine->stats_.spec_cost_context = engine->cost_context_;
      engine->stats_.spec_select_lengths = std::move(lengths);
    }
  }
  return engine;
}

absl::Status LlmEngine::RunForward(const std::vector<SequenceInput>& batch,
                                   std::vector<float>* logits) {
  ForwardBackend* backend = options_.backend;
  return backend != nullptr ? backend->Forward(batch, logits)
                            : model_->Forward(batch, cache_.get(), logits);
}

int LlmEngine::RowsPerPass() const {
  return options_.backend != nullptr
             ? 0
             : kernels::LinearRowsPerPass(model_->activation_dtype(), kernels::BestCpuIsa());
}

absl::Status LlmEngine::ProfileCost() {
  // Decode-like steps: `requests` sequences with a context of `context` tokens each feed
  // tokens / requests new tokens with logits for all of them, into scratch blocks (no sequence
  // holds any block yet, and whatever is written is overwritten before anyone reads it).
  const int k = options_.speculative.num_speculative_tokens;
  const int bs = options_.block_size;
  // SpecOptions::profile_context, less where the model's positions or the KV cache would not hold
  // the largest row (up to 32 requests) at k + 1 tokens a request; at least 1.
  const int64_t widest = std::min(32, options_.max_running);
  const int64_t context = std::max<int64_t>(
      1, std::min({static_cast<int64_t>(options_.speculative.profile_context),
                   model_->config().max_position_embeddings - (k + 1),
                   (options_.num_blocks / widest) * bs - (k + 1)}));
  cost_context_ = context;
  const int vocab = model_->config().vocab_size;
  // The CPU's projections multiply several tokens per pass over the weights: the one-request row
  // also measures the edges where one token more starts a pass (speculative::CostProfileShapes: at
  // more requests the edges' noise drove the plan). A GPU backend's passes are not the CPU's: none.
  constexpr int kEdgeShapes = 24;
  const int rows_per_pass = RowsPerPass();
  const int edge_requests =
      options_.speculative.profile_edge_requests > 0 ? options_.speculative.profile_edge_requests
      : rows_per_pass >= SpecOptions::kAutoEdgeRowsPerPass ? 8
                                                            : 1;
  const std::vector<std::pair<int, int>> shapes = speculative::CostProfileShapes(
      k, options_.max_running, rows_per_pass, kEdgeShapes, edge_requests,
      [&](int tokens, int requests) {
        const int per_request = (tokens + requests - 1) / requests;
        const int64_t blocks_needed = requests * ((context + per_request + bs - 1) / bs);
        return tokens <= options_.max_batch_tokens && blocks_needed <= options_.num_blocks;
      });
  if (shapes.size() < 2) {
    return absl::FailedPreconditionError(
        "speculative: the KV cache or the step budget is too small to profile the step cost");
  }
  std::vector<int32_t> ids;
  std::vector<int32_t> tables;
  std::vector<float> logits;
  auto run_step = [&](int tokens, int requests) -> absl::StatusOr<double> {
    std::vector<SequenceInput> batch(requests);
    const int64_t per_blocks = (context + (tokens + requests - 1) / requests + bs - 1) / bs;
    ids.assign(tokens, 0);
    for (int i = 0; i < tokens; ++i) ids[i] = (i * 131 + 7) % vocab;
    tables.resize(requests * per_blocks);
    for (size_t i = 0; i < tables.size(); ++i) {
      tables[i] = static_cast<int32_t>(i % options_.num_blocks);
    }
    int offset = 0;
    for (int r = 0; r < requests; ++r) {
      const int n = tokens / requests + (r < tokens % requests ? 1 : 0);
      batch[r].tokens = ids.data() + offset;
      batch[r].num_tokens = n;
      batch[r].start_position = context;
      batch[r].block_table = tables.data() + r * per_blocks;
      batch[r].num_blocks = per_blocks;
      batch[r].all_logits = true;
      offset += n;
    }
    const auto t0 = Clock::now();
    DI_RETURN_IF_ERROR(RunForward(batch, &logits));
    return Seconds(t0, Clock::now());
  };
  // ProfileCostTable warms each shape (buffers, rope tables, caches) before measuring it.
  DI_ASSIGN_OR_RETURN(
      speculative::CostTable table,
      speculative::ProfileCostTable(run_step, shapes, options_.speculative.profile_runs));
  cost_ = std::make_unique<speculative::CostTable>(std::move(table));
  return absl::OkStatus();
}

LlmEngine::LlmEngine(Model* model, const EngineOptions& options, std::unique_ptr<KvCache> cache)
    : model_(model),
      options_(options),
      cache_(std::move(cache)),
      blocks_(options.num_blocks, options.block_size),
      overlap_(options.overlap) {}

LlmEngine::~LlmEngine() { Stop(); }

absl::Status LlmEngine::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (started_) return absl::FailedPreconditionError("engine already started");
  started_ = true;
  executor_ = std::thread([this] { ExecutorLoop(); });
  scheduler_ = std::thread([this] { SchedulerLoop(); });
  return absl::OkStatus();
}

void LlmEngine::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (scheduler_.joinable()) scheduler_.join();
  {
    std::lock_guard<std::mutex> lock(exec_mu_);
    exec_stop_ = true;
  }
  exec_cv_.notify_all();
  if (executor_.joinable()) executor_.join();
}

absl::Status LlmEngine::ValidateImages(const std::vector<int32_t>& prompt,
                                       const std::vector<ImageEmbeddings>& images,
                                       bool data_required) const {
  const ModelConfig& c = model_->config();
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (!images.empty() && c.image_token_id < 0) {
    return absl::InvalidArgumentError(absl::StrCat("images: this model takes no images (",
                                                   c.architecture, " has no image_token_id), got ",
                                                   images.size()));
  }
  int64_t covered_end = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    const ImageEmbeddings& image = images[i];
    const std::string field = absl::StrCat("images[", i, "]");
    if (image.content_hash.size() != 32) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".content_hash: expected 32 bytes (SHA-256), got ", image.content_hash.size()));
    }
    if (image.num_tokens < 1 || image.num_tokens > n) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".num_tokens: expected [1, ", n,
                                                     "] (the prompt's length), got ",
                                                     image.num_tokens));
    }
    if (image.position < covered_end || image.position > n - image.num_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".position: expected a run of ", image.num_tokens, " tokens within [", covered_end,
          ", ", n, ") (runs are sorted, disjoint and inside the prompt), got ", image.position));
    }
    covered_end = image.position + image.num_tokens;
    const int64_t want = image.num_tokens * c.hidden_size;
    if (image.data == nullptr ? data_required : static_cast<int64_t>(image.data->size()) != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".data: expected num_tokens x hidden_size = ", image.num_tokens, " x ",
          c.hidden_size, " = ", want, " floats, got ",
          image.data == nullptr ? std::string("none") : absl::StrCat(image.data->size())));
    }
  }
  // Then the tokens: the runs cover exactly the placeholder tokens.
  covered_end = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    const ImageEmbeddings& image = images[i];
    const std::string field = absl::StrCat("images[", i, "]");
    for (int64_t t = covered_end; t < image.position; ++t) {
      if (prompt[t] == c.image_token_id) {
        return absl::InvalidArgumentError(
            absl::StrCat("prompt_token_ids[", t, "]: image placeholder token without an image"));
      }
    }
    for (int64_t t = image.position; t < image.position + image.num_tokens; ++t) {
      if (prompt[t] != c.image_token_id) {
        return absl::InvalidArgumentError(
            absl::StrCat("prompt_token_ids[", t, "]: expected the image placeholder token ",
                         c.image_token_id, " (covered by ", field, "), got ", prompt[t]));
      }
    }
    covered_end = image.position + image.num_tokens;
  }
  if (c.image_token_id >= 0) {
    for (int64_t t = covered_end; t < n; ++t) {
      if (prompt[t] == c.image_token_id) {
        return absl::InvalidArgumentError(
            absl::StrCat("prompt_token_ids[", t, "]: image placeholder token without an image"));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<uint64_t> LlmEngine::FullBlockHashes(const Sequence& seq) const {
  return PromptBlockHashes(seq.root_hash, seq.tokens, seq.image_spans, options_.block_size);
}

absl::StatusOr<std::unique_ptr<LlmEngine::Sequence>> LlmEngine::MakeSequence(
    EngineRequest request, OutputCallback on_output, bool image_data_required) {
  const ModelConfig& c = model_->config();
  if (request.request_id.empty()) {
    return absl::InvalidArgumentError("request_id: expected a non-empty id");
  }
  if (!request.messages.is_null()) {
    if (options_.tokenizer == nullptr || options_.chat_template == nullptr) {
      return absl::FailedPreconditionError(
          "messages: this engine has no tokenizer and chat template; send token ids");
    }
    if (!request.messages.is_array() || request.messages.empty()) {
      return absl::InvalidArgumentError("messages: expected a non-empty list of messages");
    }
    nlohmann::ordered_json context = options_.template_context;
    context["messages"] = request.messages;
    context["add_generation_prompt"] = request.add_generation_prompt;
    absl::StatusOr<std::string> text = options_.chat_template->Render(context);
    if (!text.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("messages: ", text.status().message()));
    }
    absl::StatusOr<std::vector<int32_t>> ids =
        options_.tokenizer->Encode(*text, /*add_special_tokens=*/false);
    if (!ids.ok())
      return absl::InvalidArgumentError(absl::StrCat("messages: ", ids.status().message()));
    request.prompt = std::move(*ids);
  }
  if (!request.sampling.stop.empty() && options_.tokenizer == nullptr) {
    return absl::InvalidArgumentError(
        "sampling.stop: stop strings need the engine's tokenizer; use stop_token_ids");
  }
  if (request.prompt.empty()) {
    return absl::InvalidArgumentError("prompt_token_ids: expected at least one token, got 0");
  }
  for (size_t i = 0; i < request.prompt.size(); ++i) {
    if (request.prompt[i] < 0 || request.prompt[i] >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt_token_ids[", i,
                                                     "]: expected a token id in [0, ", c.vocab_size,
                                                     "), got ", request.prompt[i]));
    }
  }
  DI_RETURN_IF_ERROR(ValidateImages(request.prompt, request.images, image_data_required));
  DI_RETURN_IF_ERROR(ValidateSamplingParams(request.sampling, c.vocab_size));
  const int64_t total = static_cast<int64_t>(request.prompt.size()) + request.sampling.max_tokens;
  if (total > c.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.max_tokens: prompt (", request.prompt.size(),
                     " tokens) + max_tokens (", request.sampling.max_tokens,
                     ") exceeds the model's context of ", c.max_position_embeddings, " tokens"));
  }
  if ((total + options_.block_size - 1) / options_.block_size > options_.num_blocks) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "prompt + max_tokens (", total, " tokens) can never fit in this node's KV cache (",
        static_cast<int64_t>(options_.num_blocks) * options_.block_size, " tokens)"));
  }
  auto seq = std::make_unique<Sequence>();
  seq->request_id = request.request_id;
  seq->tokens = std::move(request.prompt);
  seq->prompt_len = static_cast<int64_t>(seq->tokens.size());
  seq->sampling = request.sampling;
  if (!request.images.empty()) {
    bool have_data = true;
    for (const ImageEmbeddings& image : request.images) {
      seq->image_spans.push_back({image.content_hash, image.position, image.num_tokens});
      have_data = have_data && image.data != nullptr;
    }
    seq->images_end = request.images.back().position + request.images.back().num_tokens;
    if (have_data) {
      seq->embedding_rows.assign(seq->images_end, nullptr);
      for (const ImageEmbeddings& image : request.images) {
        for (int64_t t = 0; t < image.num_tokens; ++t) {
          seq->embedding_rows[image.position + t] = image.data->data() + t * c.hidden_size;
        }
      }
    }
    seq->images = std::move(request.images);
  }
  if (options_.speculative.enabled) {
    seq->verifier = std::make_unique<speculative::Verifier>(request.sampling);
    seq->verifier->AddPromptTokens(seq->tokens.data(), seq->prompt_len);
  } else {
    seq->sampler = std::make_unique<Sampler>(request.sampling);
    seq->sampler->AddPromptTokens(seq->tokens.data(), seq->prompt_len);
  }
  seq->on_output = std::move(on_output);
  if (options_.tokenizer != nullptr) {
    seq->text = std::make_unique<TextStream>(*options_.tokenizer, request.sampling.stop);
  }
  seq->priority = request.priority;
  seq->root_hash = RootBlockHash(options_.hash_seed, request.cache_salt);
  seq->arrived = Clock::now();
  seq->usage.prompt_tokens = seq->prompt_len;
  return seq;
}

absl::Status LlmEngine::Submit(EngineRequest request, OutputCallback on_output) {
  DI_ASSIGN_OR_RETURN(std::unique_ptr<Sequence> seq,
                      MakeSequence(std::move(request), std::move(on_output)));
  return Enqueue(std::move(seq));
}

absl::Status LlmEngine::Enqueue(std::unique_ptr<Sequence> seq) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_ || stopping_) return absl::FailedPreconditionError("engine is not running");
    if (live_.count(seq->request_id) != 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("request_id: \"", seq->request_id, "\" is already running"));
    }
    if (queued_ >= options_.max_waiting) {
      return absl::ResourceExhaustedError(
          absl::StrCat("queue full: ", options_.max_waiting, " requests waiting; retry later"));
    }
    live_[seq->request_id] = seq.get();
    ++queued_;
    incoming_.push_back(std::move(seq));
  }
  wake_.notify_all();
  return absl::OkStatus();
}

absl::Status LlmEngine::RunOnScheduler(std::function<absl::Status()> fn) {
  auto promise = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> result = promise->get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_ || stopping_) return absl::FailedPreconditionError("engine is not running");
    commands_.push_back([this, fn = std::move(fn), promise] {
      absl::Status status = fn();
      {
        // What the command changed (a reservation, a release) is in Stats() once it returns.
        std::lock_guard<std::mutex> lock(mu_);
        PublishQueueStats();
      }
      promise->set_value(std::move(status));
    });
  }
  wake_.notify_all();
  return result.get();
}

LlmEngine::Sequence* LlmEngine::FindIn(std::list<std::unique_ptr<Sequence>>& list,
                                       const std::string& id) {
  for (auto& s : list) {
    if (s->request_id == id) return s.get();
  }
  return nullptr;
}

absl::StatusOr<KvReservation> LlmEngine::ReserveForRemotePrefill(EngineRequest request,
                                                                 OutputCallback on_output) {
  DI_ASSIGN_OR_RETURN(std::unique_ptr<Sequence> owned,
                      MakeSequence(std::move(request), std::move(on_output),
                                   /*image_data_required=*/false));
  KvReservation reservation;
  absl::Status status = RunOnScheduler([&]() -> absl::Status {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (live_.count(owned->request_id) != 0) {
        return absl::AlreadyExistsError(
            absl::StrCat("request_id: \"", owned->request_id, "\" is already running"));
      }
    }
    Sequence* seq = owned.get();
    seq->id = next_seq_id_++;
    seq->arrival = arrival_counter_++;
    std::vector<uint64_t> hashes;
    if (options_.enable_prefix_cache) hashes = FullBlockHashes(*seq);
    DI_ASSIGN_OR_RETURN(
        int64_t cached,
        blocks_.AllocateSequence(seq->id, static_cast<int64_t>(seq->tokens.size()), hashes));
    seq->has_blocks = true;
    seq->usage.cached_prompt_tokens = cached;
    seq->counted_cache = true;
    seq->scheduled_once = true;
    seq->state = Sequence::State::kAwaitingKv;
    if (options_.enable_prefix_cache) {
      hashes.resize(cached / options_.block_size);
      seq->block_hashes = hashes;
    }
    const std::vector<int32_t>& table = *blocks_.Table(seq->id);
    const int64_t prompt_blocks = (seq->prompt_len + options_.block_size - 1) / options_.block_size;
    reservation.block_ids.assign(table.begin(), table.begin() + prompt_blocks);
    reservation.cached_tokens = cached;
    reservation.block_size = options_.block_size;
    {
      std::lock_guard<std::mutex> lock(mu_);
      live_[seq->request_id] = seq;
    }
    awaiting_kv_.push_back(std::move(owned));
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return reservation;
}

absl::Status LlmEngine::CompleteRemotePrefill(const std::string& request_id,
                                              const StepOutput& first) {
  return RunOnScheduler([&]() -> absl::Status {
    Sequence* seq = FindIn(awaiting_kv_, request_id);
    if (seq == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("request_id: \"", request_id, "\" is not awaiting a remote prefill"));
    }
    if (first.token < 0 || first.token >= model_->config().vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "first_token_id: expected [0, ", model_->config().vocab_size, "), got ", first.token));
    }
    if (options_.backend != nullptr) {
      // The transfer wrote the host cache's blocks past the cached prefix: move them to the
      // backend before anything reads them.
      const std::vector<int32_t>& table = *blocks_.Table(seq->id);
      const int64_t prompt_blocks =
          (seq->prompt_len + options_.block_size - 1) / options_.block_size;
      const int64_t cached_blocks = seq->usage.cached_prompt_tokens / options_.block_size;
      absl::Status copied = options_.backend->Upload(
          *cache_,
          absl::MakeConstSpan(table).subspan(cached_blocks, prompt_blocks - cached_blocks));
      if (!copied.ok()) {
        const absl::Status failed = absl::InternalError(
            absl::StrCat("backend ", options_.backend->name(), ": KV upload: ", copied.message()));
        Finish(seq, FinishReason::kAborted, failed);
        return failed;
      }
    }
    // The KV is there either way; an abort that arrived meanwhile ends the request now.
    seq->computed = seq->scheduled_end = seq->prompt_len;
    CommitBlocks(seq);
    auto it = std::find_if(awaiting_kv_.begin(), awaiting_kv_.end(),
                           [&](const auto& s) { return s.get() == seq; });
    std::unique_ptr<Sequence> owned = std::move(*it);
    awaiting_kv_.erase(it);
    seq->state = Sequence::State::kRunning;
    running_.push_back(std::move(owned));
    if (seq->abort_pending) {
      Finish(seq, FinishReason::kAborted, absl::CancelledError("aborted"));
      return absl::OkStatus();
    }
    // Emit the prefill node's token exactly as if it had been sampled here.
    Planned p;
    p.seq = seq;
    p.start = seq->prompt_len - 1;
    p.count = 1;
    p.sample = true;
    p.result.token = first.token;
    p.result.logprob = first.logprob;
    p.result.top = first.top;
    RecordOutputToken(seq, first.token);
    ++seq->in_flight;
    ++seq->pending_samples;
    Step step;
    step.external = true;
    step.items.push_back(std::move(p));
    Process(step);
    return absl::OkStatus();
  });
}

absl::Status LlmEngine::FailRemotePrefill(const std::string& request_id, absl::Status status) {
  return RunOnScheduler([&]() -> absl::Status {
    Sequence* seq = FindIn(awaiting_kv_, request_id);
    if (seq == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("request_id: \"", request_id, "\" is not awaiting a remote prefill"));
    }
    Finish(seq, FinishReason::kAborted,
           seq->abort_pending ? absl::CancelledError("aborted") : status);
    return absl::OkStatus();
  });
}

absl::Status LlmEngine::SubmitPrefill(EngineRequest request, PrefillCallback done) {
  request.sampling.max_tokens = 1;
  DI_ASSIGN_OR_RETURN(std::unique_ptr<Sequence> seq,
                      MakeSequence(std::move(request), [](const EngineOutput&) {}));
  PrefillCallback report = std::move(done);
  seq->prefill_only = true;
  // Failures before the first token (abort, engine stop, forward error) reach `done` too.
  seq->on_output = [report](const EngineOutput& out) {
    if (out.finished && !out.status.ok()) report(out.status);
  };
  seq->prefill_done = std::move(report);
  return Enqueue(std::move(seq));
}

absl::Status LlmEngine::ReleasePrefilled(const std::string& request_id) {
  return RunOnScheduler([&]() -> absl::Status {
    Sequence* seq = FindIn(held_, request_id);
    if (seq == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("request_id: \"", request_id, "\" holds no prefilled blocks"));
    }
    seq->on_output = [](const EngineOutput&) {};  // `done` was already called
    Finish(seq, FinishReason::kLength, absl::OkStatus());
    return absl::OkStatus();
  });
}

bool LlmEngine::Abort(const std::string& request_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (live_.count(request_id) == 0) return false;
    abort_requests_.push_back(request_id);
  }
  wake_.notify_all();
  return true;
}

std::vector<KvEvent> LlmEngine::DrainKvEvents() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<KvEvent> out(kv_events_.begin(), kv_events_.end());
  kv_events_.clear();
  return out;
}

EngineStats LlmEngine::GetStats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void LlmEngine::Finish(Sequence* seq, FinishReason reason, absl::Status status) {
  if (seq->state == Sequence::State::kFinished) return;
  const Sequence::State was = seq->state;
  seq->state = Sequence::State::kFinished;
  if (drafter_ != nullptr) drafter_->Release(static_cast<int64_t>(seq->id));
  const auto now = Clock::now();
  seq->usage.completion_tokens = seq->generated();
  seq->usage.total_us = Micros(seq->arrived, now);
  if (seq->generated() > 1) {
    seq->usage.mean_itl_us = static_cast<double>(seq->itl_sum_us) / (seq->generated() - 1);
  }
  {
    // Before the callback: a client may reuse the id as soon as it sees the final output.
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(seq->request_id);
    ++stats_.finished;
    if (was == Sequence::State::kWaiting) --queued_;
  }
  EngineOutput out;
  out.request_id = seq->request_id;
  if (seq->text != nullptr && reason != FinishReason::kAborted)
    out.text_delta = seq->text->Finish();
  out.finished = true;
  out.finish_reason = reason;
  out.status = std::move(status);
  out.usage = seq->usage;
  seq->on_output(out);
  auto& from = was == Sequence::State::kWaiting      ? waiting_
               : was == Sequence::State::kAwaitingKv ? awaiting_kv_
               : was == Sequence::State::kHeld       ? held_
                                                     : running_;
  for (auto it = from.begin(); it != from.end(); ++it) {
    if (it->get() == seq) {
      finished_pending_free_.push_back(std::move(*it));
      from.erase(it);
      break;
    }
  }
}

void LlmEngine::HandleAborts() {
  std::vector<std::string> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ids.swap(abort_requests_);
  }
  for (const std::string& id : ids) {
    Sequence* seq = nullptr;
    for (auto& s : waiting_) {
      if (s->request_id == id) seq = s.get();
    }
    for (auto& s : running_) {
      if (s->request_id == id) seq = s.get();
    }
    if (Sequence* pinned = FindIn(awaiting_kv_, id); pinned != nullptr)
      pinned->abort_pending = true;
    if (Sequence* pinned = FindIn(held_, id); pinned != nullptr) pinned->abort_pending = true;
    if (seq != nullptr) {
      seq->aborted = true;
      Finish(seq, FinishReason::kAborted, absl::CancelledError("aborted"));
    }
  }
}

void LlmEngine::Preempt(Sequence* seq) {
  if (!seq->images.empty() && seq->embedding_rows.empty()) {
    // Reserved for a remote prefill without the image data: the prompt cannot be recomputed.
    Finish(seq, FinishReason::kAborted,
           absl::ResourceExhaustedError(
               "preempted for KV space, and its prompt's image embeddings are not here to "
               "recompute it; retry"));
    return;
  }
  (void)blocks_.Free(seq->id);
  seq->has_blocks = false;
  seq->computed = 0;
  seq->scheduled_end = 0;
  seq->block_hashes.clear();
  seq->preempt_requested = false;
  seq->pending_samples = 0;  // nothing in flight; planned-but-unsubmitted items are voided
  ++seq->epoch;
  seq->state = Sequence::State::kWaiting;
  ++seq->usage.preemptions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.preemptions;
    ++queued_;
  }
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if (it->get() == seq) {
      std::unique_ptr<Sequence> owned = std::move(*it);
      running_.erase(it);
      auto pos = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& w) {
        return w->priority < owned->priority ||
               (w->priority == owned->priority && w->arrival > owned->arrival);
      });
      waiting_.insert(pos, std::move(owned));
      return;
    }
  }
}

void LlmEngine::ReleaseOutOfWindow(Sequence* seq) {
  if (!model_->all_layers_sliding()) return;
  // The next query is at position `computed`; it reads keys from computed - window + 1 on.
  const int64_t first_needed = seq->computed - model_->config().sliding_window + 1;
  if (first_needed <= 0) return;
  absl::StatusOr<int64_t> released =
      blocks_.ReleasePrefix(seq->id, first_needed / options_.block_size);
  if (released.ok() && *released > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.window_released_blocks += *released;
  }
}

void LlmEngine::CommitBlocks(Sequence* seq) {
  if (!options_.enable_prefix_cache) return;
  const int bs = options_.block_size;
  const int64_t full = seq->computed / bs;
  if (static_cast<int64_t>(seq->block_hashes.size()) < full &&
      static_cast<int64_t>(seq->block_hashes.size()) * bs < seq->images_end) {
    // Blocks an image run may overlap carry its content: hash the whole chain with the images.
    const std::vector<uint64_t> all = FullBlockHashes(*seq);
    while (static_cast<int64_t>(seq->block_hashes.size()) < full) {
      const int64_t b = static_cast<int64_t>(seq->block_hashes.size());
      (void)blocks_.Commit(seq->id, b, all[b], b == 0 ? 0 : all[b - 1]);
      seq->block_hashes.push_back(all[b]);
    }
    return;
  }
  while (static_cast<int64_t>(seq->block_hashes.size()) < full) {
    const int64_t b = static_cast<int64_t>(seq->block_hashes.size());
    const uint64_t parent = b == 0 ? seq->root_hash : seq->block_hashes.back();
    const uint64_t hash = BlockHash(parent, seq->tokens.data() + b * bs, bs);
    (void)blocks_.Commit(seq->id, b, hash, b == 0 ? 0 : parent);
    seq->block_hashes.push_back(hash);
  }
}

double LlmEngine::SyncOverheadSeconds() const {
  // Before any synchronous step was measured, the overlapped steps' overhead (a lower bound:
  // overlap hides the scheduling) stands in for it; with neither, the pure table.
  if (have_overhead_) return std::max(0.0, overhead_ema_);
  if (have_overlap_overhead_) return std::max(0.0, overlap_overhead_ema_);
  return 0.0;
}

speculative::StepShape LlmEngine::SyncStepShape(int sampling_requests, int step_tokens,
                                                int step_requests) const {
  speculative::StepShape shape;
  shape.sampling_requests = sampling_requests;
  shape.step_tokens = step_tokens;
  shape.step_requests = step_requests;
  shape.extra_seconds = SyncOverheadSeconds() + forward_fit_.Offset(step_requests);
  shape.cost_scale = forward_fit_.Scale();
  return shape;
}

LlmEngine::DraftGate LlmEngine::PlanDrafting() {
  DraftGate gate;
  if (drafter_ == nullptr) return gate;
  const SpecOptions& so = options_.speculative;
  const int k = so.num_speculative_tokens;
  // The next step's decoding sequences as Schedule will see them once the step in flight (if
  // any) is processed: one known token to feed, counting the samples in flight.
  std::vector<const Sequence*> decodes;
  int64_t prefill_tokens = 0;
  int prefills = 0;
  for (const auto& owned : running_) {
    const Sequence* seq = owned.get();
    if (seq->preempt_requested) continue;
    const int64_t avail =
        static_cast<int64_t>(seq->tokens.size()) + seq->pending_samples - seq->scheduled_end;
    if (avail == 1 && seq->verifier != nullptr) {
      decodes.push_back(seq);
    } else if (avail > 0) {
      prefill_tokens += avail;
      ++prefills;
    }
  }
  if (decodes.empty()) return gate;
  const int64_t budget = options_.max_batch_tokens;
  const int64_t n = static_cast<int64_t>(decodes.size());
  const int64_t spare = std::max<int64_t>(budget - n - prefill_tokens, 0);
  const bool adaptive = so.adaptive && cost_ != nullptr;
  std::vector<int> caps(decodes.size(), 0);
  int longest = 0;
  for (size_t i = 0; i < decodes.size(); ++i) {
    // Never draft past max_tokens: the step emits up to drafts + 1 tokens.
    const Sequence* seq = decodes[i];
    const int64_t room = seq->sampling.max_tokens - seq->generated() - seq->pending_samples - 1;
    caps[i] = spare > 0 ? static_cast<int>(std::clamp<int64_t>(room, 0, k)) : 0;
    longest = std::max(longest, caps[i]);
  }
  // Probes count steps with decoding sequences; a probe due waits for a step that can draft.
  // The gap backs off (doubling, up to kMaxProbeBackoff x probe_interval) while the plan keeps
  // saying "no draft" between probes, and returns to probe_interval once it drafts again: a probe
  // costs a synchronous step (and a draft model's catch-up), which an unprofitable drafter should
  // pay ever more rarely.
  if (adaptive && selector_.has_value()) {
    // Measured modes (speculative::DraftModeSelector): no drafting, a fixed length, or the plan
    // below.
    const speculative::DraftModeSelector::Choice choice = selector_->Choose(static_cast<int>(n));
    gate.mode = choice.mode;
    gate.mode_measured = choice.measured;
    gate.upkeep = choice.upkeep;
    gate.upkeep_catch_up = choice.catch_up;
    const int length = selector_->length(choice.mode);
    if (length != speculative::DraftModeSelector::kPlan) {
      gate.fixed_length = length;
      gate.may_draft = length > 0 && longest > 0;
      return gate;
    }
  }
  if (probe_gap_ <= 0) probe_gap_ = so.probe_interval;
  if (adaptive && so.probe_interval > 0 && ++steps_since_probe_ >= probe_gap_ && longest > 0) {
    gate.probe = true;
    steps_since_probe_ = 0;
    probe_gap_ = planned_draft_since_probe_
                     ? so.probe_interval
                     : std::min(probe_gap_ * 2, so.probe_interval * kMaxProbeBackoff);
    planned_draft_since_probe_ = false;
  }
  if (longest == 0) return gate;  // nothing could be drafted or verified
  gate.may_draft = true;
  if (!adaptive || gate.probe) return gate;
  // The planner's decision from earlier steps' estimates (as Draft makes it): drafting runs
  // synchronously at the measured synchronous overhead; not drafting overlaps, at the measured
  // overlapped overhead once known.
  const speculative::StepShape shape =
      SyncStepShape(static_cast<int>(n), static_cast<int>(std::min(n + prefill_tokens, budget)),
                    static_cast<int>(n) + prefills);
  double draft_rate = 0.0;  // expected tokens per second of the best plan that drafts
  bool drafts = true;
  if (calibration_ != nullptr) {
    std::vector<std::vector<double>> priors(decodes.size());
    for (size_t i = 0; i < decodes.size(); ++i) {
      calibration_->PositionPrior(caps[i], &priors[i]);
    }
    absl::StatusOr<speculative::DraftLengthPlan> length = speculative::PlanDraftLength(
        shape, priors, cost_.get(), draft_cost_.get(), draft_scale_, kDraftLengthMinGain);
    if (length.ok() && length->adaptive) {
      drafts = length->length > 0;
      draft_rate = length->tokens_per_second;
    }
  } else {
    // n-gram drafts: the match length is known only after drafting; the most optimistic row
    // over match lengths bounds what any draft could be worth (B = 0 there: B = 0 for all).
    std::vector<speculative::VerifyCandidate> candidates(decodes.size());
    std::vector<double> row;
    for (size_t i = 0; i < decodes.size(); ++i) {
      std::vector<double>& best = candidates[i].prior;
      best.assign(caps[i], 0.0);
      for (int m = 1; m <= so.max_n; ++m) {
        survival_->Survival(m, caps[i], &row);
        for (int j = 0; j < caps[i] && j < static_cast<int>(row.size()); ++j) {
          best[j] = std::max(best[j], row[j]);
        }
      }
    }
    absl::StatusOr<speculative::VerifyPlan> plan =
        speculative::PlanVerification(shape, candidates, cost_.get());
    if (plan.ok() && plan->adaptive) {
      drafts = plan->budget > 0;
      draft_rate = plan->tokens_per_second;
    }
  }
  if (drafts && have_overlap_overhead_) {
    const double plain =
        forward_fit_.Predict(
            cost_->StepSeconds(static_cast<double>(shape.step_tokens), shape.step_requests),
            shape.step_requests) +
        std::max(0.0, overlap_overhead_ema_);
    if (plain > 0.0 && static_cast<double>(n) / plain >= draft_rate) drafts = false;
  }
  // Measured: at this many decoding sequences, the steps the plan drafted in emitted fewer
  // tokens per second than those it did not (speculative::DraftingRateCheck).
  const bool vetoed = drafts && !rate_check_.DraftingPays(static_cast<int>(n));
  if (vetoed) drafts = false;
  if (drafts) planned_draft_since_probe_ = true;
  if (!drafts) {
    gate.may_draft = false;
    std::lock_guard<std::mutex> lock(mu_);
    if (vetoed) ++stats_.spec_rate_vetoed_steps;
    if (calibration_ != nullptr) ++stats_.spec_no_draft_steps;
  }
  return gate;
}

std::unique_ptr<LlmEngine::Step> LlmEngine::Schedule(const DraftGate& gate) {
  auto step = std::make_unique<Step>();
  int64_t budget = options_.max_batch_tokens;
  bool preempting = false;

  // Plans `seq` for up to the remaining budget; returns false when it had to be skipped.
  auto plan = [&](Sequence* seq) {
    // Drafts chosen by Draft for this step (decoding sequences only).
    std::vector<int32_t> draft = std::move(seq->draft);
    std::vector<float> draft_probs = std::move(seq->draft_probs);
    std::vector<float> draft_confidence = std::move(seq->draft_confidence);
    seq->draft.clear();
    seq->draft_probs.clear();
    seq->draft_confidence.clear();
    const int64_t known = static_cast<int64_t>(seq->tokens.size()) + seq->pending_samples;
    const int64_t avail = known - seq->scheduled_end;
    if (avail <= 0 || budget <= 0) return;
    // A sequence whose planned samples already reach max_tokens is finishing: nothing to do.
    if (seq->generated() + seq->pending_samples >= seq->sampling.max_tokens) return;
    if (avail != 1) draft.clear();
    draft.resize(std::min<int64_t>(draft.size(), std::max<int64_t>(budget - 1, 0)));
    int64_t count = std::min(avail + static_cast<int64_t>(draft.size()), budget);
    if (!options_.chunked_prefill && count < avail) {
      if (!step->items.empty()) return;
      count = avail;  // alone in the step: run the whole prompt
    }
    absl::Status grown = blocks_.Grow(seq->id, seq->scheduled_end + count);
    if (!grown.ok() && !draft.empty()) {
      // No room for the drafts: decode without them rather than preempt anyone.
      draft.clear();
      count = avail;
      grown = blocks_.Grow(seq->id, seq->scheduled_end + count);
    }
    if (!grown.ok()) {
      // Free room: ask the newest, lowest-priority other running sequence to give its blocks
      // back once the step in flight is done.
      Sequence* victim = nullptr;
      for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
        Sequence* s = it->get();
        if (s == seq || s->preempt_requested) continue;
        if (victim == nullptr || s->priority < victim->priority) victim = s;
      }
      if (victim != nullptr) victim->preempt_requested = true;
      preempting = true;
      return;
    }
    Planned p;
    p.seq = seq;
    p.epoch = seq->epoch;
    p.start = seq->scheduled_end;
    p.count = count;
    p.sample = p.start + count - static_cast<int64_t>(draft.size()) == known;
    if (!draft.empty()) {
      // Probabilities and confidences follow the drafts kept (a prefix of those proposed).
      const size_t kept = draft.size();
      if (!draft_probs.empty()) draft_probs.resize(kept * model_->config().vocab_size);
      if (!draft_confidence.empty()) draft_confidence.resize(kept);
      p.draft = std::move(draft);
      p.draft_match = seq->draft_match;
      p.draft_probs = std::move(draft_probs);
      p.draft_confidence = std::move(draft_confidence);
    }
    seq->scheduled_end += count;
    if (p.sample) ++seq->pending_samples;
    budget -= count;
    step->items.push_back(std::move(p));
  };

  if (drafter_ != nullptr) {
    // Speculative decoding. Decoding sequences (one known token to feed) get drafts within what
    // the budget has left after one token each, when the gate allows it: then nothing is in
    // flight and every sequence's tokens are known here. Otherwise (a step may be in flight,
    // sampling for some of them) they are planned as plain one-token decodes.
    std::vector<Sequence*> decodes;
    int64_t prefill_tokens = 0;
    int prefills = 0;
    for (auto& owned : running_) {
      Sequence* seq = owned.get();
      if (seq->preempt_requested) continue;
      const int64_t avail =
          static_cast<int64_t>(seq->tokens.size()) + seq->pending_samples - seq->scheduled_end;
      if (avail == 1 && seq->verifier != nullptr) {
        decodes.push_back(seq);
      } else if (avail > 0) {
        prefill_tokens += avail;
        ++prefills;
      }
    }
    if (!decodes.empty()) {
      step->spec_timed = options_.speculative.adaptive && cost_ != nullptr;
      // Its period: from the previous step's processing (the loop's own work between steps is
      // part of every step's cost), or from here after the engine idled.
      step->spec_start = have_last_processed_ ? last_processed_at_ : Clock::now();
    }
    bool all_known = true;
    for (const Sequence* seq : decodes) all_known = all_known && seq->pending_samples == 0;
    if (!decodes.empty() && (!gate.may_draft || all_known) && gate.fixed_length < 0) {
      // The plan's steps only (no fixed-length or no-drafting mode of the selector).
      step->spec_decoding = static_cast<int>(decodes.size());
      step->spec_drafting = gate.probe ? -1 : (gate.may_draft ? 1 : 0);
    }
    if (!decodes.empty() && gate.mode >= 0) {
      step->spec_mode = gate.mode;
      step->spec_mode_measured = gate.mode_measured;
      step->spec_mode_decoding = static_cast<int>(decodes.size());
    }
    if (gate.may_draft && all_known && !decodes.empty()) {
      // Drafts take what one token per decode and the running prefills leave of the budget.
      const int64_t n = static_cast<int64_t>(decodes.size());
      const int64_t spare = std::max<int64_t>(budget - n - prefill_tokens, 0);
      Draft(decodes, spare, static_cast<int>(std::min(n + prefill_tokens, budget)),
            static_cast<int>(n) + prefills, gate.probe, gate.fixed_length, step.get());
    }
    if (model_drafter_ != nullptr && step->spec_timed &&
        options_.speculative.draft_upkeep_tokens > 0) {
      bool drafted = false;
      for (const Sequence* seq : decodes) drafted = drafted || !seq->draft.empty();
      if (!drafted && gate.upkeep) UpkeepDrafter(decodes, gate.upkeep_catch_up, step.get());
    }
  }
  // Decodes first (one token each, plus drafts), then continuing prefills.
  for (int pass = 0; pass < 2; ++pass) {
    for (auto& owned : running_) {
      Sequence* seq = owned.get();
      if (seq->preempt_requested) continue;
      const int64_t avail =
          static_cast<int64_t>(seq->tokens.size()) + seq->pending_samples - seq->scheduled_end;
      if ((pass == 0) != (avail == 1)) continue;
      plan(seq);
    }
  }
  // Admissions: priority, then FCFS; stop at the first that does not fit.
  // No admissions while running sequences are short of blocks.
  for (auto& s : running_) preempting = preempting || s->preempt_requested;
  while (!preempting && budget > 0 && static_cast<int>(running_.size()) < options_.max_running &&
         !waiting_.empty()) {
    Sequence* seq = waiting_.front().get();
    std::vector<uint64_t> hashes;
    if (options_.enable_prefix_cache) hashes = FullBlockHashes(*seq);
    absl::StatusOr<int64_t> cached =
        blocks_.AllocateSequence(seq->id, static_cast<int64_t>(seq->tokens.size()), hashes);
    if (!cached.ok()) break;
    seq->has_blocks = true;
    seq->computed = seq->scheduled_end = *cached;
    if (options_.enable_prefix_cache) {
      hashes.resize(*cached / options_.block_size);
      seq->block_hashes = hashes;
    }
    if (!seq->counted_cache) {
      seq->usage.cached_prompt_tokens = *cached;
      seq->counted_cache = true;
    }
    if (!seq->scheduled_once) {
      seq->scheduled_once = true;
      seq->usage.queue_us = Micros(seq->arrived, Clock::now());
    }
    seq->state = Sequence::State::kRunning;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    {
      std::lock_guard<std::mutex> lock(mu_);
      --queued_;
    }
    plan(seq);
  }
  for (const Planned& p : step->items) {
    // A decode is one sampled token plus its drafts; anything else computes prompt tokens.
    if (!p.sample || p.count - static_cast<int64_t>(p.draft.size()) > 1) {
      step->spec_prompt_tokens = true;
    }
  }
  return step;
}

bool LlmEngine::FinalizeAndSubmit(std::unique_ptr<Step> step, Clock::time_point* executed_at) {
  std::vector<Planned> kept;
  for (Planned& p : step->items) {
    Sequence* seq = p.seq;
    if (seq->state != Sequence::State::kRunning || seq->epoch != p.epoch) continue;
    const int64_t known = p.count - static_cast<int64_t>(p.draft.size());
    p.input.assign(seq->tokens.begin() + p.start, seq->tokens.begin() + p.start + known);
    p.input.insert(p.input.end(), p.draft.begin(), p.draft.end());
    if (p.start < static_cast<int64_t>(seq->embedding_rows.size())) {
      // Image rows by absolute position: a chunk may start or end inside a run.
      const int64_t end =
          std::min(p.start + p.count, static_cast<int64_t>(seq->embedding_rows.size()));
      p.embedding_rows.assign(seq->embedding_rows.begin() + p.start,
                              seq->embedding_rows.begin() + end);
      p.embedding_rows.resize(p.count, nullptr);
    }
    p.table = *blocks_.Table(seq->id);
    ++seq->in_flight;
    kept.push_back(std::move(p));
  }
  step->items = std::move(kept);
  if (step->items.empty()) return false;
  bool has_draft = false;
  for (const Planned& p : step->items) has_draft = has_draft || !p.draft.empty();
  if (!overlap_ || has_draft) {
    // A step with drafts runs alone: the next one's positions depend on what it accepts.
    ExecuteStep(*step);
    *executed_at = step->done_at;
    Process(*step);
    return false;
  }
  // Overlapped: its period runs from the previous step's processing (which comes after its
  // scheduling) to its own.
  step->spec_overlapped = true;
  if (step->spec_timed && have_last_processed_) step->spec_start = last_processed_at_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.overlapped_steps;
  }
  {
    std::unique_lock<std::mutex> lock(exec_mu_);
    exec_in_ = std::move(step);
  }
  exec_cv_.notify_all();
  return true;
}

void LlmEngine::ExecuteStep(Step& step) {
  const auto t0 = Clock::now();
  std::vector<SequenceInput> inputs;
  inputs.reserve(step.items.size());
  for (const Planned& p : step.items) {
    SequenceInput in;
    in.tokens = p.input.data();
    in.num_tokens = p.count;
    in.start_position = p.start;
    in.block_table = p.table.data();
    in.num_blocks = static_cast<int64_t>(p.table.size());
    in.all_logits = !p.draft.empty();
    if (!p.embedding_rows.empty()) in.embedding_override = p.embedding_rows.data();
    inputs.push_back(in);
  }
  std::vector<float> logits;
  step.status = RunForward(inputs, &logits);
  if (step.status.ok()) {
    const int vocab = model_->config().vocab_size;
    int64_t row = 0;
    for (Planned& p : step.items) {
      const float* rows = logits.data() + row * vocab;
      row += p.draft.empty() ? 1 : p.count;
      if (!p.sample) continue;
      Sequence* seq = p.seq;
      if (!p.draft.empty()) {
        // Rows of the known token and the drafts: verify the drafts (records what it emits).
        const int64_t first = p.count - static_cast<int64_t>(p.draft.size()) - 1;
        absl::Status verified =
            seq->verifier->Verify(rows + first * vocab, vocab, p.draft, p.draft_probs, &p.verify);
        if (!verified.ok()) {
          step.status = verified;
          break;
        }
      } else if (seq->verifier != nullptr) {
        p.result = seq->verifier->Sample(rows, vocab);
      } else {
        p.result = seq->sampler->Sample(rows, vocab);
        seq->sampler->AddOutputToken(p.result.token);
      }
    }
  }
  step.done_at = Clock::now();
  step.forward_seconds = Seconds(t0, step.done_at);
}

void LlmEngine::ExecutorLoop() {
  while (true) {
    std::unique_ptr<Step> step;
    {
      std::unique_lock<std::mutex> lock(exec_mu_);
      exec_cv_.wait(lock, [&] { return exec_stop_ || exec_in_ != nullptr; });
      if (exec_in_ == nullptr) return;
      step = std::move(exec_in_);
    }
    ExecuteStep(*step);
    {
      std::lock_guard<std::mutex> lock(exec_mu_);
      exec_out_ = std::move(step);
    }
    exec_cv_.notify_all();
  }
}

void LlmEngine::Process(Step& step) {
  int64_t tokens = 0;
  int64_t spec_steps = 0, spec_verified = 0, spec_accepted = 0, longest_verified = 0;
  int64_t emitted_tokens = 0;
  int64_t generated_before = 0;  // the sampled sequences' output tokens before the step (trace)
  for (Planned& p : step.items) {
    Sequence* seq = p.seq;
    --seq->in_flight;
    tokens += p.count;
    if (p.sample) --seq->pending_samples;
    if (seq->state == Sequence::State::kFinished) continue;
    if (!step.status.ok()) {
      Finish(seq, FinishReason::kAborted, step.status);
      continue;
    }
    if (p.sample) generated_before += seq->generated();
    if (!p.sample) {
      seq->computed = std::max(seq->computed, p.start + p.count);
      CommitBlocks(seq);
      ReleaseOutOfWindow(seq);
      continue;
    }
    // The tokens this step emits for the sequence, and how far its KV is valid.
    ++emitted_tokens;
    std::vector<SampleResult> emitted;
    int64_t kv_end = p.start + p.count;
    if (p.draft.empty()) {
      emitted.push_back(std::move(p.result));
    } else {
      const int verified = static_cast<int>(p.draft.size());
      const int accepted = p.verify.accepted;
      ++spec_steps;
      spec_verified += verified;
      spec_accepted += accepted;
      longest_verified = std::max<int64_t>(longest_verified, verified);
      seq->usage.draft_tokens += verified;
      seq->usage.accepted_draft_tokens += accepted;
      speculative::DraftProposal proposal;
      proposal.tokens = p.draft;
      proposal.match_length = p.draft_match;
      if (calibration_ != nullptr) {
        calibration_->Observe(p.draft_confidence, verified, accepted);
        proposal.confidence = p.draft_confidence;
      } else {
        survival_->Observe(p.draft_match, verified, accepted);
      }
      drafter_->OnVerified(static_cast<int64_t>(seq->id), proposal, verified, accepted);
      // Positions of rejected drafts are rolled back: the next step rewrites from kv_end.
      kv_end -= verified - accepted;
      seq->scheduled_end -= verified - accepted;
      emitted = std::move(p.verify.tokens);
    }
    if (seq->prefill_only) {
      seq->computed = std::max(seq->computed, kv_end);
      const int32_t token = emitted[0].token;
      seq->tokens.push_back(token);
      CommitBlocks(seq);
      ReleaseOutOfWindow(seq);
      const auto now = Clock::now();
      seq->first_token_seen = true;
      seq->usage.first_token_us = Micros(seq->arrived, now);
      seq->last_token_at = now;
      // Hold the prompt's blocks for the transfer; the caller releases them.
      PrefillResult result;
      result.first_token = token;
      result.first_logprob = emitted[0].logprob;
      result.first_top = std::move(emitted[0].top);
      const int64_t prompt_blocks =
          (seq->prompt_len + options_.block_size - 1) / options_.block_size;
      const std::vector<int32_t>& table = *blocks_.Table(seq->id);
      result.block_ids.assign(table.begin(), table.begin() + prompt_blocks);
      result.cached_tokens = seq->usage.cached_prompt_tokens;
      if (options_.backend != nullptr) {
        // The transfer reads the host cache: bring the whole prompt there (cached blocks too:
        // the destination decides which it already holds).
        absl::Status copied = options_.backend->Download(result.block_ids, cache_.get());
        if (!copied.ok()) {
          Finish(seq, FinishReason::kAborted,
                 absl::InternalError(absl::StrCat("backend ", options_.backend->name(),
                                                  ": KV download: ", copied.message())));
          continue;
        }
      }
      auto it = std::find_if(running_.begin(), running_.end(),
                             [&](const auto& s) { return s.get() == seq; });
      held_.push_back(std::move(*it));
      running_.erase(it);
      seq->state = Sequence::State::kHeld;
      seq->prefill_done(std::move(result));
      continue;
    }
    // Emit token by token; the first stop condition truncates the rest of the run.
    EngineOutput o;
    o.request_id = seq->request_id;
    bool stopped = false;
    FinishReason reason = FinishReason::kLength;
    const auto now = Clock::now();
    for (SampleResult& r : emitted) {
      const int32_t token = r.token;
      seq->tokens.push_back(token);
      if (!seq->first_token_seen) {
        seq->first_token_seen = true;
        seq->usage.first_token_us = Micros(seq->arrived, now);
      } else {
        const int64_t gap = Micros(seq->last_token_at, now);
        seq->itl_sum_us += gap;
        seq->usage.max_itl_us = std::max(seq->usage.max_itl_us, gap);
      }
      seq->last_token_at = now;
      o.new_tokens.push_back(StepOutput{token, r.logprob, std::move(r.top)});
      if (seq->text != nullptr) {
        absl::StatusOr<std::string> d = seq->text->Push(token);
        if (d.ok()) o.text_delta += *d;
        if (seq->text->stopped()) {
          o.matched_stop = seq->text->matched_stop();
          stopped = true;
          reason = FinishReason::kStopString;
          break;
        }
      }
      const auto& eos = options_.eos_token_ids;
      const bool is_eos =
          !seq->sampling.ignore_eos && std::find(eos.begin(), eos.end(), token) != eos.end();
      const auto& stops = seq->sampling.stop_token_ids;
      const bool is_stop = std::find(stops.begin(), stops.end(), token) != stops.end();
      if (is_eos || is_stop || seq->generated() >= seq->sampling.max_tokens) {
        stopped = true;
        reason = is_eos || is_stop ? FinishReason::kStop : FinishReason::kLength;
        break;
      }
    }
    // KV is valid for the accepted run only, and never beyond the tokens actually kept.
    seq->computed =
        std::max(seq->computed, std::min(kv_end, static_cast<int64_t>(seq->tokens.size())));
    CommitBlocks(seq);
    ReleaseOutOfWindow(seq);
    if (!p.draft.empty() && !stopped) {
      // Free the blocks only rejected positions needed (the table covers `computed` tokens,
      // as after a step without speculation).
      (void)blocks_.Truncate(seq->id, seq->scheduled_end);
    }
    if (stopped) {
      if (reason != FinishReason::kStopString) seq->usage.completion_tokens = seq->generated();
      seq->on_output(o);
      Finish(seq, reason, absl::OkStatus());
      continue;
    }
    seq->on_output(o);
  }
  if (step.external) return;
  const auto processed_at = Clock::now();
  if (spdlog::should_log(spdlog::level::debug) && !step.items.empty()) {
    // One line per step for offline fits of step time (tools/bench/spec_sweep.sh SWEEP_TRACE=1):
    // period = time since the previous step's processing (0 after the engine idled); generated =
    // the sampled sequences' output tokens before the step (where in their answers it ran).
    int64_t samples = 0;
    for (const Planned& p : step.items) samples += p.sample ? 1 : 0;
    spdlog::debug(
        "step-trace mode={} measured={} decoding={} overlapped={} items={} samples={} tokens={} "
        "verified={} accepted={} generated={} "
        "period_us={} forward_us={} draft_us={} catch_up_us={} fit_scale={:.3f} "
        "fit_offset_us={:.0f} fit_per_request_us={:.0f} overhead_us={:.0f} "
        "overlap_overhead_us={:.0f} draft_scale={:.3f}",
        selector_.has_value() && step.spec_mode >= 0 ? selector_->length(step.spec_mode) : -2,
        step.SelectorMeasured() ? 1 : 0, step.spec_mode_decoding, step.spec_overlapped ? 1 : 0,
        step.items.size(), samples, tokens, spec_verified, spec_accepted, generated_before,
        have_last_processed_ ? static_cast<int64_t>(Seconds(last_processed_at_, processed_at) * 1e6)
                             : 0,
        static_cast<int64_t>(step.forward_seconds * 1e6),
        static_cast<int64_t>(step.spec_draft_seconds * 1e6),
        static_cast<int64_t>(step.spec_catch_up_seconds * 1e6), forward_fit_.Scale(),
        forward_fit_.offset() * 1e6, forward_fit_.per_request() * 1e6, overhead_ema_ * 1e6,
        overlap_overhead_ema_ * 1e6, draft_scale_);
  }
  last_processed_at_ = processed_at;
  have_last_processed_ = true;
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.steps;
  stats_.step_tokens += tokens;
  stats_.step_sequences += static_cast<int64_t>(step.items.size());
  stats_.last_step_tokens = tokens;
  stats_.last_step_sequences = static_cast<int64_t>(step.items.size());
  stats_.forward_seconds += step.forward_seconds;
  stats_.spec_steps += spec_steps;
  stats_.spec_verified_tokens += spec_verified;
  stats_.spec_longest_verified = std::max(stats_.spec_longest_verified, longest_verified);
  stats_.spec_accepted_tokens += spec_accepted;
  if (step.spec_timed && cost_ != nullptr && !step.items.empty()) {
    // The step's period (Schedule through this point) is modelled as s x T(tokens) (the target's
    // forward pass: the cost table scaled by how much slower it runs in service) + drafting + E.
    const double measured = Seconds(step.spec_start, processed_at);
    const double table =
        cost_->StepSeconds(static_cast<double>(tokens), static_cast<int>(step.items.size()));
    double& ema = step.spec_overlapped ? overlap_overhead_ema_ : overhead_ema_;
    bool& have = step.spec_overlapped ? have_overlap_overhead_ : have_overhead_;
    const int requests = static_cast<int>(step.items.size());
    const double predicted = forward_fit_.Predict(table, requests) + step.spec_draft_predicted +
                             (have ? std::max(0.0, ema) : 0.0);
    // Contention and contexts longer than the profile's make forward passes slower than the
    // table: by a factor, per sequence and per step (ForwardCostFit).
    forward_fit_.Observe(table, requests, step.forward_seconds);
    // The rest of the period: scheduling, n-gram drafting, sampling bookkeeping, output. A draft
    // model's drafting is modelled by its own table: its measured time (catch-up after steps
    // without drafts included) stays out. Synchronous steps (drafting ones among them) and
    // overlapped ones (no drafts) have their own overhead: the plan weighs drafting at the first
    // against not drafting at the second.
    const double sample = measured - step.forward_seconds - step.spec_draft_model_seconds;
    ema = have ? BoundedEmaStep(ema, sample, 100e-6) : sample;
    have = true;
    const double emitted = static_cast<double>(emitted_tokens + spec_accepted);
    if (step.spec_drafting >= 0) {
      rate_check_.Observe(step.spec_decoding, step.spec_drafting == 1, emitted, measured);
    }
    if (selector_.has_value() && step.spec_mode >= 0) {
      if (step.spec_prompt_catch_up) ++stats_.spec_prompt_catch_up_steps;
      if (step.spec_prompt_tokens) ++stats_.spec_select_prompt_steps;
      // No drafting is rated as it runs in a frozen bucket, without the draft model's upkeep:
      // that upkeep is a cost of keeping drafting possible, and charged to no drafting it hid
      // what drafting costs against a node without it (issue 12, session 15: a draft-model node
      // whose no-drafting steps paid ~0.5 ms of upkeep each rated the plan level with them, never
      // froze, and ran 15% below a node without speculation).
      const int length = selector_->length(step.spec_mode);
      double seconds = measured;
      if (length == 0) seconds = std::max(measured - step.spec_upkeep_seconds, 0.1 * measured);
      selector_->Observe(step.spec_mode_decoding, step.spec_mode, step.SelectorMeasured(), emitted,
                         seconds, step.spec_catch_up_seconds);
      if (length == speculative::DraftModeSelector::kPlan) {
        ++stats_.spec_select_plan_steps;
      } else if (length > 0) {
        ++stats_.spec_select_fixed_steps;
        stats_.spec_select_longest_fixed =
            std::max<int64_t>(stats_.spec_select_longest_fixed, length);
      } else {
        ++stats_.spec_select_off_steps;
      }
      if (selector_->epochs() != stats_.spec_select_epochs) {
        const int last = selector_->last_epoch_mode();
        spdlog::debug(
            "speculative: epoch {} runs mode {} (-1: the plan); the last compared ran {} "
            "at {:.0f} tokens/s",
            selector_->epochs(), selector_->length(selector_->current()),
            last >= 0 ? selector_->length(last) : -2, selector_->last_epoch_rate());
        const speculative::DraftModeSelector::LastTrial& trial = selector_->last_trial();
        if (trial.epoch >= 0 && trial.epoch != logged_trial_epoch_) {
          logged_trial_epoch_ = trial.epoch;
          spdlog::debug(
              "speculative: trial of mode {} against {} in bucket {} ({} and {} measured steps): "
              "{:.1f}% of its rate, weight {:.2f}; rated {:.1f}%",
              selector_->length(trial.mode), selector_->length(trial.incumbent),
              speculative::DraftModeSelector::BucketName(trial.bucket), trial.steps,
              trial.incumbent_steps, 100.0 * std::exp(trial.log_ratio), trial.weight,
              100.0 * std::exp(trial.score));
        }
        if (selector_->epochs() % kSelectorLogEpochs == 0) {
          spdlog::info(
              "speculative: measured modes (tokens/s by decoding sequences) {}; draft model "
              "upkeep {} tokens in {:.2f} s; {} steps held in a frozen bucket's mode",
              selector_->DebugString(), stats_.spec_draft_upkeep_tokens,
              stats_.spec_draft_upkeep_seconds, selector_->held_steps());
        }
      }
      stats_.spec_select_epochs = selector_->epochs();
      stats_.spec_select_explorations = selector_->explorations();
      stats_.spec_select_mode = selector_->length(selector_->current());
    }
    ++stats_.spec_timed_steps;
    stats_.spec_predicted_step_seconds += predicted;
    stats_.spec_measured_step_seconds += measured;
    stats_.spec_overhead_seconds = std::max(0.0, overhead_ema_);
    stats_.spec_overlap_overhead_seconds = std::max(0.0, overlap_overhead_ema_);
    stats_.spec_forward_scale = forward_fit_.Scale();
    stats_.spec_forward_offset_seconds = forward_fit_.offset();
    stats_.spec_forward_per_request_seconds = forward_fit_.per_request();
  }
}

void LlmEngine::RecordOutputToken(Sequence* seq, int32_t token) {
  if (seq->verifier != nullptr) {
    seq->verifier->processor().AddOutputToken(token);
  } else {
    seq->sampler->AddOutputToken(token);
  }
}

int64_t LlmEngine::CatchUpExcess(int64_t lag) const {
  const SpecOptions& so = options_.speculative;
  const int64_t steady =
      2 * static_cast<int64_t>(std::max(so.draft_upkeep_tokens, 0)) + so.num_speculative_tokens + 1;
  return std::max<int64_t>(lag - steady, 0);
}

bool LlmEngine::CatchesUpOnPrompt(int64_t lag) const { return CatchUpExcess(lag) > 0; }

void LlmEngine::UpkeepDrafter(const std::vector<Sequence*>& decodes, bool catch_up, Step* step) {
  const int64_t lag_min = options_.speculative.draft_upkeep_tokens;
  model_drafter_->set_decoding(static_cast<int64_t>(decodes.size()));
  std::vector<speculative::DraftRequest> requests;
  int64_t lags = 0;
  int64_t excess = 0;  // beyond what steady drafting or upkeep leaves behind (CatchUpExcess)
  for (const Sequence* seq : decodes) {
    // Feeding stops before the last known token (the next proposal feeds it for its logits).
    const int64_t lag = model_drafter_->Lag(static_cast<int64_t>(seq->id),
                                            static_cast<int64_t>(seq->tokens.size()) - 1);
    if (lag < lag_min) continue;
    if (!catch_up && CatchesUpOnPrompt(lag)) continue;
    if (CatchesUpOnPrompt(lag)) {
      step->spec_prompt_catch_up = true;
      excess += CatchUpExcess(lag);
    }
    lags += lag;
    speculative::DraftRequest r;
    r.seq_id = static_cast<int64_t>(seq->id);
    r.context = seq->tokens;
    requests.push_back(r);
  }
  if (requests.empty()) return;
  const int64_t fed_before = model_drafter_->computed_tokens();
  const auto t0 = Clock::now();
  absl::Status fed = model_drafter_->Feed(requests);
  const double seconds = Seconds(t0, Clock::now());
  if (!fed.ok()) spdlog::debug("speculative: draft model upkeep: {}", fed.ToString());
  const int64_t fed_tokens = model_drafter_->computed_tokens() - fed_before;
  std::lock_guard<std::mutex> lock(mu_);
  stats_.spec_draft_upkeep_tokens += fed_tokens;
  stats_.spec_draft_upkeep_seconds += seconds;
  stats_.spec_draft_skipped_tokens = model_drafter_->skipped_tokens();
  step->spec_upkeep_seconds += seconds;
  // A catch-up fed here (a drafting mode's step whose drafter left sequences behind, or one
  // after steps without upkeep) is part of the catch-up the selector charges drafting for.
  if (excess > 0 && lags > 0) {
    step->spec_catch_up_seconds +=
        seconds * static_cast<double>(excess) / static_cast<double>(lags);
  }
}

void LlmEngine::Draft(const std::vector<Sequence*>& decodes, int64_t spare, int step_tokens,
                      int step_requests, bool probe, int fixed_length, Step* step) {
  const SpecOptions& so = options_.speculative;
  // A fixed-length mode of the selector drafts and verifies like the non-adaptive engine.
  const int k = fixed_length > 0 ? std::min(fixed_length, so.num_speculative_tokens)
                                 : so.num_speculative_tokens;
  const bool adaptive = so.adaptive && cost_ != nullptr && fixed_length < 0;
  // Every decision below (draft length, budget, probe: PlanDrafting) uses only estimates and
  // times from earlier steps and the step count, never the drafts themselves: lossless
  // (budget.h).
  speculative::StepShape shape =
      SyncStepShape(static_cast<int>(decodes.size()), step_tokens, step_requests);
  probe = probe && adaptive;
  if (model_drafter_ != nullptr) model_drafter_->set_decoding(static_cast<int64_t>(decodes.size()));
  std::vector<int> caps(decodes.size());
  for (size_t i = 0; i < decodes.size(); ++i) {
    // Never draft past max_tokens: the step emits up to drafts + 1 tokens.
    const Sequence* seq = decodes[i];
    const int64_t room = seq->sampling.max_tokens - seq->generated() - 1;
    caps[i] = static_cast<int>(std::clamp<int64_t>(room, 0, k));
  }
  if (spare <= 0) {
    // No room left in the step's token budget: nothing drafted could be verified.
    std::fill(caps.begin(), caps.end(), 0);
  }
  bool no_draft = false;
  double keep_threshold = -1.0;  // >= 0: draft-model drafts stop by confidence (below)
  int probe_seq = -1;            // a probe's sequence (index into decodes), if any
  if (adaptive && calibration_ != nullptr && spare > 0) {
    // A draft model pays for every token it drafts, verified or not: one draft length for the
    // step, chosen before drafting from the prior rows and the target's and the draft's costs.
    std::vector<std::vector<double>> priors(decodes.size());
    for (size_t i = 0; i < decodes.size(); ++i) {
      calibration_->PositionPrior(caps[i], &priors[i]);
    }
    absl::StatusOr<speculative::DraftLengthPlan> length = speculative::PlanDraftLength(
        shape, priors, cost_.get(), draft_cost_.get(), draft_scale_, kDraftLengthMinGain);
    int l = length.ok() ? length->length : k;
    if (!probe && length.ok() && model_drafter_ != nullptr &&
        static_cast<int>(decodes.size()) >= so.draft_stop_extend_min_decoding) {
      // Up to the longest L nearly as good as the best: the confidence stop below cuts each
      // sequence's draft where the next token is not worth it (SpecOptions::draft_stop_extend).
      l = speculative::ExtendDraftLength(*length, so.draft_stop_extend);
    }
    no_draft = l == 0 && *std::max_element(caps.begin(), caps.end()) > 0;
    // A probe drafts one token more for one sequence: the one whose draft cache lags least (a
    // sequence not drafted for a while first feeds everything since into the draft model, which
    // for a whole batch would cost more than the probe learns). Chosen from the contexts only.
    if (probe && model_drafter_ != nullptr) {
      int64_t least = 0;
      for (size_t i = 0; i < decodes.size(); ++i) {
        if (caps[i] <= 0) continue;
        const int64_t lag = model_drafter_->Lag(static_cast<int64_t>(decodes[i]->id),
                                                static_cast<int64_t>(decodes[i]->tokens.size()));
        if (probe_seq < 0 || lag < least) {
          probe_seq = static_cast<int>(i);
          least = lag;
        }
      }
    }
    for (size_t i = 0; i < caps.size(); ++i) {
      const int allowed = static_cast<int>(i) == probe_seq || (probe && model_drafter_ == nullptr)
                              ? std::min(k, l + 1)
                              : l;
      caps[i] = std::min(caps[i], allowed);
    }
    if ((probe ? so.probe_past_stop && l >= 1 : l > 1) && length.ok() && length->adaptive &&
        model_drafter_ != nullptr) {
      // Within the plan's L, each sequence stops drafting early once the draft's own confidence
      // (known before each token is drawn) says the next token is not worth its time: position
      // j >= 1 is drafted (and then verified) while its calibrated survival a_j is at least the
      // plan's rate x (one more verified token + its share of a draft round). A probe's sequence
      // drafts one position past its stop (speculative::ConfidenceStop).
      const double t0 = static_cast<double>(shape.step_tokens + length->budget);
      const double verify_token =
          shape.cost_scale * (cost_->StepSeconds(t0 + 1.0, shape.step_requests) -
                              cost_->StepSeconds(t0, shape.step_requests));
      const int n = static_cast<int>(decodes.size());
      const double draft_token =
          draft_cost_ != nullptr ? draft_scale_ * draft_cost_->StepSeconds(n, n) / n : 0.0;
      keep_threshold = length->tokens_per_second * (verify_token + draft_token);
    }
  }
  double draft_profiled = 0.0;  // the round-cost table's prediction, unscaled
  if (calibration_ != nullptr && draft_cost_ != nullptr) {
    draft_profiled = speculative::DraftSeconds(*draft_cost_, caps, k);
  }
  double draft_predicted = draft_scale_ * draft_profiled;
  step->spec_draft_predicted = draft_predicted;
  for (Sequence* seq : decodes) {
    seq->draft.clear();
    seq->draft_match = 0;
    seq->draft_probs.clear();
    seq->draft_confidence.clear();
  }
  // All decoding sequences are drafted together (a draft model batches its forward passes).
  std::vector<speculative::DraftRequest> requests;
  std::vector<Sequence*> asked;
  for (size_t i = 0; i < decodes.size(); ++i) {
    if (caps[i] <= 0) continue;
    Sequence* seq = decodes[i];
    speculative::DraftRequest r;
    r.seq_id = static_cast<int64_t>(seq->id);
    r.context = seq->tokens;
    r.k = caps[i];
    r.temperature = seq->sampling.temperature;
    if (keep_threshold >= 0.0) {
      // a_j = prod_{i<=j} c(confidence_i): the first token is always drafted (the catch-up
      // round that computes it is paid once drafting is on), later ones while a_j is worth it.
      r.keep_drafting = speculative::ConfidenceStop(calibration_.get(), keep_threshold,
                                                    static_cast<int>(i) == probe_seq ? 1 : 0);
    }
    requests.push_back(r);
    asked.push_back(seq);
  }
  double draft_seconds = 0.0;
  int64_t drafted = 0;
  if (!requests.empty()) {
    std::vector<speculative::DraftProposal> proposals;
    const int64_t fed_before = model_drafter_ != nullptr ? model_drafter_->computed_tokens() : 0;
    if (model_drafter_ != nullptr) {
      for (const speculative::DraftRequest& r : requests) {
        const int64_t lag =
            model_drafter_->Lag(r.seq_id, static_cast<int64_t>(r.context.size()));
        if (CatchesUpOnPrompt(lag)) step->spec_prompt_catch_up = true;
      }
    }
    const auto t0 = Clock::now();
    absl::Status proposed = drafter_->ProposeBatch(requests, &proposals);
    draft_seconds = Seconds(t0, Clock::now());
    if (calibration_ != nullptr) step->spec_draft_model_seconds = draft_seconds;
    step->spec_draft_seconds = draft_seconds;
    // What a steady round feeds: per sequence the tokens accepted since its last draft (at most
    // its previous draft length + the bonus token) and its new drafts. More means the draft
    // cache caught up on a whole new prompt (a new request, or one drafted after steps without
    // drafts or after eviction): a one-off prefill the per-round profile does not describe.
    int64_t steady_tokens = 0;
    for (const speculative::DraftRequest& r : requests) steady_tokens += 2 * r.k + 2;
    const int64_t fed =
        model_drafter_ != nullptr ? model_drafter_->computed_tokens() - fed_before : 0;
    const bool caught_up = fed > steady_tokens;
    if (caught_up) {
      // The catch-up's share of the drafting time, by tokens fed (the selector's catch-up
      // charge, speculative::DraftModeSelector).
      step->spec_catch_up_seconds =
          draft_seconds * static_cast<double>(fed - steady_tokens) / static_cast<double>(fed);
    }
    if (keep_threshold >= 0.0 && draft_cost_ != nullptr) {
      // Drafts stopped by confidence ran fewer rounds than the caps: predict from the rounds
      // each sequence took part in (its tokens, plus the round whose token it declined).
      std::vector<int> rounds(requests.size(), 0);
      for (size_t i = 0; i < requests.size() && i < proposals.size(); ++i) {
        const int m = static_cast<int>(proposals[i].tokens.size());
        rounds[i] = std::min(requests[i].k, m + 1);
      }
      draft_profiled = speculative::DraftSeconds(*draft_cost_, rounds, k);
      draft_predicted = draft_scale_ * draft_profiled;
      step->spec_draft_predicted = draft_predicted;
    }
    if (caught_up && selector_.has_value() && step->spec_mode >= 0 && !step->spec_mode_measured) {
      // Right after a change of mode: the draft model is still catching up on the steps it
      // skipped, which belongs to the change, not to the new mode's steady rate.
      selector_->StillWarming();
    }
    if (adaptive && !probe && !caught_up && draft_profiled > 0.0 && draft_seconds > 0.0) {
      // Learn how far real drafting (choosing tokens, real contexts) is from the profile. Probes
      // and catch-up rounds are left out: they also prefill the draft cache.
      draft_scale_ = BoundedEmaStep(draft_scale_, draft_seconds / draft_profiled, 0.0);
    }
    if (!proposed.ok()) spdlog::debug("speculative: drafter: {}", proposed.ToString());
    for (size_t i = 0; i < asked.size() && i < proposals.size(); ++i) {
      Sequence* seq = asked[i];
      speculative::DraftProposal& proposal = proposals[i];
      seq->draft = std::move(proposal.tokens);
      seq->draft_match = proposal.match_length;
      seq->draft_probs = std::move(proposal.probs);
      seq->draft_confidence = std::move(proposal.confidence);
      drafted += static_cast<int64_t>(seq->draft.size());
    }
  }
  std::vector<int> verify_len(decodes.size());
  for (size_t i = 0; i < decodes.size(); ++i) {
    verify_len[i] = static_cast<int>(decodes[i]->draft.size());
  }
  if (adaptive && drafted > 0 && keep_threshold < 0.0) {
    // (Drafts stopped by confidence are verified whole: each token was drafted only because its
    // survival, known before it was drawn, paid for its verification.)
    // The budget comes from earlier steps' acceptance estimates (keyed by match length and
    // position), never from the drafted tokens themselves: lossless (budget.h). The drafting
    // just done is part of the step's time.
    std::vector<speculative::VerifyCandidate> candidates(decodes.size());
    for (size_t i = 0; i < decodes.size(); ++i) {
      const Sequence* seq = decodes[i];
      if (calibration_ != nullptr) {
        // Prior from per-position rates sizes B; the current row (confidences known before
        // each token was chosen) hands out the slots.
        const speculative::DraftCalibration* calibration = calibration_.get();
        calibration->PositionPrior(verify_len[i], &candidates[i].prior);
        if (seq->draft_confidence.size() == static_cast<size_t>(verify_len[i])) {
          calibration->Survival(seq->draft_confidence, &candidates[i].current);
        }
      } else {
        survival_->Survival(seq->draft_match, verify_len[i], &candidates[i].prior);
      }
    }
    shape.extra_seconds += draft_predicted;
    absl::StatusOr<speculative::VerifyPlan> plan =
        speculative::PlanVerification(shape, candidates, cost_.get());
    if (plan.ok()) {
      // A probe verifies one draft more than the plan per sequence: whether d_j is verified
      // still depends only on a_1..a_{j-1} of its own row.
      for (size_t i = 0; i < decodes.size(); ++i) {
        verify_len[i] = std::min(verify_len[i], plan->verify_len[i] + (probe ? 1 : 0));
      }
    }
  }
  // Whatever the plan, the step's token budget has the last word (in running order).
  for (size_t i = 0; i < decodes.size(); ++i) {
    const int64_t len = std::min<int64_t>(verify_len[i], spare);
    decodes[i]->draft.resize(len);
    spare -= len;
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_.spec_drafted_tokens += drafted;
  stats_.spec_draft_seconds += draft_seconds;
  stats_.spec_draft_predicted_seconds += draft_predicted;
  if (no_draft) ++stats_.spec_no_draft_steps;
  stats_.spec_draft_cost_scale = draft_scale_;
  if (model_drafter_ != nullptr) {
    stats_.spec_draft_evictions = model_drafter_->evictions();
    stats_.spec_draft_reused_tokens = model_drafter_->reused_tokens();
    stats_.spec_draft_skipped_tokens = model_drafter_->skipped_tokens();
  }
  if (probe) ++stats_.spec_probe_steps;
}

void LlmEngine::PublishQueueStats() {
  stats_.running = static_cast<int64_t>(running_.size());
  stats_.waiting = static_cast<int64_t>(waiting_.size());
  stats_.awaiting_kv = static_cast<int64_t>(awaiting_kv_.size());
  int64_t pending_prefill = 0;
  for (const auto& w : waiting_) {
    pending_prefill += static_cast<int64_t>(w->tokens.size()) - w->computed;
  }
  for (const auto& r : running_) {
    pending_prefill += std::max<int64_t>(0, r->prompt_len - r->computed);
  }
  stats_.pending_prefill_tokens = pending_prefill;
  stats_.held = static_cast<int64_t>(held_.size());
  stats_.blocks = blocks_.stats();
  for (const KvEvent& e : blocks_.DrainEvents()) {
    if (kv_events_.size() >= kMaxPendingKvEvents) {
      kv_events_.pop_front();
      ++stats_.kv_events_dropped;
    }
    kv_events_.push_back(e);
  }
}

void LlmEngine::SchedulerLoop() {
  bool in_flight = false;
  Clock::time_point last_done = Clock::now();
  bool have_last_done = false;
  while (true) {
    bool stopping = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (!incoming_.empty()) {
        std::unique_ptr<Sequence> seq = std::move(incoming_.front());
        incoming_.pop_front();
        seq->id = next_seq_id_++;
        seq->arrival = arrival_counter_++;
        auto pos = std::find_if(waiting_.begin(), waiting_.end(),
                                [&](const auto& w) { return w->priority < seq->priority; });
        waiting_.insert(pos, std::move(seq));
      }
      stopping = stopping_;
    }
    std::deque<std::function<void()>> commands;
    {
      std::lock_guard<std::mutex> lock(mu_);
      commands.swap(commands_);
    }
    for (auto& command : commands) command();
    HandleAborts();
    if (stopping) {
      std::vector<Sequence*> all;
      for (auto& s : waiting_) all.push_back(s.get());
      for (auto& s : running_) all.push_back(s.get());
      for (auto& s : awaiting_kv_) all.push_back(s.get());
      for (auto& s : held_) all.push_back(s.get());
      for (Sequence* s : all)
        Finish(s, FinishReason::kAborted, absl::CancelledError("engine stopped"));
    }

    // Waits for the step in flight and processes its outputs.
    auto complete_in_flight = [&] {
      if (!in_flight) return;
      std::unique_ptr<Step> done;
      {
        std::unique_lock<std::mutex> lock(exec_mu_);
        exec_cv_.wait(lock, [&] { return exec_out_ != nullptr; });
        done = std::move(exec_out_);
      }
      last_done = done->done_at;
      have_last_done = true;
      Process(*done);
      in_flight = false;
    };
    // Blocks of finished or preempted sequences are released once no step uses them.
    auto release = [&] {
      for (auto it = finished_pending_free_.begin(); it != finished_pending_free_.end();) {
        Sequence* seq = it->get();
        if (seq->in_flight > 0) {
          ++it;
          continue;
        }
        if (seq->has_blocks) (void)blocks_.Free(seq->id);
        it = finished_pending_free_.erase(it);
      }
      std::vector<Sequence*> victims;
      for (auto& s : running_) {
        if (s->preempt_requested && s->in_flight == 0) victims.push_back(s.get());
      }
      for (Sequence* v : victims) Preempt(v);
    };

    // Speculative decoding: a step that may draft needs every sequence's latest token, so the
    // step in flight is processed first; one that may not is prepared while it runs.
    const DraftGate gate = stopping ? DraftGate() : PlanDrafting();
    if (gate.may_draft && in_flight) {
      complete_in_flight();
      release();
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.spec_synced_steps;
    }
    const auto sched_start = Clock::now();
    std::unique_ptr<Step> next = stopping ? std::make_unique<Step>() : Schedule(gate);
    const auto sched_end = Clock::now();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.schedule_seconds += Seconds(sched_start, sched_end);
    }
    complete_in_flight();
    release();

    const bool had_work = !next->items.empty();
    if (had_work) {
      const auto submit_at = Clock::now();
      if (overlap_ && have_last_done && submit_at > last_done) {
        // The executor sat idle from the previous step's end until now: scheduling time that
        // the overlap did not hide.
        std::lock_guard<std::mutex> lock(mu_);
        stats_.exposed_schedule_seconds += Seconds(last_done, submit_at);
      }
      Clock::time_point executed_at = Clock::time_point::min();
      in_flight = FinalizeAndSubmit(std::move(next), &executed_at);
      if (executed_at != Clock::time_point::min()) {
        // Ran inline: the executor's next idle period starts where it ended.
        last_done = executed_at;
        have_last_done = true;
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      PublishQueueStats();
    }
    if (stopping && !in_flight && finished_pending_free_.empty()) return;
    if (!had_work && !in_flight) {
      have_last_done = false;
      have_last_processed_ = false;
      std::unique_lock<std::mutex> lock(mu_);
      const bool runnable = !waiting_.empty() || !running_.empty();
      wake_.wait_for(lock, std::chrono::milliseconds(runnable ? 1 : 50), [&] {
        return stopping_ || !incoming_.empty() || !abort_requests_.empty() || !commands_.empty();
      });
    }
  }
}

}  // namespace deepinfer::engine
