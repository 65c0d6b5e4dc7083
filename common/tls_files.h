// A TLS certificate chain and private key read from PEM files and checked as a pair, for the
// public listeners (router --tls_cert_file/--tls_key_file) and their reload.
//
// Thread-safety: free functions without shared state.
#ifndef DEEPINFER_COMMON_TLS_FILES_H_
#define DEEPINFER_COMMON_TLS_FILES_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace deepinfer {

struct TlsFiles {
  std::string cert_file;
  std::string key_file;
  std::string cert_pem;  // the whole certificate file: leaf first, then any intermediates
  std::string key_pem;
};

// Reads both files and checks that the first certificate parses, the key parses and the key is
// the certificate's. Errors name the flag and the file: kInvalidArgument "--tls_cert_file and
// --tls_key_file go together" when exactly one path is empty; kNotFound / kPermissionDenied when
// a file is missing or unreadable; kInvalidArgument for a file without a PEM certificate or key,
// or a key that does not match the certificate.
absl::StatusOr<TlsFiles> LoadTlsFiles(const std::string& cert_file, const std::string& key_file);

// The later of both files' modification times; kNotFound etc. when one cannot be stat'ed. A
// change tells a poller to reload.
absl::StatusOr<absl::Time> TlsFilesModified(const std::string& cert_file,
                                            const std::string& key_file);

}  // namespace deepinfer

#endif  // DEEPINFER_COMMON_TLS_FILES_H_
