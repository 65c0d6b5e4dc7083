#include "common/subprocess.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

extern char** environ;

namespace deepinfer {
namespace {

// "CPUs 0-3,6" for the set; "no CPUs" when empty.
std::string CpuListString(const cpu_set_t& set) {
  std::vector<std::string> ranges;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    int last = cpu;
    while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set)) ++last;
    ranges.push_back(last == cpu ? absl::StrCat(cpu) : absl::StrCat(cpu, "-", last));
    cpu = last;
  }
  return ranges.empty() ? "no CPUs" : absl::StrCat("CPUs ", absl::StrJoin(ranges, ","));
}

// Resolves a bare program name through PATH in the parent, so the child only calls execve.
absl::StatusOr<std::string> ResolveProgram(const std::string& program) {
  if (program.find('/') != std::string::npos) return program;
  const char* path = getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
    std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", program);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return absl::NotFoundError(absl::StrCat("argv[0]: program \"", program, "\" not found in PATH"));
}

std::vector<std::string> BuildEnvironment(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    absl::string_view entry(*e);
    absl::string_view name = entry.substr(0, entry.find('='));
    bool overridden = std::any_of(overrides.begin(), overrides.end(),
                                  [&](const auto& kv) { return kv.first == name; });
    if (!overridden) env.emplace_back(entry);
  }
  for (const auto& [name, value] : overrides) env.push_back(absl::StrCat(name, "=", value));
  return env;
}

void CloseRange(int first, int last, int open_max) {
  if (first > last) return;
#ifdef SYS_close_range
  if (syscall(SYS_close_range, static_cast<unsigned>(first), static_cast<unsigned>(last), 0) == 0) {
    return;
  }
#endif
  for (int fd = first; fd <= std::min(last, open_max); ++fd) close(fd);
}

// Sends errno to the parent, negated when the CPU affinity failed (not exec).
[[noreturn]] void ReportExecFailure(int error_fd, bool affinity = false) {
  int err = affinity ? -errno : errno;
  ssize_t ignored = write(error_fd, &err, sizeof(err));
  (void)ignored;
  _exit(127);
}

// Runs in the forked child: only async-signal-safe calls from here to execve.
[[noreturn]] void ExecChild(const char* program, char* const* argv, char* const* envp, int stdin_fd,
                            int log_fd, int error_fd, bool new_process_group, const cpu_set_t* cpus,
                            pid_t parent, int open_max) {
  auto fail = [error_fd]() { ReportExecFailure(error_fd); };
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail();
  // The parent may have died between fork and prctl: then nobody will ever reap or stop us.
  if (getppid() != parent) _exit(126);
  if (new_process_group && setpgid(0, 0) != 0) fail();
  if (cpus != nullptr && sched_setaffinity(0, sizeof(cpu_set_t), cpus) != 0) {
    ReportExecFailure(error_fd, /*affinity=*/true);
  }

  struct sigaction dfl;
  memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    sigaction(sig, &dfl, nullptr);  // Fails harmlessly for signals glibc reserves.
  }
  sigset_t none;
  sigemptyset(&none);
  if (sigprocmask(SIG_SETMASK, &none, nullptr) != 0) fail();

  if (dup2(stdin_fd, 0) < 0) fail();
  if (log_fd >= 0 && (dup2(log_fd, 1) < 0 || dup2(log_fd, 2) < 0)) fail();
  CloseRange(3, error_fd - 1, open_max);
  CloseRange(error_fd + 1, INT_MAX, open_max);
  execve(program, argv, envp);
  ReportExecFailure(error_fd);
}

