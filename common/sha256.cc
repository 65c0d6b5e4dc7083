#include "common/sha256.h"

#include <openssl/evp.h>

#include <cstdlib>

namespace deepinfer {

std::string Sha256(absl::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  // EVP_Digest fails only on allocation failure or a broken libcrypto; neither is recoverable.
  if (EVP_Digest(data.data(), data.size(), digest, &length, EVP_sha256(), nullptr) != 1 ||
      length != 32) {
    std::abort();
  }
  return std::string(reinterpret_cast<const char*>(digest), length);
}

std::string HexLower(absl::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(bytes.size() * 2, '0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    const auto b = static_cast<unsigned char>(bytes[i]);
    out[2 * i] = kDigits[b >> 4];
    out[2 * i + 1] = kDigits[b & 0xf];
  }
  return out;
}

}  // namespace deepinfer
