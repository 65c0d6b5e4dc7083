// The byte format of one stored object, shared by every backend (README.md, "Object format"):
//
//   offset 0    "DIKVOBJ1"              magic (8 bytes)
//          8    u32 format_version      kFormatVersion
//         12    u32 header_bytes        = HeaderBytes(layout), payload starts here
//         16    key                     32 bytes
//         48    model digest            32 bytes
//         80    u32 num_layers, u32 dtype_tag, u64 bytes_per_layer
//         96    u32 layer_crc[num_layers]  CRC-32 (zlib) of each layer's bytes
//               u32 header_crc          CRC-32 of every header byte before it
//               zero padding up to header_bytes (a multiple of 4096, so the payload is aligned
//               for direct I/O)
//   header_bytes + i * bytes_per_layer: layer i
//
// Integers are little-endian.
//
// Thread-safety: all functions are pure and thread-safe.
#ifndef DEEPINFER_KV_STORE_INTERNAL_OBJECT_FORMAT_H_
#define DEEPINFER_KV_STORE_INTERNAL_OBJECT_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kv_store/block_key.h"
#include "kv_store/kv_store.h"

namespace deepinfer::kv_store_internal {

inline constexpr uint32_t kFormatVersion = 1;
inline constexpr uint64_t kHeaderAlign = 4096;

// Bytes before the payload.
uint64_t HeaderBytes(const KvBlockLayout& layout);
// Header plus payload.
uint64_t ObjectBytes(const KvBlockLayout& layout);

// CRC-32 (the zlib/IEEE polynomial) of `bytes`.
uint32_t Crc32(absl::Span<const uint8_t> bytes);

// The header (HeaderBytes(layout) bytes) for an object with these layer CRCs.
std::vector<uint8_t> EncodeHeader(const KvBlockKey& key, const KvBlockKey& model_digest,
                                  const KvBlockLayout& layout,
                                  absl::Span<const uint32_t> layer_crcs);

// Checks a header read back (at least HeaderBytes(layout) bytes) against what the reader expects
// and returns its layer CRCs. kDataLoss naming the first mismatch (magic, version, header CRC,
// key, model digest or layout).
absl::StatusOr<std::vector<uint32_t>> DecodeHeader(absl::Span<const uint8_t> header,
                                                   const KvBlockKey& key,
                                                   const KvBlockKey& model_digest,
                                                   const KvBlockLayout& layout);

// Checks the request of a layer read or write: range within the layout, buffer of exactly the
// range's size. kInvalidArgument otherwise.
absl::Status CheckLayerRange(const KvBlockLayout& layout, uint32_t first_layer, uint32_t num_layers,
                             size_t buffer_bytes);

}  // namespace deepinfer::kv_store_internal

#endif  // DEEPINFER_KV_STORE_INTERNAL_OBJECT_FORMAT_H_
