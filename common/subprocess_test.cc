#include "common/subprocess.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = getenv("TEST_TMPDIR");
  return absl::StrCat(dir ? dir : "/tmp", "/", name, ".", getpid());
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::unique_ptr<Subprocess> StartShell(const std::string& script, const std::string& log = "",
                                       std::vector<std::pair<std::string, std::string>> env = {}) {
  SubprocessOptions options;
  options.argv = {"/bin/sh", "-c", script};
  options.log_path = log;
  options.env = std::move(env);
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(std::move(options));
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : nullptr;
}

TEST(SubprocessTest, ReportsExitCode) {
  auto p = StartShell("exit 7");
  ASSERT_NE(p, nullptr);
  EXPECT_GT(p->pid(), 0);
  absl::StatusOr<ExitStatus> status = p->Wait(absl::Seconds(10));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(status->exited);
  EXPECT_EQ(status->exit_code, 7);
  EXPECT_FALSE(status->ok());
  EXPECT_EQ(status->ToString(), "exit code 7");
  EXPECT_FALSE(p->Running());
  // Later calls report the same status without waiting.
  EXPECT_EQ(p->Wait(absl::ZeroDuration())->exit_code, 7);
  EXPECT_EQ(p->exit_status()->exit_code, 7);
  // A reaped pid is never signalled again.
  EXPECT_EQ(p->Signal(SIGTERM).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(SubprocessTest, CleanExitIsOk) {
  auto p = StartShell("true");
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(p->Wait(absl::Seconds(10))->ok());
}

TEST(SubprocessTest, WaitTimesOutWhileRunningThenSignalKills) {
  auto p = StartShell("exec sleep 30");
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(p->Running());
  EXPECT_EQ(p->Wait(absl::Milliseconds(50)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(p->exit_status().has_value());
  ASSERT_TRUE(p->Signal(SIGKILL).ok());
  absl::StatusOr<ExitStatus> status = p->Wait(absl::Seconds(10));
  ASSERT_TRUE(status.ok());
  EXPECT_FALSE(status->exited);
  EXPECT_EQ(status->signal, SIGKILL);
  EXPECT_EQ(status->ToString(), "killed by signal 9 (KILL)");
}

TEST(SubprocessTest, ChildCanTrapSigtermEvenWhenParentBlocksIt) {
  // The launcher blocks SIGTERM in every thread for sigwait; the child must not inherit that.
  sigset_t set, old;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &set, &old), 0);
  const std::string log = TempPath("trap.log");
  auto p = StartShell("trap 'echo got-term; exit 3' TERM; echo ready; while :; do sleep 0.01; done",
                      log);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ASSERT_NE(p, nullptr);
  // Wait until the trap is installed before signalling.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (ReadAll(log).find("ready") == std::string::npos && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(p->Signal(SIGTERM).ok());
  absl::StatusOr<ExitStatus> status = p->Wait(absl::Seconds(10));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->exit_code, 3);
  EXPECT_NE(ReadAll(log).find("got-term"), std::string::npos);
}

TEST(SubprocessTest, TerminateEscalatesToSigkill) {
  const std::string log = TempPath("ignore.log");
  auto p = StartShell("trap '' TERM; echo ready; while :; do sleep 0.01; done", log);
  ASSERT_NE(p, nullptr);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (ReadAll(log).find("ready") == std::string::npos && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ExitStatus status = p->Terminate(absl::Milliseconds(200));
  EXPECT_EQ(status.signal, SIGKILL);

  auto q = StartShell("exec sleep 30");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->Terminate(absl::Seconds(10)).signal, SIGTERM);
}

TEST(SubprocessTest, CapturesStdoutAndStderrInLog) {
  const std::string log = TempPath("capture.log");
  auto p = StartShell("echo to-stdout; echo to-stderr >&2; read x; echo \"stdin:[$x]\"", log);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(p->Wait(absl::Seconds(10))->ok());
  EXPECT_EQ(p->log_path(), log);
  EXPECT_EQ(ReadAll(log), "to-stdout\nto-stderr\nstdin:[]\n");

  // The log is truncated by default, appended on request.
  auto again = StartShell("echo second", log);
  ASSERT_TRUE(again->Wait(absl::Seconds(10))->ok());
  EXPECT_EQ(ReadAll(log), "second\n");
  SubprocessOptions append;
  append.argv = {"/bin/sh", "-c", "echo third"};
  append.log_path = log;
  append.truncate_log = false;
  auto third = Subprocess::Start(append);
  ASSERT_TRUE(third.ok());
  ASSERT_TRUE((*third)->Wait(absl::Seconds(10))->ok());
  EXPECT_EQ(ReadAll(log), "second\nthird\n");
}

TEST(SubprocessTest, PassesExtraEnvironmentAndInheritsTheRest) {
  setenv("DEEPINFER_SUBPROCESS_INHERITED", "from-parent", 1);
  setenv("DEEPINFER_SUBPROCESS_OVERRIDDEN", "old", 1);
  const std::string log = TempPath("env.log");
  auto p = StartShell(
      "echo \"$DEEPINFER_SUBPROCESS_INHERITED $DEEPINFER_SUBPROCESS_OVERRIDDEN $EXTRA_VAR\"", log,
      {{"DEEPINFER_SUBPROCESS_OVERRIDDEN", "new"}, {"EXTRA_VAR", "a b=c"}});
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(p->Wait(absl::Seconds(10))->ok());
  EXPECT_EQ(ReadAll(log), "from-parent new a b=c\n");
}

TEST(SubprocessTest, ArgvIsPassedVerbatimAndBareNamesUsePath) {
  const std::string log = TempPath("argv.log");
  SubprocessOptions options;
  options.argv = {"printf", "[%s]", "a b", "--flag=x y", ""};
  options.log_path = log;
  auto p = Subprocess::Start(options);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE((*p)->Wait(absl::Seconds(10))->ok());
  EXPECT_EQ(ReadAll(log), "[a b][--flag=x y][]");
}

TEST(SubprocessTest, ChildRunsInItsOwnProcessGroup) {
  const std::string log = TempPath("pgid.log");
  // Field 5 of /proc/PID/stat is the process group ("(sh)" holds no space).
  auto p = StartShell("cut -d' ' -f5 /proc/$$/stat", log);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(p->Wait(absl::Seconds(10))->ok());
  EXPECT_EQ(ReadAll(log), absl::StrCat(p->pid(), "\n"));
}

TEST(SubprocessTest, ExecFailuresAreReportedByStart) {
  SubprocessOptions missing;
  missing.argv = {"/nonexistent/deepinfer-binary"};
  auto p = Subprocess::Start(missing);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound) << p.status();
  EXPECT_NE(p.status().message().find("/nonexistent/deepinfer-binary"), std::string::npos);

  SubprocessOptions not_in_path;
  not_in_path.argv = {"deepinfer-no-such-program"};
  EXPECT_EQ(Subprocess::Start(not_in_path).status().code(), absl::StatusCode::kNotFound);

  const std::string not_executable = TempPath("not-executable");
  std::ofstream(not_executable) << "#!/bin/sh\n";
  SubprocessOptions denied;
  denied.argv = {not_executable};
  EXPECT_EQ(Subprocess::Start(denied).status().code(), absl::StatusCode::kPermissionDenied);

  SubprocessOptions empty;
  EXPECT_EQ(Subprocess::Start(empty).status().code(), absl::StatusCode::kInvalidArgument);

  SubprocessOptions bad_log;
  bad_log.argv = {"/bin/true"};
  bad_log.log_path = "/nonexistent-dir/x.log";
  auto q = Subprocess::Start(bad_log);
  EXPECT_EQ(q.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(q.status().message().find("/nonexistent-dir/x.log"), std::string::npos);
}

TEST(SubprocessTest, DestructorKillsARunningChild) {
  pid_t pid;
  {
    auto p = StartShell("exec sleep 30");
    ASSERT_NE(p, nullptr);
    pid = p->pid();
  }
  EXPECT_EQ(kill(pid, 0), -1);  // Killed and reaped: the pid no longer exists.
}

TEST(SubprocessTest, ChildIsKilledWhenTheStartingThreadExits) {
  // PR_SET_PDEATHSIG fires when the thread that forked exits (a crashed parent ends all its
  // threads): start from a short-lived thread and watch the child get SIGKILL.
  std::unique_ptr<Subprocess> p;
  std::thread starter([&] { p = StartShell("exec sleep 30"); });
  starter.join();
  ASSERT_NE(p, nullptr);
  absl::StatusOr<ExitStatus> status = p->Wait(absl::Seconds(10));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->signal, SIGKILL);
}

