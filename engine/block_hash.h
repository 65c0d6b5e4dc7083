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
#include <string>
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

// An image's run of placeholder tokens in a prompt, as far as hashing is concerned.
struct ImageSpan {
  std::string content_hash;  // identifies the image (the engine takes 32 bytes: SHA-256)
  int64_t position = 0;      // prompt index of the run's first placeholder token
  int64_t num_tokens = 0;    // tokens in the run
};

// The chain over every full block of `tokens` for a prompt with images: a block overlapping an
// image's run [position, position + num_tokens) carries three extra keys per such image, in the
// order of `images`: a 64-bit fold of content_hash, the run's start relative to the block's first
// position (negative when the run began in an earlier block) and num_tokens. Blocks overlapping
// no image hash as in BlockHashes, so with no images this equals BlockHashes. The same tokens
// with a different image thus differ from the image's first block on (and the chain carries the
// difference onwards). `tokens` may extend past the prompt (generated tokens).
std::vector<uint64_t> PromptBlockHashes(uint64_t root, const std::vector<int32_t>& tokens,
                                        const std::vector<ImageSpan>& images, int block_size);

}  // namespace deepinfer::engine

#endif  // DEEPINFER_ENGINE_BLOCK_HASH_H_
