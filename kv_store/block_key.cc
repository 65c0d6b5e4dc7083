#include "kv_store/block_key.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"

namespace deepinfer {
namespace {

void AppendU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void AppendField(std::string& out, absl::string_view field) {
  AppendU32(out, static_cast<uint32_t>(field.size()));
  out.append(field.data(), field.size());
}

KvBlockKey FromDigest(const std::string& digest) {
  KvBlockKey key;
  std::memcpy(key.bytes.data(), digest.data(), KvBlockKey::kSize);
  return key;
}

absl::string_view View(const KvBlockKey& key) {
  return absl::string_view(reinterpret_cast<const char*>(key.bytes.data()), key.bytes.size());
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string KvBlockKey::Hex() const { return HexLower(View(*this)); }

absl::StatusOr<KvBlockKey> KvBlockKey::FromHex(absl::string_view hex) {
  if (hex.size() != 2 * kSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("block key: expected 64 hex digits, found ", hex.size(), " characters"));
  }
  KvBlockKey key;
  for (size_t i = 0; i < kSize; ++i) {
    const int hi = HexValue(hex[2 * i]), lo = HexValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return absl::InvalidArgumentError(absl::StrCat("block key: not hex: \"", hex, "\""));
    }
    key.bytes[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return key;
}

uint64_t KvBlockKey::Prefix64() const {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | bytes[i];
  return v;
}

KvBlockKey ModelDigest(const KvNamespace& ns) {
  std::string in = "deepinfer.kv_model.v1";
  AppendField(in, ns.model_id);
  AppendField(in, ns.model_revision);
  AppendField(in, ns.kv_dtype);
  AppendField(in, ns.kv_layout);
  AppendU32(in, ns.block_size);
  return FromDigest(Sha256(in));
}

KvBlockKey RootKey(const KvNamespace& ns) {
  std::string in = "deepinfer.kv_root.v1";
  in.append(reinterpret_cast<const char*>(ModelDigest(ns).bytes.data()), KvBlockKey::kSize);
  AppendField(in, ns.cache_salt);
  return FromDigest(Sha256(in));
}

KvBlockKey ChainKey(const KvBlockKey& parent, absl::Span<const int32_t> tokens,
                    absl::Span<const std::string> extra_keys) {
  std::string in = "deepinfer.kv_block.v1";
  in.reserve(in.size() + KvBlockKey::kSize + 8 + 4 * tokens.size());
  in.append(reinterpret_cast<const char*>(parent.bytes.data()), KvBlockKey::kSize);
  AppendU32(in, static_cast<uint32_t>(tokens.size()));
  for (int32_t t : tokens) AppendU32(in, static_cast<uint32_t>(t));
  AppendU32(in, static_cast<uint32_t>(extra_keys.size()));
  for (const std::string& extra : extra_keys) AppendField(in, extra);
  return FromDigest(Sha256(in));
}

absl::StatusOr<std::vector<KvBlockKey>> PrefixKeys(
    const KvNamespace& ns, absl::Span<const int32_t> tokens,
    absl::Span<const std::vector<std::string>> extra_keys_per_block) {
  if (ns.block_size == 0) return absl::InvalidArgumentError("block key: block_size is 0");
  const size_t blocks = tokens.size() / ns.block_size;
  if (!extra_keys_per_block.empty() && extra_keys_per_block.size() != blocks) {
    return absl::InvalidArgumentError(absl::StrCat("block key: expected extra keys for ", blocks,
                                                   " full blocks, found ",
                                                   extra_keys_per_block.size()));
  }
  std::vector<KvBlockKey> keys;
  keys.reserve(blocks);
  KvBlockKey parent = RootKey(ns);
  for (size_t b = 0; b < blocks; ++b) {
    parent = ChainKey(parent, tokens.subspan(b * ns.block_size, ns.block_size),
                      extra_keys_per_block.empty()
                          ? absl::Span<const std::string>()
                          : absl::Span<const std::string>(extra_keys_per_block[b]));
    keys.push_back(parent);
  }
  return keys;
}

}  // namespace deepinfer
