#include "common/logging.h"

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

TEST(LoggingTest, ParsesEveryLevelName) {
  EXPECT_EQ(ParseLogLevel("trace").value(), spdlog::level::trace);
  EXPECT_EQ(ParseLogLevel("DEBUG").value(), spdlog::level::debug);
  EXPECT_EQ(ParseLogLevel("info").value(), spdlog::level::info);
  EXPECT_EQ(ParseLogLevel("warning").value(), spdlog::level::warn);
  EXPECT_EQ(ParseLogLevel("warn").value(), spdlog::level::warn);
  EXPECT_EQ(ParseLogLevel("error").value(), spdlog::level::err);
  EXPECT_EQ(ParseLogLevel("critical").value(), spdlog::level::critical);
  EXPECT_EQ(ParseLogLevel("off").value(), spdlog::level::off);
}

TEST(LoggingTest, RejectsUnknownLevelNamingTheFlag) {
  absl::StatusOr<spdlog::level::level_enum> level = ParseLogLevel("loud", "log_level");
  ASSERT_FALSE(level.ok());
  EXPECT_EQ(level.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(level.status().message().find("--log_level"), std::string_view::npos);
  EXPECT_NE(level.status().message().find("loud"), std::string_view::npos);
}

TEST(LoggingTest, InitSetsDefaultLoggerLevel) {
  ASSERT_TRUE(InitLogging("logging_test", "warn").ok());
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::warn);
  EXPECT_EQ(spdlog::default_logger()->name(), "logging_test");
  EXPECT_FALSE(InitLogging("logging_test2", "nope").ok());
}

}  // namespace
}  // namespace deepinfer
