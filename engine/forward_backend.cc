#include "engine/forward_backend.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace deepinfer::engine {

absl::Status CheckSameKvGeometry(const KvCacheConfig& backend, const KvCacheConfig& engine,
                                 const char* what) {
  auto differs = [&](const char* field, int64_t a, int64_t b) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", field, " ", a, " differs from the engine's ", b));
  };
  if (backend.num_layers != engine.num_layers) {
    return differs("num_layers", backend.num_layers, engine.num_layers);
  }
  if (backend.num_kv_heads != engine.num_kv_heads) {
    return differs("num_kv_heads", backend.num_kv_heads, engine.num_kv_heads);
  }
  if (backend.head_dim != engine.head_dim) {
    return differs("head_dim", backend.head_dim, engine.head_dim);
  }
  if (backend.block_size != engine.block_size) {
    return differs("block_size", backend.block_size, engine.block_size);
  }
  if (backend.num_blocks != engine.num_blocks) {
    return differs("num_blocks", backend.num_blocks, engine.num_blocks);
  }
  if (backend.dtype != engine.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": KV dtype ", kernels::DTypeName(backend.dtype),
                     " differs from the engine's ", kernels::DTypeName(engine.dtype)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<HostMirrorBackend>> HostMirrorBackend::Create(Model* model,
                                                                             int num_blocks,
                                                                             int block_size) {
  if (model == nullptr) return absl::InvalidArgumentError("host-mirror backend: no model");
  DI_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache,
                      KvCache::Create(model->MakeKvCacheConfig(num_blocks, block_size)));
  return std::unique_ptr<HostMirrorBackend>(new HostMirrorBackend(model, std::move(cache)));
}

absl::Status HostMirrorBackend::Forward(const std::vector<SequenceInput>& batch,
                                        std::vector<float>* logits) {
  std::lock_guard<std::mutex> lock(mu_);
  return model_->Forward(batch, cache_.get(), logits);
}

absl::Status HostMirrorBackend::Copy(const KvCache& from, KvCache* to,
                                     absl::Span<const int32_t> blocks) {
  DI_RETURN_IF_ERROR(CheckSameKvGeometry(from.config(), to->config(), "host-mirror backend"));
  const size_t bytes = from.block_bytes();
  const int num_blocks = from.config().num_blocks;
  for (int32_t b : blocks) {
    if (b >= num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("host-mirror backend: block ", b,
                                                     " is outside the ", num_blocks, " blocks"));
    }
  }
  for (int l = 0; l < from.config().num_layers; ++l) {
    for (int32_t b : blocks) {
      if (b < 0) continue;
      std::memcpy(static_cast<char*>(to->k_layer(l)) + b * bytes,
                  static_cast<const char*>(from.k_layer(l)) + b * bytes, bytes);
      std::memcpy(static_cast<char*>(to->v_layer(l)) + b * bytes,
                  static_cast<const char*>(from.v_layer(l)) + b * bytes, bytes);
    }
  }
  return absl::OkStatus();
}

absl::Status HostMirrorBackend::Upload(const KvCache& host, absl::Span<const int32_t> blocks) {
  std::lock_guard<std::mutex> lock(mu_);
  return Copy(host, cache_.get(), blocks);
}

absl::Status HostMirrorBackend::Download(absl::Span<const int32_t> blocks, KvCache* host) {
  std::lock_guard<std::mutex> lock(mu_);
  return Copy(*cache_, host, blocks);
}

}  // namespace deepinfer::engine
