// Fuzz target: parses arbitrary bytes as tokenizer.json. Malformed or unsupported documents must
// come back as a Status (never a crash, exception or hang); documents that load must encode and
// decode a fixed text without crashing.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "engine/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  auto tokenizer = deepinfer::tokenizer::Tokenizer::FromJson(input, input);
  if (!tokenizer.ok()) {
    if (tokenizer.status().code() != absl::StatusCode::kInvalidArgument) {
      std::fprintf(stderr, "unexpected status: %s\n", tokenizer.status().ToString().c_str());
      std::abort();
    }
    return 0;
  }
  auto ids = (*tokenizer)->Encode("Hello world, 123 \u00e9\u4f60 <|endoftext|>\n", true);
  if (ids.ok()) (*tokenizer)->Decode(*ids, false).IgnoreError();
  return 0;
}
