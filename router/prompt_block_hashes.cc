#include "router/prompt_block_hashes.h"

#include "engine/block_hash.h"

namespace deepinfer::router {

std::vector<uint64_t> PromptBlockHashes(absl::Span<const uint32_t> prompt_token_ids,
                                        uint64_t hash_seed, absl::string_view cache_salt,
                                        int64_t block_size) {
  std::vector<uint64_t> out;
  if (block_size < 1) return out;
  const size_t bs = static_cast<size_t>(block_size);
  out.reserve(prompt_token_ids.size() / bs);
  // The engine hashes int32 token ids (as their uint32 bit patterns): the same values here.
  std::vector<int32_t> block(bs);
  uint64_t parent = engine::RootBlockHash(hash_seed, cache_salt);
  for (size_t start = 0; start + bs <= prompt_token_ids.size(); start += bs) {
    for (size_t i = 0; i < bs; ++i) block[i] = static_cast<int32_t>(prompt_token_ids[start + i]);
    parent = engine::BlockHash(parent, block.data(), block_size);
    out.push_back(parent);
  }
  return out;
}

}  // namespace deepinfer::router
