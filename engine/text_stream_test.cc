#include "engine/text_stream.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace deepinfer::engine {
namespace {

class TextStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = tokenizer::Tokenizer::FromFile("engine/testdata/tokenizers/qwen2/tokenizer.json");
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = std::move(*tok);
  }
  std::vector<int32_t> Ids(const std::string& text) {
    return tok_->Encode(text, /*add_special_tokens=*/false).value();
  }
  std::unique_ptr<tokenizer::Tokenizer> tok_;
};

TEST_F(TextStreamTest, DeltasConcatenateToTheDecodedText) {
  const std::string text = "def move(x):\n    return x  # 東京 🌤️ naïve";
  TextStream s(*tok_, {});
  std::string out;
  for (int32_t id : Ids(text)) {
    auto d = s.Push(id);
    ASSERT_TRUE(d.ok());
    out += *d;
  }
  out += s.Finish();
  EXPECT_EQ(out, text);
  EXPECT_EQ(s.text(), text);
  EXPECT_FALSE(s.stopped());
}

TEST_F(TextStreamTest, StopStringSpanningTokensIsCutAndNeverLeaks) {
  const std::string text = "alpha beta STOP gamma";
  TextStream s(*tok_, {"STOP", "never"});
  std::string out;
  for (int32_t id : Ids(text)) {
    auto d = s.Push(id);
    ASSERT_TRUE(d.ok());
    out += *d;
    // No emitted prefix ever contains a piece of the stop string beyond what is final.
    EXPECT_EQ(out.find("STOP"), std::string::npos);
  }
  out += s.Finish();
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.matched_stop(), "STOP");
  EXPECT_EQ(out, "alpha beta ");
}

TEST_F(TextStreamTest, HeldTailIsReleasedWhenItCannotCompleteAStop) {
  TextStream s(*tok_, {"ab!"});
  std::string out;
  for (int32_t id : Ids("xxab")) out += s.Push(id).value();
  EXPECT_EQ(out.find("ab"), std::string::npos);  // "ab" could start "ab!"
  for (int32_t id : Ids("c")) out += s.Push(id).value();
  out += s.Finish();
  EXPECT_EQ(out, "xxabc");
}

TEST_F(TextStreamTest, InvalidTokenIsAnError) {
  TextStream s(*tok_, {});
  EXPECT_FALSE(s.Push(tok_->vocab_size() + 5).ok());
}

}  // namespace
}  // namespace deepinfer::engine
