// SHA-256 (FIPS 180-4) through OpenSSL's libcrypto EVP interface, and lower-case hex encoding.
// Used to key content (e.g. request images) by their bytes.
//
// Thread-safety: both functions are pure and thread-safe.
#ifndef DEEPINFER_COMMON_SHA256_H_
#define DEEPINFER_COMMON_SHA256_H_

#include <string>

#include "absl/strings/string_view.h"

namespace deepinfer {

// The 32 raw bytes of the SHA-256 digest of `data`.
std::string Sha256(absl::string_view data);

// "0a1b..": two lower-case hex digits per input byte.
std::string HexLower(absl::string_view bytes);

}  // namespace deepinfer

#endif  // DEEPINFER_COMMON_SHA256_H_
