// Fuzz target: encodes arbitrary bytes with the fixture tokenizers. It must never crash; invalid
// UTF-8 must be rejected with kInvalidArgument; for valid UTF-8, decode(encode(x)) must give x
// back on the lossless byte-level tokenizers (NFC(x) for Qwen2, which normalizes), and the
// incremental detokenizer must produce exactly the full decode.
//
// Runs as a test through //common:fuzz_main, and under clang -fsanitize=fuzzer as a libFuzzer
// target. Fixture paths are relative to the Bazel runfiles root.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "engine/tokenizer/incremental_detokenizer.h"
#include "engine/tokenizer/internal/nfc.h"
#include "engine/tokenizer/tokenizer.h"

namespace {

using deepinfer::tokenizer::IncrementalDetokenizer;
using deepinfer::tokenizer::Tokenizer;

struct Subject {
  std::unique_ptr<Tokenizer> tokenizer;
  enum class RoundTrip { kExact, kNfc, kNone } round_trip;
};

std::vector<Subject>& Subjects() {
  static std::vector<Subject>* subjects = [] {
    auto* v = new std::vector<Subject>();
    const struct {
      const char* dir;
      Subject::RoundTrip round_trip;
    } kDirs[] = {
        {"engine/testdata/tokenizers/llama3", Subject::RoundTrip::kExact},
        {"engine/testdata/tokenizers/gpt2", Subject::RoundTrip::kExact},
        {"engine/testdata/tokenizers/qwen2", Subject::RoundTrip::kNfc},
        // Prepend/Strip around added tokens make this one lossy: crash and stream checks only.
        {"engine/tokenizer/testdata/mistral", Subject::RoundTrip::kNone},
    };
    for (const auto& d : kDirs) {
      auto t = Tokenizer::FromDirectory(d.dir);
      if (!t.ok()) {
        std::fprintf(stderr, "cannot load %s: %s\n", d.dir, t.status().ToString().c_str());
        std::abort();
      }
      v->push_back(Subject{std::move(*t), d.round_trip});
    }
    return v;
  }();
  return *subjects;
}

void Check(bool ok, const char* what, const std::string& input) {
  if (ok) return;
  std::fprintf(stderr, "check failed: %s; input (%zu bytes):", what, input.size());
  for (unsigned char c : input) std::fprintf(stderr, " %02X", c);
  std::fprintf(stderr, "\n");
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  for (const Subject& s : Subjects()) {
    auto ids = s.tokenizer->Encode(input, /*add_special_tokens=*/false);
    if (!ids.ok()) {
      Check(ids.status().code() == absl::StatusCode::kInvalidArgument,
            "encode failure must be kInvalidArgument", input);
      continue;
    }
    auto with_special = s.tokenizer->Encode(input, /*add_special_tokens=*/true);
    Check(with_special.ok() && with_special->size() >= ids->size(), "encode with specials", input);
    auto decoded = s.tokenizer->Decode(*ids, /*skip_special_tokens=*/false);
    Check(decoded.ok(), "decode of encoded ids", input);
    if (s.round_trip == Subject::RoundTrip::kExact) {
      Check(*decoded == input, "decode(encode(x)) == x", input);
    } else if (s.round_trip == Subject::RoundTrip::kNfc) {
      Check(*decoded == deepinfer::tokenizer::internal::ToNfc(input), "decode(encode(x)) == NFC(x)",
            input);
    }
    IncrementalDetokenizer detok(*s.tokenizer, /*skip_special_tokens=*/false);
    std::string streamed;
    for (int32_t id : *ids) {
      auto chunk = detok.Push(id);
      Check(chunk.ok(), "detokenizer push", input);
      streamed += *chunk;
    }
    auto rest = detok.Flush();
    Check(rest.ok(), "detokenizer flush", input);
    Check(streamed + *rest == *decoded, "streamed text == full decode", input);
  }
  return 0;
}
