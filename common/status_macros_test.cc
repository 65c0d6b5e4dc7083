#include "common/status_macros.h"

#include <string>

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  DI_ASSIGN_OR_RETURN(int half, Half(x));
  DI_ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

absl::Status CheckEven(int x) {
  DI_RETURN_IF_ERROR(Half(x).status());
  return absl::OkStatus();
}

TEST(StatusMacrosTest, AssignOrReturnPassesValuesAndErrors) {
  EXPECT_EQ(Quarter(8).value(), 2);
  absl::StatusOr<int> bad = Quarter(6);  // 6 -> 3 -> odd
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "odd");
}

TEST(StatusMacrosTest, ReturnIfErrorStopsAtFirstError) {
  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_EQ(CheckEven(5).code(), absl::StatusCode::kInvalidArgument);
}

TEST(StatusMacrosTest, MoveOnlyValues) {
  auto make = []() -> absl::StatusOr<std::unique_ptr<std::string>> {
    return std::make_unique<std::string>("kv");
  };
  auto use = [&]() -> absl::StatusOr<std::string> {
    DI_ASSIGN_OR_RETURN(std::unique_ptr<std::string> p, make());
    return *p;
  };
  EXPECT_EQ(use().value(), "kv");
}

}  // namespace
}  // namespace deepinfer
