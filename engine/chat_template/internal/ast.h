// The syntax tree of a parsed chat template. Built once by the parser, then only read (by any
// number of concurrent renders).
#ifndef DEEPINFER_ENGINE_CHAT_TEMPLATE_INTERNAL_AST_H_
#define DEEPINFER_ENGINE_CHAT_TEMPLATE_INTERNAL_AST_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/chat_template/internal/value.h"

namespace deepinfer::engine::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,   // literal
    kName,      // name
    kList,      // args = items
    kTuple,     // args = items
    kDict,      // args = key0, value0, key1, value1, ...
    kGetAttr,   // args[0].name
    kGetItem,   // args[0][args[1]]
    kSlice,     // args[0][args[1]:args[2]:args[3]], unset bounds are nullptr
    kNot,       // not args[0]
    kNeg,       // -args[0]
    kPos,       // +args[0]
    kBinary,    // args[0] name args[1]; name in + - * / // % **
    kConcat,    // args joined with ~
    kAnd,       // args[0] and args[1]
    kOr,        // args[0] or args[1]
    kCompare,   // args[0] ops[0] args[1] ops[1] args[2] ... (Python chaining)
    kCondExpr,  // args[0] if args[1] else args[2] (args[2] may be nullptr)
    kCall,      // args[0](args[1:], kwargs)
    kFilter,    // args[0] | name(args[1:], kwargs); id = filter id
    kTest,      // args[0] is [not] name(args[1:], kwargs); id = test id
  };

  Kind kind;
  int line = 0;
  Value literal;
  std::string name;
  int id = -1;
  bool negated = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // if conds[i]: bodies[i] ... else: else_body
    kFor,       // for targets in expr [if filter]: body else: else_body
    kSet,       // set targets = expr  |  set targets[0].attr = expr (attr non-empty)
    kSetBlock,  // set targets[0] %}body{% endset
    kMacro,     // macro name(params = defaults): body
    kWith,      // with targets[i] = values[i]: body
    kScope,     // body rendered in place ({% generation %})
    kFilterBlock,  // filter %}body{% endfilter: expr applies filters to Name kFilterInput
    kBreak,
    kContinue,
  };

  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  Body body;
  Body else_body;
  std::vector<std::string> targets;
  bool unpack = false;  // Targets were written as a tuple.
  std::string attr;
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> values;  // Macro defaults (nullptr when none) or with values.
};

// The variable a {% filter %} block's filter chain reads its rendered body from.
inline constexpr const char* kFilterInput = "\x01filter_input";

struct Template {
  Body body;
};

}  // namespace deepinfer::engine::jinja

#endif  // DEEPINFER_ENGINE_CHAT_TEMPLATE_INTERNAL_AST_H_
