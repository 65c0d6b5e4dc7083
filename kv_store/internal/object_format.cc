#include "kv_store/internal/object_format.h"

#include <zlib.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace deepinfer::kv_store_internal {
namespace {

constexpr char kMagic[8] = {'D', 'I', 'K', 'V', 'O', 'B', 'J', '1'};
constexpr uint64_t kFixedBytes = 96;

void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t GetU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | p[i];
  return v;
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

uint64_t CrcEnd(const KvBlockLayout& layout) { return kFixedBytes + 4ull * layout.num_layers; }

}  // namespace

uint64_t HeaderBytes(const KvBlockLayout& layout) {
  const uint64_t used = CrcEnd(layout) + 4;
  return (used + kHeaderAlign - 1) / kHeaderAlign * kHeaderAlign;
}

uint64_t ObjectBytes(const KvBlockLayout& layout) {
  return HeaderBytes(layout) + layout.payload_bytes();
}

uint32_t Crc32(absl::Span<const uint8_t> bytes) {
  return static_cast<uint32_t>(crc32_z(crc32_z(0, nullptr, 0), bytes.data(), bytes.size()));
}

std::vector<uint8_t> EncodeHeader(const KvBlockKey& key, const KvBlockKey& model_digest,
                                  const KvBlockLayout& layout,
                                  absl::Span<const uint32_t> layer_crcs) {
  std::vector<uint8_t> h(HeaderBytes(layout), 0);
  std::memcpy(h.data(), kMagic, sizeof(kMagic));
  PutU32(&h[8], kFormatVersion);
  PutU32(&h[12], static_cast<uint32_t>(h.size()));
  std::memcpy(&h[16], key.bytes.data(), KvBlockKey::kSize);
  std::memcpy(&h[48], model_digest.bytes.data(), KvBlockKey::kSize);
  PutU32(&h[80], layout.num_layers);
  PutU32(&h[84], layout.dtype_tag);
  PutU64(&h[88], layout.bytes_per_layer);
  for (uint32_t i = 0; i < layout.num_layers; ++i) {
    PutU32(&h[kFixedBytes + 4ull * i], i < layer_crcs.size() ? layer_crcs[i] : 0);
  }
  const uint64_t end = CrcEnd(layout);
  PutU32(&h[end], Crc32(absl::MakeConstSpan(h.data(), end)));
  return h;
}

absl::StatusOr<std::vector<uint32_t>> DecodeHeader(absl::Span<const uint8_t> header,
                                                   const KvBlockKey& key,
                                                   const KvBlockKey& model_digest,
                                                   const KvBlockLayout& layout) {
  const uint64_t expected = HeaderBytes(layout);
  if (header.size() < expected) {
    return absl::DataLossError(absl::StrCat("kv object: expected a header of ", expected,
                                            " bytes, found ", header.size()));
  }
  const uint8_t* h = header.data();
  if (std::memcmp(h, kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError("kv object: bad magic");
  }
  if (GetU32(h + 8) != kFormatVersion) {
    return absl::DataLossError(absl::StrCat("kv object: expected format version ", kFormatVersion,
                                            ", found ", GetU32(h + 8)));
  }
  // Layout fields first: they decide where the header CRC sits.
  if (GetU32(h + 12) != expected || GetU32(h + 80) != layout.num_layers ||
      GetU32(h + 84) != layout.dtype_tag || GetU64(h + 88) != layout.bytes_per_layer) {
    return absl::DataLossError(absl::StrCat("kv object: expected layout ", layout.num_layers,
                                            " layers x ", layout.bytes_per_layer, " bytes (dtype ",
                                            layout.dtype_tag, "), found ", GetU32(h + 80), " x ",
                                            GetU64(h + 88), " (dtype ", GetU32(h + 84), ")"));
  }
  const uint64_t end = CrcEnd(layout);
  if (GetU32(h + end) != Crc32(absl::MakeConstSpan(h, end))) {
    return absl::DataLossError("kv object: header checksum mismatch");
  }
  if (std::memcmp(h + 16, key.bytes.data(), KvBlockKey::kSize) != 0) {
    return absl::DataLossError("kv object: header names another key");
  }
  if (std::memcmp(h + 48, model_digest.bytes.data(), KvBlockKey::kSize) != 0) {
    return absl::DataLossError("kv object: written for another model namespace");
  }
  std::vector<uint32_t> crcs(layout.num_layers);
  for (uint32_t i = 0; i < layout.num_layers; ++i) crcs[i] = GetU32(h + kFixedBytes + 4ull * i);
  return crcs;
}

absl::Status CheckLayerRange(const KvBlockLayout& layout, uint32_t first_layer, uint32_t num_layers,
                             size_t buffer_bytes) {
  if (num_layers == 0 || first_layer >= layout.num_layers ||
      num_layers > layout.num_layers - first_layer) {
    return absl::InvalidArgumentError(absl::StrCat("kv store: layers [", first_layer, ", ",
                                                   uint64_t{first_layer} + num_layers,
                                                   ") outside [0, ", layout.num_layers, ")"));
  }
  const uint64_t expected = uint64_t{num_layers} * layout.bytes_per_layer;
  if (buffer_bytes != expected) {
    return absl::InvalidArgumentError(absl::StrCat("kv store: expected a buffer of ", expected,
                                                   " bytes for ", num_layers, " layers, found ",
                                                   buffer_bytes));
  }
  return absl::OkStatus();
}

}  // namespace deepinfer::kv_store_internal
