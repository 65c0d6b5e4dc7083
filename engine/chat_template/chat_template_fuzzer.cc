// Fuzz target: parses arbitrary template text and renders it with a fixed chat context. It must
// never crash, hang or exhaust memory; errors are fine.
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/chat_template/chat_template.h"
#include "nlohmann/json.hpp"

namespace {

const nlohmann::ordered_json& Context() {
  static const auto* const ctx = new nlohmann::ordered_json(nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "image"}]},
      {"role": "assistant", "content": "<think>\nok\n</think>\n\nHello",
       "tool_calls": [{"type": "function",
                       "function": {"name": "f", "arguments": {"x": 1, "y": [1.5, null]}}}]},
      {"role": "tool", "content": "42"},
      {"role": "user", "content": "Thanks"}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "description": "d",
               "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}],
    "add_generation_prompt": true,
    "bos_token": "<s>",
    "eos_token": "</s>",
    "enable_thinking": false
  })"));
  return *ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using deepinfer::engine::ChatTemplate;
  ChatTemplate::Options options;
  options.max_steps = 200000;  // Keeps each input fast; the limit itself is under test.
  options.max_output_bytes = size_t{1} << 20;
  auto tmpl = ChatTemplate::Create(
      std::string(reinterpret_cast<const char*>(data), size), options);
  if (!tmpl.ok()) return 0;
  auto out = (*tmpl)->Render(Context());
  (void)out;
  return 0;
}
