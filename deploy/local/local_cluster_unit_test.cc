// LocalCluster without the real binaries: command lines, environment, config validation, and the
// start-up failure paths, with shell scripts in bin_dir that exit, hang or write port files.
// The success path (everything SERVING) is in local_cluster_test, against the real binaries.
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "deploy/local/local_cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer::deploy {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pair;

class LocalClusterUnitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = getenv("TEST_TMPDIR");
    root_ = absl::StrCat(tmp ? tmp : "/tmp", "/local_cluster_unit.", getpid(), ".",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_ + "/bin");
    config_.bin_dir = root_ + "/bin";
    config_.log_dir = root_ + "/logs";
    config_.model_dir = "/models/m";
    config_.startup_timeout = absl::Seconds(20);
  }

  void WriteScript(const std::string& relative, const std::string& body) {
    const std::string path = absl::StrCat(config_.bin_dir, "/", relative);
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream(path) << "#!/bin/sh\n" << body;
    chmod(path.c_str(), 0755);
  }

  // A script that writes `port` to its --port_file and its pid next to it, then sleeps until
  // signalled (exec: the signal reaches sleep itself).
  static std::string ServeScript(const std::string& name, int port) {
    return absl::StrCat(
        "for a in \"$@\"; do case \"$a\" in --port_file=*) pf=\"${a#--port_file=}\";; esac; done\n"
        "echo $$ > \"$pf.pid.tmp\"; mv \"$pf.pid.tmp\" \"$(dirname \"$pf\")/",
        name, ".pid\"\necho ", port, " > \"$pf\"\nexec sleep 30\n");
  }

  pid_t ReadPid(const std::string& name) {
    std::ifstream in(absl::StrCat(config_.log_dir, "/", name, ".pid"));
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    int pid = 0;
    EXPECT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &pid)) << name;
    return pid;
  }

  static bool Alive(pid_t pid) { return kill(pid, 0) == 0 || errno != ESRCH; }

  std::string root_;
  LocalClusterConfig config_;
};

TEST_F(LocalClusterUnitTest, RouterCommandLine) {
  config_.router_listen = "127.0.0.1:50051";
  config_.log_level = "debug";
  config_.router_flags = {"--heartbeat_interval=200ms", "--missed_heartbeats=2"};
  EXPECT_THAT(RouterCommandLine(config_, "/l/router.port"),
              ElementsAre(config_.bin_dir + "/router/router", "--listen=127.0.0.1:50051",
                          "--port_file=/l/router.port", "--model=/models/m", "--log_level=debug",
                          "--allow_anonymous", "--heartbeat_interval=200ms",
                          "--missed_heartbeats=2"));
}

TEST_F(LocalClusterUnitTest, RouterAnonymousOnlyOnLoopbackAndUnlessTenantsAreGiven) {
  config_.router_flags = {"--tenants_file=/t.json"};
  EXPECT_THAT(RouterCommandLine(config_, "/l/router.port"),
              Not(Contains("--allow_anonymous")));
  config_.router_flags = {};
  config_.router_listen = "0.0.0.0:50051";
  EXPECT_THAT(RouterCommandLine(config_, "/l/router.port"),
              Not(Contains("--allow_anonymous")));
}

TEST_F(LocalClusterUnitTest, WorkerCommandLines) {
  // Defaults: sizes are left to the binaries.
  EXPECT_THAT(WorkerCommandLine(config_, ClusterRole::kPrefill, "prefill-0", "127.0.0.1:7",
                                "/l/prefill-0.port"),
              ElementsAre(config_.bin_dir + "/prefill_node/prefill_node", "--listen=127.0.0.1:0",
                          "--port_file=/l/prefill-0.port", "--model=/models/m",
                          "--log_level=info", "--router=127.0.0.1:7", "--worker_id=prefill-0",
                          "--kv_transport=ucx"));
  config_.kv_blocks = 512;
  config_.block_size = 16;
  config_.threads_per_worker = 2;
  config_.decode_can_prefill = true;
  config_.prefill_flags = {"--p"};
  config_.decode_flags = {"--prefill_timeout=5s"};
  EXPECT_THAT(WorkerCommandLine(config_, ClusterRole::kDecode, "decode-3", "127.0.0.1:7",
                                "/l/decode-3.port"),
              ElementsAre(config_.bin_dir + "/decode_node/decode_node", "--listen=127.0.0.1:0",
                          "--port_file=/l/decode-3.port", "--model=/models/m", "--log_level=info",
                          "--router=127.0.0.1:7", "--worker_id=decode-3", "--kv_transport=ucx",
                          "--kv_blocks=512", "--block_size=16", "--threads=2", "--can_prefill",
                          "--prefill_timeout=5s"));
  // --can_prefill is for decode nodes only.
  std::vector<std::string> prefill = WorkerCommandLine(config_, ClusterRole::kPrefill, "p", "r", "f");
  EXPECT_EQ(std::count(prefill.begin(), prefill.end(), "--can_prefill"), 0);
  EXPECT_EQ(prefill.back(), "--p");
}

