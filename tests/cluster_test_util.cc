#include "tests/cluster_test_util.h"

#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/generate.h"

namespace deepinfer::testutil {

deploy::LocalClusterConfig ClusterConfig(const std::string& name, int prefill, int decode,
                                         bool colocated) {
  deploy::LocalClusterConfig c;
  c.bin_dir = ".";
  c.model_dir = kModelDir;
  c.num_prefill = prefill;
  c.num_decode = decode;
  c.decode_can_prefill = colocated;
  c.kv_blocks = 512;
  c.block_size = 4;
  c.threads_per_worker = 1;
  const char* out = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  if (out == nullptr) out = std::getenv("TEST_TMPDIR");
  c.log_dir = absl::StrCat(out != nullptr ? out : "/tmp", "/", name);
  std::filesystem::create_directories(c.log_dir);
  // Generous: 2 cores run several clusters at once in CI, and a starved heartbeat thread must
  // not make the router drop a live worker.
  c.router_flags = {"--heartbeat_interval=250ms", "--missed_heartbeats=12"};
  c.decode_flags = {"--prefill_timeout=3s"};
  c.startup_timeout = absl::Seconds(60);
  return c;
}

std::vector<int32_t> Reference(engine::Model& model, const std::vector<int32_t>& prompt,
                               int max_tokens) {
  engine::SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = max_tokens;
  sp.ignore_eos = true;
  auto r = engine::GenerateOne(model, prompt, sp, engine::GenerateOptions());
  std::vector<int32_t> out;
  if (!r.ok()) return out;
  for (const auto& s : r->steps) out.push_back(s.token);
  return out;
}

StreamResult GenerateStream(v1::Inference::Stub& stub, const std::vector<int32_t>& prompt,
                            int max_tokens, absl::Duration timeout) {
  v1::GenerateRequest req;
  for (int32_t t : prompt) req.add_prompt_token_ids(static_cast<uint32_t>(t));
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_max_tokens(max_tokens);
  req.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  StreamResult out;
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateChunk chunk;
  while (reader->Read(&chunk)) {
    ++out.chunks;
    for (uint32_t t : chunk.token_ids()) out.tokens.push_back(static_cast<int32_t>(t));
    if (chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      out.finish_reason = chunk.finish_reason();
      out.usage = chunk.usage();
    }
  }
  out.status = reader->Finish();
  return out;
}

absl::Status WaitNoBlocksInUse(deploy::LocalCluster& cluster, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string last;
  for (;;) {
    last.clear();
    const auto workers = cluster.workers();
    for (size_t i = 0; i < workers.size(); ++i) {
      if (!workers[i].running) continue;
      auto s = cluster.GetStats(static_cast<int>(i));
      if (!s.ok()) {
        absl::StrAppend(&last, workers[i].name, ": ", s.status().ToString(), "; ");
        continue;
      }
      if (s->used_kv_blocks() != 0 || s->awaiting_kv_sequences() != 0 ||
          s->held_sequences() != 0 || s->running_sequences() != 0 ||
          s->waiting_sequences() != 0 || s->active_requests() != 0 ||
          s->in_flight_transfers() != 0) {
        absl::StrAppend(&last, workers[i].name, ": ", s->ShortDebugString(), "; ");
      }
    }
    if (last.empty()) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("blocks still in use after ", absl::FormatDuration(timeout), ": ", last));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

}  // namespace deepinfer::testutil
