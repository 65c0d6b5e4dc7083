#include "common/process_lifecycle.h"

#include <pthread.h>
#include <unistd.h>
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace deepinfer {
namespace {

sigset_t ShutdownSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGUSR2);  // RequestShutdown
  return set;
}

}  // namespace

void InstallShutdownSignalHandlers() {
  sigset_t set = ShutdownSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForShutdownSignal() {
  sigset_t set = ShutdownSet();
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    return sig == SIGUSR2 ? 0 : sig;
  }
}

void RequestShutdown() { kill(getpid(), SIGUSR2); }

absl::Status WritePortFile(const std::string& path, int port) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return absl::InternalError(absl::StrCat("--port_file ", tmp, ": cannot write"));
    out << port << "\n";
    out.flush();
    if (!out) return absl::InternalError(absl::StrCat("--port_file ", tmp, ": write failed"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("--port_file ", path, ": rename failed, errno ", errno));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> ReadPortFile(const std::string& path, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    std::ifstream in(path);
    if (in) {
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      int port = 0;
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &port) || port <= 0 ||
          port > 65535) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": expected a port number, got \"", text, "\""));
      }
      return port;
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(path, ": no port file after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

}  // namespace deepinfer
