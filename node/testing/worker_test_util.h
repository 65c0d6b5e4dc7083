// Helpers for tests that run a WorkerRuntime in-process (node/ and tests/).
//
// Thread-safety: free functions without shared state.
#ifndef DEEPINFER_NODE_TESTING_WORKER_TEST_UTIL_H_
#define DEEPINFER_NODE_TESTING_WORKER_TEST_UTIL_H_

#include <string>

#include "node/worker_runtime.h"
#include "proto/grpc/health/v1/health.pb.h"

namespace deepinfer::node::testing {

// A small prefill worker on the llama fixture (engine/testdata/models/llama, a data dependency of
// the test): 64 blocks of 4 tokens, 2 threads, the loopback KV backend.
WorkerOptions SmallPrefillWorker(const std::string& worker_id);

// The gRPC health status of `service` ("" = the server) at `address`; UNKNOWN when the call
// fails (deadline 5 s).
grpc::health::v1::HealthCheckResponse::ServingStatus CheckHealth(const std::string& address,
                                                                 const std::string& service);

}  // namespace deepinfer::node::testing

#endif  // DEEPINFER_NODE_TESTING_WORKER_TEST_UTIL_H_