absl::Status ExecError(int err, const std::string& program) {
  std::string message = absl::StrCat("exec ", program, ": ", strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace

ExitStatus ExitStatus::FromWaitStatus(int wait_status) {
  ExitStatus s;
  if (WIFEXITED(wait_status)) {
    s.exited = true;
    s.exit_code = WEXITSTATUS(wait_status);
  } else if (WIFSIGNALED(wait_status)) {
    s.signal = WTERMSIG(wait_status);
  }
  return s;
}

std::string ExitStatus::ToString() const {
  if (exited) return absl::StrCat("exit code ", exit_code);
  const char* name = sigabbrev_np(signal);
  return absl::StrCat("killed by signal ", signal, " (", name ? name : "?", ")");
}

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(SubprocessOptions options) {
  if (options.argv.empty() || options.argv[0].empty()) {
    return absl::InvalidArgumentError("argv: expected a program and its arguments, got nothing");
  }
  absl::StatusOr<std::string> program = ResolveProgram(options.argv[0]);
  if (!program.ok()) return program.status();

  // Everything the child needs is prepared before fork: it may only make async-signal-safe
  // calls (another thread of ours may hold the malloc lock at the moment of fork).
  std::vector<std::string> env = BuildEnvironment(options.env);
  std::vector<char*> argv_ptrs, env_ptrs;
  for (std::string& a : options.argv) argv_ptrs.push_back(a.data());
  argv_ptrs.push_back(nullptr);
  for (std::string& e : env) env_ptrs.push_back(e.data());
  env_ptrs.push_back(nullptr);
  const int open_max = static_cast<int>(std::min<long>(sysconf(_SC_OPEN_MAX), 1 << 16));
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const int configured = static_cast<int>(sysconf(_SC_NPROCESSORS_CONF));
  for (int cpu : options.cpus) {
    if (cpu < 0 || cpu >= std::min(configured, CPU_SETSIZE)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cpus: CPU ", cpu, " does not exist (this machine has CPUs 0-", configured - 1, ")"));
    }
    CPU_SET(cpu, &cpus);
  }

  int stdin_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (stdin_fd < 0) return absl::InternalError(absl::StrCat("open /dev/null: ", strerror(errno)));
  int log_fd = -1;
  if (!options.log_path.empty()) {
    int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (options.truncate_log ? O_TRUNC : O_APPEND);
    log_fd = open(options.log_path.c_str(), flags, 0644);
    if (log_fd < 0) {
      int err = errno;
      close(stdin_fd);
      return absl::InternalError(
          absl::StrCat("log_path ", options.log_path, ": cannot open: ", strerror(err)));
    }
  }
  int error_pipe[2];
  if (pipe2(error_pipe, O_CLOEXEC) != 0) {
    int err = errno;
    close(stdin_fd);
    if (log_fd >= 0) close(log_fd);
    return absl::InternalError(absl::StrCat("pipe2: ", strerror(err)));
  }

  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    ExecChild(program->c_str(), argv_ptrs.data(), env_ptrs.data(), stdin_fd, log_fd, error_pipe[1],
              options.new_process_group, options.cpus.empty() ? nullptr : &cpus, parent, open_max);
  }
  int fork_errno = errno;
  close(error_pipe[1]);
  close(stdin_fd);
  if (log_fd >= 0) close(log_fd);
  if (pid < 0) {
    close(error_pipe[0]);
    return absl::InternalError(absl::StrCat("fork: ", strerror(fork_errno)));
  }

  // The pipe closes on a successful exec (O_CLOEXEC); otherwise the child sends its errno.
  int child_errno = 0;
  ssize_t n;
  do {
    n = read(error_pipe[0], &child_errno, sizeof(child_errno));
  } while (n < 0 && errno == EINTR);
  close(error_pipe[0]);
  if (n > 0) {
    int ignored;
    while (waitpid(pid, &ignored, 0) < 0 && errno == EINTR) {
    }
    if (child_errno < 0) {
      // The kernel refused the affinity: CPUs offline, or outside the cpuset (cgroup) we run in.
      return absl::InvalidArgumentError(absl::StrCat("cpus: ", *program, " cannot run on ",
                                                     CpuListString(cpus), ": ",
                                                     strerror(-child_errno)));
    }
    return ExecError(child_errno, *program);
  }
  return std::unique_ptr<Subprocess>(
      new Subprocess(pid, std::move(options.argv), std::move(options.log_path)));
}

Subprocess::~Subprocess() {
  absl::MutexLock lock(&mu_);
  if (exit_status_.has_value()) return;
  kill(pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

bool Subprocess::ReapLocked() {
  if (exit_status_.has_value()) return true;
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    exit_status_ = ExitStatus::FromWaitStatus(status);
    return true;
  }
  if (r < 0 && errno == ECHILD) {
    // Someone else reaped it (e.g. SIGCHLD set to SIG_IGN): it is gone, how is unknown.
    exit_status_ = ExitStatus{.exited = false, .exit_code = 0, .signal = 0};
    return true;
  }
  return false;
}

absl::Status Subprocess::Signal(int sig) {
  absl::MutexLock lock(&mu_);
  if (ReapLocked()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pid ", pid_, " (", argv_[0], ") has already exited: ", exit_status_->ToString()));
  }
  if (kill(pid_, sig) != 0) {
    return absl::InternalError(absl::StrCat("kill(", pid_, ", ", sig, "): ", strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<ExitStatus> Subprocess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = absl::Milliseconds(1);
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (ReapLocked()) return *exit_status_;
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("pid ", pid_, " (", argv_[0],
                                                      ") still running after ",
                                                      absl::FormatDuration(timeout)));
    }
    absl::SleepFor(std::min(pause, deadline - now));
    pause = std::min(pause * 2, absl::Milliseconds(20));
  }
}

bool Subprocess::Running() {
  absl::MutexLock lock(&mu_);
  return !ReapLocked();
}

std::optional<ExitStatus> Subprocess::exit_status() const {
  absl::MutexLock lock(&mu_);
  return exit_status_;
}

ExitStatus Subprocess::Terminate(absl::Duration grace) {
  (void)Signal(SIGTERM);  // Fails only when it has already exited; Wait reports that.
  absl::StatusOr<ExitStatus> status = Wait(grace);
  if (status.ok()) return *status;
  (void)Signal(SIGKILL);
  // SIGKILL cannot be caught; the wait is bounded by the kernel tearing the process down.
  return *Wait(absl::InfiniteDuration());
}

std::string TailFile(const std::string& path, int max_lines, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  const std::streamoff size = in.tellg();
  const std::streamoff start = std::max<std::streamoff>(0, size - static_cast<std::streamoff>(max_bytes));
  in.seekg(start);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!text.empty() && text.back() == '\n') text.pop_back();
  size_t pos = text.size();
  for (int i = 0; i < max_lines && pos != std::string::npos && pos > 0; ++i) {
    pos = text.rfind('\n', pos - 1);
  }
  if (pos != std::string::npos && pos < text.size() && text[pos] == '\n') ++pos;
  if (pos == std::string::npos) pos = 0;
  return text.substr(pos);
}

absl::StatusOr<std::vector<int>> ParseCpuList(absl::string_view field, absl::string_view text) {
  std::vector<int> cpus;
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": expected CPU numbers and ranges such as \"1\" or \"0-3,6\", got \"",
                     text, "\" (", why, ")"));
  };
  if (text.empty()) return cpus;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    std::vector<absl::string_view> ends = absl::StrSplit(part, absl::MaxSplits('-', 1));
    int first = 0, last = 0;
    if (!absl::SimpleAtoi(ends[0], &first) || first < 0 ||
        (ends.size() == 2 && (!absl::SimpleAtoi(ends[1], &last) || last < 0))) {
      return bad(absl::StrCat("\"", part, "\" is not a CPU or a range"));
    }
    if (ends.size() == 1) last = first;
    if (last < first) return bad(absl::StrCat("the range \"", part, "\" runs backwards"));
    if (last >= CPU_SETSIZE) return bad(absl::StrCat("CPUs go up to ", CPU_SETSIZE - 1));
    for (int cpu = first; cpu <= last; ++cpu) {
      if (std::find(cpus.begin(), cpus.end(), cpu) == cpus.end()) cpus.push_back(cpu);
    }
  }
  return cpus;
}

}  // namespace deepinfer
