// The router's OpenAI-compatible HTTP API from outside, as real processes on loopback: a local
// cluster (1 prefill + 1 decode node) whose router serves --http_listen, driven by the official
// `openai` Python client and curl (tests/openai_http_client.py, run with Debian's python3; see
// scripts/setup.sh): chat and completions, streamed and not, usage with cached tokens on a second
// turn, logprobs, every error status a client can provoke here (400 naming the field, 404, 405,
// 413, 429 with Retry-After), malformed HTTP, and a client that disconnects mid-stream. Then no
// KV block may be left in use on any node (the disconnect aborted the request everywhere), and
// with every worker gone the API answers 503. And an image chat (data: URL) on the LLaVA-style
// fixture with a vision encoder node.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/process_lifecycle.h"
#include "deploy/local/local_cluster.h"
#include "gtest/gtest.h"
#include "router/tenants.h"
#include "tests/cluster_test_util.h"

namespace deepinfer {
namespace {

std::string Python() {
  return std::getenv("DEEPINFER_PYTHON") != nullptr ? std::getenv("DEEPINFER_PYTHON")
                                                    : "/usr/bin/python3";
}

// Runs the client script with `args`; its output goes to the test log. The exit status.
int RunClient(const std::string& args) {
  const std::string command =
      absl::StrCat(Python(), " tests/openai_http_client.py ", args, " 2>&1");
  std::fprintf(stderr, "running: %s\n", command.c_str());
  FILE* out = ::popen(command.c_str(), "r");
  if (out == nullptr) return -1;
  char line[4096];
  while (std::fgets(line, sizeof(line), out) != nullptr) std::fputs(line, stderr);
  const int status = ::pclose(out);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(OpenAiHttpTest, OfficialClientAndCurlAgainstALocalCluster) {
  ASSERT_EQ(RunClient("--check_client"), 0)
      << "the openai Python client is missing: run scripts/setup.sh";
  deploy::LocalClusterConfig config = testutil::ClusterConfig("openai_http", 1, 1, false);
  // 128 blocks of 4 tokens: a 700-token prompt fits the context (2048) but not the KV cache,
  // which is how a client meets RESOURCE_EXHAUSTED (429) here.
  config.kv_blocks = 128;
  const std::string http_port_file = absl::StrCat(config.log_dir, "/router.http.port");
  config.router_flags.push_back("--http_listen=127.0.0.1:0");
  config.router_flags.push_back(absl::StrCat("--http_port_file=", http_port_file));
  config.router_flags.push_back("--http_max_body_bytes=1MiB");
  config.router_flags.push_back("--http_read_timeout=2s");
  config.router_flags.push_back("--max_chat_text_bytes=64KiB");
  absl::StatusOr<std::unique_ptr<deploy::LocalCluster>> cluster =
      deploy::LocalCluster::Start(config);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<int> port = ReadPortFile(http_port_file, absl::Seconds(10));
  ASSERT_TRUE(port.ok()) << port.status();
  const std::string base = absl::StrCat("--base_url http://127.0.0.1:", *port, "/v1 --model llama");

  EXPECT_EQ(RunClient(base), 0) << "see the client's output above";
  // The stream the client dropped, and every other request, left nothing behind.
  absl::Status clean = testutil::WaitNoBlocksInUse(**cluster, absl::Seconds(15));
  EXPECT_TRUE(clean.ok()) << clean;

  // No worker left: 503.
  while (!(*cluster)->workers().empty()) {
    ASSERT_TRUE((*cluster)->RemoveWorker(0, absl::Seconds(10)).ok());
  }
  EXPECT_EQ(RunClient(absl::StrCat(base, " --phase unavailable")), 0);
  EXPECT_TRUE((*cluster)->Stop(absl::Seconds(20)).ok());
}

// Tenants (router/tenants.h) through the HTTP API: 401 without or with an unknown key, 403 for
// another model's key or a priority above the tenant's, 429 with the tenant's Retry-After, and
// isolation: two tenants sending the same prompt share no cache blocks (cached_tokens stays 0 for
// the second), even when one names the other's namespace as its cache salt.
TEST(OpenAiHttpTest, TenantsKeysLimitsAndCacheIsolation) {
  deploy::LocalClusterConfig config = testutil::ClusterConfig("openai_http_tenants", 1, 1, false);
  const std::string tenants_file = absl::StrCat(config.log_dir, "/tenants.json");
  auto entry = [](const std::string& id, const std::string& key, const std::string& extra) {
    return absl::StrCat("{\"id\": \"", id, "\", \"key_sha256\": [\"", router::HashApiKey(key),
                        "\"]", extra, "}");
  };
  {
    std::ofstream out(tenants_file);
    out << "{\"tenants\": ["
        << entry("alice", "key-alice", ", \"models\": [\"llama\"], \"max_priority\": 0") << ", "
        << entry("bob", "key-bob", "") << ", " << entry("carol", "key-carol", "") << ", "
        << entry("other", "key-other", ", \"models\": [\"gpt-4\"]") << ", "
        << entry("tiny", "key-tiny", ", \"requests_per_second\": 0.001") << "]}";
  }
  const std::string http_port_file = absl::StrCat(config.log_dir, "/router.http.port");
  config.router_flags.push_back(absl::StrCat("--tenants_file=", tenants_file));
  config.router_flags.push_back("--http_listen=127.0.0.1:0");
  config.router_flags.push_back(absl::StrCat("--http_port_file=", http_port_file));
  absl::StatusOr<std::unique_ptr<deploy::LocalCluster>> cluster =
      deploy::LocalCluster::Start(config);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<int> port = ReadPortFile(http_port_file, absl::Seconds(10));
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_EQ(RunClient(absl::StrCat("--base_url http://127.0.0.1:", *port,
                                   "/v1 --model llama --phase tenants")),
            0)
      << "see the client's output above";
  EXPECT_TRUE((*cluster)->Stop(absl::Seconds(20)).ok());
}

// An image chat through the HTTP API: the tiny LLaVA-style fixture with a vision encoder node.
TEST(OpenAiHttpTest, ImageChatThroughTheEncoderPool) {
  deploy::LocalClusterConfig config = testutil::ClusterConfig("openai_http_vision", 0, 1, true);
  config.model_dir = "engine/testdata/vision/llava";
  config.num_encoders = 1;
  const std::string http_port_file = absl::StrCat(config.log_dir, "/router.http.port");
  config.router_flags.push_back("--http_listen=127.0.0.1:0");
  config.router_flags.push_back(absl::StrCat("--http_port_file=", http_port_file));
  absl::StatusOr<std::unique_ptr<deploy::LocalCluster>> cluster =
      deploy::LocalCluster::Start(config);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<int> port = ReadPortFile(http_port_file, absl::Seconds(10));
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_EQ(RunClient(absl::StrCat("--base_url http://127.0.0.1:", *port,
                                   "/v1 --model llava --phase image --image "
                                   "engine/testdata/vision/llava/images/rgb_32x32.png")),
            0);
  absl::Status clean = testutil::WaitNoBlocksInUse(**cluster, absl::Seconds(15));
  EXPECT_TRUE(clean.ok()) << clean;
  EXPECT_TRUE((*cluster)->Stop(absl::Seconds(20)).ok());
}

}  // namespace
}  // namespace deepinfer
