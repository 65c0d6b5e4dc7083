#include "node/worker_identity.h"

#include <unistd.h>

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/worker_role.h"

namespace deepinfer::node {

uint64_t NewIncarnation() {
  std::random_device rd;
  uint64_t x = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  x ^= static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  x ^= static_cast<uint64_t>(getpid()) << 17;
  // splitmix64 finaliser: spread the bits.
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x == 0 ? 1 : x;
}

std::string DefaultWorkerId(internal::v1::WorkerRole role) {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return absl::StrCat(WorkerRoleName(role), "-", host[0] != '\0' ? host : "localhost", "-",
                      getpid());
}

std::string LastPathComponent(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace deepinfer::node
