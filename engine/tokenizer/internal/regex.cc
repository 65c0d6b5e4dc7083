#include "engine/tokenizer/internal/regex.h"

#include <pcre2.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/tokenizer/internal/utf8.h"

namespace deepinfer::tokenizer::internal {
namespace {

// Per-thread match state: the match data and a JIT stack large enough for long whitespace runs
// under patterns such as `\s+(?!\S)`.
struct ThreadMatchState {
  pcre2_match_data* match_data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;

  ThreadMatchState() {
    match_data = pcre2_match_data_create(16, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (jit_stack != nullptr) pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~ThreadMatchState() {
    if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(match_data);
  }
};

ThreadMatchState& MatchState() {
  thread_local ThreadMatchState state;
  return state;
}

std::string ErrorText(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof(buf)) < 0) return absl::StrCat("error ", code);
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Regex>> Regex::Create(absl::string_view pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "expected a valid regular expression, found \"%s\" (error at offset %d: %s)",
        std::string(pattern), offset, ErrorText(error)));
  }
  // JIT is an optimisation only: where the build lacks it, the interpreter is used.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<Regex>(new Regex(std::string(pattern), code));
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::CreateLiteral(absl::string_view literal) {
  std::string quoted;
  for (char c : literal) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x80 && !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) {
      if (c == '\0') {
        quoted += "\\x{0}";
        continue;
      }
      quoted.push_back('\\');
    }
    quoted.push_back(c);
  }
  return Create(quoted);
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

absl::Status Regex::FindAll(absl::string_view text,
                            std::vector<std::pair<size_t, size_t>>* matches) const {
  matches->clear();
  ThreadMatchState& state = MatchState();
  auto* code = static_cast<pcre2_code*>(code_);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), start, PCRE2_NO_UTF_CHECK,
                               state.match_data, state.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "regex \"%s\" failed on a %d-byte input: %s", pattern_, text.size(), ErrorText(rc)));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(state.match_data);
    const size_t b = ov[0], e = ov[1];
    matches->emplace_back(b, e);
    if (e > b) {
      start = e;
    } else {
      if (e >= text.size()) break;
      start = e + SequenceLengthFromLead(static_cast<unsigned char>(text[e]));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Regex::Search(absl::string_view text) const {
  ThreadMatchState& state = MatchState();
  const int rc =
      pcre2_match(static_cast<pcre2_code*>(code_), reinterpret_cast<PCRE2_SPTR>(text.data()),
                  text.size(), 0, PCRE2_NO_UTF_CHECK, state.match_data, state.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "regex \"%s\" failed on a %d-byte input: %s", pattern_, text.size(), ErrorText(rc)));
  }
  return true;
}

}  // namespace deepinfer::tokenizer::internal
