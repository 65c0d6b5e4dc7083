// Process-level helpers every server binary uses: waiting for SIGTERM/SIGINT, and publishing the
// bound port for launchers and tests that start servers on port 0.
//
// Thread-safety: InstallShutdownSignalHandlers once from main() before threads start (it blocks
// SIGTERM/SIGINT in the calling thread, so every thread created afterwards inherits the mask and
// the signals are consumed only by WaitForShutdownSignal); the rest are thread-safe.
#ifndef DEEPINFER_COMMON_PROCESS_LIFECYCLE_H_
#define DEEPINFER_COMMON_PROCESS_LIFECYCLE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace deepinfer {

// Blocks SIGTERM and SIGINT for this thread (and threads it starts later).
void InstallShutdownSignalHandlers();

// Waits for SIGTERM or SIGINT (returns its number), or until RequestShutdown() is called
// (returns 0). Call after InstallShutdownSignalHandlers.
int WaitForShutdownSignal();

// Wakes WaitForShutdownSignal as if a signal had arrived (e.g. a fatal error on another thread).
void RequestShutdown();

// Writes `port` followed by a newline to `path` atomically (a temporary file, then rename), so a
// reader never sees a partial file. kInternal naming the path on failure.
absl::Status WritePortFile(const std::string& path, int port);

// Reads a port written by WritePortFile, waiting up to `timeout` for the file to appear.
// kDeadlineExceeded when it does not, kInvalidArgument when it holds no port.
absl::StatusOr<int> ReadPortFile(const std::string& path, absl::Duration timeout);

}  // namespace deepinfer

#endif  // DEEPINFER_COMMON_PROCESS_LIFECYCLE_H_
