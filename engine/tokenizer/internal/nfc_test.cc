#include "engine/tokenizer/internal/nfc.h"

#include <gtest/gtest.h>

#include <string>

namespace deepinfer::tokenizer::internal {
namespace {

struct NfcCase {
  const char* input;
  const char* expected;
};

// Random strings over combining marks, composites, Hangul jamo and syllables, with the NFC
// Python's unicodedata computes (gen_nfc_tables.py --test-cases).
constexpr NfcCase kGenerated[] = {
#include "engine/tokenizer/internal/nfc_test_cases.inc"
};

TEST(NfcTest, MatchesPythonOnGeneratedCases) {
  int checked = 0;
  for (const NfcCase& c : kGenerated) {
    EXPECT_EQ(ToNfc(c.input), c.expected) << "input: " << c.input;
    ++checked;
  }
  EXPECT_EQ(checked, 3000);
}

TEST(NfcTest, KnownExamples) {
  EXPECT_EQ(ToNfc("e\u0301"), "\u00E9");              // composition
  EXPECT_EQ(ToNfc("\u212B"), "\u00C5");               // Angstrom sign singleton
  EXPECT_EQ(ToNfc("\u1100\u1161\u11A8"), "\uAC01");   // Hangul LVT
  EXPECT_EQ(ToNfc("a\u0307\u0323"), "\u1EA1\u0307");  // reordering then composition
  EXPECT_EQ(ToNfc("\u0958"), "\u0915\u093C");         // composition exclusion
  EXPECT_EQ(ToNfc("plain ascii"), "plain ascii");
  EXPECT_EQ(ToNfc(""), "");
  EXPECT_EQ(ToNfc("\u0301a"), "\u0301a");  // leading combining mark stays
}

TEST(NfcTest, QuickCheck) {
  EXPECT_TRUE(IsNfcQuick("hello"));
  EXPECT_TRUE(IsNfcQuick("caf\u00E9 \u4F60\u597D \uAC01"));
  EXPECT_FALSE(IsNfcQuick("cafe\u0301"));
  EXPECT_FALSE(IsNfcQuick("\u212B"));
  EXPECT_FALSE(NfcUnicodeVersion().empty());
}

}  // namespace
}  // namespace deepinfer::tokenizer::internal
