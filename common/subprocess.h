// A child process started with fork/exec: argv and extra environment variables, stdout and
// stderr appended to a log file, signals, and waiting with a timeout. Used by the local cluster
// launcher and by cross-process tests (STYLE.md 10: process-kill helpers).
//
// The child:
//   - gets PR_SET_PDEATHSIG(SIGKILL), so nothing outlives a crashed parent. Linux delivers it
//     when the *thread* that called Start exits, so start children from a long-lived thread
//     (main, or a supervisor thread that outlives them);
//   - unblocks every signal and resets every disposition to the default before exec (the
//     parent may block SIGTERM for sigwait, or ignore SIGPIPE, and both would be inherited);
//   - reads stdin from /dev/null and inherits no descriptor besides 0, 1 and 2;
//   - runs in its own process group when `new_process_group` (the default), so a terminal's
//     Ctrl-C reaches only the parent, which then stops its children in its own order.
//
// Thread-safety: all methods are thread-safe. Not copyable or movable (it owns a pid).
#ifndef DEEPINFER_COMMON_SUBPROCESS_H_
#define DEEPINFER_COMMON_SUBPROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace deepinfer {

// How a child ended, decoded from waitpid's status.
struct ExitStatus {
  // True when the child called exit (code in `exit_code`); false when a signal killed it
  // (number in `signal`).
  bool exited = false;
  int exit_code = 0;
  int signal = 0;

  static ExitStatus FromWaitStatus(int wait_status);
  // exit(0).
  bool ok() const { return exited && exit_code == 0; }
  // "exit code 3" or "killed by signal 9 (KILL)".
  std::string ToString() const;
};

struct SubprocessOptions {
  // argv[0] is the program: a path containing '/' is executed as is, a bare name is looked up
  // in PATH. Must not be empty.
  std::vector<std::string> argv;
  // Set (or override) in the child's environment, on top of the parent's.
  std::vector<std::pair<std::string, std::string>> env;
  // stdout and stderr go to this file (created, or truncated when `truncate_log`, else
  // appended). Empty: the child shares the parent's stdout and stderr.
  std::string log_path;
  bool truncate_log = true;
  bool new_process_group = true;
  // Non-empty: the CPUs the child may run on (its affinity, set before exec, inherited by its
  // threads), e.g. a decode node kept off the cores its cluster's other processes use, from its
  // first instruction (its start-up profiles time forward passes). Start returns
  // kInvalidArgument "cpus: ..." for a CPU the machine does not have, or a set the kernel refuses
  // (CPUs offline or outside the cpuset the process runs in).
  std::vector<int> cpus;
};

class Subprocess {
 public:
  // Forks and execs. Returns once exec has succeeded. kInvalidArgument for an empty argv;
  // kNotFound when the program does not exist, kPermissionDenied when it is not executable
  // (both naming it); kInternal when the log file cannot be opened or fork fails.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(SubprocessOptions options);

  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  // Kills (SIGKILL) and reaps the child if it is still running.
  ~Subprocess();

  pid_t pid() const { return pid_; }
  const std::vector<std::string>& argv() const { return argv_; }
  const std::string& log_path() const { return log_path_; }

  // Sends `sig` to the child. kFailedPrecondition once the child has been reaped (its pid may
  // belong to another process by then); kInternal if kill() fails otherwise.
  absl::Status Signal(int sig);

  // Waits up to `timeout` (zero: just checks) for the child to exit and reaps it. Returns how
  // it ended (also on later calls); kDeadlineExceeded when it is still running.
  absl::StatusOr<ExitStatus> Wait(absl::Duration timeout);

  // True until the child has exited (reaps it if it has).
  bool Running();

  // How the child ended, once reaped by Wait or Running; nullopt before.
  std::optional<ExitStatus> exit_status() const;

  // Sends SIGTERM, waits up to `grace`, then SIGKILL and waits for the end. Returns how it
  // ended (a signal-killed status tells the caller the grace period ran out).
  ExitStatus Terminate(absl::Duration grace);

 private:
  Subprocess(pid_t pid, std::vector<std::string> argv, std::string log_path)
      : pid_(pid), argv_(std::move(argv)), log_path_(std::move(log_path)) {}

  // Non-blocking waitpid; records the status. Requires mu_.
  bool ReapLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const pid_t pid_;
  const std::vector<std::string> argv_;
  const std::string log_path_;
  mutable absl::Mutex mu_;
  std::optional<ExitStatus> exit_status_ ABSL_GUARDED_BY(mu_);
};

// The last `max_lines` lines of a text file (at most `max_bytes` from its end), for error
// messages about a child that failed. Empty when the file cannot be read.
std::string TailFile(const std::string& path, int max_lines = 20, size_t max_bytes = 8192);

// Parses a CPU list as taskset and cgroups write it ("1", "0-3,6"; duplicates dropped, order
// kept) for SubprocessOptions::cpus. Empty text: no CPUs (no affinity set). kInvalidArgument
// naming `field` for anything else.
absl::StatusOr<std::vector<int>> ParseCpuList(absl::string_view field, absl::string_view text);

}  // namespace deepinfer

#endif  // DEEPINFER_COMMON_SUBPROCESS_H_
