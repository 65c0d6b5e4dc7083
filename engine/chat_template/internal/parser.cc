#include "engine/chat_template/internal/parser.h"

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/chat_template/internal/builtins.h"
#include "engine/chat_template/internal/lexer.h"
#include "engine/chat_template/internal/ops.h"

namespace deepinfer::engine::jinja {
namespace {

#define PARSE_RETURN_IF_ERROR(expr)        \
  do {                                     \
    absl::Status parse_status_ = (expr);   \
    if (!parse_status_.ok()) return parse_status_; \
  } while (false)

#define PARSE_ASSIGN_OR_RETURN(lhs, expr)  \
  auto lhs##_or = (expr);                  \
  if (!lhs##_or.ok()) return lhs##_or.status(); \
  auto lhs = std::move(lhs##_or).value()

std::string Describe(const Token& t) {
  switch (t.type) {
    case TokenType::kText: return "template text";
    case TokenType::kVarBegin: return "'{{'";
    case TokenType::kVarEnd: return "end of print statement '}}'";
    case TokenType::kBlockBegin: return "'{%'";
    case TokenType::kBlockEnd: return "end of statement block '%}'";
    case TokenType::kName: return absl::StrCat("'", t.text, "'");
    case TokenType::kString: return "string literal";
    case TokenType::kInt:
    case TokenType::kFloat: return absl::StrCat("number ", t.text);
    case TokenType::kOp: return absl::StrCat("'", t.text, "'");
    case TokenType::kEof: return "end of template";
  }
  return "token";
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  absl::StatusOr<std::unique_ptr<Template>> Run() {
    auto tmpl = std::make_unique<Template>();
    std::string end;
    PARSE_RETURN_IF_ERROR(ParseBody({}, &tmpl->body, &end));
    for (const auto& [name, line] : called_names_) {
      if (!IsGlobalFunction(name) && defined_names_.count(name) == 0) {
        return Error(absl::StrCat("function \"", name, "\" is not supported"), line);
      }
    }
    return tmpl;
  }

 private:
  const Token& Cur() const { return toks_[pos_]; }
  const Token& Peek(size_t k = 1) const {
    return toks_[std::min(pos_ + k, toks_.size() - 1)];
  }
  void Next() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }
  bool IsOp(absl::string_view op) const { return Cur().type == TokenType::kOp && Cur().text == op; }
  bool IsName(absl::string_view name) const {
    return Cur().type == TokenType::kName && Cur().text == name;
  }
  bool SkipOp(absl::string_view op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }

  absl::Status Error(absl::string_view what, int line) const {
    return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", what));
  }
  absl::Status Unexpected(absl::string_view expected) const {
    return Error(absl::StrCat("expected ", expected, ", found ", Describe(Cur())), Cur().line);
  }
  absl::Status ExpectOp(absl::string_view op) {
    if (!SkipOp(op)) return Unexpected(absl::StrCat("'", op, "'"));
    return absl::OkStatus();
  }
  absl::Status ExpectBlockEnd() {
    if (Cur().type != TokenType::kBlockEnd) return Unexpected("end of statement block '%}'");
    Next();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Cur().type != TokenType::kName) return Unexpected("a name");
    std::string n = Cur().text;
    Next();
    return n;
  }

  // RAII nesting guard.
  struct Nest {
    explicit Nest(Parser* p) : p(p) { ++p->depth_; }
    ~Nest() { --p->depth_; }
    Parser* p;
  };
  absl::Status CheckDepth() const {
    if (depth_ > kMaxNesting) {
      return Error(absl::StrCat("nesting deeper than ", kMaxNesting, " levels"), Cur().line);
    }
    return absl::OkStatus();
  }

  // Parses nodes until `{% <one of ends>` (consumed, name stored in *found) or end of input
  // (allowed only when `ends` is empty).
  absl::Status ParseBody(const std::set<std::string>& ends, Body* out, std::string* found) {
    Nest nest(this);
    PARSE_RETURN_IF_ERROR(CheckDepth());
    while (true) {
      const Token& t = Cur();
      switch (t.type) {
        case TokenType::kEof:
          if (!ends.empty()) {
            return Error(absl::StrCat("unexpected end of template, expected '",
                                      *ends.begin(), "'"),
                         t.line);
          }
          return absl::OkStatus();
        case TokenType::kText: {
          auto node = std::make_unique<Node>();
          node->kind = Node::Kind::kText;
          node->line = t.line;
          node->text = t.text;
          out->push_back(std::move(node));
          Next();
          break;
        }
        case TokenType::kVarBegin: {
          const int line = t.line;
          Next();
          PARSE_ASSIGN_OR_RETURN(e, ParseTuple(true, false));
          if (Cur().type != TokenType::kVarEnd) return Unexpected("end of print statement '}}'");
          Next();
          auto node = std::make_unique<Node>();
          node->kind = Node::Kind::kOutput;
          node->line = line;
          node->expr = std::move(e);
          out->push_back(std::move(node));
          break;
        }
        case TokenType::kBlockBegin: {
          Next();
          if (Cur().type != TokenType::kName) return Unexpected("a statement name");
          const std::string& name = Cur().text;
          if (ends.count(name) > 0) {
            *found = name;
            Next();
            return absl::OkStatus();
          }
          PARSE_ASSIGN_OR_RETURN(node, ParseStatement());
          out->push_back(std::move(node));
          break;
        }
        default:
          return Error(absl::StrCat("unexpected ", Describe(t)), t.line);
      }
    }
  }

  absl::StatusOr<NodePtr> ParseStatement() {
    const Token& t = Cur();
    const std::string name = t.text;
    const int line = t.line;
    auto node = std::make_unique<Node>();
    node->line = line;
    Next();
    if (name == "if") {
      node->kind = Node::Kind::kIf;
      while (true) {
        PARSE_ASSIGN_OR_RETURN(cond, ParseTuple(true, false));
        PARSE_RETURN_IF_ERROR(ExpectBlockEnd());
        Body body;
        std::string end;
        PARSE_RETURN_IF_ERROR(ParseBody({"elif", "else", "endif"}, &body, &end));
        node->conds.push_back(std::move(cond));
        node->bodies.push_back(std::move(body));
        if (end == "elif") continue;
        if (end == "else") {
          PARSE_RETURN_IF_ERROR(ExpectBlockEnd());
          PARSE_RETURN_IF_ERROR(ParseBody({"endif"}, &node->else_body, &end));
        }
        PARSE_RETURN_IF_ERROR(ExpectBlockEnd());
        return node;
      }
    }
    if (name == "for") {
      node->kind = Node::Kind::kFor;
      PARSE_RETURN_IF_ERROR(ParseTargets(node.get()));
      if (!IsName("in")) return Unexpected("'in'");
      Next();
      PARSE_ASSIGN_OR_RETURN(iter, ParseTuple(false, false));
      node->expr = std::move(iter);
      if (IsName("if")) {
        Next();
        PARSE_ASSIGN_OR_RETURN(filter, ParseExpression(true));
        node->filter = std::move(filter);
      }
      if (IsName("recursive")) return Error("recursive for loops are not supported", line);
      PARSE_RETURN_IF_ERROR(ExpectBlockEnd());
      std::string end;
      ++loop_depth_;
      absl::Status body_status = ParseBody({"endfor", "else"}, &node->body, &end);
      --loop_depth_;
      PARSE_RETURN_IF_ERROR(body_status);
      if (end == "else") {
        PARSE_RETURN_IF_ERROR(ExpectBlockEnd());
        PARSE_RETURN_IF_ERROR(ParseBody({"endfor"}, &node->else_body, &end));
      }
      PARSE_RETURN_IF_ERROR(ExpectBlockEnd());
      return node;
    }
    if (name == "set") {
      if (Cur().type == TokenType::kName && Peek().type == TokenType::kOp && Peek().text == "." &&
          Peek(2).type == TokenType::kName) {
        node->kind = Node::Kind::kSet;
        node->targets.push_back(Cur().text);
        node->attr = Peek(2).text;
        pos_ += 3;
      } else {
        PARSE_RETURN_IF_ERROR(ParseTargets(node.get()));
        node->kind = Node::Kind::kSet;
      }
      if (SkipOp("=")) {
        PARSE_ASSIGN_OR_RETURN(value, ParseTuple(true, false));
        node->expr = std::move(value);
        PARSE_RETURN_IF_ERROR(ExpectBlockEnd());
        return node;
      }
      if (node->unpack || node->targets.size() != 1 || !node->attr.empty()) {
        return Unexpected("'='");
      }
      if (IsOp("|")) return Error("filters on {% set %} blocks are not supported", line);
      node->kind = Node::Kind::kSetBlock;
      PARSE_RETURN_IF_ERROR(ExpectBlockEnd());
      std::string end;
      PARSE_RETURN_IF_ERROR(ParseBody({"endset"}, &node->body, &end));
      PARSE_RETURN_IF_ERROR(ExpectBlockEnd());
      return node;
    }
    if (name == "macro") {
      node->kind = Node::Kind::kMacro;
      PARSE_ASSIGN_OR_RETURN(macro_name, ExpectName());
      node->name = macro_name;
      defined_names_.insert(macro_name);
      PARSE_RETURN_IF_ERROR(ExpectOp("("));
      while (!IsOp(")")) {
        if (!node->params.empty()) PARSE_RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp(")")) break;
        PARSE_ASSIGN_OR_RETURN(param, ExpectName());
        defined_names_.insert(param);
        node->params.push_back(param);
        if (SkipOp("=")) {
          PARSE_ASSIGN_OR_RETURN(dflt, ParseExpression(true));
          node->values.push_back(std::move(dflt));
        } else {
          node->values.push_back(nullptr);
        }
      }
      Next();
      PARSE_RETURN_IF_ERROR(ExpectBlockEnd());
      std::string end;
      const int saved_loop_depth = loop_depth_;
      loop_depth_ = 0;  // A macro body cannot break out of a loop around its definition.
      absl::Status body_status = ParseBody({"endmacro"}, &node->body, &end);
      loop_depth_ = saved_loop_depth;
      PARSE_RETURN_IF_ERROR(body_status);
      if (Cur().type == TokenType::kName && Cur().text == node->name) Next();
      PARSE_RETURN_IF_ERROR(ExpectBlockEnd());
      return node;
    }
    if (name == "with") {
      node->kind = Node::Kind::kWith;
      while (Cur().type != TokenType::kBlockEnd) {
        if (!node->targets.empty()) PARSE_RETURN_IF_ERROR(ExpectOp(","));
        PARSE_ASSIGN_OR_RETURN(target, ExpectName());
        defined_names_.insert(target);
        PARSE_RETURN_IF_ERROR(ExpectOp("="));
        PARSE_ASSIGN_OR_RETURN(value, ParseExpression(true));
        node->targets.push_back(target);
        node->values.push_back(std::move(value));
      }
      Next();
      std::string end;
      PARSE_RETURN_IF_ERROR(ParseBody({"endwith"}, &node->body, &end));
      PARSE_RETURN_IF_ERROR(ExpectBlockEnd());
      return node;
    }
    if (name == "generation") {
      // transformers' AssistantTracker tag: renders its body in place.
      node->kind = Node::Kind::kScope;
      PARSE_RETURN_IF_ERROR(ExpectBlockEnd());
      std::string end;
      PARSE_RETURN_IF_ERROR(ParseBody({"endgeneration"}, &node->body, &end));
      PARSE_RETURN_IF_ERROR(ExpectBlockEnd());
      return node;
    }
    if (name == "filter") {
      node->kind = Node::Kind::kFilterBlock;
      auto input = Make(Expr::Kind::kName, line);
      input->name = kFilterInput;
      if (Cur().type != TokenType::kName) return Unexpected("a filter name");
      // Same grammar as `x | f | g(args)` with the leading `|` implied.
      PARSE_ASSIGN_OR_RETURN(chain, ParseFilterChain(std::move(input)));
      node->expr = std::move(chain);
      PARSE_RETURN_IF_ERROR(ExpectBlockEnd());
      std::string end;
      PARSE_RETURN_IF_ERROR(ParseBody({"endfilter"}, &node->body, &end));
      PARSE_RETURN_IF_ERROR(ExpectBlockEnd());
      return node;
    }
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) return Error(absl::StrCat("'", name, "' outside of a loop"), line);
      node->kind = name == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      PARSE_RETURN_IF_ERROR(ExpectBlockEnd());
      return node;
    }
    static const std::set<std::string> kEndTags = {"endif",   "endfor",        "endset",
                                                   "endmacro", "endwith",      "endgeneration",
                                                   "endfilter", "elif",        "else"};
    if (kEndTags.count(name) > 0) {
      return Error(absl::StrCat("unexpected tag \"", name, "\" without a matching opening tag"),
                   line);
    }
    return Error(absl::StrCat("tag \"", name, "\" is not supported"), line);
  }

  // `a`, `a, b`, `(a, b)`.
  absl::Status ParseTargets(Node* node) {
    const bool paren = SkipOp("(");
    while (true) {
      PARSE_ASSIGN_OR_RETURN(target, ExpectName());
      defined_names_.insert(target);
      node->targets.push_back(target);
      if (!SkipOp(",")) break;
      node->unpack = true;
      if (paren && IsOp(")")) break;
      if (!paren && (IsName("in") || IsOp("="))) break;
    }
    if (paren) {
      node->unpack = true;
      PARSE_RETURN_IF_ERROR(ExpectOp(")"));
    }
    return absl::OkStatus();
  }

  ExprPtr Make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  bool AtTupleEnd() const {
    const Token& t = Cur();
    return t.type == TokenType::kVarEnd || t.type == TokenType::kBlockEnd ||
           (t.type == TokenType::kOp && t.text == ")") ||
           (t.type == TokenType::kName && (t.text == "recursive" || t.text == "if"));
  }

  // Jinja's parse_tuple: `a, b` without parentheses makes a tuple.
  absl::StatusOr<ExprPtr> ParseTuple(bool with_condexpr, bool explicit_parens) {
    const int line = Cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) PARSE_RETURN_IF_ERROR(ExpectOp(","));
      if (AtTupleEnd()) break;
      PARSE_ASSIGN_OR_RETURN(e, ParseExpression(with_condexpr));
      items.push_back(std::move(e));
      if (IsOp(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) return Unexpected("an expression");
    }
    auto t = Make(Expr::Kind::kTuple, line);
    t->args = std::move(items);
    return t;
  }

  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr) {
    Nest nest(this);
    PARSE_RETURN_IF_ERROR(CheckDepth());
    if (!with_condexpr) return ParseOr();
    PARSE_ASSIGN_OR_RETURN(expr, ParseOr());
    while (IsName("if")) {
      const int line = Cur().line;
      Next();
      PARSE_ASSIGN_OR_RETURN(cond, ParseOr());
      ExprPtr otherwise;
      if (IsName("else")) {
        Next();
        PARSE_ASSIGN_OR_RETURN(e, ParseExpression(true));
        otherwise = std::move(e);
      }
      auto c = Make(Expr::Kind::kCondExpr, line);
      c->args.push_back(std::move(expr));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(otherwise));
      expr = std::move(c);
    }
    return expr;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    PARSE_ASSIGN_OR_RETURN(left, ParseAnd());
    while (IsName("or")) {
      const int line = Cur().line;
      Next();
      PARSE_ASSIGN_OR_RETURN(right, ParseAnd());
      auto e = Make(Expr::Kind::kOr, line);
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    PARSE_ASSIGN_OR_RETURN(left, ParseNot());
    while (IsName("and")) {
      const int line = Cur().line;
      Next();
      PARSE_ASSIGN_OR_RETURN(right, ParseNot());
      auto e = Make(Expr::Kind::kAnd, line);
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      Nest nest(this);
      PARSE_RETURN_IF_ERROR(CheckDepth());
      const int line = Cur().line;
      Next();
      PARSE_ASSIGN_OR_RETURN(operand, ParseNot());
      auto e = Make(Expr::Kind::kNot, line);
      e->args.push_back(std::move(operand));
      return e;
    }
    return ParseCompare();
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    const int line = Cur().line;
    PARSE_ASSIGN_OR_RETURN(first, ParseMath1());
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (Cur().type == TokenType::kOp &&
          (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" || Cur().text == "<=" ||
           Cur().text == ">" || Cur().text == ">=")) {
        op = Cur().text;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && Peek().type == TokenType::kName && Peek().text == "in") {
        op = "not in";
        Next();
        Next();
      } else {
        break;
      }
      PARSE_ASSIGN_OR_RETURN(operand, ParseMath1());
      if (!cmp) {
        cmp = Make(Expr::Kind::kCompare, line);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(std::move(operand));
    }
    if (cmp) return cmp;
    return first;
  }

  absl::StatusOr<ExprPtr> Binary(ExprPtr left, const std::string& op, ExprPtr right, int line) {
    auto e = Make(Expr::Kind::kBinary, line);
    e->name = op;
    e->args.push_back(std::move(left));
    e->args.push_back(std::move(right));
    return e;
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    PARSE_ASSIGN_OR_RETURN(left, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      const std::string op = Cur().text;
      const int line = Cur().line;
      Next();
      PARSE_ASSIGN_OR_RETURN(right, ParseConcat());
      PARSE_ASSIGN_OR_RETURN(e, Binary(std::move(left), op, std::move(right), line));
      left = std::move(e);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseConcat() {
    const int line = Cur().line;
    PARSE_ASSIGN_OR_RETURN(first, ParseMath2());
    if (!IsOp("~")) return first;
    auto e = Make(Expr::Kind::kConcat, line);
    e->args.push_back(std::move(first));
    while (SkipOp("~")) {
      PARSE_ASSIGN_OR_RETURN(next, ParseMath2());
      e->args.push_back(std::move(next));
    }
    return e;
  }

  absl::StatusOr<ExprPtr> ParseMath2() {
    PARSE_ASSIGN_OR_RETURN(left, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const std::string op = Cur().text;
      const int line = Cur().line;
      Next();
      PARSE_ASSIGN_OR_RETURN(right, ParsePow());
      PARSE_ASSIGN_OR_RETURN(e, Binary(std::move(left), op, std::move(right), line));
      left = std::move(e);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParsePow() {
    PARSE_ASSIGN_OR_RETURN(left, ParseUnary(true));
    while (IsOp("**")) {
      const int line = Cur().line;
      Next();
      PARSE_ASSIGN_OR_RETURN(right, ParseUnary(true));
      PARSE_ASSIGN_OR_RETURN(e, Binary(std::move(left), "**", std::move(right), line));
      left = std::move(e);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    Nest nest(this);
    PARSE_RETURN_IF_ERROR(CheckDepth());
    const int line = Cur().line;
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      const bool neg = IsOp("-");
      Next();
      PARSE_ASSIGN_OR_RETURN(operand, ParseUnary(false));
      node = Make(neg ? Expr::Kind::kNeg : Expr::Kind::kPos, line);
      node->args.push_back(std::move(operand));
    } else {
      PARSE_ASSIGN_OR_RETURN(primary, ParsePrimary());
      node = std::move(primary);
    }
    PARSE_ASSIGN_OR_RETURN(post, ParsePostfix(std::move(node)));
    if (!with_filter) return post;
    return ParseFilterExpr(std::move(post));
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token& t = Cur();
    const int line = t.line;
    switch (t.type) {
      case TokenType::kName: {
        auto e = Make(Expr::Kind::kLiteral, line);
        if (t.text == "true" || t.text == "True") {
          e->literal = Value::Bool(true);
        } else if (t.text == "false" || t.text == "False") {
          e->literal = Value::Bool(false);
        } else if (t.text == "none" || t.text == "None") {
          e->literal = Value::None();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t.text;
        }
        Next();
        return e;
      }
      case TokenType::kString: {
        std::string s;
        while (Cur().type == TokenType::kString) {  // Adjacent literals concatenate.
          s += Cur().text;
          Next();
        }
        auto e = Make(Expr::Kind::kLiteral, line);
        e->literal = Value::String(std::move(s));
        return e;
      }
      case TokenType::kInt:
      case TokenType::kFloat: {
        auto e = Make(Expr::Kind::kLiteral, line);
        e->literal = t.type == TokenType::kInt ? Value::Int(t.int_value) : Value::Float(t.float_value);
        Next();
        return e;
      }
      case TokenType::kOp:
        if (t.text == "(") {
          Next();
          PARSE_ASSIGN_OR_RETURN(e, ParseTuple(true, true));
          PARSE_RETURN_IF_ERROR(ExpectOp(")"));
          return e;
        }
        if (t.text == "[") {
          Next();
          auto e = Make(Expr::Kind::kList, line);
          while (!IsOp("]")) {
            if (!e->args.empty()) PARSE_RETURN_IF_ERROR(ExpectOp(","));
            if (IsOp("]")) break;
            PARSE_ASSIGN_OR_RETURN(item, ParseExpression(true));
            e->args.push_back(std::move(item));
          }
          Next();
          return e;
        }
        if (t.text == "{") {
          Next();
          auto e = Make(Expr::Kind::kDict, line);
          while (!IsOp("}")) {
            if (!e->args.empty()) PARSE_RETURN_IF_ERROR(ExpectOp(","));
            if (IsOp("}")) break;
            PARSE_ASSIGN_OR_RETURN(key, ParseExpression(true));
            PARSE_RETURN_IF_ERROR(ExpectOp(":"));
            PARSE_ASSIGN_OR_RETURN(value, ParseExpression(true));
            e->args.push_back(std::move(key));
            e->args.push_back(std::move(value));
          }
          Next();
          return e;
        }
        break;
      default:
        break;
    }
    return Error(absl::StrCat("unexpected ", Describe(t)), line);
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      const int line = Cur().line;
      if (IsOp(".")) {
        Next();
        if (Cur().type == TokenType::kName) {
          auto e = Make(Expr::Kind::kGetAttr, line);
          e->name = Cur().text;
          e->args.push_back(std::move(node));
          node = std::move(e);
          Next();
        } else if (Cur().type == TokenType::kInt) {
          auto e = Make(Expr::Kind::kGetItem, line);
          auto key = Make(Expr::Kind::kLiteral, line);
          key->literal = Value::Int(Cur().int_value);
          e->args.push_back(std::move(node));
          e->args.push_back(std::move(key));
          node = std::move(e);
          Next();
        } else {
          return Unexpected("a name or number after '.'");
        }
      } else if (IsOp("[")) {
        Next();
        PARSE_ASSIGN_OR_RETURN(sub, ParseSubscript(std::move(node), line));
        node = std::move(sub);
      } else if (IsOp("(")) {
        PARSE_ASSIGN_OR_RETURN(call, ParseCall(std::move(node)));
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr obj, int line) {
    // One subscript: an expression or a slice (a:b:c). `[a, b]` indexes with a tuple.
    std::vector<ExprPtr> parts;
    bool is_slice = false;
    ExprPtr bounds[3];
    int count = 0;
    while (!IsOp("]")) {
      if (count > 0) PARSE_RETURN_IF_ERROR(ExpectOp(","));
      ++count;
      ExprPtr first;
      if (!IsOp(":")) {
        PARSE_ASSIGN_OR_RETURN(e, ParseExpression(true));
        first = std::move(e);
      }
      if (!IsOp(":")) {
        parts.push_back(std::move(first));
        continue;
      }
      if (count > 1) return Error("multi-dimensional slices are not supported", line);
      is_slice = true;
      bounds[0] = std::move(first);
      Next();
      if (!IsOp(":") && !IsOp("]") && !IsOp(",")) {
        PARSE_ASSIGN_OR_RETURN(e, ParseExpression(true));
        bounds[1] = std::move(e);
      }
      if (SkipOp(":")) {
        if (!IsOp("]") && !IsOp(",")) {
          PARSE_ASSIGN_OR_RETURN(e, ParseExpression(true));
          bounds[2] = std::move(e);
        }
      }
    }
    Next();
    if (is_slice) {
      if (count > 1) return Error("multi-dimensional slices are not supported", line);
      auto e = Make(Expr::Kind::kSlice, line);
      e->args.push_back(std::move(obj));
      for (auto& b : bounds) e->args.push_back(std::move(b));
      return e;
    }
    if (parts.empty()) return Error("expected a subscript inside '[]'", line);
    auto e = Make(Expr::Kind::kGetItem, line);
    e->args.push_back(std::move(obj));
    if (parts.size() == 1) {
      e->args.push_back(std::move(parts[0]));
    } else {
      auto t = Make(Expr::Kind::kTuple, line);
      t->args = std::move(parts);
      e->args.push_back(std::move(t));
    }
    return e;
  }

  // Parses `(args, key=value)` into e->args (appended) and e->kwargs.
  absl::Status ParseCallArgs(Expr* e) {
    PARSE_RETURN_IF_ERROR(ExpectOp("("));
    bool first = true;
    while (!IsOp(")")) {
      if (!first) {
        PARSE_RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp(")")) break;
      }
      first = false;
      if (IsOp("*") || IsOp("**")) return Error("*args and **kwargs in calls are not supported",
                                                Cur().line);
      if (Cur().type == TokenType::kName && Peek().type == TokenType::kOp && Peek().text == "=") {
        std::string key = Cur().text;
        Next();
        Next();
        PARSE_ASSIGN_OR_RETURN(value, ParseExpression(true));
        e->kwargs.emplace_back(std::move(key), std::move(value));
      } else {
        if (!e->kwargs.empty()) {
          return Error("positional argument follows keyword argument", Cur().line);
        }
        PARSE_ASSIGN_OR_RETURN(value, ParseExpression(true));
        e->args.push_back(std::move(value));
      }
    }
    Next();
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    const int line = Cur().line;
    if (callee->kind == Expr::Kind::kName) {
      called_names_.emplace_back(callee->name, line);
    } else if (callee->kind == Expr::Kind::kGetAttr) {
      if (!IsKnownMethodName(callee->name) && callee->name != "cycle") {
        return Error(absl::StrCat("method \"", callee->name, "\" is not supported"), line);
      }
    } else {
      return Error("only functions, macros and methods can be called", line);
    }
    auto e = Make(Expr::Kind::kCall, line);
    e->args.push_back(std::move(callee));
    PARSE_RETURN_IF_ERROR(ParseCallArgs(e.get()));
    return e;
  }

  // `f(args) | g ...` applied to `node` (the `{% filter %}` tag's chain).
  absl::StatusOr<ExprPtr> ParseFilterChain(ExprPtr node) {
    while (true) {
      PARSE_ASSIGN_OR_RETURN(filtered, ParseOneFilter(std::move(node)));
      node = std::move(filtered);
      if (!SkipOp("|")) return node;
    }
  }

  // One `name(args)` after a `|`.
  absl::StatusOr<ExprPtr> ParseOneFilter(ExprPtr node) {
    const int line = Cur().line;
    PARSE_ASSIGN_OR_RETURN(name, ExpectName());
    while (IsOp(".")) {
      Next();
      PARSE_ASSIGN_OR_RETURN(part, ExpectName());
      name += "." + part;
    }
    const int id = FindFilter(name);
    if (id < 0) return Error(absl::StrCat("filter \"", name, "\" is not supported"), line);
    auto e = Make(Expr::Kind::kFilter, line);
    e->name = name;
    e->id = id;
    e->args.push_back(std::move(node));
    if (IsOp("(")) PARSE_RETURN_IF_ERROR(ParseCallArgs(e.get()));
    return e;
  }

  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node) {
    while (true) {
      const int line = Cur().line;
      if (IsOp("|")) {
        Next();
        PARSE_ASSIGN_OR_RETURN(filtered, ParseOneFilter(std::move(node)));
        node = std::move(filtered);
      } else if (IsName("is")) {
        Next();
        bool negated = false;
        if (IsName("not")) {
          negated = true;
          Next();
        }
        std::string name;
        if (Cur().type == TokenType::kName) {
          name = Cur().text;
        } else if (Cur().type == TokenType::kOp &&
                   (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" ||
                    Cur().text == "<=" || Cur().text == ">" || Cur().text == ">=")) {
          name = Cur().text;
        } else {
          return Unexpected("a test name after 'is'");
        }
        Next();
        const int id = FindTest(name);
        if (id < 0) return Error(absl::StrCat("test \"", name, "\" is not supported"), line);
        auto e = Make(Expr::Kind::kTest, line);
        e->name = name;
        e->id = id;
        e->negated = negated;
        e->args.push_back(std::move(node));
        if (IsOp("(")) {
          PARSE_RETURN_IF_ERROR(ParseCallArgs(e.get()));
        } else if ((Cur().type == TokenType::kName || Cur().type == TokenType::kString ||
                    Cur().type == TokenType::kInt || Cur().type == TokenType::kFloat ||
                    IsOp("[") || IsOp("{")) &&
                   !IsName("else") && !IsName("or") && !IsName("and") && !IsName("if") &&
                   !IsName("is") && !IsName("not") && !IsName("in")) {
          // `x is divisibleby 3`: one argument without parentheses.
          PARSE_ASSIGN_OR_RETURN(arg, ParsePrimary());
          PARSE_ASSIGN_OR_RETURN(post, ParsePostfix(std::move(arg)));
          e->args.push_back(std::move(post));
        }
        node = std::move(e);
      } else if (IsOp("(")) {
        PARSE_ASSIGN_OR_RETURN(call, ParseCall(std::move(node)));
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::set<std::string> defined_names_;
  std::vector<std::pair<std::string, int>> called_names_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Template>> Parse(absl::string_view source) {
  auto tokens = Tokenize(source);
  if (!tokens.ok()) return tokens.status();
  return Parser(*std::move(tokens)).Run();
}

}  // namespace deepinfer::engine::jinja
