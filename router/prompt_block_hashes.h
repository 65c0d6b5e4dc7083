// The block-hash chain of a prompt exactly as a worker's engine computes it for its prefix cache
// (engine/block_hash.h: root from the hash seed and the cache salt, then one hash per full block,
// each covering its parent), so that WorkerRegistry::PrefixOverlap can compare it with the
// hashes workers publish in their KV events.
//
// The seed and block size are the workers' (WorkerInfo.block_hash_seed, WorkerInfo.block_size;
// registration makes every prefill/decode worker of a model agree on both). A trailing partial
// block has no hash. A prompt with images passes their runs (content hash, position, length):
// the blocks they overlap then carry the content as the engine hashes it
// (engine::PromptBlockHashes), so the same tokens with another image do not match.
//
// Thread-safety: a pure function.
#ifndef DEEPINFER_ROUTER_PROMPT_BLOCK_HASHES_H_
#define DEEPINFER_ROUTER_PROMPT_BLOCK_HASHES_H_

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/block_hash.h"

namespace deepinfer::router {

// Hashes of the prompt's full blocks of `block_size` tokens, in order. Empty when block_size < 1.
std::vector<uint64_t> PromptBlockHashes(absl::Span<const uint32_t> prompt_token_ids,
                                        uint64_t hash_seed, absl::string_view cache_salt,
                                        int64_t block_size,
                                        const std::vector<engine::ImageSpan>& images = {});

}  // namespace deepinfer::router

#endif  // DEEPINFER_ROUTER_PROMPT_BLOCK_HASHES_H_
