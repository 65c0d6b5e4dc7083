#include "kv_store/internal/object_format.h"

#include <string>

#include "gtest/gtest.h"

namespace deepinfer::kv_store_internal {
namespace {

KvBlockKey KeyOf(uint8_t fill) {
  KvBlockKey key;
  key.bytes.fill(fill);
  return key;
}

TEST(ObjectFormatTest, Crc32IsZlibsCheckValue) {
  const std::string check = "123456789";
  EXPECT_EQ(
      Crc32(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(check.data()), check.size())),
      0xCBF43926u);
}

TEST(ObjectFormatTest, HeaderIsPaddedToTheAlignment) {
  EXPECT_EQ(HeaderBytes(KvBlockLayout{4, 1024, 0}), 4096u);
  // 96 fixed bytes + 4 per layer + 4 for the header CRC.
  EXPECT_EQ(HeaderBytes(KvBlockLayout{999, 1, 0}), 4096u);
  EXPECT_EQ(HeaderBytes(KvBlockLayout{1000, 1, 0}), 8192u);
  EXPECT_EQ(ObjectBytes(KvBlockLayout{4, 1024, 0}), 8192u);
}

TEST(ObjectFormatTest, HeaderRoundTripsAndEveryMismatchIsDataLoss) {
  const KvBlockLayout layout{3, 256, 5};
  const std::vector<uint32_t> crcs = {1, 2, 3};
  const std::vector<uint8_t> header = EncodeHeader(KeyOf(1), KeyOf(2), layout, crcs);
  ASSERT_EQ(header.size(), HeaderBytes(layout));
  auto decoded = DecodeHeader(header, KeyOf(1), KeyOf(2), layout);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, crcs);

  EXPECT_EQ(DecodeHeader(header, KeyOf(9), KeyOf(2), layout).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeHeader(header, KeyOf(1), KeyOf(9), layout).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeHeader(header, KeyOf(1), KeyOf(2), KvBlockLayout{3, 256, 6}).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeHeader(absl::MakeConstSpan(header).first(100), KeyOf(1), KeyOf(2), layout)
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
  // Any bit flipped in the used part of the header is caught by its CRC (or a field check).
  for (size_t offset = 0; offset < 96 + 4 * 3 + 4; ++offset) {
    std::vector<uint8_t> flipped = header;
    flipped[offset] ^= 0x10;
    EXPECT_FALSE(DecodeHeader(flipped, KeyOf(1), KeyOf(2), layout).ok()) << offset;
  }
}

TEST(ObjectFormatTest, LayerRangesAndBufferSizesAreChecked) {
  const KvBlockLayout layout{4, 16, 0};
  EXPECT_TRUE(CheckLayerRange(layout, 0, 4, 64).ok());
  EXPECT_TRUE(CheckLayerRange(layout, 3, 1, 16).ok());
  EXPECT_FALSE(CheckLayerRange(layout, 3, 2, 32).ok());
  EXPECT_FALSE(CheckLayerRange(layout, 0, 0, 0).ok());
  EXPECT_FALSE(CheckLayerRange(layout, 4, 1, 16).ok());
  EXPECT_FALSE(CheckLayerRange(layout, 0xffffffffu, 2, 32).ok());
  EXPECT_FALSE(CheckLayerRange(layout, 0, 2, 31).ok());
}

}  // namespace
}  // namespace deepinfer::kv_store_internal
