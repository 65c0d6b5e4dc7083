// Addressing a node's KV pools for kv_transfer: the layout a node advertises
// (internal.v1.KvPoolLayout) and the descriptor lists built from it.
//
// Descriptor list order (both local and remote lists, so indices are computed, never looked up):
//   index(pool, layer, block) = (pool * num_layers + layer) * num_blocks + block,  pool 0 = K, 1 = V
// and descriptor i covers block `block` of layer `layer` of that pool:
//   region = pool == 0 ? k_region : v_region, offset = (layer * num_blocks + block) * block_bytes,
//   length = block_bytes.
// This matches engine::KvCache's memory (one contiguous K and V allocation, layer-major).
//
// Thread-safety: pure functions.
#ifndef DEEPINFER_NODE_KV_POOL_H_
#define DEEPINFER_NODE_KV_POOL_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kv_transfer/transfer_agent.h"
#include "proto/deepinfer/internal/v1/kv_transfer.pb.h"

namespace deepinfer::node {

// Every (pool, layer, block) of `layout`, in the order above.
std::vector<kv_transfer::BlockDesc> PoolDescriptors(const internal::v1::KvPoolLayout& layout);

inline uint32_t DescriptorIndex(const internal::v1::KvPoolLayout& layout, int pool, int layer,
                                uint32_t block) {
  return (static_cast<uint32_t>(pool) * layout.num_layers() + static_cast<uint32_t>(layer)) *
             layout.num_blocks() +
         block;
}

// Checks that a remote pool can receive blocks from a local one: same num_layers and
// block_bytes (kFailedPrecondition naming the field and both values), and every value non-zero
// (kInvalidArgument naming "destination.pool.<field>").
absl::Status CheckCompatible(const internal::v1::KvPoolLayout& local,
                             const internal::v1::KvPoolLayout& remote);

// Source and destination indices for writing layer `layer` of blocks
// src_blocks[i] -> dst_blocks[i] (K then V). Both spans must have equal length and every id must
// be below its layout's num_blocks (the caller checks).
void LayerIndices(const internal::v1::KvPoolLayout& local, const internal::v1::KvPoolLayout& remote,
                  int layer, absl::Span<const int32_t> src_blocks,
                  absl::Span<const uint32_t> dst_blocks, std::vector<uint32_t>* src_indices,
                  std::vector<uint32_t>* dst_indices);

}  // namespace deepinfer::node

#endif  // DEEPINFER_NODE_KV_POOL_H_
