// TTFT of one long prompt, colocated vs disaggregated, with the prefill node's KV streamed layer by
// layer during the compute and (the baseline) sent after it; in one process, so the three are
// measured on the same machine, model and moment. Each repeat runs the three in a rotating order
// on a fresh random prompt (no prefix-cache hits).
//
//   colocated      a decode-side engine prefills the prompt itself: submit -> first token.
//   streamed       reserve blocks on the decode-side engine, PrefillService::Prefill into them
//   after-prefill  (layer_streaming on / off), wait for every layer's notification, complete the
//                  reservation: reserve -> first token emitted by the decode-side engine.
// For the two disaggregated modes it also reports the prefill node's compute_us, transfer_us and
// transfer_exposed_us (the transfer left after the compute ended).
//
//   bazel run -c opt //prefill_node:stream_bench -- --model $PWD/models/demo --prompt_tokens 2000
//
// The prefill service is called in-process (no gRPC hop); the KV moves through the worker's
// transfer agent (--kv_backend ucx: UCX between the two agents of this process, loopback: memcpy).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "engine/llm_engine.h"
#include "engine/model.h"
#include "kv_transfer/agent_factory.h"
#include "kv_transfer/notification_tracker.h"
#include "node/worker_runtime.h"
#include "prefill_node/prefill_service.h"

ABSL_FLAG(std::string, model, "", "Model directory (Hugging Face layout).");
ABSL_FLAG(int, prompt_tokens, 2000, "Prompt length.");
ABSL_FLAG(int, repeats, 5, "Measured repeats (after one warm-up).");
ABSL_FLAG(int, threads, 0, "Forward threads of each engine (0: all cores).");
ABSL_FLAG(int, block_size, 16, "KV block size.");
ABSL_FLAG(int, max_batch_tokens, 512, "Per-step token budget (the prefill chunk).");
ABSL_FLAG(std::string, kv_backend, "ucx", "ucx or loopback.");

