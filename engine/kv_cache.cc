#include "engine/kv_cache.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace deepinfer::engine {

namespace {

absl::Status CheckConfig(const KvCacheConfig& c) {
  if (c.num_layers <= 0 || c.num_kv_heads <= 0 || c.head_dim <= 0 || c.block_size <= 0 ||
      c.num_blocks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv cache: expected positive num_layers, num_kv_heads, head_dim, block_size, num_blocks; "
        "got ", c.num_layers, ", ", c.num_kv_heads, ", ", c.head_dim, ", ", c.block_size, ", ",
        c.num_blocks));
  }
  return absl::OkStatus();
}

}  // namespace

size_t KvCache::PoolBytes(const KvCacheConfig& c) {
  return static_cast<size_t>(c.num_layers) * c.num_blocks * c.block_size * c.num_kv_heads *
         c.head_dim * kernels::DTypeSize(c.dtype);
}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::CreateOnMemory(const KvCacheConfig& c, void* k,
                                                                 void* v) {
  if (absl::Status s = CheckConfig(c); !s.ok()) return s;
  if (k == nullptr || v == nullptr || reinterpret_cast<uintptr_t>(k) % 64 != 0 ||
      reinterpret_cast<uintptr_t>(v) % 64 != 0) {
    return absl::InvalidArgumentError("kv cache: external K/V memory must be non-null and 64-byte aligned");
  }
  std::memset(k, 0, PoolBytes(c));
  std::memset(v, 0, PoolBytes(c));
  return std::unique_ptr<KvCache>(new KvCache(c, k, v, /*owned=*/false));
}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const KvCacheConfig& c) {
  if (absl::Status s = CheckConfig(c); !s.ok()) return s;
  const size_t bytes = PoolBytes(c);
  // 64-byte alignment for vector loads; zeroed so unused slots are never NaN garbage.
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* k = std::aligned_alloc(64, rounded);
  void* v = std::aligned_alloc(64, rounded);
  if (k == nullptr || v == nullptr) {
    std::free(k);
    std::free(v);
    return absl::ResourceExhaustedError(
        absl::StrCat("kv cache: cannot allocate 2 x ", bytes, " bytes"));
  }
  std::memset(k, 0, rounded);
  std::memset(v, 0, rounded);
  return std::unique_ptr<KvCache>(new KvCache(c, k, v, /*owned=*/true));
}

KvCache::KvCache(const KvCacheConfig& c, void* k, void* v, bool owned)
    : config_(c),
      block_elements_(static_cast<int64_t>(c.block_size) * c.num_kv_heads * c.head_dim),
      k_(k),
      v_(v),
      owned_(owned) {}

KvCache::~KvCache() {
  if (!owned_) return;
  std::free(k_);
  std::free(v_);
}

size_t KvCache::block_bytes() const {
  return static_cast<size_t>(block_elements_) * kernels::DTypeSize(config_.dtype);
}

size_t KvCache::bytes_per_pool() const {
  return block_bytes() * config_.num_blocks * config_.num_layers;
}

void* KvCache::k_layer(int layer) const {
  return static_cast<char*>(k_) + block_bytes() * config_.num_blocks * layer;
}

void* KvCache::v_layer(int layer) const {
  return static_cast<char*>(v_) + block_bytes() * config_.num_blocks * layer;
}

}  // namespace deepinfer::engine
