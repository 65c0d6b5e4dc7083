#include "engine/cuda/cuda_backend.h"

#include <utility>

#include "common/status_macros.h"

namespace deepinfer::engine {

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const Model& host, int num_blocks,
                                                                 int block_size, int max_batch,
                                                                 int max_context) {
  CudaModelOptions o;
  o.num_blocks = num_blocks;
  o.block_size = block_size;
  if (max_batch > 0 && max_context > 0 && block_size > 0) {
    o.graph_max_batch = max_batch;
    o.graph_max_blocks_per_seq = (max_context + block_size - 1) / block_size;
  }
  DI_ASSIGN_OR_RETURN(std::unique_ptr<CudaModel> model, CudaModel::Create(host, o));
  return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(model)));
}

absl::Status CudaBackend::Forward(const std::vector<SequenceInput>& batch,
                                  std::vector<float>* logits) {
  std::lock_guard<std::mutex> lock(mu_);
  return model_->Forward(batch, logits);
}

absl::Status CudaBackend::Upload(const KvCache& host, absl::Span<const int32_t> blocks) {
  std::lock_guard<std::mutex> lock(mu_);
  return model_->UploadBlocks(host, blocks);
}

absl::Status CudaBackend::Download(absl::Span<const int32_t> blocks, KvCache* host) {
  std::lock_guard<std::mutex> lock(mu_);
  return model_->DownloadBlocks(blocks, host);
}

}  // namespace deepinfer::engine
