#include "common/grpc_status.h"

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

TEST(GrpcStatusTest, EveryCodeMapsOneToOneBothWays) {
  for (int code = 0; code <= 16; ++code) {
    const absl::Status in(static_cast<absl::StatusCode>(code), code == 0 ? "" : "why");
    const grpc::Status g = ToGrpcStatus(in);
    EXPECT_EQ(static_cast<int>(g.error_code()), code);
    const absl::Status back = FromGrpcStatus(g);
    EXPECT_EQ(back, in) << code;
  }
}

TEST(GrpcStatusTest, MessageTravels) {
  const grpc::Status g =
      ToGrpcStatus(absl::InvalidArgumentError("max_tokens: expected 1..4096, got 0"));
  EXPECT_EQ(g.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(g.error_message(), "max_tokens: expected 1..4096, got 0");
}

}  // namespace
}  // namespace deepinfer
