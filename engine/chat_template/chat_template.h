// Chat templates: the Jinja2 programs Hugging Face models ship in tokenizer_config.json
// (`chat_template`) that turn chat messages into prompt text. This is an interpreter for the
// subset those templates use (Llama 3, Qwen 2/2.5/3, Mistral and similar), rendering exactly
// what transformers' `apply_chat_template` renders: Jinja 3.1 semantics in an immutable sandbox,
// trim_blocks and lstrip_blocks on, keep_trailing_newline off, transformers' `tojson`
// (json.dumps with ensure_ascii=False), `raise_exception`, `strftime_now`, loop controls
// (`break`/`continue`) and the `{% generation %}` tag.
//
// Supported: text, {{ }}, {# #}, whitespace control (-/+), {% raw %}, if/elif/else,
// for (tuple targets, `if` filter, else, loop.*), set (incl. namespace attributes and block
// set), macro and macro calls, with, break/continue; Python literals, attribute/item access,
// slices, arithmetic, ~, comparisons, and/or/not, in, tests, conditional expressions, the
// common filters and str/dict methods (see internal/builtins.h). Anything else (include,
// extends, call blocks, unknown filters/tests/methods/functions) is rejected by Create().
//
// Values behave like Jinja's default Undefined: printing an undefined value prints nothing,
// iterating it iterates nothing, and using an attribute of it or doing arithmetic with it fails.
// Known differences from CPython: case mapping (upper/lower/title/capitalize) is ASCII-only, and
// integers are 64-bit (overflow fails instead of growing).
#ifndef DEEPINFER_ENGINE_CHAT_TEMPLATE_CHAT_TEMPLATE_H_
#define DEEPINFER_ENGINE_CHAT_TEMPLATE_CHAT_TEMPLATE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace deepinfer::engine {

namespace jinja {
struct Template;
}  // namespace jinja

class ChatTemplate {
 public:
  // Bounds that keep a hostile template from hanging or exhausting memory or stack.
  struct Options {
    // Expression evaluations, statements, loop iterations and produced bytes / 256, per render.
    int64_t max_steps = 20'000'000;
    // Rendered output size.
    size_t max_output_bytes = size_t{64} << 20;
    // Nested evaluations (expressions, statements, macro calls): bounds stack use.
    int max_depth = 500;
    // Clock for strftime_now(); absl::Now when empty.
    std::function<absl::Time()> clock;
  };

  // Parses `source`. Fails with kInvalidArgument "chat template line N: ..." for syntax errors
  // and for any construct the interpreter does not support, e.g.
  // `chat template line 3: filter "wordwrap" is not supported`.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Create(absl::string_view source);
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Create(absl::string_view source,
                                                              Options options);

  ~ChatTemplate();
  ChatTemplate(const ChatTemplate&) = delete;
  ChatTemplate& operator=(const ChatTemplate&) = delete;

  // Renders with `context`, a JSON object whose keys become template variables: `messages`,
  // `add_generation_prompt`, `bos_token`, `eos_token`, `tools` (null or a list), and any extra
  // kwargs (`enable_thinking`, `documents`, ...). Pass what transformers would pass: a key that
  // is absent is undefined in the template, a key set to null is None. It is an ordered_json
  // because key order is visible in the output (`tool|tojson` prints keys in their order, as
  // Python dicts do); nlohmann::json would have sorted them.
  //
  // Fails with kInvalidArgument when the context is not an object, when the template calls
  // raise_exception(msg) (the status message is exactly `msg`), when it fails at run time
  // (message "chat template line N: ..."), or when it exceeds `Options` limits.
  //
  // Thread-safe: any number of threads may render concurrently.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context) const;

 private:
  ChatTemplate(std::unique_ptr<jinja::Template> tmpl, Options options);

  std::unique_ptr<jinja::Template> tmpl_;
  Options options_;
};

// Picks and parses the chat template of a Hugging Face tokenizer_config.json, as transformers
// does: `chat_template` is either one template string or a list of {"name", "template"} objects
// (or a name -> template object), from which "tool_use" is chosen when `has_tools` and present,
// else "default". Fails with kNotFound when the config has no chat template (newer checkpoints
// keep it in chat_template.jinja: pass that file's text to ChatTemplate::Create), and with
// kInvalidArgument when it is malformed or has no usable entry.
absl::StatusOr<std::unique_ptr<ChatTemplate>> LoadChatTemplate(
    const nlohmann::ordered_json& tokenizer_config, bool has_tools);

}  // namespace deepinfer::engine

#endif  // DEEPINFER_ENGINE_CHAT_TEMPLATE_CHAT_TEMPLATE_H_
