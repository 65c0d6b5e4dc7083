#include "engine/chat_template/chat_template.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/chat_template/internal/ast.h"
#include "engine/chat_template/internal/builtins.h"
#include "engine/chat_template/internal/ops.h"
#include "engine/chat_template/internal/parser.h"
#include "engine/chat_template/internal/value.h"

namespace deepinfer::engine {
namespace {

using jinja::Body;
using jinja::CallArgs;
using jinja::Expr;
using jinja::Node;
using jinja::Value;

#define RETURN_IF_ERROR(expr)              \
  do {                                     \
    absl::Status status_ = (expr);         \
    if (!status_.ok()) return status_;     \
  } while (false)

#define ASSIGN_OR_RETURN(lhs, expr)                  \
  auto lhs##_or = (expr);                            \
  if (!lhs##_or.ok()) return lhs##_or.status();      \
  auto lhs = std::move(lhs##_or).value()

constexpr const char* kLinePayload = "deepinfer.chat_template/line";

// Prefixes the line of the innermost failing expression, once.
absl::Status AtLine(const absl::Status& st, int line) {
  if (jinja::IsRaisedException(st) || st.GetPayload(kLinePayload).has_value()) return st;
  absl::Status out(st.code(), absl::StrCat("chat template line ", line, ": ", st.message()));
  out.SetPayload(kLinePayload, absl::Cord(absl::StrCat(line)));
  return out;
}

absl::Status LimitError(absl::string_view what) {
  absl::Status st = absl::InvalidArgumentError(absl::StrCat("chat template exceeded ", what));
  st.SetPayload(kLinePayload, absl::Cord("0"));
  return st;
}

// Variables of one scope; lookups walk to the parent.
struct Scope {
  Scope* parent = nullptr;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* Find(absl::string_view name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent) {
      for (auto it = s->vars.rbegin(); it != s->vars.rend(); ++it) {
        if (it->first == name) return &it->second;
      }
    }
    return nullptr;
  }
  void Set(absl::string_view name, Value v) {
    for (auto& [k, val] : vars) {
      if (k == name) {
        val = std::move(v);
        return;
      }
    }
    vars.emplace_back(std::string(name), std::move(v));
  }
};

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  Renderer(const ChatTemplate::Options& options, absl::Time now, Scope* root)
      : options_(options), now_(now), root_(root) {}

  absl::Status Run(const Body& body, std::string* out) {
    ASSIGN_OR_RETURN(flow, ExecBody(body, root_, out));
    (void)flow;
    return absl::OkStatus();
  }

 private:
  struct DepthGuard {
    explicit DepthGuard(Renderer* r) : r(r) { ++r->depth_; }
    ~DepthGuard() { --r->depth_; }
    Renderer* r;
  };

  absl::Status Enter() {
    if (++steps_ > options_.max_steps) {
      return LimitError(absl::StrCat("its budget of ", options_.max_steps, " steps"));
    }
    if (depth_ > options_.max_depth) {
      return LimitError(absl::StrCat("the nesting limit of ", options_.max_depth));
    }
    return absl::OkStatus();
  }

  // Charges work proportional to the size of a value an operation built.
  absl::Status Charge(const Value& v) {
    if (v.is_string()) {
      steps_ += static_cast<int64_t>(v.as_string().size() / 256);
    } else if (v.is_list()) {
      steps_ += static_cast<int64_t>(v.as_list().items.size() / 16);
    }
    if (steps_ > options_.max_steps) {
      return LimitError(absl::StrCat("its budget of ", options_.max_steps, " steps"));
    }
    return absl::OkStatus();
  }

  absl::Status Append(std::string* out, absl::string_view s) {
    if (out->size() + s.size() > options_.max_output_bytes) {
      return LimitError(absl::StrCat("the output limit of ", options_.max_output_bytes, " bytes"));
    }
    out->append(s.data(), s.size());
    return absl::OkStatus();
  }

  absl::StatusOr<Flow> ExecBody(const Body& body, Scope* scope, std::string* out) {
    for (const auto& node : body) {
      ASSIGN_OR_RETURN(flow, Exec(*node, scope, out));
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  absl::StatusOr<Flow> Exec(const Node& n, Scope* scope, std::string* out) {
    DepthGuard guard(this);
    RETURN_IF_ERROR(Enter());
    switch (n.kind) {
      case Node::Kind::kText:
        RETURN_IF_ERROR(Append(out, n.text));
        return Flow::kNormal;
      case Node::Kind::kOutput: {
        ASSIGN_OR_RETURN(v, Eval(*n.expr, scope));
        RETURN_IF_ERROR(Append(out, v.Str()));
        return Flow::kNormal;
      }
      case Node::Kind::kIf:
        for (size_t i = 0; i < n.conds.size(); ++i) {
          ASSIGN_OR_RETURN(c, Eval(*n.conds[i], scope));
          if (c.Truthy()) return ExecBody(n.bodies[i], scope, out);
        }
        return ExecBody(n.else_body, scope, out);
      case Node::Kind::kFor: return ExecFor(n, scope, out);
      case Node::Kind::kSet: {
        ASSIGN_OR_RETURN(v, Eval(*n.expr, scope));
        RETURN_IF_ERROR(Assign(n, v, scope));
        return Flow::kNormal;
      }
      case Node::Kind::kSetBlock: {
        std::string captured;
        ASSIGN_OR_RETURN(flow, ExecBody(n.body, scope, &captured));
        (void)flow;
        scope->Set(n.targets[0], Value::String(std::move(captured)));
        return Flow::kNormal;
      }
      case Node::Kind::kMacro: {
        jinja::Callable c;
        c.kind = jinja::kMacro;
        c.name = n.name;
        c.payload = std::shared_ptr<const void>(std::shared_ptr<const void>(), &n);
        scope->Set(n.name, Value::MakeCallable(std::move(c)));
        return Flow::kNormal;
      }
      case Node::Kind::kWith: {
        Scope inner;
        inner.parent = scope;
        for (size_t i = 0; i < n.targets.size(); ++i) {
          ASSIGN_OR_RETURN(v, Eval(*n.values[i], scope));
          inner.Set(n.targets[i], std::move(v));
        }
        return ExecBody(n.body, &inner, out);
      }
      case Node::Kind::kScope: return ExecBody(n.body, scope, out);
      case Node::Kind::kFilterBlock: {
        Scope inner;
        inner.parent = scope;
        std::string captured;
        ASSIGN_OR_RETURN(flow, ExecBody(n.body, scope, &captured));
        inner.Set(jinja::kFilterInput, Value::String(std::move(captured)));
        ASSIGN_OR_RETURN(v, Eval(*n.expr, &inner));
        RETURN_IF_ERROR(Append(out, v.Str()));
        return flow;
      }
      case Node::Kind::kBreak: return Flow::kBreak;
      case Node::Kind::kContinue: return Flow::kContinue;
    }
    return absl::InternalError("unknown statement");
  }

  absl::Status Bind(const Node& n, const Value& v, Scope* scope) {
    if (!n.unpack) {
      scope->Set(n.targets[0], v);
      return absl::OkStatus();
    }
    auto items = jinja::Iterate(v);
    if (!items.ok()) return AtLine(items.status(), n.line);
    if (items->size() != n.targets.size()) {
      return AtLine(absl::InvalidArgumentError(absl::StrCat(
                        items->size() > n.targets.size() ? "too many" : "not enough",
                        " values to unpack (expected ", n.targets.size(), ", got ",
                        items->size(), ")")),
                    n.line);
    }
    for (size_t i = 0; i < items->size(); ++i) scope->Set(n.targets[i], (*items)[i]);
    return absl::OkStatus();
  }

  absl::Status Assign(const Node& n, const Value& v, Scope* scope) {
    if (n.attr.empty()) return Bind(n, v, scope);
    const Value* target = scope->Find(n.targets[0]);
    if (target == nullptr || !target->is_namespace()) {
      return AtLine(absl::InvalidArgumentError(absl::StrCat(
                        "cannot assign attribute on non-namespace object '", n.targets[0], "'")),
                    n.line);
    }
    if (v.depth() + 1 > jinja::kMaxValueDepth) {
      return AtLine(absl::InvalidArgumentError("value nested too deeply"), n.line);
    }
    auto& attrs = target->as_namespace().attrs.items;
    for (auto& [k, val] : attrs) {
      if (k.is_string() && k.as_string() == n.attr) {
        val = v;
        return absl::OkStatus();
      }
    }
    attrs.emplace_back(Value::String(n.attr), v);
    return absl::OkStatus();
  }

  absl::StatusOr<Value> MakeLoop(int64_t i, const std::vector<Value>& items) {
    // Keys are built once; the loop object is a plain dict, as `loop.x` and `loop['x']` read it.
    static const auto* const kKeys = new std::vector<Value>{
        Value::String("index"),  Value::String("index0"), Value::String("revindex"),
        Value::String("revindex0"), Value::String("first"), Value::String("last"),
        Value::String("length"), Value::String("depth"),  Value::String("depth0"),
        Value::String("cycle"),  Value::String("previtem"), Value::String("nextitem")};
    const auto& k = *kKeys;
    const int64_t n = static_cast<int64_t>(items.size());
    jinja::Callable cycle;
    cycle.kind = jinja::kLoopCycle;
    cycle.name = "loop.cycle";
    cycle.bound.push_back(Value::Int(i));
    std::vector<std::pair<Value, Value>> f = {
        {k[0], Value::Int(i + 1)},       {k[1], Value::Int(i)},
        {k[2], Value::Int(n - i)},       {k[3], Value::Int(n - i - 1)},
        {k[4], Value::Bool(i == 0)},     {k[5], Value::Bool(i == n - 1)},
        {k[6], Value::Int(n)},           {k[7], Value::Int(1)},
        {k[8], Value::Int(0)},           {k[9], Value::MakeCallable(std::move(cycle))}};
    if (i > 0) f.emplace_back(k[10], items[i - 1]);
    if (i + 1 < n) f.emplace_back(k[11], items[i + 1]);
    return Value::MakeDict(std::move(f), /*keys_unique=*/true);
  }

  absl::StatusOr<Flow> ExecFor(const Node& n, Scope* scope, std::string* out) {
    ASSIGN_OR_RETURN(seq, Eval(*n.expr, scope));
    auto all = jinja::Iterate(seq);
    if (!all.ok()) return AtLine(all.status(), n.expr->line);
    std::vector<Value> items;
    if (n.filter) {
      for (const Value& item : *all) {
        RETURN_IF_ERROR(Enter());
        Scope probe;
        probe.parent = scope;
        RETURN_IF_ERROR(Bind(n, item, &probe));
        ASSIGN_OR_RETURN(keep, Eval(*n.filter, &probe));
        if (keep.Truthy()) items.push_back(item);
      }
    } else {
      items = *std::move(all);
    }
    for (size_t i = 0; i < items.size(); ++i) {
      RETURN_IF_ERROR(Enter());
      Scope iter;
      iter.parent = scope;
      RETURN_IF_ERROR(Bind(n, items[i], &iter));
      ASSIGN_OR_RETURN(loop, MakeLoop(static_cast<int64_t>(i), items));
      iter.Set("loop", std::move(loop));
      ASSIGN_OR_RETURN(flow, ExecBody(n.body, &iter, out));
      if (flow == Flow::kBreak) break;
    }
    if (items.empty()) return ExecBody(n.else_body, scope, out);
    return Flow::kNormal;
  }

  absl::StatusOr<Value> Eval(const Expr& e, Scope* scope) {
    DepthGuard guard(this);
    RETURN_IF_ERROR(Enter());
    auto v = EvalImpl(e, scope);
    if (!v.ok()) return AtLine(v.status(), e.line);
    return v;
  }

  absl::StatusOr<CallArgs> EvalArgs(const Expr& e, size_t first, Scope* scope) {
    CallArgs a;
    for (size_t i = first; i < e.args.size(); ++i) {
      ASSIGN_OR_RETURN(v, Eval(*e.args[i], scope));
      a.args.push_back(std::move(v));
    }
    for (const auto& [k, x] : e.kwargs) {
      ASSIGN_OR_RETURN(v, Eval(*x, scope));
      a.kwargs.emplace_back(k, std::move(v));
    }
    return a;
  }

  absl::StatusOr<Value> EvalImpl(const Expr& e, Scope* scope) {
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.literal;
      case Expr::Kind::kName: {
        if (const Value* v = scope->Find(e.name)) return *v;
        if (jinja::IsGlobalFunction(e.name)) {
          jinja::Callable c;
          c.kind = jinja::kGlobalFunction;
          c.name = e.name;
          return Value::MakeCallable(std::move(c));
        }
        return Value::Undefined(absl::StrCat("'", e.name, "' is undefined"));
      }
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        std::vector<Value> items;
        items.reserve(e.args.size());
        for (const auto& a : e.args) {
          ASSIGN_OR_RETURN(v, Eval(*a, scope));
          items.push_back(std::move(v));
        }
        return Value::MakeList(std::move(items), e.kind == Expr::Kind::kTuple);
      }
      case Expr::Kind::kDict: {
        std::vector<std::pair<Value, Value>> items;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          ASSIGN_OR_RETURN(k, Eval(*e.args[i], scope));
          ASSIGN_OR_RETURN(v, Eval(*e.args[i + 1], scope));
          if (k.is_list() && !k.as_list().is_tuple) {
            return absl::InvalidArgumentError("unhashable type: 'list'");
          }
          if (k.is_dict()) return absl::InvalidArgumentError("unhashable type: 'dict'");
          items.emplace_back(std::move(k), std::move(v));
        }
        return Value::MakeDict(std::move(items));
      }
      case Expr::Kind::kGetAttr: {
        ASSIGN_OR_RETURN(obj, Eval(*e.args[0], scope));
        return jinja::GetAttr(obj, e.name);
      }
      case Expr::Kind::kGetItem: {
        ASSIGN_OR_RETURN(obj, Eval(*e.args[0], scope));
        ASSIGN_OR_RETURN(key, Eval(*e.args[1], scope));
        return jinja::GetItem(obj, key);
      }
      case Expr::Kind::kSlice: {
        ASSIGN_OR_RETURN(obj, Eval(*e.args[0], scope));
        Value bounds[3] = {Value::None(), Value::None(), Value::None()};
        for (int i = 0; i < 3; ++i) {
          if (!e.args[i + 1]) continue;
          ASSIGN_OR_RETURN(b, Eval(*e.args[i + 1], scope));
          bounds[i] = std::move(b);
        }
        ASSIGN_OR_RETURN(r, jinja::GetSlice(obj, bounds[0], bounds[1], bounds[2]));
        RETURN_IF_ERROR(Charge(r));
        return r;
      }
      case Expr::Kind::kNot: {
        ASSIGN_OR_RETURN(v, Eval(*e.args[0], scope));
        return Value::Bool(!v.Truthy());
      }
      case Expr::Kind::kNeg:
      case Expr::Kind::kPos: {
        ASSIGN_OR_RETURN(v, Eval(*e.args[0], scope));
        return jinja::UnaryOp(e.kind == Expr::Kind::kNeg ? "-" : "+", v);
      }
      case Expr::Kind::kBinary: {
        ASSIGN_OR_RETURN(a, Eval(*e.args[0], scope));
        ASSIGN_OR_RETURN(b, Eval(*e.args[1], scope));
        ASSIGN_OR_RETURN(r, jinja::BinaryOp(e.name, a, b));
        RETURN_IF_ERROR(Charge(r));
        return r;
      }
      case Expr::Kind::kConcat: {
        std::string s;
        for (const auto& a : e.args) {
          ASSIGN_OR_RETURN(v, Eval(*a, scope));
          s += v.Str();
          if (s.size() > jinja::kMaxStringBytes) {
            return absl::InvalidArgumentError("string larger than the size limit");
          }
        }
        Value r = Value::String(std::move(s));
        RETURN_IF_ERROR(Charge(r));
        return r;
      }
      case Expr::Kind::kAnd:
      case Expr::Kind::kOr: {
        ASSIGN_OR_RETURN(a, Eval(*e.args[0], scope));
        if (a.Truthy() == (e.kind == Expr::Kind::kOr)) return a;
        return Eval(*e.args[1], scope);
      }
      case Expr::Kind::kCompare: {
        ASSIGN_OR_RETURN(left, Eval(*e.args[0], scope));
        for (size_t i = 0; i < e.ops.size(); ++i) {
          ASSIGN_OR_RETURN(right, Eval(*e.args[i + 1], scope));
          const std::string& op = e.ops[i];
          bool r;
          if (op == "==" || op == "!=") {
            r = left.Equals(right) == (op == "==");
          } else if (op == "in" || op == "not in") {
            ASSIGN_OR_RETURN(c, jinja::Contains(right, left));
            r = c == (op == "in");
          } else {
            ASSIGN_OR_RETURN(c, jinja::Compare(left, right, op));
            r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
          }
          if (!r) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case Expr::Kind::kCondExpr: {
        ASSIGN_OR_RETURN(c, Eval(*e.args[1], scope));
        if (c.Truthy()) return Eval(*e.args[0], scope);
        if (e.args[2]) return Eval(*e.args[2], scope);
        return Value::Undefined(absl::StrCat("the inline if-expression on line ", e.line,
                                             " evaluated to false and no else section was "
                                             "defined."));
      }
      case Expr::Kind::kCall: {
        ASSIGN_OR_RETURN(callee, Eval(*e.args[0], scope));
        ASSIGN_OR_RETURN(args, EvalArgs(e, 1, scope));
        ASSIGN_OR_RETURN(r, Call(callee, std::move(args)));
        RETURN_IF_ERROR(Charge(r));
        return r;
      }
      case Expr::Kind::kFilter: {
        ASSIGN_OR_RETURN(input, Eval(*e.args[0], scope));
        ASSIGN_OR_RETURN(args, EvalArgs(e, 1, scope));
        ASSIGN_OR_RETURN(r, jinja::ApplyFilter(e.id, input, args));
        RETURN_IF_ERROR(Charge(r));
        return r;
      }
      case Expr::Kind::kTest: {
        ASSIGN_OR_RETURN(input, Eval(*e.args[0], scope));
        ASSIGN_OR_RETURN(args, EvalArgs(e, 1, scope));
        ASSIGN_OR_RETURN(r, jinja::ApplyTest(e.id, input, args));
        return Value::Bool(r != e.negated);
      }
    }
    return absl::InternalError("unknown expression");
  }

  absl::StatusOr<Value> Call(const Value& callee, CallArgs args) {
    if (callee.is_undefined()) return jinja::UndefinedError(callee);
    if (!callee.is_callable()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", callee.TypeName(), "' object is not callable"));
    }
    const jinja::Callable& c = callee.as_callable();
    switch (c.kind) {
      case jinja::kGlobalFunction: return jinja::CallGlobal(c.name, args, now_);
      case jinja::kBoundMethod: return jinja::CallMethod(c.bound[0], c.name, args);
      case jinja::kLoopCycle: {
        if (args.args.empty()) return absl::InvalidArgumentError("no items for cycling given");
        const int64_t i = c.bound[0].as_int() % static_cast<int64_t>(args.args.size());
        return args.args[i];
      }
      case jinja::kMacro:
        return CallMacro(*static_cast<const Node*>(c.payload.get()), std::move(args));
    }
    return absl::InternalError("unknown callable");
  }

  absl::StatusOr<Value> CallMacro(const Node& m, CallArgs args) {
    if (args.args.size() > m.params.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "macro '", m.name, "' takes not more than ", m.params.size(), " argument(s)"));
    }
    Scope local;
    local.parent = root_;
    std::vector<bool> given(m.params.size(), false);
    for (size_t i = 0; i < args.args.size(); ++i) {
      local.Set(m.params[i], std::move(args.args[i]));
      given[i] = true;
    }
    for (auto& [k, v] : args.kwargs) {
      size_t i = 0;
      while (i < m.params.size() && m.params[i] != k) ++i;
      if (i == m.params.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("macro '", m.name, "' takes no keyword argument '", k, "'"));
      }
      if (given[i]) {
        return absl::InvalidArgumentError(
            absl::StrCat("macro '", m.name, "' got multiple values for argument '", k, "'"));
      }
      local.Set(k, std::move(v));
      given[i] = true;
    }
    for (size_t i = 0; i < m.params.size(); ++i) {
      if (given[i]) continue;
      if (m.values[i]) {
        ASSIGN_OR_RETURN(d, Eval(*m.values[i], &local));
        local.Set(m.params[i], std::move(d));
      } else {
        local.Set(m.params[i],
                  Value::Undefined(absl::StrCat("parameter '", m.params[i], "' was not provided")));
      }
    }
    std::string out;
    ASSIGN_OR_RETURN(flow, ExecBody(m.body, &local, &out));
    (void)flow;
    return Value::String(std::move(out));
  }

