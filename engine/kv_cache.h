// Paged KV-cache storage: per layer, `num_blocks` blocks of `block_size` token slots; a slot holds
// K (or V) for every KV head: [num_kv_heads][head_dim] elements of `dtype`. Which sequence owns
// which block is the block manager's business; this class only owns the memory.
//
// Memory is one contiguous allocation per K and V, layer-major, so a transfer engine can register
// it once and address blocks by index: element offset of (layer, block) =
// (layer * num_blocks + block) * block_elements().
//
// Thread-safety: the buffers are plain memory; callers ensure a block is written by one step at a
// time. Not copyable or movable (registered memory must not move).
#ifndef DEEPINFER_ENGINE_KV_CACHE_H_
#define DEEPINFER_ENGINE_KV_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/dtype.h"

namespace deepinfer::engine {

struct KvCacheConfig {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;  // tokens per block
  int num_blocks = 0;
  kernels::DType dtype = kernels::DType::kF32;
};

class KvCache {
 public:
  // kInvalidArgument for non-positive sizes; kResourceExhausted when the allocation fails.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(const KvCacheConfig& config);

  // Bytes of each of the K and V pools for `config`.
  static size_t PoolBytes(const KvCacheConfig& config);

  // A cache on memory the caller owns (e.g. pools a transfer engine allocated so that peers can
  // write into them): `k` and `v` must each hold PoolBytes(config) bytes, be 64-byte aligned and
  // outlive the cache. The memory is zeroed here.
  static absl::StatusOr<std::unique_ptr<KvCache>> CreateOnMemory(const KvCacheConfig& config,
                                                                 void* k, void* v);

  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;
  ~KvCache();

  const KvCacheConfig& config() const { return config_; }
  // Elements in one block: block_size * num_kv_heads * head_dim.
  int64_t block_elements() const { return block_elements_; }
  size_t block_bytes() const;
  // Base of layer `layer`'s K (V) pool; block b starts b * block_elements() elements later.
  void* k_layer(int layer) const;
  void* v_layer(int layer) const;
  // Whole K / V allocations (for memory registration).
  void* k_data() const { return k_; }
  void* v_data() const { return v_; }
  size_t bytes_per_pool() const;

 private:
  KvCache(const KvCacheConfig& config, void* k, void* v, bool owned);

  const KvCacheConfig config_;
  const int64_t block_elements_;
  void* k_;
  void* v_;
  const bool owned_;
};

}  // namespace deepinfer::engine

#endif  // DEEPINFER_ENGINE_KV_CACHE_H_
