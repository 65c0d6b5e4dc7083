// How a worker process names itself: a random incarnation per process start, a default worker id
// and the model id taken from a directory path. Shared by the prefill/decode runtime and the
// vision encoder node.
//
// Thread-safety: all functions are thread-safe.
#ifndef DEEPINFER_NODE_WORKER_IDENTITY_H_
#define DEEPINFER_NODE_WORKER_IDENTITY_H_

#include <cstdint>
#include <string>

#include "proto/deepinfer/internal/v1/worker.pb.h"

namespace deepinfer::node {

// Non-zero, different on every call and in every process (random device, time and pid mixed).
uint64_t NewIncarnation();

// "<role>-<hostname>-<pid>", e.g. "decode-host1-4242".
std::string DefaultWorkerId(internal::v1::WorkerRole role);

// The last component of `path`, trailing slashes ignored ("models/demo/" -> "demo").
std::string LastPathComponent(std::string path);

}  // namespace deepinfer::node

#endif  // DEEPINFER_NODE_WORKER_IDENTITY_H_
