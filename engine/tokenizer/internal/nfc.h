// Unicode Normalization Form C (canonical decomposition, then canonical composition), as the
// `NFC` normalizer of Hugging Face tokenizers applies it. Tables are generated from Python's
// unicodedata by gen_nfc_tables.py (nfc_tables.inc), Hangul is algorithmic. Thread-safe.
#ifndef DEEPINFER_ENGINE_TOKENIZER_INTERNAL_NFC_H_
#define DEEPINFER_ENGINE_TOKENIZER_INTERNAL_NFC_H_

#include <string>

#include "absl/strings/string_view.h"

namespace deepinfer::tokenizer::internal {

// True if `s` (valid UTF-8) is certainly already in NFC (a quick check; false means "maybe").
bool IsNfcQuick(absl::string_view s);

// Returns the NFC form of `s`, which must be valid UTF-8.
std::string ToNfc(absl::string_view s);

// Unicode version of the tables.
absl::string_view NfcUnicodeVersion();

}  // namespace deepinfer::tokenizer::internal

#endif  // DEEPINFER_ENGINE_TOKENIZER_INTERNAL_NFC_H_
