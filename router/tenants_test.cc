#include "router/tenants.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fake_clock.h"
#include "common/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer::router {
namespace {

using ::testing::HasSubstr;

std::string TenantJson(absl::string_view id, absl::string_view key, absl::string_view extra = "") {
  return absl::StrCat("{\"id\": \"", id, "\", \"key_sha256\": [\"", HashApiKey(key), "\"]",
                      extra.empty() ? "" : ", ", extra, "}");
}

std::string FileJson(std::vector<std::string> tenants) {
  return absl::StrCat("{\"tenants\": [", absl::StrJoin(tenants, ", "), "]}");
}

class TenantsFile {
 public:
  TenantsFile() : path_(absl::StrCat(::testing::TempDir(), "/tenants_", getpid(), "_", ++n_, ".json")) {}
  ~TenantsFile() { std::remove(path_.c_str()); }
  void Write(const std::string& text) {
    // A new file renamed over the old one, as an editor or a config manager does.
    const std::string tmp = path_ + ".tmp";
    std::ofstream(tmp) << text;
    std::rename(tmp.c_str(), path_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  static inline int n_ = 0;
  std::string path_;
};

TEST(HashApiKeyTest, IsSha256Hex) {
  EXPECT_EQ(HashApiKey("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(BearerKeyTest, AcceptsBearerOnly) {
  EXPECT_EQ(*BearerKey("Bearer k1"), "k1");
  EXPECT_EQ(*BearerKey("bearer   k1 "), "k1");
  EXPECT_EQ(BearerKey("Basic abc").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(BearerKey("Bearer ").status().code(), absl::StatusCode::kUnauthenticated);
}

TEST(ParseTenantsTest, ParsesEveryField) {
  absl::StatusOr<TenantTable> table = ParseTenants(FileJson({TenantJson(
      "acme", "k1",
      "\"cache_namespace\": \"ns\", \"allow_client_cache_salt\": true, \"models\": [\"m\"], "
      "\"max_priority\": 5, \"requests_per_second\": 2.5, \"tokens_per_second\": 100, "
      "\"max_concurrent_streams\": 3")}));
  ASSERT_TRUE(table.ok()) << table.status();
  const Tenant& t = *table->by_key_sha256.at(HashApiKey("k1"));
  EXPECT_EQ(t.id, "acme");
  EXPECT_EQ(t.cache_namespace, "ns");
  EXPECT_TRUE(t.allow_client_cache_salt);
  EXPECT_EQ(t.models, std::vector<std::string>{"m"});
  EXPECT_EQ(t.max_priority, 5);
  EXPECT_EQ(t.requests_per_second, 2.5);
  EXPECT_EQ(t.tokens_per_second, 100);
  EXPECT_EQ(t.max_concurrent_streams, 3);
}

TEST(ParseTenantsTest, NamesTheBadField) {
  const std::string k = HashApiKey("k");
  struct Case {
    std::string text;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"not json", "malformed JSON"},
      {"{\"tenant\": []}", "tenant: unknown field"},
      {"{\"tenants\": [{\"key_sha256\": [\"" + k + "\"]}]}", "tenants[0].id: missing"},
      {"{\"tenants\": [{\"id\": \"a b\", \"key_sha256\": [\"" + k + "\"]}]}", "tenants[0].id:"},
      {"{\"tenants\": [{\"id\": \"a\"}]}", "tenants[0].key_sha256: missing"},
      {"{\"tenants\": [{\"id\": \"a\", \"key_sha256\": [\"secret\"]}]}",
       "tenants[0].key_sha256[0]: expected 64 lowercase hex"},
      {FileJson({TenantJson("a", "k", "\"max_priority\": 101")}), "tenants[0].max_priority:"},
      {FileJson({TenantJson("a", "k", "\"requests_per_second\": -1")}),
       "tenants[0].requests_per_second:"},
      {FileJson({TenantJson("a", "k", "\"rate\": 1")}), "tenants[0].rate: unknown field"},
      {FileJson({TenantJson("a", "k"), TenantJson("a", "k2")}), "tenants[1].id: duplicate"},
      {FileJson({TenantJson("a", "k"), TenantJson("b", "k")}),
       "tenants[1].key_sha256[0]: this key is already listed"},
      {FileJson({TenantJson("anonymous", "k")}), "tenants[0].id: \"anonymous\" is reserved"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<TenantTable> table = ParseTenants(c.text);
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(table.status().message(), HasSubstr(c.message)) << c.text;
  }
}

TEST(TenantsTest, NeedsAFileOrAnonymous) {
  absl::StatusOr<std::unique_ptr<Tenants>> t = Tenants::Create({});
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("--allow_anonymous"));
}

TEST(TenantsTest, MalformedFileAtStartNamesFileAndField) {
  TenantsFile file;
  file.Write("{\"tenants\": [{\"id\": 3}]}");
  absl::StatusOr<std::unique_ptr<Tenants>> t = Tenants::Create({.file = file.path()});
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr(file.path()));
  EXPECT_THAT(t.status().message(), HasSubstr("tenants[0].id"));
  EXPECT_EQ(Tenants::Create({.file = file.path() + ".missing"}).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(TenantsTest, AuthenticatesKeysAndAnonymous) {
  TenantsFile file;
  file.Write(FileJson({TenantJson("acme", "key-a")}));
  auto tenants = Tenants::Create({.file = file.path()});
  ASSERT_TRUE(tenants.ok()) << tenants.status();
  EXPECT_EQ((*(*tenants)->Authenticate("Bearer key-a"))->id, "acme");
  EXPECT_EQ((*tenants)->Authenticate("Bearer key-b").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*tenants)->Authenticate(std::nullopt).status().code(),
            absl::StatusCode::kUnauthenticated);

  auto open = Tenants::Create({.file = file.path(), .allow_anonymous = true});
  ASSERT_TRUE(open.ok());
  EXPECT_EQ((*(*open)->Authenticate(std::nullopt))->id, kAnonymousTenant);
  // A key that is sent is checked even when anonymous calls are allowed.
  EXPECT_EQ((*open)->Authenticate("Bearer key-b").status().code(),
            absl::StatusCode::kUnauthenticated);

  // Without a file, everyone is anonymous, whatever key they send.
  auto no_file = Tenants::Create({.allow_anonymous = true});
  ASSERT_TRUE(no_file.ok());
  EXPECT_EQ((*(*no_file)->Authenticate("Bearer anything"))->id, kAnonymousTenant);
  EXPECT_EQ((*(*no_file)->Authenticate(std::nullopt))->id, kAnonymousTenant);
}

TEST(TenantsTest, ModelAndPriorityArePermissions) {
  auto tenants = Tenants::Create({.allow_anonymous = true});
  ASSERT_TRUE(tenants.ok());
  Tenant t{.id = "a", .models = {"m1"}, .max_priority = 3};
  EXPECT_TRUE((*tenants)->CheckModel(t, "m1").ok());
  EXPECT_EQ((*tenants)->CheckModel(t, "m2").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE((*tenants)->CheckPriority(t, 3).ok());
  EXPECT_TRUE((*tenants)->CheckPriority(t, -100).ok());
  EXPECT_EQ((*tenants)->CheckPriority(t, 4).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE((*tenants)->CheckPriority(t, 1000).ok());  // out of range: validation's to refuse
}

TEST(TenantsTest, RequestsPerSecondWithRetryHint) {
  FakeClock clock;
  auto tenants = Tenants::Create({.allow_anonymous = true, .clock = clock.AsFunction()});
  ASSERT_TRUE(tenants.ok());
  Tenant t{.id = "a", .requests_per_second = 2};
  EXPECT_TRUE((*tenants)->Admit(t).ok());
  EXPECT_TRUE((*tenants)->Admit(t).ok());
  absl::StatusOr<std::unique_ptr<Tenants::Stream>> third = (*tenants)->Admit(t);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.status().message(), HasSubstr("requests_per_second"));
  EXPECT_EQ(RetryAfterSeconds(third.status()), 1);
  clock.Advance(absl::Milliseconds(499));
  EXPECT_FALSE((*tenants)->Admit(t).ok());
  clock.Advance(absl::Milliseconds(2));
  EXPECT_TRUE((*tenants)->Admit(t).ok());
}

TEST(TenantsTest, TokensPerSecondGoesIntoDebt) {
  FakeClock clock;
  auto tenants = Tenants::Create({.allow_anonymous = true, .clock = clock.AsFunction()});
  ASSERT_TRUE(tenants.ok());
  Tenant t{.id = "a", .tokens_per_second = 100};
  {
    auto s = (*tenants)->Admit(t);
    ASSERT_TRUE(s.ok());
    (*s)->ChargePromptTokens(250);  // larger than the bucket: admitted, leaves a debt
    (*s)->ChargeCompletionTokens(150);
  }
  absl::StatusOr<std::unique_ptr<Tenants::Stream>> refused = (*tenants)->Admit(t);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("tokens_per_second"));
  // The bucket held 100; 400 charged leaves 300 of debt at 100/s.
  EXPECT_EQ(RetryAfterSeconds(refused.status()), 3);
  clock.Advance(absl::Milliseconds(2990));
  EXPECT_FALSE((*tenants)->Admit(t).ok());
  clock.Advance(absl::Milliseconds(10));
  EXPECT_TRUE((*tenants)->Admit(t).ok());
}

TEST(TenantsTest, ConcurrentStreams) {
  FakeClock clock;
  auto tenants = Tenants::Create({.allow_anonymous = true, .clock = clock.AsFunction()});
  ASSERT_TRUE(tenants.ok());
  Tenant t{.id = "a", .max_concurrent_streams = 2};
  Tenant other{.id = "b", .max_concurrent_streams = 2};
  auto s1 = (*tenants)->Admit(t);
  auto s2 = (*tenants)->Admit(t);
  ASSERT_TRUE(s1.ok() && s2.ok());
  absl::StatusOr<std::unique_ptr<Tenants::Stream>> s3 = (*tenants)->Admit(t);
  EXPECT_EQ(s3.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s3.status().message(), HasSubstr("max_concurrent_streams (2)"));
  EXPECT_TRUE((*tenants)->Admit(other).ok());  // limits are per tenant
  s1->reset();
  EXPECT_TRUE((*tenants)->Admit(t).ok());
}

TEST(TenantsTest, CacheSaltComesFromTheTenant) {
  Tenant a{.id = "a", .cache_namespace = "ns-a"};
  Tenant b{.id = "b", .cache_namespace = "ns-b"};
  EXPECT_EQ(Tenants::CacheSalt(a, ""), Tenants::CacheSalt(a, "client"));
  EXPECT_NE(Tenants::CacheSalt(a, "x"), Tenants::CacheSalt(b, "x"));
  Tenant gateway{.id = "g", .cache_namespace = "g", .allow_client_cache_salt = true};
  EXPECT_EQ(Tenants::CacheSalt(gateway, "user-7"), "user-7");
  EXPECT_EQ(Tenants::CacheSalt(gateway, ""), Tenants::CacheSalt(Tenant{.cache_namespace = "g"}, ""));
  Tenant anonymous{.id = "anonymous", .allow_client_cache_salt = true};
  EXPECT_EQ(Tenants::CacheSalt(anonymous, ""), "");
}

TEST(TenantsTest, ReloadRevokesAndBadReloadKeepsTheTable) {
  TenantsFile file;
  file.Write(FileJson({TenantJson("a", "key-a"), TenantJson("b", "key-b")}));
  auto tenants = Tenants::Create({.file = file.path()});
  ASSERT_TRUE(tenants.ok());
  ASSERT_TRUE((*tenants)->Authenticate("Bearer key-b").ok());

  file.Write(FileJson({TenantJson("a", "key-a")}));
  (*tenants)->ReloadIfChanged();
  EXPECT_EQ((*tenants)->Authenticate("Bearer key-b").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE((*tenants)->Authenticate("Bearer key-a").ok());

  file.Write("{\"tenants\": [ broken");
  absl::Status bad = (*tenants)->Reload();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr(file.path()));
  EXPECT_TRUE((*tenants)->Authenticate("Bearer key-a").ok());
}

TEST(TenantsTest, SighupReloadsAFileWhoseTimeAndSizeDidNotChange) {
  TenantsFile file;
  file.Write(FileJson({TenantJson("a", "key-1")}));
  struct stat before {};
  ASSERT_EQ(::stat(file.path().c_str(), &before), 0);
  auto tenants = Tenants::Create({.file = file.path()});
  ASSERT_TRUE(tenants.ok());
  // Same length, same modification time: only the signal can tell.
  file.Write(FileJson({TenantJson("a", "key-2")}));
  const struct timespec times[2] = {before.st_atim, before.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, file.path().c_str(), times, 0), 0);
  (*tenants)->ReloadIfChanged();
  EXPECT_TRUE((*tenants)->Authenticate("Bearer key-1").ok());
  Tenants::InstallReloadOnSighup();
  ASSERT_EQ(std::raise(SIGHUP), 0);
  (*tenants)->ReloadIfChanged();
  EXPECT_FALSE((*tenants)->Authenticate("Bearer key-1").ok());
  EXPECT_TRUE((*tenants)->Authenticate("Bearer key-2").ok());
}

TEST(TenantsTest, WatchPicksUpAChangedFile) {
  TenantsFile file;
  file.Write(FileJson({TenantJson("a", "key-1")}));
  auto tenants = Tenants::Create({.file = file.path()});
  ASSERT_TRUE(tenants.ok());
  (*tenants)->Watch(absl::Milliseconds(10));
  file.Write(FileJson({TenantJson("a", "key-1"), TenantJson("b", "key-two")}));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!(*tenants)->Authenticate("Bearer key-two").ok() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE((*tenants)->Authenticate("Bearer key-two").ok());
}

TEST(TenantsTest, MetricsUseConfiguredIdsOnly) {
  MetricsRegistry registry;
  TenantsFile file;
  file.Write(FileJson({TenantJson("a", "key-a")}));
  auto tenants = Tenants::Create({.file = file.path(), .metrics = &registry});
  ASSERT_TRUE(tenants.ok());
  Tenant t{.id = "a", .max_concurrent_streams = 1};
  auto s = (*tenants)->Admit(t);
  ASSERT_TRUE(s.ok());
  (*s)->ChargePromptTokens(7);
  EXPECT_FALSE((*tenants)->Admit(t).ok());
  EXPECT_TRUE((*tenants)->Authenticate("Bearer made-up-key-1").status().code() ==
              absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE((*tenants)->Authenticate("Bearer made-up-key-2").status().code() ==
              absl::StatusCode::kUnauthenticated);
  const std::string text = registry.Serialize();
  EXPECT_THAT(text, HasSubstr("deepinfer_tenant_requests_total{tenant=\"a\"} 1"));
  EXPECT_THAT(text, HasSubstr("deepinfer_tenant_tokens_total{tenant=\"a\",kind=\"prompt\"} 7"));
  EXPECT_THAT(text, HasSubstr(
      "deepinfer_tenant_rejections_total{tenant=\"a\",reason=\"concurrent_streams\"} 1"));
  EXPECT_THAT(text, HasSubstr("deepinfer_tenant_rejections_total{tenant=\"unauthenticated\","
                              "reason=\"unauthenticated\"} 2"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("made-up")));
}

}  // namespace
}  // namespace deepinfer::router