TEST(TailFileTest, ReturnsTheLastLines) {
  const std::string path = TempPath("tail.txt");
  std::ofstream(path) << "one\ntwo\nthree\nfour\n";
  EXPECT_EQ(TailFile(path, 2), "three\nfour");
  EXPECT_EQ(TailFile(path, 10), "one\ntwo\nthree\nfour");
  EXPECT_EQ(TailFile(path, 1, 6), "four");
  EXPECT_EQ(TailFile("/nonexistent/file"), "");
}

// The CPUs this test may run on, ascending.
std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

TEST(SubprocessTest, ChildRunsOnTheCpusGiven) {
  const std::vector<int> allowed = AllowedCpus();
  ASSERT_FALSE(allowed.empty());
  const int cpu = allowed.back();
  const std::string log = TempPath("affinity");
  SubprocessOptions options;
  // The kernel's own account of the child's affinity, after exec.
  options.argv = {"/bin/sh", "-c", "grep Cpus_allowed_list /proc/self/status"};
  options.log_path = log;
  options.cpus = {cpu};
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(std::move(options));
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE((*p)->Wait(absl::Seconds(10))->ok());
  EXPECT_EQ(ReadAll(log), absl::StrCat("Cpus_allowed_list:\t", cpu, "\n"));
  unlink(log.c_str());
}

