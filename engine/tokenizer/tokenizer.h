// A Hugging Face `tokenizer.json` tokenizer: byte-level / byte-fallback BPE with the normalizers,
// pre-tokenizers, post-processors, decoders and added tokens that Llama-3, Qwen2, GPT-2 and
// Mistral-style checkpoints use. Encode and Decode match the `tokenizers` library id for id and
// byte for byte on those configurations.
//
// Anything in a tokenizer.json that is not supported is rejected at load time with
// kInvalidArgument naming the component, e.g. `pre_tokenizer type "Whitespace" is not
// supported`; nothing is silently ignored except offsets-only options (trim_offsets).
//
// Thread-safety: a Tokenizer is immutable after creation; every method is const and may be
// called from any number of threads at once.
#ifndef DEEPINFER_ENGINE_TOKENIZER_TOKENIZER_H_
#define DEEPINFER_ENGINE_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deepinfer::tokenizer {

namespace internal {
class AddedVocabulary;
class BpeModel;
class Decoder;
class Normalizer;
class PreTokenizer;
}  // namespace internal

class IncrementalDetokenizer;

class Tokenizer {
 public:
  // Parses a tokenizer.json document. `tokenizer_config_json`, if not empty, is the content of
  // tokenizer_config.json, read for `bos_token`, `eos_token` (strings or {"content": ...}
  // objects) and `add_bos_token` / `add_eos_token`.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(
      absl::string_view tokenizer_json, absl::string_view tokenizer_config_json = {});
  // Reads and parses the tokenizer.json file at `tokenizer_json_path` (no tokenizer_config).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(
      const std::string& tokenizer_json_path);
  // Reads `dir`/tokenizer.json and, when present, `dir`/tokenizer_config.json.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromDirectory(const std::string& dir);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text`. With `add_special_tokens`, the post-processor's special tokens (e.g.
  // Llama-3's <|begin_of_text|>) are added. Special tokens written in the text are always
  // recognised. kInvalidArgument if `text` is not valid UTF-8, naming the byte offset.
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                              bool add_special_tokens) const;

  // Text of `ids`; with `skip_special_tokens`, special added tokens are left out. Invalid UTF-8
  // that byte-level tokens spell becomes U+FFFD as in tokenizers. kInvalidArgument naming the
  // first id that is not in the vocabulary.
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids,
                                     bool skip_special_tokens) const;

  // One past the largest token id (model vocab and added tokens): the embedding rows needed.
  int32_t vocab_size() const { return vocab_size_; }
  std::optional<int32_t> TokenToId(absl::string_view token) const;
  // The token string as stored in the vocab (byte-level form for byte-level models), or
  // nullopt if `id` is unknown.
  std::optional<std::string> IdToToken(int32_t id) const;
  // True if `id` is an added token marked special.
  bool IsSpecial(int32_t id) const;
  // Ids of all special added tokens, ascending.
  const std::vector<int32_t>& special_ids() const { return special_ids_; }

  // From tokenizer_config.json when it names them and they are in the vocabulary.
  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }
  std::optional<bool> add_bos_token() const { return add_bos_token_; }
  std::optional<bool> add_eos_token() const { return add_eos_token_; }

 private:
  friend class IncrementalDetokenizer;
  Tokenizer();

  // The string a decoder receives for `id` (added tokens' decode form), or null if unknown.
  const std::string* DecoderInput(int32_t id) const;
  absl::Status EncodeSegment(absl::string_view text, bool at_origin,
                             std::vector<int32_t>* ids) const;

  std::unique_ptr<internal::Normalizer> normalizer_;
  std::unique_ptr<internal::PreTokenizer> pre_tokenizer_;
  std::unique_ptr<internal::BpeModel> model_;
  std::unique_ptr<internal::AddedVocabulary> added_;
  std::unique_ptr<internal::Decoder> decoder_;
  // Single-sequence post-processing: ids added before and after the text.
  std::vector<int32_t> post_prefix_;
  std::vector<int32_t> post_suffix_;
  std::vector<int32_t> special_ids_;
  int32_t vocab_size_ = 0;
  std::optional<int32_t> bos_id_;
  std::optional<int32_t> eos_id_;
  std::optional<bool> add_bos_token_;
  std::optional<bool> add_eos_token_;
};

}  // namespace deepinfer::tokenizer

#endif  // DEEPINFER_ENGINE_TOKENIZER_TOKENIZER_H_
