// Helpers shared by the cross-process cluster tests.
#ifndef DEEPINFER_TESTS_CLUSTER_TEST_UTIL_H_
#define DEEPINFER_TESTS_CLUSTER_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "deploy/local/local_cluster.h"
#include "engine/model.h"
#include "grpcpp/grpcpp.h"
#include "proto/deepinfer/v1/inference.grpc.pb.h"

namespace deepinfer::testutil {

inline constexpr char kModelDir[] = "engine/testdata/models/llama";

// A loopback cluster of the test model: `prefill` prefill nodes, `decode` decode nodes (that also
// prefill when `colocated`), fast heartbeats (250 ms, 12 missed) and a 3 s transfer deadline, logs
// under the test's output directory in a folder named `name`.
deploy::LocalClusterConfig ClusterConfig(const std::string& name, int prefill, int decode,
                                         bool colocated);

// Greedy reference tokens from engine::GenerateOne (what //engine:generate prints).
std::vector<int32_t> Reference(engine::Model& model, const std::vector<int32_t>& prompt,
                               int max_tokens);

struct StreamResult {
  grpc::Status status;
  std::vector<int32_t> tokens;
  v1::FinishReason finish_reason = v1::FINISH_REASON_UNSPECIFIED;
  v1::Usage usage;
  int chunks = 0;
};

// One greedy Generate stream (temperature 0, ignore_eos) read to the end.
StreamResult GenerateStream(v1::Inference::Stub& stub, const std::vector<int32_t>& prompt,
                            int max_tokens, absl::Duration timeout = absl::Seconds(60));

// Polls every live worker's WorkerAdmin.GetStats until none has a KV block in use, a sequence
// awaiting KV or holding blocks for a transfer, a running/waiting sequence or an active request.
// kDeadlineExceeded with the last stats of the offenders otherwise.
absl::Status WaitNoBlocksInUse(deploy::LocalCluster& cluster, absl::Duration timeout);

}  // namespace deepinfer::testutil

#endif  // DEEPINFER_TESTS_CLUSTER_TEST_UTIL_H_