TEST(SubprocessTest, CpusTheMachineLacksAreRefusedByName) {
  const int configured = static_cast<int>(sysconf(_SC_NPROCESSORS_CONF));
  for (int cpu : {configured, -1, CPU_SETSIZE}) {
    SubprocessOptions options;
    options.argv = {"/bin/true"};
    options.cpus = {AllowedCpus().front(), cpu};
    absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(std::move(options));
    ASSERT_FALSE(p.ok()) << cpu;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(absl::StrCat("cpus: CPU ", cpu, " does not exist")),
              std::string::npos)
        << p.status();
  }
}

TEST(ParseCpuListTest, ListsAndRanges) {
  EXPECT_EQ(*ParseCpuList("f", "1"), std::vector<int>({1}));
  EXPECT_EQ(*ParseCpuList("f", "0-3,6"), std::vector<int>({0, 1, 2, 3, 6}));
  EXPECT_EQ(*ParseCpuList("f", "5,2-3,3"), std::vector<int>({5, 2, 3}));
  EXPECT_TRUE(ParseCpuList("f", "")->empty());
  for (const char* bad : {"x", "1,", "3-1", "-2", "1-", "0-99999", "1 2"}) {
    absl::StatusOr<std::vector<int>> cpus = ParseCpuList("--decode_cpus", bad);
    ASSERT_FALSE(cpus.ok()) << bad;
    EXPECT_EQ(cpus.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(cpus.status().message().rfind("--decode_cpus: expected CPU numbers", 0), 0)
        << cpus.status();
  }
}

}  // namespace
}  // namespace deepinfer
