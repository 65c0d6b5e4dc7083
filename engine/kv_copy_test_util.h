// Test helper: moves a prefilled prompt's KV from one engine's cache into another engine's
// reservation with memcpy, standing in for kv_transfer in single-process disaggregation tests.
#ifndef DEEPINFER_ENGINE_KV_COPY_TEST_UTIL_H_
#define DEEPINFER_ENGINE_KV_COPY_TEST_UTIL_H_

#include <cstring>

#include "engine/kv_cache.h"
#include "engine/llm_engine.h"

namespace deepinfer::engine {

// Copies every layer's K and V of the reserved blocks the destination does not already hold
// (those past res.cached_tokens) from `pre`'s blocks in `src` to `res`'s blocks in `dst`.
inline void CopyPrefilledBlocks(const KvCache& src, const PrefillResult& pre, KvCache& dst,
                                const KvReservation& res) {
  const size_t block_bytes = src.block_bytes();
  for (size_t b = res.cached_tokens / res.block_size; b < res.block_ids.size(); ++b) {
    for (int l = 0; l < src.config().num_layers; ++l) {
      std::memcpy(static_cast<char*>(dst.k_layer(l)) + res.block_ids[b] * block_bytes,
                  static_cast<char*>(src.k_layer(l)) + pre.block_ids[b] * block_bytes,
                  block_bytes);
      std::memcpy(static_cast<char*>(dst.v_layer(l)) + res.block_ids[b] * block_bytes,
                  static_cast<char*>(src.v_layer(l)) + pre.block_ids[b] * block_bytes,
                  block_bytes);
    }
  }
}

}  // namespace deepinfer::engine

#endif  // DEEPINFER_ENGINE_KV_COPY_TEST_UTIL_H_
