#include "router/image_prompt.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer::router {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int32_t kImage = 9;

TEST(ExpandImagePlaceholdersTest, RepeatsEachPlaceholderOncePerRow) {
  const std::vector<int32_t> rendered = {1, kImage, 2, 3, kImage, kImage, 4};
  const std::vector<int64_t> rows = {2, 3, 1};
  absl::StatusOr<ExpandedPrompt> e = ExpandImagePlaceholders(rendered, kImage, rows);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_THAT(e->token_ids, ElementsAre(1, kImage, kImage, 2, 3, kImage, kImage, kImage, kImage, 4));
  EXPECT_THAT(e->image_positions, ElementsAre(1, 5, 8));
}

TEST(ExpandImagePlaceholdersTest, NoImagesLeavesThePromptAlone) {
  const std::vector<int32_t> rendered = {5, 6, 7};
  absl::StatusOr<ExpandedPrompt> e = ExpandImagePlaceholders(rendered, kImage, {});
  ASSERT_TRUE(e.ok());
  EXPECT_THAT(e->token_ids, ElementsAre(5, 6, 7));
  EXPECT_TRUE(e->image_positions.empty());
}

TEST(ExpandImagePlaceholdersTest, CountMismatchNamesMessages) {
  const std::vector<int32_t> rendered = {1, kImage, kImage};
  absl::StatusOr<ExpandedPrompt> e = ExpandImagePlaceholders(rendered, kImage, {{4}});
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(e.status().message(), HasSubstr("messages: the chat template rendered 2 image "
                                              "placeholder tokens (id 9) for 1 image"));
  e = ExpandImagePlaceholders(std::vector<int32_t>{1, 2}, kImage, {{4}});
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ExpandImagePlaceholdersTest, RowCountMustBePositive) {
  const std::vector<int32_t> rendered = {kImage};
  EXPECT_EQ(ExpandImagePlaceholders(rendered, kImage, {{0}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deepinfer::router
