#include "engine/llm_engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "engine/block_hash.h"
#include "engine/chat_template/chat_template.h"
#include "engine/speculative/controller.h"
#include "engine/speculative/drafter.h"
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
  // Drafts chosen for the step being planned (PrepareSpeculation -> Schedule's plan).
  speculative::DraftProposal draft;
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
  LayerKvCallback on_layer_kv;  // set at creation (SubmitPrefill), read by the executor

  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
};

struct LlmEngine::Planned {
  Sequence* seq = nullptr;
  uint64_t epoch = 0;
  int64_t start = 0;
  int64_t count = 0;
  bool sample = false;
  // Speculative tokens after the one known input token (probabilities and confidences trimmed
  // to them).
  speculative::DraftProposal draft;
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
  speculative::StepRecord spec;  // speculative decoding's record of the step
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
  std::unique_ptr<LlmEngine> engine(new LlmEngine(model, options, std::move(cache)));
  if (options.speculative.enabled) {
    speculative::EngineLimits limits;
    limits.vocab_size = model->config().vocab_size;
    limits.num_blocks = options.num_blocks;
    limits.block_size = options.block_size;
    limits.max_batch_tokens = options.max_batch_tokens;
    limits.max_running = options.max_running;
    limits.max_position_embeddings = model->config().max_position_embeddings;
    limits.hash_seed = options.hash_seed;
    limits.rows_per_pass = engine->RowsPerPass();
    LlmEngine* e = engine.get();
    DI_ASSIGN_OR_RETURN(engine->controller_,
                        speculative::SpeculativeController::Create(
                            options.speculative, limits,
                            [e](int tokens, int requests, int64_t context) {
                              return e->ProfileStep(tokens, requests, context);
                            }));
    std::lock_guard<std::mutex> lock(engine->mu_);
    engine->ExportSpecStats();
  }
  return engine;
}

absl::Status LlmEngine::RunForward(const std::vector<SequenceInput>& batch,
                                   std::vector<float>* logits,
                                   const std::function<void(int layer)>& on_layer_kv) {
  ForwardBackend* backend = options_.backend;
  return backend != nullptr ? backend->Forward(batch, logits)
                            : model_->Forward(batch, cache_.get(), logits, on_layer_kv);
}

int LlmEngine::RowsPerPass() const {
  return options_.backend != nullptr
             ? 0
             : kernels::LinearRowsPerPass(model_->activation_dtype(), kernels::BestCpuIsa());
}

absl::StatusOr<double> LlmEngine::ProfileStep(int tokens, int requests, int64_t context) {
  // Scratch blocks: no sequence holds any block yet (Create runs before Start), and whatever is
  // written is overwritten before anyone reads it.
  const int bs = options_.block_size;
  const int vocab = model_->config().vocab_size;
  std::vector<SequenceInput> batch(requests);
  const int64_t per_blocks = (context + (tokens + requests - 1) / requests + bs - 1) / bs;
  std::vector<int32_t> ids(tokens, 0);
  for (int i = 0; i < tokens; ++i) ids[i] = (i * 131 + 7) % vocab;
  std::vector<int32_t> tables(requests * per_blocks);
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
  std::vector<float> logits;
  const auto t0 = Clock::now();
  DI_RETURN_IF_ERROR(RunForward(batch, &logits));
  return Seconds(t0, Clock::now());
}

