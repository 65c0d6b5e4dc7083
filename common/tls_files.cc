#include "common/tls_files.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "openssl/bio.h"
#include "openssl/evp.h"
#include "openssl/pem.h"
#include "openssl/x509.h"

namespace deepinfer {
namespace {

absl::Status ErrnoError(int err, const std::string& flag, const std::string& path) {
  const std::string message = absl::StrCat("--", flag, ": cannot read ", path, ": ",
                                           std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == EACCES) return absl::PermissionDeniedError(message);
  return absl::InvalidArgumentError(message);
}

absl::StatusOr<std::string> ReadWhole(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoError(errno, flag, path);
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) return ErrnoError(errno, flag, path);
  return out.str();
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

}  // namespace

absl::StatusOr<TlsFiles> LoadTlsFiles(const std::string& cert_file, const std::string& key_file) {
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_cert_file and --tls_key_file go together; only --",
        cert_file.empty() ? "tls_key_file" : "tls_cert_file", " is set"));
  }
  TlsFiles files;
  files.cert_file = cert_file;
  files.key_file = key_file;
  absl::StatusOr<std::string> cert = ReadWhole("tls_cert_file", cert_file);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadWhole("tls_key_file", key_file);
  if (!key.ok()) return key.status();
  files.cert_pem = std::move(*cert);
  files.key_pem = std::move(*key);

  std::unique_ptr<BIO, BioFree> cert_bio(
      BIO_new_mem_buf(files.cert_pem.data(), static_cast<int>(files.cert_pem.size())));
  std::unique_ptr<X509, X509Free> x509(
      PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  if (x509 == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_cert_file: ", cert_file, " holds no PEM certificate"));
  }
  std::unique_ptr<BIO, BioFree> key_bio(
      BIO_new_mem_buf(files.key_pem.data(), static_cast<int>(files.key_pem.size())));
  // An empty passphrase callback: an encrypted key fails here instead of prompting.
  std::unique_ptr<EVP_PKEY, PkeyFree> pkey(PEM_read_bio_PrivateKey(
      key_bio.get(), nullptr, [](char*, int, int, void*) { return 0; }, nullptr));
  if (pkey == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_key_file: ", key_file, " holds no unencrypted PEM private key"));
  }
  if (X509_check_private_key(x509.get(), pkey.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("--tls_key_file: ", key_file,
                                                   " is not the key of the certificate in ",
                                                   cert_file));
  }
  return files;
}

absl::StatusOr<absl::Time> TlsFilesModified(const std::string& cert_file,
                                            const std::string& key_file) {
  absl::Time latest = absl::InfinitePast();
  for (const auto& [flag, path] : {std::pair<const char*, const std::string&>{"tls_cert_file",
                                                                            cert_file},
                                   {"tls_key_file", key_file}}) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return ErrnoError(errno, flag, path);
    latest = std::max(latest, absl::TimeFromTimespec(st.st_mtim));
  }
  return latest;
}

}  // namespace deepinfer
