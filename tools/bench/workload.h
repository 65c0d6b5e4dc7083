// Benchmark workloads, generated from a seed so two runs (or the two sides of a comparison) send
// exactly the same requests.
//
// A workload is a list of sessions. A session is one conversation: a system context and one or
// more turns, sent one after the other (turn k+1 leaves after turn k's answer arrived, plus the
// session's think time), each turn resending the whole history (system context, earlier
// instructions and the answers the server really gave) plus a new user instruction. Single-turn
// workloads are sessions of one turn. The load generator (runner.h) decides when sessions start
// (open loop: Poisson or gamma arrivals; closed loop: a fixed number of sessions in flight).
//
// Kinds:
//   chat       ShareGPT-like: one turn, input and output lengths log-normal (long tails), short
//              system prompt.
//   coding     multi-turn coding-agent sessions: a long shared context (project files and
//              history) resent every turn, a short new instruction, a medium-length answer;
//              several sessions interleave, so prefix reuse across turns is what matters.
//   summarize  long-context summarisation: one long document, a short summary.
//   mixed      each session, drawn from the seed, is a coding session (probability
//              mixed_coding_fraction: long prompts) or a chat session (short prompts), with the
//              options of those kinds: long prefills arriving among short requests' decodes, the
//              load that separates colocated from disaggregated serving (tools/bench/goodput.sh).
//
// Lengths are in words of generated text (the server's tokenizer decides the token count; the
// runner records the real counts from usage). Each length is clamped to the given bounds so a
// request fits the model's context.
//
// Thread-safety: pure functions.
#ifndef DEEPINFER_TOOLS_BENCH_WORKLOAD_H_
#define DEEPINFER_TOOLS_BENCH_WORKLOAD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deepinfer::bench {

struct TurnPlan {
  std::string instruction;  // the new user message of this turn
  uint32_t max_tokens = 0;  // answer length (sent with ignore_eos, so it is exact)
};

struct SessionPlan {
  uint64_t id = 0;
  std::string system;  // system message ("" = none)
  std::vector<TurnPlan> turns;
  double think_time_s = 0.0;  // pause between receiving an answer and sending the next turn
};

struct WorkloadOptions {
  std::string kind = "chat";  // chat | coding | summarize | mixed
  uint64_t seed = 1;
  int sessions = 100;
  // chat: median input/output words (log-normal, sigma below).
  double chat_input_words = 120;
  double chat_output_tokens = 100;
  double sigma = 0.8;
  // coding: shared context words per session, turns per session, instruction words, answer
  // tokens, think time.
  int coding_context_words = 600;
  int coding_turns = 4;
  int coding_instruction_words = 12;
  int coding_answer_tokens = 64;
  double coding_think_time_s = 0.0;
  // mixed: share of sessions that are coding sessions, in [0, 1].
  double mixed_coding_fraction = 0.25;
  // summarize: document words and summary tokens.
  int summarize_document_words = 1200;
  int summarize_output_tokens = 32;
  // Clamps (applied to every generated length).
  int max_input_words = 1500;
  int max_output_tokens = 512;
};

// kInvalidArgument naming the option (e.g. "kind: expected chat, coding, summarize or mixed, got
// \"x\"") for bad options.
absl::StatusOr<std::vector<SessionPlan>> GenerateWorkload(const WorkloadOptions& options);

// `words` pseudo-random words (a fixed English-like vocabulary, code-like for coding contexts)
// from `seed`; deterministic.
std::string RandomText(uint64_t seed, int words, bool code_like);

}  // namespace deepinfer::bench

#endif  // DEEPINFER_TOOLS_BENCH_WORKLOAD_H_
