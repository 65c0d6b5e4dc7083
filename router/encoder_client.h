// The router's side of the vision encoder pool: sends a request's images to one live encoder of
// the model and returns their embeddings inline, in order.
//
// Choice of encoder: rendezvous (highest random weight) hashing of the first image's SHA-256 over
// the live encoders' ids, so the same image keeps reaching the encoder whose embedding cache
// holds it while the pool is unchanged, and only 1/N of the images move when it changes. One
// retry on another encoder when the first answers UNAVAILABLE (e.g. it is draining or died).
//
// Thread-safety: thread-safe; channels are cached per address.
#ifndef DEEPINFER_ROUTER_ENCODER_CLIENT_H_
#define DEEPINFER_ROUTER_ENCODER_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "proto/deepinfer/internal/v1/encoder.grpc.pb.h"
#include "router/worker_registry.h"

namespace deepinfer::router {

struct EncodedImages {
  // One per image, in request order, with inline float32 data.
  std::vector<internal::v1::EmbeddingHandle> embeddings;
  // Images the encoder served from its embedding cache.
  uint32_t cache_hits = 0;
  std::string encoder_id;
};

class EncoderClient {
 public:
  // `registry` is not owned and must outlive the client.
  EncoderClient(WorkerRegistry* registry, std::string model_id, int max_message_bytes);

  // True when a live encoder serves the model.
  bool HasEncoder() const;

  // Encodes `images` (encoded PNG/JPEG files; `hashes` their SHA-256, same order) before
  // `deadline`; `parent` (may be null) propagates the client's cancellation. kUnavailable when
  // no encoder is live; otherwise the encoder's status (kInvalidArgument messages name
  // images[k], k indexing `images`). kInternal when the answer is malformed (wrong count,
  // missing data, dtype other than "f32", data size not rows x hidden x 4).
  absl::StatusOr<EncodedImages> Encode(const grpc::ServerContext* parent,
                                       const std::string& request_id,
                                       const std::vector<std::string>& images,
                                       const std::vector<std::string>& hashes,
                                       absl::Time deadline);

 private:
  std::unique_ptr<internal::v1::Encoder::Stub> Stub(const std::string& address);

  WorkerRegistry* const registry_;
  const std::string model_id_;
  const int max_message_bytes_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
};

// The live encoders of `model` in rendezvous order for `key` (best first), by worker id.
std::vector<WorkerSnapshot> RankEncoders(const std::vector<WorkerSnapshot>& live,
                                         const std::string& key);

}  // namespace deepinfer::router

#endif  // DEEPINFER_ROUTER_ENCODER_CLIENT_H_