void LlmEngine::ExportSpecStats() {
  if (controller_ != nullptr) {
    static_cast<speculative::SpecStats&>(stats_) = controller_->stats();
  }
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
  LayerKvCallback on_layer_kv = std::move(request.on_layer_kv);
  DI_ASSIGN_OR_RETURN(std::unique_ptr<Sequence> seq,
                      MakeSequence(std::move(request), [](const EngineOutput&) {}));
  PrefillCallback report = std::move(done);
  seq->prefill_only = true;
  // Layer hooks need the KV in the host cache as each layer ends and every old block kept.
  if (options_.backend == nullptr && !model_->all_layers_sliding()) {
    seq->on_layer_kv = std::move(on_layer_kv);
  }
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
  if (controller_ != nullptr) controller_->Release(static_cast<int64_t>(seq->id));
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

void LlmEngine::CollectDecodes(std::vector<Sequence*>* decodes,
                               std::vector<speculative::DecodeView>* views,
                               int64_t* prefill_tokens, int* prefills) {
  *prefill_tokens = 0;
  *prefills = 0;
  for (auto& owned : running_) {
    Sequence* seq = owned.get();
    if (seq->preempt_requested) continue;
    const int64_t avail =
        static_cast<int64_t>(seq->tokens.size()) + seq->pending_samples - seq->scheduled_end;
    if (avail == 1 && seq->verifier != nullptr) {
      decodes->push_back(seq);
      speculative::DecodeView view;
      view.seq_id = static_cast<int64_t>(seq->id);
      view.context = seq->tokens;
      view.temperature = seq->sampling.temperature;
      view.room = seq->sampling.max_tokens - seq->generated() - seq->pending_samples - 1;
      views->push_back(view);
    } else if (avail > 0) {
      *prefill_tokens += avail;
      ++*prefills;
    }
  }
}

speculative::StepPlan LlmEngine::PlanDrafting() {
  if (controller_ == nullptr) return speculative::StepPlan();
  // The next step's decoding sequences as Schedule will see them once the step in flight (if
  // any) is processed.
  std::vector<Sequence*> decodes;
  std::vector<speculative::DecodeView> views;
  int64_t prefill_tokens = 0;
  int prefills = 0;
  CollectDecodes(&decodes, &views, &prefill_tokens, &prefills);
  return controller_->Plan(views, prefill_tokens, prefills);
}

void LlmEngine::PrepareSpeculation(const speculative::StepPlan& plan, int64_t budget,
                                   Step* step) {
  // Decoding sequences (one known token to feed) get drafts within what the budget has left
  // after one token each, when the plan allows it: then nothing is in flight and every
  // sequence's tokens are known here. Otherwise (a step may be in flight, sampling for some of
  // them) they are planned as plain one-token decodes.
  std::vector<Sequence*> decodes;
  std::vector<speculative::DecodeView> views;
  int64_t prefill_tokens = 0;
  int prefills = 0;
  CollectDecodes(&decodes, &views, &prefill_tokens, &prefills);
  bool all_known = true;
  for (const Sequence* seq : decodes) all_known = all_known && seq->pending_samples == 0;
  // Its period: from the previous step's processing (the loop's own work between steps is part
  // of every step's cost), or from here after the engine idled.
  const Clock::time_point period_start = have_last_processed_ ? last_processed_at_ : Clock::now();
  std::vector<speculative::DraftProposal> drafts;
  controller_->PrepareStep(plan, views, all_known, prefill_tokens, prefills, budget, period_start,
                           &step->spec, &drafts);
  for (size_t i = 0; i < decodes.size(); ++i) decodes[i]->draft = std::move(drafts[i]);
}

void LlmEngine::PlanSequence(Sequence* seq, Step* step, int64_t* budget, bool* preempting) {
  // Drafts chosen for this step (decoding sequences only).
  speculative::DraftProposal draft = std::move(seq->draft);
  seq->draft = speculative::DraftProposal();
  const int64_t known = static_cast<int64_t>(seq->tokens.size()) + seq->pending_samples;
  const int64_t avail = known - seq->scheduled_end;
  if (avail <= 0 || *budget <= 0) return;
  // A sequence whose planned samples already reach max_tokens is finishing: nothing to do.
  if (seq->generated() + seq->pending_samples >= seq->sampling.max_tokens) return;
  if (avail != 1) draft.tokens.clear();
  draft.tokens.resize(std::min<int64_t>(draft.tokens.size(), std::max<int64_t>(*budget - 1, 0)));
  int64_t count = std::min(avail + static_cast<int64_t>(draft.tokens.size()), *budget);
  if (!options_.chunked_prefill && count < avail) {
    if (!step->items.empty()) return;
    count = avail;  // alone in the step: run the whole prompt
  }
  absl::Status grown = blocks_.Grow(seq->id, seq->scheduled_end + count);
  if (!grown.ok() && !draft.tokens.empty()) {
    // No room for the drafts: decode without them rather than preempt anyone.
    draft.tokens.clear();
    count = avail;
    grown = blocks_.Grow(seq->id, seq->scheduled_end + count);
  }
  if (!grown.ok()) {
    // Free room: ask the newest, lowest-priority other running sequence to give its blocks back
    // once the step in flight is done.
    Sequence* victim = nullptr;
    for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
      Sequence* s = it->get();
      // A streaming prefill's blocks may be read by transfers in flight: never take them.
      if (s == seq || s->preempt_requested || s->on_layer_kv) continue;
      if (victim == nullptr || s->priority < victim->priority) victim = s;
    }
    if (victim != nullptr) victim->preempt_requested = true;
    *preempting = true;
    return;
  }
  Planned p;
  p.seq = seq;
  p.epoch = seq->epoch;
  p.start = seq->scheduled_end;
  p.count = count;
  p.sample = p.start + count - static_cast<int64_t>(draft.tokens.size()) == known;
  if (!draft.tokens.empty()) {
    // Probabilities and confidences follow the drafts kept (a prefix of those proposed).
    const size_t kept = draft.tokens.size();
    if (!draft.probs.empty()) draft.probs.resize(kept * model_->config().vocab_size);
    if (!draft.confidence.empty()) draft.confidence.resize(kept);
    p.draft = std::move(draft);
  }
  seq->scheduled_end += count;
  if (p.sample) ++seq->pending_samples;
  *budget -= count;
  step->items.push_back(std::move(p));
}