  const ChatTemplate::Options& options_;
  const absl::Time now_;
  Scope* const root_;
  int64_t steps_ = 0;
  int depth_ = 0;
};

}  // namespace

ChatTemplate::ChatTemplate(std::unique_ptr<jinja::Template> tmpl, Options options)
    : tmpl_(std::move(tmpl)), options_(std::move(options)) {}

ChatTemplate::~ChatTemplate() = default;

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Create(absl::string_view source) {
  return Create(source, Options());
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Create(absl::string_view source,
                                                                   Options options) {
  auto tmpl = jinja::Parse(source);
  if (!tmpl.ok()) return tmpl.status();
  return std::unique_ptr<ChatTemplate>(new ChatTemplate(*std::move(tmpl), std::move(options)));
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context) const {
  if (!context.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template context must be a JSON object, found ", context.type_name()));
  }
  Scope root;
  root.vars.reserve(context.size());
  for (auto it = context.begin(); it != context.end(); ++it) {
    auto v = Value::FromJson(it.value());
    if (!v.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("chat template context \"", it.key(), "\": ", v.status().message()));
    }
    root.vars.emplace_back(it.key(), *std::move(v));
  }
  const absl::Time now = options_.clock ? options_.clock() : absl::Now();
  Renderer renderer(options_, now, &root);
  std::string out;
  absl::Status st = renderer.Run(tmpl_->body, &out);
  if (!st.ok()) {
    absl::Status clean(st.code(), st.message());  // Drop internal payloads.
    return clean;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> LoadChatTemplate(
    const nlohmann::ordered_json& tokenizer_config, bool has_tools) {
  if (!tokenizer_config.is_object() || !tokenizer_config.contains("chat_template") ||
      tokenizer_config["chat_template"].is_null()) {
    return absl::NotFoundError("tokenizer_config has no \"chat_template\"");
  }
  const nlohmann::ordered_json& ct = tokenizer_config["chat_template"];
  if (ct.is_string()) return ChatTemplate::Create(ct.get<std::string>());
  std::vector<std::pair<std::string, std::string>> named;
  if (ct.is_array()) {
    for (const auto& entry : ct) {
      if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
          !entry["name"].is_string() || !entry["template"].is_string()) {
        return absl::InvalidArgumentError(
            "chat_template list entries must be {\"name\": string, \"template\": string}");
      }
      named.emplace_back(entry["name"].get<std::string>(), entry["template"].get<std::string>());
    }
  } else if (ct.is_object()) {
    for (auto it = ct.begin(); it != ct.end(); ++it) {
      if (!it.value().is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("chat_template \"", it.key(), "\" must be a string"));
      }
      named.emplace_back(it.key(), it.value().get<std::string>());
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "chat_template must be a string or a list of named templates, found ", ct.type_name()));
  }
  auto find = [&](absl::string_view name) -> const std::string* {
    for (const auto& [n, t] : named) {
      if (n == name) return &t;
    }
    return nullptr;
  };
  const std::string* chosen = has_tools ? find("tool_use") : nullptr;
  if (chosen == nullptr) chosen = find("default");
  if (chosen == nullptr) {
    std::vector<std::string> names;
    for (const auto& [n, t] : named) names.push_back(n);
    return absl::InvalidArgumentError(absl::StrCat(
        "chat_template has no \"default\" template", has_tools ? " or \"tool_use\"" : "",
        "; it has: ", absl::StrJoin(names, ", ")));
  }
  return ChatTemplate::Create(*chosen);
}

}  // namespace deepinfer::engine