TEST_F(LocalClusterUnitTest, EnvironmentDefaultsUcxToSharedMemory) {
  const char* saved = getenv("UCX_TLS");
  std::string saved_value = saved ? saved : "";
  unsetenv("UCX_TLS");
  config_.env = {{"A", "1"}};
  EXPECT_THAT(ClusterEnvironment(config_), ElementsAre(Pair("A", "1"), Pair("UCX_TLS", "sm,self")));
  // The caller's environment wins (children inherit it).
  setenv("UCX_TLS", "tcp", 1);
  EXPECT_THAT(ClusterEnvironment(config_), ElementsAre(Pair("A", "1")));
  unsetenv("UCX_TLS");
  // So does the config.
  config_.env = {{"UCX_TLS", "sm,self,tcp"}};
  EXPECT_THAT(ClusterEnvironment(config_), ElementsAre(Pair("UCX_TLS", "sm,self,tcp")));
  if (saved) setenv("UCX_TLS", saved_value.c_str(), 1);
}

TEST_F(LocalClusterUnitTest, InvalidConfigNamesTheField) {
  auto expect_invalid = [](LocalClusterConfig config, const std::string& field) {
    absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(config);
    EXPECT_EQ(cluster.status().code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(cluster.status().message(), HasSubstr(field));
  };
  LocalClusterConfig c = config_;
  c.model_dir = "";
  expect_invalid(c, "model_dir");
  c = config_;
  c.log_dir = "";
  expect_invalid(c, "log_dir");
  c = config_;
  c.num_decode = 0;
  expect_invalid(c, "num_decode");
  c = config_;
  c.num_prefill = 0;
  expect_invalid(c, "num_prefill");
  c = config_;
  c.kv_blocks = -1;
  expect_invalid(c, "kv_blocks");
  c = config_;
  c.router_listen = "nope";
  expect_invalid(c, "router_listen");
}

TEST_F(LocalClusterUnitTest, MissingBinaryIsNotFound) {
  WriteScript("router/router", "exit 0\n");
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(config_);
  EXPECT_EQ(cluster.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(cluster.status().message(), HasSubstr("prefill_node/prefill_node"));
}

TEST_F(LocalClusterUnitTest, RouterExitingAtOnceFailsWithItsNameAndLogTail) {
  WriteScript("router/router",
              "echo \"args: $*\"\necho \"UCX_TLS=$UCX_TLS\"\n"
              "echo 'router: --model: no config.json' >&2\nexit 3\n");
  WriteScript("prefill_node/prefill_node", "exit 0\n");
  WriteScript("decode_node/decode_node", "exit 0\n");
  config_.env = {{"UCX_TLS", "sm,self"}};
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(config_);
  ASSERT_EQ(cluster.status().code(), absl::StatusCode::kUnavailable) << cluster.status();
  const std::string message(cluster.status().message());
  EXPECT_THAT(message, HasSubstr("router (pid "));
  EXPECT_THAT(message, HasSubstr("exited during start-up: exit code 3"));
  EXPECT_THAT(message, HasSubstr(config_.log_dir + "/router.log"));
  EXPECT_THAT(message, HasSubstr("router: --model: no config.json"));
  // The log shows what the process was given.
  EXPECT_THAT(message, HasSubstr("args: --listen=127.0.0.1:0 --port_file=" + config_.log_dir +
                                 "/router.port --model=/models/m --log_level=info"));
  EXPECT_THAT(message, HasSubstr("UCX_TLS=sm,self"));
}

TEST_F(LocalClusterUnitTest, WorkerExitingAtOnceFailsAndStopsTheOthers) {
  WriteScript("router/router", ServeScript("router", 1));
  WriteScript("prefill_node/prefill_node", ServeScript("prefill-0", 2));
  // Decode nodes start once the prefill nodes wrote their port files (their models loaded: an
  // adaptive decode node's start-up profile must not share the cores with that); this one says
  // whether it found prefill-0's, then fails, so that the test sees started processes stopped.
  WriteScript("decode_node/decode_node",
              absl::StrCat("echo \"args: $*\"\n"
                           "if [ -f '",
                           config_.log_dir,
                           "/prefill-0.port' ]; then echo 'prefill-0 port file: present'; fi\n"
                           "echo 'decode: cannot allocate KV pool' >&2\nexit 1\n"));
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(config_);
  ASSERT_EQ(cluster.status().code(), absl::StatusCode::kUnavailable) << cluster.status();
  const std::string message(cluster.status().message());
  EXPECT_THAT(message, HasSubstr("decode-0 (pid "));
  EXPECT_THAT(message, HasSubstr("exit code 1"));
  EXPECT_THAT(message, HasSubstr("decode: cannot allocate KV pool"));
  EXPECT_THAT(message, HasSubstr("prefill-0 port file: present"));
  // Workers got the router's address from its port file.
  EXPECT_THAT(message, HasSubstr("--router=127.0.0.1:1 --worker_id=decode-0"));
  // Everything started was stopped and reaped.
  EXPECT_FALSE(Alive(ReadPid("router")));
  EXPECT_FALSE(Alive(ReadPid("prefill-0")));
}

TEST_F(LocalClusterUnitTest, DecodeNodesRunOnTheirCpusFromTheStart) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  int cpu = CPU_SETSIZE - 1;
  while (cpu > 0 && !CPU_ISSET(cpu, &set)) --cpu;
  config_.decode_cpus = {cpu};
  WriteScript("router/router", ServeScript("router", 1));
  WriteScript("prefill_node/prefill_node", ServeScript("prefill-0", 2));
  // The kernel's account of the decode node's affinity, from its first command.
  WriteScript("decode_node/decode_node", "grep Cpus_allowed_list /proc/self/status\nexit 1\n");
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(config_);
  ASSERT_EQ(cluster.status().code(), absl::StatusCode::kUnavailable) << cluster.status();
  EXPECT_THAT(cluster.status().message(), HasSubstr(absl::StrCat("Cpus_allowed_list:\t", cpu)));
  // A CPU the machine lacks fails the start, by name.
  config_.decode_cpus = {CPU_SETSIZE - 1};
  cluster = LocalCluster::Start(config_);
  EXPECT_EQ(cluster.status().code(), absl::StatusCode::kInvalidArgument) << cluster.status();
  EXPECT_THAT(cluster.status().message(), HasSubstr("decode-0: cpus: CPU"));
}

TEST_F(LocalClusterUnitTest, BadPortFileIsReported) {
  WriteScript("router/router",
              "for a in \"$@\"; do case \"$a\" in --port_file=*) pf=\"${a#--port_file=}\";; "
              "esac; done\necho 'not a port' > \"$pf\"\nexec sleep 30\n");
  WriteScript("prefill_node/prefill_node", "exit 0\n");
  WriteScript("decode_node/decode_node", "exit 0\n");
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(config_);
  EXPECT_EQ(cluster.status().code(), absl::StatusCode::kInvalidArgument) << cluster.status();
  EXPECT_THAT(cluster.status().message(), HasSubstr("router: "));
  EXPECT_THAT(cluster.status().message(), HasSubstr("expected a port number"));
}

TEST_F(LocalClusterUnitTest, NoPortFileInTimeIsDeadlineExceeded) {
  WriteScript("router/router", "echo 'loading weights'\nexec sleep 30\n");
  WriteScript("prefill_node/prefill_node", "exit 0\n");
  WriteScript("decode_node/decode_node", "exit 0\n");
  config_.startup_timeout = absl::Milliseconds(300);
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(config_);
  EXPECT_EQ(cluster.status().code(), absl::StatusCode::kDeadlineExceeded) << cluster.status();
  EXPECT_THAT(cluster.status().message(), HasSubstr("router wrote no port file"));
  EXPECT_THAT(cluster.status().message(), HasSubstr("loading weights"));
}

TEST_F(LocalClusterUnitTest, NotServingInTimeIsDeadlineExceeded) {
  // Port files appear, but nothing answers health checks there.
  WriteScript("router/router", ServeScript("router", 1));
  WriteScript("prefill_node/prefill_node", ServeScript("prefill-0", 1));
  WriteScript("decode_node/decode_node", ServeScript("decode-0", 1));
  config_.startup_timeout = absl::Milliseconds(500);
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(config_);
  EXPECT_EQ(cluster.status().code(), absl::StatusCode::kDeadlineExceeded) << cluster.status();
  EXPECT_THAT(cluster.status().message(), HasSubstr("router at 127.0.0.1:1 not SERVING in time"));
  EXPECT_FALSE(Alive(ReadPid("router")));
  EXPECT_FALSE(Alive(ReadPid("prefill-0")));
  EXPECT_FALSE(Alive(ReadPid("decode-0")));
}

}  // namespace
}  // namespace deepinfer::deploy