namespace deepinfer::prefill_node {
namespace {

struct Sample {
  double ttft_ms = 0;
  double compute_ms = 0, transfer_ms = 0, exposed_ms = 0;
};

// When a request's first token came and that it finished (the engine's callback outlives the
// submitting call: it is waited for to the end).
struct Progress {
  absl::Mutex mu;
  absl::Time first_at = absl::InfiniteFuture();
  bool finished = false;
  absl::Status status;
  engine::OutputCallback Callback() {
    return [this](const engine::EngineOutput& out) {
      absl::MutexLock lock(&mu);
      if (!out.new_tokens.empty() && first_at == absl::InfiniteFuture()) first_at = absl::Now();
      if (out.finished) {
        finished = true;
        status = out.status;
      }
    };
  }
  // The first token's time, once the request finished.
  absl::StatusOr<absl::Time> Wait() {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&finished));
    if (!status.ok()) return status;
    return first_at;
  }
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int Fail(const absl::Status& s, const char* what) {
  std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
  return 1;
}

int Run() {
  const std::string model_dir = absl::GetFlag(FLAGS_model);
  const int prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  const int block_size = absl::GetFlag(FLAGS_block_size);
  const int threads = absl::GetFlag(FLAGS_threads);
  const kv_transfer::Backend backend = absl::GetFlag(FLAGS_kv_backend) == "loopback"
                                           ? kv_transfer::Backend::kLoopback
                                           : kv_transfer::Backend::kUcx;
  const int blocks = 4 * ((prompt_tokens + block_size - 1) / block_size) + 64;

  node::WorkerOptions o;
  o.role = internal::v1::WORKER_ROLE_PREFILL;
  o.worker_id = "bench-prefill";
  o.model_path = model_dir;
  o.kv_blocks = blocks;
  o.block_size = block_size;
  o.threads = threads;
  o.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  o.kv_backend = backend;
  auto rt = node::WorkerRuntime::Create(o);
  if (!rt.ok()) return Fail(rt.status(), "prefill runtime");
  std::unique_ptr<node::WorkerRuntime> runtime = std::move(*rt);
  PrefillServiceOptions streamed_options;
  PrefillServiceOptions baseline_options;
  baseline_options.layer_streaming = false;
  PrefillService streamed(runtime.get(), streamed_options);
  PrefillService baseline(runtime.get(), baseline_options);
  absl::Status started =
      runtime->Start({&streamed}, {PrefillService::ServiceName()}, streamed.stats_contributor());
  if (!started.ok()) return Fail(started, "prefill runtime start");

  // The decode side: its own model, agent and engine; also the colocated engine.
  auto model = engine::Model::Load(model_dir, engine::ModelOptions{threads});
  if (!model.ok()) return Fail(model.status(), "model");
  kv_transfer::AgentConfig ac;
  ac.name = "bench-decode";
  ac.incarnation = 11;
  ac.backend = backend;
  auto agent_or = kv_transfer::CreateTransferAgent(ac);
  if (!agent_or.ok()) return Fail(agent_or.status(), "decode agent");
  std::unique_ptr<kv_transfer::TransferAgent> agent = std::move(*agent_or);
  if (absl::Status s = agent->Start(); !s.ok()) return Fail(s, "decode agent start");
  internal::v1::KvPoolLayout pool;
  engine::EngineOptions eo;
  eo.num_blocks = blocks;
  eo.block_size = block_size;
  eo.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  eo.enable_prefix_cache = false;
  eo.kv_memory = [&](size_t bytes) -> absl::StatusOr<std::pair<void*, void*>> {
    auto k = agent->AllocateMemory(bytes, kv_transfer::MemoryKind::kHost);
    if (!k.ok()) return k.status();
    auto v = agent->AllocateMemory(bytes, kv_transfer::MemoryKind::kHost);
    if (!v.ok()) return v.status();
    pool.set_k_region(k->region);
    pool.set_v_region(v->region);
    return std::make_pair(k->base, v->base);
  };
  auto decode_or = engine::LlmEngine::Create(model->get(), eo);
  if (!decode_or.ok()) return Fail(decode_or.status(), "decode engine");
  std::unique_ptr<engine::LlmEngine> decode = std::move(*decode_or);
  if (absl::Status s = decode->Start(); !s.ok()) return Fail(s, "decode engine start");
  pool.set_num_layers((*model)->config().num_layers);
  pool.set_num_blocks(blocks);
  pool.set_block_bytes(decode->kv_cache()->block_bytes());
  auto blob = agent->ExportMetadata();
  if (!blob.ok()) return Fail(blob.status(), "metadata");
  internal::v1::KvPeerMetadata meta = runtime->kv_metadata();
  meta.set_agent_name(ac.name);
  meta.set_incarnation(ac.incarnation);
  meta.set_blob(*blob);

  std::mt19937 rng(7);
  const int vocab = (*model)->config().vocab_size;
  kv_transfer::NotificationTracker tracker;
  uint64_t tag = 1;
  int serial = 0;

  auto colocated = [&](const std::vector<int32_t>& prompt) -> absl::StatusOr<Sample> {
    engine::EngineRequest req;
    req.request_id = absl::StrCat("c", serial++);
    req.prompt = prompt;
    req.sampling.temperature = 0;
    req.sampling.max_tokens = 1;
    Progress progress;
    const absl::Time t0 = absl::Now();
    absl::Status s = decode->Submit(req, progress.Callback());
    if (!s.ok()) return s;
    absl::StatusOr<absl::Time> t1 = progress.Wait();
    if (!t1.ok()) return t1.status();
    Sample r;
    r.ttft_ms = absl::ToDoubleMilliseconds(*t1 - t0);
    return r;
  };

  auto disaggregated = [&](PrefillService* service,
                           const std::vector<int32_t>& prompt) -> absl::StatusOr<Sample> {
    const std::string id = absl::StrCat("d", serial++);
    engine::EngineRequest req;
    req.request_id = id;
    req.prompt = prompt;
    req.sampling.temperature = 0;
    req.sampling.max_tokens = 2;
    Progress progress;
    const absl::Time t0 = absl::Now();
    auto reservation = decode->ReserveForRemotePrefill(req, progress.Callback());
    if (!reservation.ok()) return reservation.status();
    internal::v1::PrefillRequest pr;
    pr.set_request_id(id);
    for (int32_t t : prompt) pr.add_prompt_token_ids(static_cast<uint32_t>(t));
    pr.mutable_sampling()->set_temperature(0);
    pr.mutable_sampling()->set_max_tokens(2);
    internal::v1::KvDestination* d = pr.mutable_destination();
    d->set_agent_name(ac.name);
    d->set_incarnation(ac.incarnation);
    for (int32_t b : reservation->block_ids) d->add_block_ids(static_cast<uint32_t>(b));
    d->set_block_size(block_size);
    d->set_skip_blocks(static_cast<uint32_t>(reservation->cached_tokens / block_size));
    d->set_notification_tag(++tag);
    *d->mutable_metadata() = meta;
    *d->mutable_pool() = pool;
    internal::v1::PrefillResponse response;
    grpc::Status st = service->Prefill(nullptr, &pr, &response);
    if (!st.ok()) {
      (void)decode->FailRemotePrefill(id, absl::UnavailableError("bench"));
      (void)progress.Wait();
      return absl::UnavailableError(st.error_message());
    }
    bool complete = false;
    while (!complete) {
      if (!agent->WaitForNotifications(absl::Now() + absl::Seconds(30))) {
        return absl::DeadlineExceededError("notifications");
      }
      for (auto& note : agent->DrainNotifications()) {
        kv_transfer::NotificationTracker::Completed c;
        absl::StatusOr<bool> all = tracker.Add(std::move(note), &c);
        if (!all.ok()) return all.status();
        complete = complete || (*all && c.request_id == tag);
      }
    }
    absl::Status s = decode->CompleteRemotePrefill(
        id, {static_cast<int32_t>(response.first_token_id()),
             response.first_token_logprob().logprob(),
             {}});
    if (!s.ok()) return s;
    absl::StatusOr<absl::Time> t1 = progress.Wait();
    if (!t1.ok()) return t1.status();
    Sample r;
    r.ttft_ms = absl::ToDoubleMilliseconds(*t1 - t0);
    r.compute_ms = response.compute_us() / 1e3;
    r.transfer_ms = response.transfer_us() / 1e3;
    r.exposed_ms = response.transfer_exposed_us() / 1e3;
    return r;
  };

  const char* names[3] = {"colocated", "streamed", "after-prefill"};
  std::vector<Sample> samples[3];
  const int repeats = absl::GetFlag(FLAGS_repeats);
  for (int rep = -1; rep < repeats; ++rep) {  // rep -1: warm-up, not recorded
    for (int k = 0; k < 3; ++k) {
      const int mode = (k + std::max(rep, 0)) % 3;
      std::vector<int32_t> prompt(prompt_tokens);
      for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % vocab);
      absl::StatusOr<Sample> s = mode == 0   ? colocated(prompt)
                                 : mode == 1 ? disaggregated(&streamed, prompt)
                                             : disaggregated(&baseline, prompt);
      if (!s.ok()) return Fail(s.status(), names[mode]);
      if (rep >= 0) samples[mode].push_back(*s);
    }
  }

