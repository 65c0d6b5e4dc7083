// Where an engine's forward passes run when they do not run on the CPU model over the engine's
// own KV cache: a backend with KV pools of its own (a GPU's memory: engine/cuda/cuda_backend.h),
// numbered and shaped as the engine's host KvCache.
//
// The host KvCache stays the surface KV transfer registers and moves: a prefill node sends a
// prompt's blocks from it, a decode node receives them into it. So the engine (LlmEngine with
// EngineOptions::backend) copies blocks across at the two points where KV leaves or enters the
// node, and nowhere else:
//   - a finished SubmitPrefill's prompt blocks are downloaded (backend -> host) before the
//     PrefillCallback hands them to the transfer;
//   - CompleteRemotePrefill uploads (host -> backend) the blocks the transfer wrote (those past
//     the reservation's cached prefix) before the sequence runs.
// Everything else (prefix-cache hits, preemption, speculative rollback, sliding-window release)
// only changes which blocks the engine's tables name, so the backend's pools stay the truth for
// every block computed on the node.
//
// Layer-wise KV streaming (EngineRequest::on_layer_kv) is not offered through a backend: Forward
// reports no per-layer completion (a device backend would need a per-layer event on its stream
// and a host copy of that layer's blocks), so with EngineOptions::backend the engine calls no
// layer hook and a prefill's KV leaves the node only after the whole pass (the download above).
//
// Thread-safety: implementations serialise their methods (the engine calls Forward from its
// executor thread and the copies from its scheduler thread, possibly while a step runs).
#ifndef DEEPINFER_ENGINE_FORWARD_BACKEND_H_
#define DEEPINFER_ENGINE_FORWARD_BACKEND_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/kv_cache.h"
#include "engine/model.h"

namespace deepinfer::engine {

class ForwardBackend {
 public:
  virtual ~ForwardBackend() = default;

  // For logs: "cuda", "host-mirror".
  virtual std::string name() const = 0;
  // The geometry of the backend's KV pools; LlmEngine::Create refuses a backend whose geometry
  // differs from its host cache's (kInvalidArgument naming the field).
  virtual const KvCacheConfig& kv_config() const = 0;

  // Model::Forward's contract (engine/model.h) over the backend's KV pools: `logits` is resized
  // to the batch's logit rows x vocab_size.
  virtual absl::Status Forward(const std::vector<SequenceInput>& batch,
                               std::vector<float>* logits) = 0;

  // Copies every layer's K and V of `blocks` (ids of the host cache's numbering; negative ids,
  // blocks a sliding window released, are skipped) from `host` into the backend's pools, or from
  // the backend's pools into `host`. kInvalidArgument for ids outside the pools or a host cache
  // of another geometry.
  virtual absl::Status Upload(const KvCache& host, absl::Span<const int32_t> blocks) = 0;
  virtual absl::Status Download(absl::Span<const int32_t> blocks, KvCache* host) = 0;
};

// kInvalidArgument "<what>: <field> <a> differs from the engine's <b>" when the two geometries
// differ; OK otherwise.
absl::Status CheckSameKvGeometry(const KvCacheConfig& backend, const KvCacheConfig& engine,
                                 const char* what);

// A backend on the CPU model (`model`, not owned) with a KV cache of its own: what a device
// backend does, without a device. Tests run the engine's copy points through it (a missed upload
// or download leaves zeros where KV should be, and outputs change).
class HostMirrorBackend : public ForwardBackend {
 public:
  static absl::StatusOr<std::unique_ptr<HostMirrorBackend>> Create(Model* model, int num_blocks,
                                                                   int block_size);
  std::string name() const override { return "host-mirror"; }
  const KvCacheConfig& kv_config() const override { return cache_->config(); }
  absl::Status Forward(const std::vector<SequenceInput>& batch,
                       std::vector<float>* logits) override;
  absl::Status Upload(const KvCache& host, absl::Span<const int32_t> blocks) override;
  absl::Status Download(absl::Span<const int32_t> blocks, KvCache* host) override;

 private:
  HostMirrorBackend(Model* model, std::unique_ptr<KvCache> cache)
      : model_(model), cache_(std::move(cache)) {}
  absl::Status Copy(const KvCache& from, KvCache* to, absl::Span<const int32_t> blocks);

  Model* const model_;
  std::unique_ptr<KvCache> cache_;
  std::mutex mu_;
};

}  // namespace deepinfer::engine

#endif  // DEEPINFER_ENGINE_FORWARD_BACKEND_H_
