#include "router/prompt_block_hashes.h"

namespace deepinfer::router {

std::vector<uint64_t> PromptBlockHashes(absl::Span<const uint32_t> prompt_token_ids,
                                        uint64_t hash_seed, absl::string_view cache_salt,
                                        int64_t block_size,
                                        const std::vector<engine::ImageSpan>& images) {
  if (block_size < 1 || block_size > (int64_t{1} << 30)) return {};
  // The engine hashes int32 token ids (as their uint32 bit patterns): the same values here.
  const std::vector<int32_t> tokens(prompt_token_ids.begin(), prompt_token_ids.end());
  return engine::PromptBlockHashes(engine::RootBlockHash(hash_seed, cache_salt), tokens, images,
                                   static_cast<int>(block_size));
}

}  // namespace deepinfer::router
