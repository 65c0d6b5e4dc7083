// The load generator: sends a workload's sessions to a deepinfer router (deepinfer.v1.Inference
// Chat, streaming) and records every request (report.h).
//
// Open loop: sessions start at random times, exponential (Poisson) or gamma inter-arrival gaps
// with mean 1 / rate (gamma shape `burstiness`: 1 = Poisson, < 1 burstier), whether or not
// earlier ones have finished (at most `max_in_flight` sessions at once, a safety cap: when it
// binds the report says so through `RunStats::arrivals_delayed`). Closed loop: `concurrency`
// sessions in flight, a new one starting as soon as one ends. Within a session, turns are sequential
// and each resends the history with the server's real answers.
//
// Warm-up: the first `warmup_sessions` sessions run first (closed loop, `concurrency` at once);
// their records are marked warmup and left out of the summary. The run then stops starting
// sessions after `duration` (or when the workload is exhausted), and waits for those in flight.
//
// Every request uses temperature 0 and ignore_eos so output lengths are exact and both sides of a
// comparison do the same work.
//
// Thread-safety: RunWorkload may be called from one thread at a time per options.target.
#ifndef DEEPINFER_TOOLS_BENCH_RUNNER_H_
#define DEEPINFER_TOOLS_BENCH_RUNNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tools/bench/report.h"
#include "tools/bench/workload.h"

namespace deepinfer::bench {

struct RunnerOptions {
  std::string target = "127.0.0.1:50051";  // router "host:port"
  std::string model;                       // "" = the router's only model
  std::string mode = "open";               // open | closed
  double rate = 1.0;                       // open: sessions per second, > 0
  double burstiness = 1.0;                 // open: gamma shape, > 0 (1 = Poisson)
  int concurrency = 4;                     // closed: sessions in flight, >= 1
  int max_in_flight = 256;                 // open: safety cap on sessions in flight
  int warmup_sessions = 0;
  absl::Duration duration = absl::InfiniteDuration();
  absl::Duration request_timeout = absl::Minutes(5);
  uint64_t seed = 1;  // arrival times
};

struct RunStats {
  int64_t arrivals_delayed = 0;  // open loop: sessions that waited for the in-flight cap
};

// kInvalidArgument naming the option for bad options; kUnavailable when the router cannot be
// reached at all (ListModels fails). Request failures are recorded, not returned.
absl::StatusOr<std::vector<RequestRecord>> RunWorkload(const std::vector<SessionPlan>& sessions,
                                                       const RunnerOptions& options,
                                                       RunStats* stats = nullptr);

}  // namespace deepinfer::bench

#endif  // DEEPINFER_TOOLS_BENCH_RUNNER_H_
