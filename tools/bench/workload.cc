#include "tools/bench/workload.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace deepinfer::bench {
namespace {

constexpr const char* kWords[] = {
    "the",     "system",  "request", "token",  "cache",   "model",   "value",   "return",
    "button",  "layout",  "login",   "page",   "user",    "error",   "update",  "render",
    "state",   "config",  "server",  "client", "stream",  "block",   "memory",  "thread",
    "compute", "result",  "number",  "string", "message", "handler", "queue",   "worker",
    "prefix",  "decode",  "prefill", "weight", "matrix",  "vector",  "index",   "option",
    "and",     "with",    "from",    "into",   "over",    "under",   "before",  "after",
    "small",   "large",   "fast",    "slow",   "new",     "old",     "first",   "last",
    "move",    "change",  "add",     "remove", "check",   "test",    "build",   "run"};
constexpr const char* kCode[] = {
    "int",    "return", "if",     "else",  "for",    "while", "const", "auto",  "void",
    "struct", "class",  "public", "(",     ")",      "{",     "}",     ";",     "=",
    "==",     "+",      "-",      "*",     "->",     "::",    "std",   "size",  "data",
    "value",  "index",  "count",  "state", "button", "style", "top",   "right", "render",
    "props",  "div",    "<",      ">",     "/",      "0",     "1",     "x",     "y"};

int Clamp(double v, int lo, int hi) {
  return std::max(lo, std::min(hi, static_cast<int>(std::lround(v))));
}

}  // namespace

std::string RandomText(uint64_t seed, int words, bool code_like) {
  std::mt19937_64 rng(seed);
  std::string out;
  const size_t n = code_like ? std::size(kCode) : std::size(kWords);
  for (int i = 0; i < words; ++i) {
    const char* w = code_like ? kCode[rng() % n] : kWords[rng() % n];
    if (i > 0) out += (code_like && rng() % 8 == 0) ? "\n" : " ";
    out += w;
  }
  return out;
}

absl::StatusOr<std::vector<SessionPlan>> GenerateWorkload(const WorkloadOptions& o) {
  if (o.kind != "chat" && o.kind != "coding" && o.kind != "summarize" && o.kind != "mixed") {
    return absl::InvalidArgumentError(absl::StrCat(
        "kind: expected chat, coding, summarize or mixed, got \"", o.kind, "\""));
  }
  if (o.kind == "mixed" && !(o.mixed_coding_fraction >= 0 && o.mixed_coding_fraction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("mixed_coding_fraction: expected in [0, 1], got ", o.mixed_coding_fraction));
  }
  if (o.sessions < 1) {
    return absl::InvalidArgumentError(absl::StrCat("sessions: expected >= 1, got ", o.sessions));
  }
  if (o.max_input_words < 1 || o.max_output_tokens < 1) {
    return absl::InvalidArgumentError("max_input_words / max_output_tokens: expected >= 1");
  }
  if ((o.kind == "coding" || o.kind == "mixed") && o.coding_turns < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("coding_turns: expected >= 1, got ", o.coding_turns));
  }
  if (o.sigma < 0) {
    return absl::InvalidArgumentError(absl::StrCat("sigma: expected >= 0, got ", o.sigma));
  }
  std::mt19937_64 rng(o.seed);
  std::vector<SessionPlan> out;
  out.reserve(o.sessions);
  for (int s = 0; s < o.sessions; ++s) {
    SessionPlan p;
    p.id = static_cast<uint64_t>(s);
    const uint64_t text_seed = rng();
    std::string kind = o.kind;
    if (kind == "mixed") {
      kind = std::uniform_real_distribution<double>(0, 1)(rng) < o.mixed_coding_fraction
                 ? "coding"
                 : "chat";
    }
    if (kind == "chat") {
      std::lognormal_distribution<double> in(std::log(o.chat_input_words), o.sigma);
      std::lognormal_distribution<double> outl(std::log(o.chat_output_tokens), o.sigma);
      const int words = Clamp(in(rng), 1, o.max_input_words);
      p.system = "You are a helpful assistant.";
      p.turns.push_back({RandomText(text_seed, words, false),
                         static_cast<uint32_t>(Clamp(outl(rng), 1, o.max_output_tokens))});
    } else if (kind == "coding") {
      const int context = Clamp(o.coding_context_words, 1, o.max_input_words);
      p.system = absl::StrCat("You are a coding agent. Project files follow.\n",
                              RandomText(text_seed, context, true));
      p.think_time_s = o.coding_think_time_s;
      for (int t = 0; t < o.coding_turns; ++t) {
        p.turns.push_back(
            {absl::StrCat("Turn ", t + 1, ": ",
                          RandomText(text_seed + 1000003ull * (t + 1),
                                     Clamp(o.coding_instruction_words, 1, o.max_input_words),
                                     false)),
             static_cast<uint32_t>(Clamp(o.coding_answer_tokens, 1, o.max_output_tokens))});
      }
    } else {
      const int words = Clamp(o.summarize_document_words, 1, o.max_input_words);
      p.turns.push_back(
          {absl::StrCat("Summarize this document:\n", RandomText(text_seed, words, false)),
           static_cast<uint32_t>(Clamp(o.summarize_output_tokens, 1, o.max_output_tokens))});
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace deepinfer::bench
