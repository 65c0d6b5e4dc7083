#include "kv_transfer/notification_tracker.h"

#include "gtest/gtest.h"

namespace deepinfer::kv_transfer {
namespace {

TEST(NotificationTrackerTest, CompletesWhenAllLayersArriveInAnyOrder) {
  NotificationTracker t;
  NotificationTracker::Completed done;
  EXPECT_FALSE(*t.Add({9, 2, 3, "c"}, &done));
  EXPECT_FALSE(*t.Add({9, 0, 3, "a"}, &done));
  EXPECT_EQ(t.Add({9, 0, 3, "a"}, &done).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(*t.Add({9, 1, 3, "b"}, &done));
  EXPECT_EQ(done.request_id, 9u);
  ASSERT_EQ(done.parts.size(), 3u);
  EXPECT_EQ(done.parts[0].payload, "a");
  EXPECT_EQ(done.parts[2].payload, "c");
  EXPECT_EQ(t.pending_requests(), 0u);
}

TEST(NotificationTrackerTest, ExpectForSendersWithoutTotal) {
  NotificationTracker t;
  NotificationTracker::Completed done;
  EXPECT_FALSE(*t.Add({4, 1, 0, ""}, &done));
  EXPECT_EQ(t.Expect(4, 1).code(), absl::StatusCode::kInvalidArgument);  // part 1 already seen
  ASSERT_TRUE(t.Expect(4, 2).ok());
  EXPECT_TRUE(*t.Add({4, 0, 0, ""}, &done));
  EXPECT_EQ(t.Add({5, 3, 2, ""}, &done).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(*t.Add({6, 0, 2, ""}, &done));
  EXPECT_EQ(t.Add({6, 1, 3, ""}, &done).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deepinfer::kv_transfer
