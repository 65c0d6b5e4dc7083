// Parser for the Jinja2 subset of chat templates: tokens (lexer.h) to a syntax tree (ast.h),
// following Jinja 3.1's grammar and operator precedence.
//
// Everything the interpreter cannot run is rejected here with kInvalidArgument naming the line
// and the construct: unknown tags (`{% include %}`, `{% call %}`, ...), filters and tests that
// are not built in, method calls no supported type has, and calls of names that are neither
// globals nor defined by the template.
//
// Thread-safety: stateless function.
#ifndef DEEPINFER_ENGINE_CHAT_TEMPLATE_INTERNAL_PARSER_H_
#define DEEPINFER_ENGINE_CHAT_TEMPLATE_INTERNAL_PARSER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/chat_template/internal/ast.h"

namespace deepinfer::engine::jinja {

// Deepest nesting of expressions or blocks the parser accepts (bounds recursion everywhere).
inline constexpr int kMaxNesting = 100;

absl::StatusOr<std::unique_ptr<Template>> Parse(absl::string_view source);

}  // namespace deepinfer::engine::jinja

#endif  // DEEPINFER_ENGINE_CHAT_TEMPLATE_INTERNAL_PARSER_H_