  std::printf("model %s, prompt %d tokens, block %d, chunk %d, kv %s, %d repeats (medians, ms)\n",
              model_dir.c_str(), prompt_tokens, block_size, eo.max_batch_tokens,
              absl::GetFlag(FLAGS_kv_backend).c_str(), repeats);
  std::printf("%-14s %10s %10s %10s %10s\n", "mode", "TTFT", "compute", "transfer", "exposed");
  double med[3][4];
  for (int m = 0; m < 3; ++m) {
    std::vector<double> ttft, compute, transfer, exposed;
    for (const Sample& s : samples[m]) {
      ttft.push_back(s.ttft_ms);
      compute.push_back(s.compute_ms);
      transfer.push_back(s.transfer_ms);
      exposed.push_back(s.exposed_ms);
    }
    med[m][0] = Median(ttft);
    med[m][1] = Median(compute);
    med[m][2] = Median(transfer);
    med[m][3] = Median(exposed);
    std::printf("%-14s %10.2f %10.2f %10.2f %10.2f\n", names[m], med[m][0], med[m][1], med[m][2],
                med[m][3]);
  }
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  std::printf("exposed transfer, streamed / after-prefill: %.3f\n", ratio(med[1][3], med[2][3]));
  std::printf("exposed transfer streamed / transfer after-prefill: %.3f\n",
              ratio(med[1][3], med[2][2]));
  std::printf("TTFT streamed / colocated: %.3f   after-prefill / colocated: %.3f\n",
              ratio(med[1][0], med[0][0]), ratio(med[2][0], med[0][0]));
  decode->Stop();
  runtime->Drain(absl::Seconds(1));
  return 0;
}

}  // namespace
}  // namespace deepinfer::prefill_node

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return deepinfer::prefill_node::Run();
}
