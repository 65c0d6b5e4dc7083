// Content keys of KV blocks for the shared store (and, later, the engine's prefix cache, KV events
// and the router's index).
//
// A block's key is SHA-256 chained over the keys before it:
//
//   root   = SHA-256("deepinfer.kv_root.v1" | ModelDigest(namespace) | cache_salt)
//   key[0] = SHA-256("deepinfer.kv_block.v1" | root     | tokens[0] | extra_keys[0])
//   key[i] = SHA-256("deepinfer.kv_block.v1" | key[i-1] | tokens[i] | extra_keys[i])
//
// so a key names the whole prefix up to and including its block, under one model, KV format and
// tenant. Every variable-length field is length-prefixed, so no two different inputs encode to
// the same bytes; 256 bits make a collision (another prefix's KV served) practically impossible,
// which the 64-bit hash this replaces could not promise.
//
// Thread-safety: all functions are pure and thread-safe.
#ifndef DEEPINFER_KV_STORE_BLOCK_KEY_H_
#define DEEPINFER_KV_STORE_BLOCK_KEY_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace deepinfer {

// A 256-bit digest: a block key, a chain root or a namespace digest.
struct KvBlockKey {
  static constexpr size_t kSize = 32;
  std::array<uint8_t, kSize> bytes{};

  // 64 lower-case hex digits.
  std::string Hex() const;
  // The inverse of Hex(); kInvalidArgument for anything but 64 hex digits.
  static absl::StatusOr<KvBlockKey> FromHex(absl::string_view hex);
  // The first 8 bytes, little-endian: a hash-table slot, never an identity.
  uint64_t Prefix64() const;

  friend bool operator==(const KvBlockKey& a, const KvBlockKey& b) { return a.bytes == b.bytes; }
  friend bool operator!=(const KvBlockKey& a, const KvBlockKey& b) { return !(a == b); }
  friend bool operator<(const KvBlockKey& a, const KvBlockKey& b) { return a.bytes < b.bytes; }
  template <typename H>
  friend H AbslHashValue(H h, const KvBlockKey& k) {
    return H::combine(std::move(h), k.Prefix64());
  }
};

// Everything that decides whether two nodes' KV bytes for the same tokens are interchangeable,
// plus the tenant's cache salt (tenants never share KV unless they share the salt).
struct KvNamespace {
  std::string model_id;        // e.g. "Qwen/Qwen2.5-7B-Instruct"
  std::string model_revision;  // weights revision (commit or content hash)
  std::string kv_dtype;        // e.g. "bf16", "fp8_e4m3"
  std::string kv_layout;       // e.g. "paged_nhd", incl. anything that changes the bytes
  uint32_t block_size = 0;     // tokens per block
  std::string cache_salt;      // tenant's salt; empty: shared by all tenants without one
};

// Digest of every namespace field except the cache salt: identifies the model and KV format a
// store object was written for (stored in each object's header and checked on read).
KvBlockKey ModelDigest(const KvNamespace& ns);

// The parent of a prefix's first block: digest of the whole namespace, cache salt included.
KvBlockKey RootKey(const KvNamespace& ns);

// The key of one block whose prefix ends in `parent` (RootKey for the first block). `tokens` are
// the block's token ids; `extra_keys` anything else its KV depends on, in order (e.g. the content
// hash of an image whose placeholder tokens fall in the block).
KvBlockKey ChainKey(const KvBlockKey& parent, absl::Span<const int32_t> tokens,
                    absl::Span<const std::string> extra_keys = {});

// Keys of the full blocks of `tokens` (a trailing partial block has none) under `ns`.
// `extra_keys_per_block`, when not empty, has one entry per full block. kInvalidArgument for a
// zero block size or a wrong number of extra-key lists.
absl::StatusOr<std::vector<KvBlockKey>> PrefixKeys(
    const KvNamespace& ns, absl::Span<const int32_t> tokens,
    absl::Span<const std::vector<std::string>> extra_keys_per_block = {});

}  // namespace deepinfer

#endif  // DEEPINFER_KV_STORE_BLOCK_KEY_H_
