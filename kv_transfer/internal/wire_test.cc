#include "kv_transfer/internal/wire.h"

#include "gtest/gtest.h"

namespace deepinfer::kv_transfer::internal {
namespace {

TEST(WireTest, MetadataRoundTripsAndRejectsDamage) {
  PeerMetadata m{"decode-0", 42, Backend::kUcx, std::string("\0addr", 5),
                 {{3, 0x1000, 4096, MemoryKind::kHost, "key"}}};
  std::string blob = EncodeMetadata(m);
  auto back = DecodeMetadata(blob);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->name, "decode-0");
  EXPECT_EQ(back->incarnation, 42u);
  EXPECT_EQ(back->address, m.address);
  ASSERT_EQ(back->regions.size(), 1u);
  EXPECT_EQ(back->regions[0].remote_key, "key");
  for (size_t cut = 0; cut < blob.size(); ++cut) {
    EXPECT_EQ(DecodeMetadata(blob.substr(0, cut)).status().code(),
              absl::StatusCode::kInvalidArgument)
        << cut;
  }
  std::string other_version = blob;
  other_version[8] = 9;
  EXPECT_EQ(DecodeMetadata(other_version).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(DecodeMetadata(blob + "x").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(WireTest, NotificationRoundTrips) {
  std::string bytes;
  EncodeNotification(Notification{7, 2, 5, "p"}, "prefill-1", 9, &bytes);
  auto n = DecodeNotification(bytes);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->request_id, 7u);
  EXPECT_EQ(n->seq, 2u);
  EXPECT_EQ(n->total, 5u);
  EXPECT_EQ(n->payload, "p");
  EXPECT_EQ(n->sender, "prefill-1");
  EXPECT_EQ(n->sender_incarnation, 9u);
  EXPECT_FALSE(DecodeNotification(bytes.substr(0, 10)).ok());
}

}  // namespace
}  // namespace deepinfer::kv_transfer::internal
