#include "common/flags.h"

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

TEST(ParseHostPortTest, AcceptsTheUsualForms) {
  HostPort a = ParseHostPort("listen", "127.0.0.1:50051", false).value();
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(a.port, 50051);
  EXPECT_EQ(a.ToString(), "127.0.0.1:50051");

  HostPort b = ParseHostPort("listen", ":8080", false).value();
  EXPECT_EQ(b.host, "0.0.0.0");
  EXPECT_EQ(b.port, 8080);

  HostPort c = ParseHostPort("listen", "[::1]:9", false).value();
  EXPECT_EQ(c.host, "::1");
  EXPECT_EQ(c.ToString(), "[::1]:9");

  HostPort d = ParseHostPort("router", "router.svc.cluster.local:7000", false).value();
  EXPECT_EQ(d.host, "router.svc.cluster.local");
}

TEST(ParseHostPortTest, PortZeroOnlyWhenAllowed) {
  EXPECT_TRUE(ParseHostPort("listen", "127.0.0.1:0", true).ok());
  absl::StatusOr<HostPort> r = ParseHostPort("router", "127.0.0.1:0", false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--router"), std::string_view::npos);
}

TEST(ParseHostPortTest, RejectsMalformedNamingTheFlag) {
  for (const char* bad : {"", "localhost", "host:", "host:70000", "host:-1", "host:12ab",
                          "::1:80", "[::1]80", "[::1"}) {
    absl::StatusOr<HostPort> r = ParseHostPort("listen", bad, true);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("--listen"), std::string_view::npos) << bad;
  }
}

TEST(ParseByteSizeTest, Units) {
  EXPECT_EQ(ParseByteSize("kv", "1048576").value(), 1048576u);
  EXPECT_EQ(ParseByteSize("kv", "512MiB").value(), 512ull << 20);
  EXPECT_EQ(ParseByteSize("kv", "4gb").value(), 4000000000ull);
  EXPECT_EQ(ParseByteSize("kv", "2 GiB").value(), 2ull << 30);
  EXPECT_EQ(ParseByteSize("kv", "7B").value(), 7u);
}

TEST(ParseByteSizeTest, RejectsGarbageAndOverflow) {
  for (const char* bad : {"", "MiB", "-1", "1.5GiB", "12 parsecs", "99999999999TiB"}) {
    absl::StatusOr<uint64_t> r = ParseByteSize("kv_capacity", bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--kv_capacity"), std::string_view::npos) << bad;
  }
}

}  // namespace
}  // namespace deepinfer
