#include "router/fake_scaler.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer::router {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(FakeScalerTest, SetThenGetPerPool) {
  FakeScaler scaler;
  scaler.AddPool(Pool::kPrefill, 2);
  scaler.AddPool(Pool::kDecode, 1);
  Scaler& s = scaler;
  ASSERT_TRUE(s.SetReplicas(Pool::kDecode, 4).ok());
  EXPECT_EQ(*s.GetReplicas(Pool::kDecode), 4);
  EXPECT_EQ(*s.GetReplicas(Pool::kPrefill), 2);
  ASSERT_TRUE(s.SetReplicas(Pool::kPrefill, 0).ok());
  EXPECT_EQ(*s.GetReplicas(Pool::kPrefill), 0);
  EXPECT_THAT(scaler.set_calls(), ElementsAre(FakeScaler::SetCall{Pool::kDecode, 4},
                                              FakeScaler::SetCall{Pool::kPrefill, 0}));
}

TEST(FakeScalerTest, UnknownPoolAndNegativeCount) {
  FakeScaler scaler;
  scaler.AddPool(Pool::kDecode, 1);
  absl::StatusOr<int> missing = scaler.GetReplicas(Pool::kEncoder);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("encoder"));
  absl::Status negative = scaler.SetReplicas(Pool::kDecode, -1);
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(negative.message(), HasSubstr("replicas: expected >= 0, got -1"));
  EXPECT_EQ(*scaler.GetReplicas(Pool::kDecode), 1);
  EXPECT_TRUE(scaler.set_calls().empty());
}

TEST(FakeScalerTest, InjectedFailuresChangeNothingThenClear) {
  FakeScaler scaler;
  scaler.AddPool(Pool::kPrefill, 3);
  scaler.FailNext(Pool::kPrefill, absl::UnavailableError("api server down"), 2);
  EXPECT_EQ(scaler.SetReplicas(Pool::kPrefill, 5).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(scaler.GetReplicas(Pool::kPrefill).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(*scaler.GetReplicas(Pool::kPrefill), 3);
  ASSERT_TRUE(scaler.SetReplicas(Pool::kPrefill, 5).ok());
  EXPECT_EQ(*scaler.GetReplicas(Pool::kPrefill), 5);
  EXPECT_THAT(scaler.set_calls(), ElementsAre(FakeScaler::SetCall{Pool::kPrefill, 5}));
}

}  // namespace
}  // namespace deepinfer::router
