// Decoders of Hugging Face tokenizer.json ("decoder" field): ByteLevel, Sequence, Replace,
// ByteFallback, Fuse, Strip, Metaspace; and the space-joining default when there is none.
//
// Decoding is written as a stream so that one implementation serves both Tokenizer::Decode and
// the incremental detokenizer, which therefore agree exactly. A stream carries pieces of tokens:
// a token may arrive in several pieces (after Fuse or ByteLevel everything is one token), each
// stage passes on what it can no longer change and holds back the rest (an incomplete UTF-8
// sequence, a run of byte-fallback tokens, characters Strip may still remove) until more input
// or Finish(). Every piece a stream emits is valid UTF-8.
//
// Thread-safety: a Decoder is immutable and may be shared; a DecodeStream is single-threaded.
#ifndef DEEPINFER_ENGINE_TOKENIZER_INTERNAL_DECODER_H_
#define DEEPINFER_ENGINE_TOKENIZER_INTERNAL_DECODER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/tokenizer/internal/json_util.h"

namespace deepinfer::tokenizer::internal {

struct DecodePiece {
  std::string text;
  bool starts_token = true;  // first piece of a token
  bool ends_token = true;    // last piece of a token
};

// Per-stream state of one decoder stage.
class DecoderStage {
 public:
  virtual ~DecoderStage() = default;
  virtual absl::Status Push(DecodePiece piece, std::vector<DecodePiece>* out) = 0;
  // End of input: emit everything held back.
  virtual absl::Status Finish(std::vector<DecodePiece>* out) = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual std::unique_ptr<DecoderStage> NewStage() const = 0;
};

// Parses one decoder object. kInvalidArgument naming the type if unsupported.
absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const Json& j, int depth = 0);
// What tokenizers does without a decoder: tokens joined with " ".
std::unique_ptr<Decoder> NewSpaceJoinDecoder();

// Text out of a decoder: push token strings, read back text that is final.
class DecodeStream {
 public:
  explicit DecodeStream(const Decoder& decoder) : stage_(decoder.NewStage()) {}
  // Feeds one token string; appends the text that became final to `out`.
  absl::Status PushToken(absl::string_view token, std::string* out);
  // Ends the stream; appends everything left to `out`.
  absl::Status Finish(std::string* out);

 private:
  std::unique_ptr<DecoderStage> stage_;
  std::vector<DecodePiece> scratch_;
};

}  // namespace deepinfer::tokenizer::internal

#endif  // DEEPINFER_ENGINE_TOKENIZER_INTERNAL_DECODER_H_
