// The prefix-cache key of a KV block: a hash chain over block contents. Block i's hash covers the
// hash of block i-1 (its parent), its token ids, and extra keys (image content hashes for image
// tokens in the block). The chain starts from a root derived from the hash seed and the tenant's
// cache salt, so tenants share blocks only when they share a salt.
//
// The function is fixed and platform-independent (little-endian 64-bit mixing, no std::hash), so
// the router computes exactly the hashes every worker publishes in its KV events, across
// processes and machines, for the same seed.
#ifndef DEEPINFER_ENGINE_BLOCK_HASH_H_
#define DEEPINFER_ENGINE_BLOCK_HASH_H_

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"

namespace deepinfer::engine {

// The chain's root for a seed and a cache salt ("" = no salt).
uint64_t RootBlockHash(uint64_t seed, absl::string_view cache_salt);

// Hash of one full block given its parent's hash.
uint64_t BlockHash(uint64_t parent, const int32_t* tokens, int64_t num_tokens,
                   const uint64_t* extra_keys = nullptr, int64_t num_extra = 0);

// Hashes of every full block of `tokens` (a trailing partial block has none).
std::vector<uint64_t> BlockHashes(uint64_t root, const std::vector<int32_t>& tokens,
                                  int block_size);

}  // namespace deepinfer::engine

#endif  // DEEPINFER_ENGINE_BLOCK_HASH_H_
