#include "engine/chat_template/internal/lexer.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/internal/utf8.h"

namespace deepinfer::engine::jinja {
namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string RStrip(absl::string_view s) {
  size_t n = s.size();
  while (n > 0 && IsSpace(s[n - 1])) --n;
  return std::string(s.substr(0, n));
}

// \u/\U escapes: surrogates and values beyond U+10FFFF become U+FFFD, as Python does when
// encoding them for output.
void AppendUtf8(std::string* out, uint32_t cp) {
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;
  tokenizer::internal::AppendUtf8(static_cast<char32_t>(cp), out);
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {}

  absl::StatusOr<std::vector<Token>> Run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t at = FindTagStart(pos_);
      if (at == std::string::npos) {
        Emit(TokenType::kText, src_.substr(pos_), line_);
        CountLines(pos_, src_.size());
        pos_ = src_.size();
        break;
      }
      const char kind = src_[at + 1];
      char sign = 0;
      if (at + 2 < src_.size() && (src_[at + 2] == '-' || src_[at + 2] == '+')) {
        sign = src_[at + 2];
      }
      std::string text = src_.substr(pos_, at - pos_);
      if (sign == '-') {
        text = RStrip(text);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: drop spaces between the start of the line and a block or comment tag.
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size()) {
          bool all_space = true;
          for (size_t i = l_pos; i < text.size(); ++i) all_space &= IsSpace(text[i]);
          if (all_space) text.resize(l_pos);
        }
      }
      const int text_line = line_;
      CountLines(pos_, at);
      if (!text.empty()) Emit(TokenType::kText, std::move(text), text_line);
      pos_ = at + 2 + (sign != 0 ? 1 : 0);
      absl::Status st;
      if (kind == '#') {
        st = LexComment();
      } else if (kind == '%' && TryRawBlock()) {
        st = LexRawBody();
      } else {
        st = LexTag(kind == '{');
      }
      if (!st.ok()) return st;
      line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
    }
    tokens_.push_back(Token{TokenType::kEof, "", 0, 0, line_});
    return std::move(tokens_);
  }

 private:
  size_t FindTagStart(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  void CountLines(size_t from, size_t to) {
    for (size_t i = from; i < to && i < src_.size(); ++i) line_ += src_[i] == '\n';
  }

  void Emit(TokenType type, std::string text, int line) {
    tokens_.push_back(Token{type, std::move(text), 0, 0, line});
  }

  absl::Status Error(absl::string_view what, int line) const {
    return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", what));
  }

  // After a closing tag: `-` eats all following whitespace, `+` nothing, plain eats one "\n"
  // (trim_blocks) when `trim` is set.
  void AfterClose(char sign, bool trim) {
    if (sign == '-') {
      while (pos_ < src_.size() && IsSpace(src_[pos_])) {
        line_ += src_[pos_] == '\n';
        ++pos_;
      }
    } else if (sign == 0 && trim && pos_ < src_.size() && src_[pos_] == '\n') {
      ++line_;
      ++pos_;
    }
  }

  absl::Status LexComment() {
    const int start_line = line_;
    const size_t body = pos_;
    const size_t end = src_.find("#}", body);
    if (end == std::string::npos) return Error("comment is not closed with \"#}\"", start_line);
    char sign = 0;
    if (end > body && (src_[end - 1] == '-' || src_[end - 1] == '+')) sign = src_[end - 1];
    CountLines(body, end + 2);
    pos_ = end + 2;
    AfterClose(sign, /*trim=*/true);
    return absl::OkStatus();
  }

  // Matches `\s*raw\s*(-%}|%})` at pos_ (just after "{%" and its sign); consumes it on success.
  bool TryRawBlock() {
    size_t i = pos_;
    while (i < src_.size() && IsSpace(src_[i])) ++i;
    if (src_.compare(i, 3, "raw") != 0) return false;
    i += 3;
    while (i < src_.size() && IsSpace(src_[i])) ++i;
    char sign = 0;
    if (i < src_.size() && src_[i] == '-') {
      sign = '-';
      ++i;
    }
    if (src_.compare(i, 2, "%}") != 0) return false;
    CountLines(pos_, i + 2);
    pos_ = i + 2;
    AfterClose(sign, /*trim=*/false);  // Jinja does not apply trim_blocks to `{% raw %}`.
    return true;
  }

  absl::Status LexRawBody() {
    const int start_line = line_;
    for (size_t at = src_.find("{%", pos_); at != std::string::npos;
         at = src_.find("{%", at + 1)) {
      size_t i = at + 2;
      char open_sign = 0;
      if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) open_sign = src_[i++];
      while (i < src_.size() && IsSpace(src_[i])) ++i;
      if (src_.compare(i, 6, "endraw") != 0) continue;
      i += 6;
      while (i < src_.size() && IsSpace(src_[i])) ++i;
      char close_sign = 0;
      if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) close_sign = src_[i++];
      if (src_.compare(i, 2, "%}") != 0) continue;
      std::string text = src_.substr(pos_, at - pos_);
      if (open_sign == '-') {
        text = RStrip(text);
      } else if (open_sign != '+') {
        const size_t nl = text.rfind('\n');
        if (nl != std::string::npos) {
          bool all_space = true;
          for (size_t k = nl + 1; k < text.size(); ++k) all_space &= IsSpace(text[k]);
          if (all_space) text.resize(nl + 1);
        }
      }
      if (!text.empty()) Emit(TokenType::kText, std::move(text), line_);
      CountLines(pos_, i + 2);
      pos_ = i + 2;
      AfterClose(close_sign, /*trim=*/true);
      return absl::OkStatus();
    }
    return Error("raw block is not closed with {% endraw %}", start_line);
  }

  absl::Status LexTag(bool variable) {
    tokens_.push_back(
        Token{variable ? TokenType::kVarBegin : TokenType::kBlockBegin, "", 0, 0, line_});
    const int start_line = line_;
    std::string brackets;
    while (true) {
      while (pos_ < src_.size() && IsSpace(src_[pos_])) {
        line_ += src_[pos_] == '\n';
        ++pos_;
      }
      if (pos_ >= src_.size()) {
        return Error(variable ? "\"{{\" is not closed with \"}}\"" : "\"{%\" is not closed with \"%}\"",
                     start_line);
      }
      if (brackets.empty()) {
        const char* end = variable ? "}}" : "%}";
        char sign = 0;
        size_t len = 0;
        if (src_.compare(pos_, 2, end) == 0) {
          len = 2;
        } else if (src_[pos_] == '-' && src_.compare(pos_ + 1, 2, end) == 0) {
          sign = '-';
          len = 3;
        } else if (!variable && src_[pos_] == '+' && src_.compare(pos_ + 1, 2, end) == 0) {
          sign = '+';
          len = 3;
        }
        if (len > 0) {
          tokens_.push_back(
              Token{variable ? TokenType::kVarEnd : TokenType::kBlockEnd, "", 0, 0, line_});
          pos_ += len;
          AfterClose(sign, /*trim=*/!variable);
          return absl::OkStatus();
        }
      }
      const char c = src_[pos_];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) {
          ++e;
        }
        Emit(TokenType::kName, src_.substr(pos_, e - pos_), line_);
        pos_ = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        auto st = LexNumber();
        if (!st.ok()) return st;
      } else if (c == '\'' || c == '"') {
        auto st = LexString();
        if (!st.ok()) return st;
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                           "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                           ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};
        const char* match = nullptr;
        for (const char* op : kOps) {
          if (src_.compare(pos_, std::char_traits<char>::length(op), op) == 0) {
            match = op;
            break;
          }
        }
        if (match == nullptr) {
          return Error(absl::StrCat("unexpected character '", std::string(1, c), "'"), line_);
        }
        const std::string op = match;
        if (op == "(" || op == "[" || op == "{") {
          brackets.push_back(op[0]);
        } else if (op == ")" || op == "]" || op == "}") {
          const char want = op == ")" ? '(' : op == "]" ? '[' : '{';
          if (brackets.empty() || brackets.back() != want) {
            return Error(absl::StrCat("unexpected '", op, "'"), line_);
          }
          brackets.pop_back();
        }
        Emit(TokenType::kOp, op, line_);
        pos_ += op.size();
      }
    }
  }

  // Digits with optional '_' separators between them.
  size_t ScanDigits(size_t i) const {
    while (i < src_.size()) {
      if (std::isdigit(static_cast<unsigned char>(src_[i]))) {
        ++i;
      } else if (src_[i] == '_' && i + 1 < src_.size() &&
                 std::isdigit(static_cast<unsigned char>(src_[i + 1])) && i > 0 &&
                 std::isdigit(static_cast<unsigned char>(src_[i - 1]))) {
        ++i;
      } else {
        break;
      }
    }
    return i;
  }

  absl::Status LexNumber() {
    size_t e = ScanDigits(pos_);
    bool is_float = false;
    // No float right after a '.', so `x.0.1` is two item accesses, as in Jinja.
    const bool after_dot = pos_ > 0 && src_[pos_ - 1] == '.';
    if (!after_dot) {
      if (e + 1 < src_.size() && src_[e] == '.' &&
          std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
        e = ScanDigits(e + 1);
        is_float = true;
      }
      if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
        size_t k = e + 1;
        if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
        if (k < src_.size() && std::isdigit(static_cast<unsigned char>(src_[k]))) {
          e = ScanDigits(k);
          is_float = true;
        }
      }
    }
    std::string digits;
    for (size_t i = pos_; i < e; ++i) {
      if (src_[i] != '_') digits.push_back(src_[i]);
    }
    Token t{is_float ? TokenType::kFloat : TokenType::kInt, digits, 0, 0, line_};
    if (is_float) {
      t.float_value = std::strtod(digits.c_str(), nullptr);
    } else {
      errno = 0;
      char* end = nullptr;
      const long long v = std::strtoll(digits.c_str(), &end, 10);
      if (errno == ERANGE) return Error(absl::StrCat("integer ", digits, " is too large"), line_);
      t.int_value = v;
    }
    tokens_.push_back(std::move(t));
    pos_ = e;
    return absl::OkStatus();
  }

  // Python's "unicode-escape" decoding of the literal's body, as Jinja does.
  absl::Status LexString() {
    const char quote = src_[pos_];
    const int start_line = line_;
    std::string out;
    size_t i = pos_ + 1;
    while (true) {
      if (i >= src_.size()) return Error("string literal is not closed", start_line);
      const char c = src_[i];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        out.push_back(c);
        ++i;
        continue;
      }
      if (i + 1 >= src_.size()) return Error("string literal is not closed", start_line);
      const char n = src_[i + 1];
      i += 2;
      switch (n) {
        case '\n': ++line_; break;
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'v': out.push_back('\v'); break;
        case 'x':
        case 'u':
        case 'U': {
          const int len = n == 'x' ? 2 : n == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (int k = 0; k < len; ++k) {
            const int d = i + k < src_.size() ? HexDigit(src_[i + k]) : -1;
            if (d < 0) {
              return Error(absl::StrCat("truncated \\", std::string(1, n), " escape in string"),
                           line_);
            }
            cp = cp * 16 + d;
          }
          i += len;
          AppendUtf8(&out, cp);
          break;
        }
        default:
          if (n >= '0' && n <= '7') {
            uint32_t cp = n - '0';
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k) {
              cp = cp * 8 + (src_[i++] - '0');
            }
            AppendUtf8(&out, cp);
          } else {
            out.push_back('\\');  // Unknown escapes keep their backslash.
            out.push_back(n);
            if (n == '\n') ++line_;
          }
      }
    }
    tokens_.push_back(Token{TokenType::kString, std::move(out), 0, 0, start_line});
    pos_ = i + 1;
    return absl::OkStatus();
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source) {
  std::string normalized;
  normalized.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      normalized.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      normalized.push_back(source[i]);
    }
  }
  // keep_trailing_newline=False drops one final newline.
  if (!normalized.empty() && normalized.back() == '\n') normalized.pop_back();
  return Lexer(std::move(normalized)).Run();
}

}  // namespace deepinfer::engine::jinja