bool LlmEngine::AdmitWaiting() {
  Sequence* seq = waiting_.front().get();
  std::vector<uint64_t> hashes;
  if (options_.enable_prefix_cache) hashes = FullBlockHashes(*seq);
  absl::StatusOr<int64_t> cached =
      blocks_.AllocateSequence(seq->id, static_cast<int64_t>(seq->tokens.size()), hashes);
  if (!cached.ok()) return false;
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
  std::lock_guard<std::mutex> lock(mu_);
  --queued_;
  return true;
}

std::unique_ptr<LlmEngine::Step> LlmEngine::Schedule(const speculative::StepPlan& plan) {
  auto step = std::make_unique<Step>();
  int64_t budget = options_.max_batch_tokens;
  bool preempting = false;
  if (controller_ != nullptr) PrepareSpeculation(plan, budget, step.get());
  // Decodes first (one token each, plus drafts), then continuing prefills.
  for (int pass = 0; pass < 2; ++pass) {
    for (auto& owned : running_) {
      Sequence* seq = owned.get();
      if (seq->preempt_requested) continue;
      const int64_t avail =
          static_cast<int64_t>(seq->tokens.size()) + seq->pending_samples - seq->scheduled_end;
      if ((pass == 0) != (avail == 1)) continue;
      PlanSequence(seq, step.get(), &budget, &preempting);
    }
  }
  // Admissions: priority, then FCFS; stop at the first that does not fit.
  // No admissions while running sequences are short of blocks.
  for (auto& s : running_) preempting = preempting || s->preempt_requested;
  while (!preempting && budget > 0 && static_cast<int>(running_.size()) < options_.max_running &&
         !waiting_.empty()) {
    if (!AdmitWaiting()) break;
    PlanSequence(running_.back().get(), step.get(), &budget, &preempting);
  }
  for (const Planned& p : step->items) {
    // A decode is one sampled token plus its drafts; anything else computes prompt tokens.
    if (!p.sample || p.count - static_cast<int64_t>(p.draft.tokens.size()) > 1) {
      step->spec.prompt_tokens = true;
    }
  }
  return step;
}

