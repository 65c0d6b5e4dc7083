// Tokenizer for the Jinja2 subset of chat templates. Applies Jinja's whitespace rules the way
// Hugging Face configures them (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=
// False, newlines normalised to "\n"), plus the `-`/`+` markers on tags, so the parser sees
// text tokens that are already final. Comments are dropped and `{% raw %}` bodies become text.
//
// Thread-safety: stateless function.
#ifndef DEEPINFER_ENGINE_CHAT_TEMPLATE_INTERNAL_LEXER_H_
#define DEEPINFER_ENGINE_CHAT_TEMPLATE_INTERNAL_LEXER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deepinfer::engine::jinja {

enum class TokenType {
  kText,        // Literal template text.
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,        // Identifier or keyword.
  kString,      // String literal; `text` holds the decoded value.
  kInt,
  kFloat,
  kOp,          // Operator or punctuation; `text` holds it ("==", "(", "|", ...).
  kEof,
};

struct Token {
  TokenType type;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
};

// Splits `source` into tokens ending with kEof. Fails with kInvalidArgument naming the line for
// unterminated tags, comments, strings or raw blocks, unbalanced brackets and stray characters.
absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source);

}  // namespace deepinfer::engine::jinja

#endif  // DEEPINFER_ENGINE_CHAT_TEMPLATE_INTERNAL_LEXER_H_
