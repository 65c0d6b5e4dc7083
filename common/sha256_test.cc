#include "common/sha256.h"

#include <string>

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

// FIPS 180-4 / NIST CAVP example vectors.
TEST(Sha256Test, StandardVectors) {
  EXPECT_EQ(HexLower(Sha256("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(HexLower(Sha256("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(HexLower(Sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(HexLower(Sha256(std::string(1000000, 'a'))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, BinaryInputAndRawDigest) {
  const std::string zeros(3, '\0');
  const std::string digest = Sha256(zeros);
  EXPECT_EQ(digest.size(), 32u);
  EXPECT_EQ(HexLower(digest), "709e80c88487a2411e1ee4dfb9f22a861492d20c4765150c0c794abd70f8147c");
}

TEST(HexLowerTest, EncodesEveryByte) {
  EXPECT_EQ(HexLower(""), "");
  EXPECT_EQ(HexLower(std::string("\x00\x0f\xf0\xff\x7f", 5)), "000ff0ff7f");
}

}  // namespace
}  // namespace deepinfer