bool LlmEngine::FinalizeAndSubmit(std::unique_ptr<Step> step, Clock::time_point* executed_at) {
  std::vector<Planned> kept;
  for (Planned& p : step->items) {
    Sequence* seq = p.seq;
    if (seq->state != Sequence::State::kRunning || seq->epoch != p.epoch) continue;
    const int64_t known = p.count - static_cast<int64_t>(p.draft.tokens.size());
    p.input.assign(seq->tokens.begin() + p.start, seq->tokens.begin() + p.start + known);
    p.input.insert(p.input.end(), p.draft.tokens.begin(), p.draft.tokens.end());
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
  for (const Planned& p : step->items) has_draft = has_draft || !p.draft.tokens.empty();
  if (!overlap_ || has_draft) {
    // A step with drafts runs alone: the next one's positions depend on what it accepts.
    ExecuteStep(*step);
    *executed_at = step->done_at;
    Process(*step);
    return false;
  }
  // Overlapped: its period runs from the previous step's processing (which comes after its
  // scheduling) to its own.
  step->spec.overlapped = true;
  if (step->spec.timed && have_last_processed_) step->spec.start = last_processed_at_;
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
    in.all_logits = !p.draft.tokens.empty();
    if (!p.embedding_rows.empty()) in.embedding_override = p.embedding_rows.data();
    inputs.push_back(in);
  }
  // Streaming prefills (EngineRequest::on_layer_kv) hear of each layer as its KV is stored.
  std::function<void(int)> on_layer_kv;
  if (std::any_of(step.items.begin(), step.items.end(),
                  [](const Planned& p) { return static_cast<bool>(p.seq->on_layer_kv); })) {
    on_layer_kv = [&step](int layer) {
      for (const Planned& p : step.items) {
        if (!p.seq->on_layer_kv) continue;
        LayerKvReady ready;
        ready.layer = layer;
        ready.kv_end = p.start + p.count;
        ready.block_table = p.table;
        p.seq->on_layer_kv(ready);
      }
    };
  }
  std::vector<float> logits;
  step.status = RunForward(inputs, &logits, on_layer_kv);
  if (step.status.ok()) {
    const int vocab = model_->config().vocab_size;
    int64_t row = 0;
    for (Planned& p : step.items) {
      const float* rows = logits.data() + row * vocab;
      row += p.draft.tokens.empty() ? 1 : p.count;
      if (!p.sample) continue;
      Sequence* seq = p.seq;
      if (!p.draft.tokens.empty()) {
        // Rows of the known token and the drafts: verify the drafts (records what it emits).
        const int64_t first = p.count - static_cast<int64_t>(p.draft.tokens.size()) - 1;
        absl::Status verified =
            seq->verifier->Verify(rows + first * vocab, vocab, p.draft.tokens, p.draft.probs,
                                 &p.verify);
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
  StepTally tally;
  for (Planned& p : step.items) ProcessItem(step, p, &tally);
  if (step.external) return;
  FinishStep(step, tally);
}

void LlmEngine::ProcessItem(const Step& step, Planned& p, StepTally* tally) {
  Sequence* seq = p.seq;
  --seq->in_flight;
  tally->tokens += p.count;
  if (p.sample) --seq->pending_samples;
  if (seq->state == Sequence::State::kFinished) return;
  if (!step.status.ok()) {
    Finish(seq, FinishReason::kAborted, step.status);
    return;
  }
  if (!p.sample) {
    seq->computed = std::max(seq->computed, p.start + p.count);
    CommitBlocks(seq);
    ReleaseOutOfWindow(seq);
    return;
  }
  tally->generated_before += seq->generated();
  // The tokens this step emits for the sequence, and how far its KV is valid.
  ++tally->emitted_tokens;
  std::vector<SampleResult> emitted;
  int64_t kv_end = p.start + p.count;
  if (p.draft.tokens.empty()) {
    emitted.push_back(std::move(p.result));
  } else {
    const int verified = static_cast<int>(p.draft.tokens.size());
    const int accepted = p.verify.accepted;
    tally->verified += verified;
    tally->accepted += accepted;
    seq->usage.draft_tokens += verified;
    seq->usage.accepted_draft_tokens += accepted;
    controller_->OnVerified(static_cast<int64_t>(seq->id), p.draft, verified, accepted);
    // Positions of rejected drafts are rolled back: the next step rewrites from kv_end.
    kv_end -= verified - accepted;
    seq->scheduled_end -= verified - accepted;
    emitted = std::move(p.verify.tokens);
  }
  if (seq->prefill_only) {
    HoldPrefilled(seq, emitted[0], kv_end);
    return;
  }
  EmitTokens(seq, !p.draft.tokens.empty(), &emitted, kv_end);
}

void LlmEngine::HoldPrefilled(Sequence* seq, SampleResult& first, int64_t kv_end) {
  seq->computed = std::max(seq->computed, kv_end);
  const int32_t token = first.token;
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
  result.first_logprob = first.logprob;
  result.first_top = std::move(first.top);
  const int64_t prompt_blocks = (seq->prompt_len + options_.block_size - 1) / options_.block_size;
  const std::vector<int32_t>& table = *blocks_.Table(seq->id);
  result.block_ids.assign(table.begin(), table.begin() + prompt_blocks);
  result.cached_tokens = seq->usage.cached_prompt_tokens;
  if (options_.backend != nullptr) {
    // The transfer reads the host cache: bring the whole prompt there (cached blocks too: the
    // destination decides which it already holds).
    absl::Status copied = options_.backend->Download(result.block_ids, cache_.get());
    if (!copied.ok()) {
      Finish(seq, FinishReason::kAborted,
             absl::InternalError(absl::StrCat("backend ", options_.backend->name(),
                                              ": KV download: ", copied.message())));
      return;
    }
  }
  auto it = std::find_if(running_.begin(), running_.end(),
                         [&](const auto& s) { return s.get() == seq; });
  held_.push_back(std::move(*it));
  running_.erase(it);
  seq->state = Sequence::State::kHeld;
  seq->prefill_done(std::move(result));
}

void LlmEngine::EmitTokens(Sequence* seq, bool drafted, std::vector<SampleResult>* emitted,
                           int64_t kv_end) {
  // Emit token by token; the first stop condition truncates the rest of the run.
  EngineOutput o;
  o.request_id = seq->request_id;
  bool stopped = false;
  FinishReason reason = FinishReason::kLength;
  const auto now = Clock::now();
  for (SampleResult& r : *emitted) {
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
  if (drafted && !stopped) {
    // Free the blocks only rejected positions needed (the table covers `computed` tokens,
    // as after a step without speculation).
    (void)blocks_.Truncate(seq->id, seq->scheduled_end);
  }
  if (stopped) {
    if (reason != FinishReason::kStopString) seq->usage.completion_tokens = seq->generated();
    seq->on_output(o);
    Finish(seq, reason, absl::OkStatus());
    return;
  }
  seq->on_output(o);
}

void LlmEngine::FinishStep(const Step& step, const StepTally& tally) {
  const auto processed_at = Clock::now();
  if (spdlog::should_log(spdlog::level::debug) && !step.items.empty()) {
    LogStepTrace(step, tally, processed_at);
  }
  last_processed_at_ = processed_at;
  have_last_processed_ = true;
  if (controller_ != nullptr) {
    speculative::StepOutcome outcome;
    outcome.tokens = tally.tokens;
    outcome.requests = static_cast<int>(step.items.size());
    outcome.forward_seconds = step.forward_seconds;
    outcome.emitted = static_cast<double>(tally.emitted_tokens + tally.accepted);
    controller_->OnStepProcessed(step.spec, outcome, processed_at);
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.steps;
  stats_.step_tokens += tally.tokens;
  stats_.step_sequences += static_cast<int64_t>(step.items.size());
  stats_.last_step_tokens = tally.tokens;
  stats_.last_step_sequences = static_cast<int64_t>(step.items.size());
  stats_.forward_seconds += step.forward_seconds;
  ExportSpecStats();
}

void LlmEngine::LogStepTrace(const Step& step, const StepTally& tally,
                             Clock::time_point processed_at) const {
  // One line per step for offline fits of step time (tools/bench/spec_sweep.sh SWEEP_TRACE=1):
  // period = time since the previous step's processing (0 after the engine idled); generated =
  // the sampled sequences' output tokens before the step (where in their answers it ran).
  int64_t samples = 0;
  for (const Planned& p : step.items) samples += p.sample ? 1 : 0;
  const speculative::TraceFigures f =
      controller_ != nullptr ? controller_->Trace(step.spec) : speculative::TraceFigures();
  spdlog::debug(
      "step-trace mode={} measured={} decoding={} overlapped={} items={} samples={} tokens={} "
      "verified={} accepted={} generated={} "
      "period_us={} forward_us={} draft_us={} catch_up_us={} fit_scale={:.3f} "
      "fit_offset_us={:.0f} fit_per_request_us={:.0f} overhead_us={:.0f} "
      "overlap_overhead_us={:.0f} draft_scale={:.3f}",
      f.mode_length, step.spec.SelectorMeasured() ? 1 : 0, step.spec.mode_decoding,
      step.spec.overlapped ? 1 : 0, step.items.size(), samples, tally.tokens, tally.verified,
      tally.accepted, tally.generated_before,
      have_last_processed_ ? static_cast<int64_t>(Seconds(last_processed_at_, processed_at) * 1e6)
                           : 0,
      static_cast<int64_t>(step.forward_seconds * 1e6),
      static_cast<int64_t>(step.spec.draft_seconds * 1e6),
      static_cast<int64_t>(step.spec.catch_up_seconds * 1e6), f.fit_scale,
      f.fit_offset_seconds * 1e6, f.fit_per_request_seconds * 1e6, f.overhead_seconds * 1e6,
      f.overlap_overhead_seconds * 1e6, f.draft_scale);
}

void LlmEngine::RecordOutputToken(Sequence* seq, int32_t token) {
  if (seq->verifier != nullptr) {
    seq->verifier->processor().AddOutputToken(token);
  } else {
    seq->sampler->AddOutputToken(token);
  }
}

void LlmEngine::PublishQueueStats() {
  ExportSpecStats();
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
    const speculative::StepPlan plan = stopping ? speculative::StepPlan() : PlanDrafting();
    if (plan.may_draft && in_flight) {
      complete_in_flight();
      release();
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.spec_synced_steps;
    }
    const auto sched_start = Clock::now();
    std::unique_ptr<Step> next = stopping ? std::make_unique<Step>() : Schedule(plan);
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
