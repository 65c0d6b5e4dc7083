// The engine's GPU backend (engine/forward_backend.h): forward passes on a CudaModel (weights and
// KV pools in device memory, decode steps from CUDA graphs), KV blocks moved between the device
// pools and the engine's host cache (the transfer surface) at the points the engine names.
//
// Thread-safety: every method holds one mutex (the engine's executor runs Forward while its
// scheduler may upload a transferred prompt or download a finished one).
#ifndef DEEPINFER_ENGINE_CUDA_CUDA_BACKEND_H_
#define DEEPINFER_ENGINE_CUDA_CUDA_BACKEND_H_

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/cuda/cuda_model.h"
#include "engine/forward_backend.h"
#include "engine/model.h"

namespace deepinfer::engine {

class CudaBackend : public ForwardBackend {
 public:
  // `host`'s weights copied to the device with KV pools of num_blocks x block_size tokens;
  // one-token decode steps of up to `max_batch` sequences whose contexts fit `max_context` tokens
  // replay CUDA graphs (0: never). Errors as CudaModel::Create (kUnavailable without a device,
  // kUnimplemented for shapes the kernels do not cover, naming the reason).
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const Model& host, int num_blocks,
                                                             int block_size, int max_batch,
                                                             int max_context);

  std::string name() const override { return "cuda"; }
  const KvCacheConfig& kv_config() const override { return model_->kv_config(); }
  absl::Status Forward(const std::vector<SequenceInput>& batch,
                       std::vector<float>* logits) override;
  absl::Status Upload(const KvCache& host, absl::Span<const int32_t> blocks) override;
  absl::Status Download(absl::Span<const int32_t> blocks, KvCache* host) override;

  const CudaModel& model() const { return *model_; }

 private:
  explicit CudaBackend(std::unique_ptr<CudaModel> model) : model_(std::move(model)) {}

  std::unique_ptr<CudaModel> model_;
  std::mutex mu_;
};

}  // namespace deepinfer::engine

#endif  // DEEPINFER_ENGINE_CUDA_CUDA_BACKEND_H_
