// Test/bench helpers: a deterministic byte pattern per (seed, block) so a receiver can check a
// block without being sent its contents, plus helpers to pass small structs through payloads.
#ifndef DEEPINFER_KV_TRANSFER_INTERNAL_TEST_PATTERN_H_
#define DEEPINFER_KV_TRANSFER_INTERNAL_TEST_PATTERN_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace deepinfer::kv_transfer::internal {

inline uint64_t PatternWord(uint64_t seed, uint64_t block, uint64_t word) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull ^ (block << 32) ^ word;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// `length` must be a multiple of 8.
inline void FillPattern(uint64_t seed, uint64_t block, char* dst, uint64_t length) {
  for (uint64_t w = 0; w < length / 8; ++w) {
    const uint64_t v = PatternWord(seed, block, w);
    std::memcpy(dst + 8 * w, &v, 8);
  }
}

inline bool CheckPattern(uint64_t seed, uint64_t block, const char* src, uint64_t length) {
  for (uint64_t w = 0; w < length / 8; ++w) {
    uint64_t v;
    std::memcpy(&v, src + 8 * w, 8);
    if (v != PatternWord(seed, block, w)) return false;
  }
  return true;
}

// Payload "seed + list of (pattern block id, target block index)".
struct PatternPayload {
  uint64_t seed = 0;
  std::vector<std::pair<uint32_t, uint32_t>> blocks;  // (pattern id, target index)

  std::string Encode() const {
    std::string out(8 + 8 * blocks.size(), '\0');
    std::memcpy(out.data(), &seed, 8);
    for (size_t i = 0; i < blocks.size(); ++i) {
      std::memcpy(out.data() + 8 + 8 * i, &blocks[i].first, 4);
      std::memcpy(out.data() + 12 + 8 * i, &blocks[i].second, 4);
    }
    return out;
  }
  static PatternPayload Decode(const std::string& in) {
    PatternPayload p;
    if (in.size() < 8) return p;
    std::memcpy(&p.seed, in.data(), 8);
    for (size_t off = 8; off + 8 <= in.size(); off += 8) {
      uint32_t a, b;
      std::memcpy(&a, in.data() + off, 4);
      std::memcpy(&b, in.data() + off + 4, 4);
      p.blocks.push_back({a, b});
    }
    return p;
  }
};

}  // namespace deepinfer::kv_transfer::internal

#endif  // DEEPINFER_KV_TRANSFER_INTERNAL_TEST_PATTERN_H_
