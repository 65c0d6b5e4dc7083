#include "node/kv_pool.h"

#include "absl/strings/str_cat.h"

namespace deepinfer::node {

std::vector<kv_transfer::BlockDesc> PoolDescriptors(const internal::v1::KvPoolLayout& layout) {
  std::vector<kv_transfer::BlockDesc> out;
  out.reserve(size_t{2} * layout.num_layers() * layout.num_blocks());
  for (int pool = 0; pool < 2; ++pool) {
    for (uint32_t l = 0; l < layout.num_layers(); ++l) {
      for (uint32_t b = 0; b < layout.num_blocks(); ++b) {
        out.push_back({pool == 0 ? layout.k_region() : layout.v_region(),
                       (static_cast<uint64_t>(l) * layout.num_blocks() + b) * layout.block_bytes(),
                       layout.block_bytes()});
      }
    }
  }
  return out;
}

absl::Status CheckCompatible(const internal::v1::KvPoolLayout& local,
                             const internal::v1::KvPoolLayout& remote) {
  if (remote.num_layers() == 0) {
    return absl::InvalidArgumentError("destination.pool.num_layers: expected > 0, got 0");
  }
  if (remote.num_blocks() == 0) {
    return absl::InvalidArgumentError("destination.pool.num_blocks: expected > 0, got 0");
  }
  if (remote.block_bytes() == 0) {
    return absl::InvalidArgumentError("destination.pool.block_bytes: expected > 0, got 0");
  }
  if (remote.num_layers() != local.num_layers()) {
    return absl::FailedPreconditionError(
        absl::StrCat("destination.pool.num_layers: this node's model has ", local.num_layers(),
                     " layers, the destination ", remote.num_layers()));
  }
  if (remote.block_bytes() != local.block_bytes()) {
    return absl::FailedPreconditionError(
        absl::StrCat("destination.pool.block_bytes: this node's blocks are ", local.block_bytes(),
                     " bytes, the destination's ", remote.block_bytes()));
  }
  return absl::OkStatus();
}

void LayerIndices(const internal::v1::KvPoolLayout& local, const internal::v1::KvPoolLayout& remote,
                  int layer, absl::Span<const int32_t> src_blocks,
                  absl::Span<const uint32_t> dst_blocks, std::vector<uint32_t>* src_indices,
                  std::vector<uint32_t>* dst_indices) {
  src_indices->clear();
  dst_indices->clear();
  for (int pool = 0; pool < 2; ++pool) {
    for (size_t i = 0; i < src_blocks.size(); ++i) {
      src_indices->push_back(
          DescriptorIndex(local, pool, layer, static_cast<uint32_t>(src_blocks[i])));
      dst_indices->push_back(DescriptorIndex(remote, pool, layer, dst_blocks[i]));
    }
  }
}

}  // namespace deepinfer::node
