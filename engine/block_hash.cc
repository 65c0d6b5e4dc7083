#include "engine/block_hash.h"

namespace deepinfer::engine {
namespace {

// 64-bit multiply-xorshift mixing (a finaliser in the style of splitmix64): cheap, and every
// input bit affects every output bit.
inline uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

// Little-endian 8-byte words of `bytes`, length first.
uint64_t FoldBytes(uint64_t h, absl::string_view bytes) {
  h = Mix(h, bytes.size());
  uint64_t word = 0;
  int n = 0;
  for (unsigned char c : bytes) {
    word |= static_cast<uint64_t>(c) << (8 * n);
    if (++n == 8) {
      h = Mix(h, word);
      word = 0;
      n = 0;
    }
  }
  if (n > 0) h = Mix(h, word);
  return h;
}

}  // namespace

uint64_t RootBlockHash(uint64_t seed, absl::string_view cache_salt) {
  return FoldBytes(Mix(0x6465657069666572ull /* "deepifer" */, seed), cache_salt);
}

uint64_t BlockHash(uint64_t parent, const int32_t* tokens, int64_t num_tokens,
                   const uint64_t* extra_keys, int64_t num_extra) {
  uint64_t h = Mix(parent, static_cast<uint64_t>(num_tokens));
  for (int64_t i = 0; i < num_tokens; ++i) h = Mix(h, static_cast<uint32_t>(tokens[i]));
  h = Mix(h, static_cast<uint64_t>(num_extra));
  for (int64_t i = 0; i < num_extra; ++i) h = Mix(h, extra_keys[i]);
  // 0 is reserved for "no parent" in KV events.
  return h == 0 ? 1 : h;
}

std::vector<uint64_t> BlockHashes(uint64_t root, const std::vector<int32_t>& tokens,
                                  int block_size) {
  std::vector<uint64_t> out;
  uint64_t parent = root;
  for (size_t b = 0; (b + 1) * block_size <= tokens.size(); ++b) {
    parent = BlockHash(parent, tokens.data() + b * block_size, block_size);
    out.push_back(parent);
  }
  return out;
}

std::vector<uint64_t> PromptBlockHashes(uint64_t root, const std::vector<int32_t>& tokens,
                                        const std::vector<ImageSpan>& images, int block_size) {
  std::vector<uint64_t> out;
  if (block_size < 1) return out;
  std::vector<uint64_t> folded;
  folded.reserve(images.size());
  for (const ImageSpan& image : images) {
    folded.push_back(FoldBytes(0x696d616765ull /* "image" */, image.content_hash));
  }
  std::vector<uint64_t> extra;
  uint64_t parent = root;
  const int64_t bs = block_size;
  for (int64_t b = 0; (b + 1) * bs <= static_cast<int64_t>(tokens.size()); ++b) {
    const int64_t begin = b * bs;
    extra.clear();
    for (size_t i = 0; i < images.size(); ++i) {
      const ImageSpan& image = images[i];
      if (image.position < begin + bs && image.position + image.num_tokens > begin) {
        extra.push_back(folded[i]);
        extra.push_back(static_cast<uint64_t>(image.position - begin));
        extra.push_back(static_cast<uint64_t>(image.num_tokens));
      }
    }
    parent = BlockHash(parent, tokens.data() + begin, bs, extra.empty() ? nullptr : extra.data(),
                       static_cast<int64_t>(extra.size()));
    out.push_back(parent);
  }
  return out;
}

}  // namespace deepinfer::engine
