// Keys, payloads and a config shared by the contract suite and its writer helper process.
#ifndef DEEPINFER_KV_STORE_TESTING_TEST_BLOCKS_H_
#define DEEPINFER_KV_STORE_TESTING_TEST_BLOCKS_H_

#include <cstdint>
#include <vector>

#include "kv_store/block_key.h"
#include "kv_store/kv_store.h"

namespace deepinfer::kv_store_testing {

inline KvNamespace TestNamespace() {
  KvNamespace ns;
  ns.model_id = "contract-test-model";
  ns.model_revision = "r1";
  ns.kv_dtype = "bf16";
  ns.kv_layout = "paged_nhd";
  ns.block_size = 4;
  return ns;
}

// Small objects (4 layers of 1 KiB, 8 KiB with the header) keep the suite fast.
inline KvBlockLayout TestLayout() { return KvBlockLayout{4, 1024, 7}; }

// The i-th test key: a one-block prefix of tokens {i, i, i, i}.
inline KvBlockKey TestKey(uint64_t i) {
  const int32_t t = static_cast<int32_t>(i);
  const int32_t tokens[4] = {t, t, t, t};
  return ChainKey(RootKey(TestNamespace()), tokens);
}

// The payload writer `writer` stores under `key`: every byte depends on the key, the writer, the
// layer and the offset, so a read that mixes writers, layers or keys never matches.
inline std::vector<uint8_t> TestPayload(const KvBlockKey& key, uint32_t writer) {
  const KvBlockLayout layout = TestLayout();
  std::vector<uint8_t> out(layout.payload_bytes());
  uint64_t x = key.Prefix64() ^ (uint64_t{writer} * 0x9e3779b97f4a7c15ull);
  for (size_t i = 0; i < out.size(); ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;  // xorshift64
    out[i] = static_cast<uint8_t>(x >> 24);
  }
  return out;
}

inline KvStoreConfig TestConfig(uint64_t capacity_bytes) {
  KvStoreConfig config;
  config.layout = TestLayout();
  config.model_digest = ModelDigest(TestNamespace());
  config.capacity_bytes = capacity_bytes;
  config.high_watermark = 0.8;
  config.low_watermark = 0.5;
  config.reservation_timeout = absl::Seconds(30);
  return config;
}

}  // namespace deepinfer::kv_store_testing

#endif  // DEEPINFER_KV_STORE_TESTING_TEST_BLOCKS_H_
