// The research knobs of speculative decoding, read from one optional JSON file (--spec_config)
// instead of a flag each. An operator needs only the worker flags (--speculative, --draft_model,
// --num_speculative_tokens, --draft_kv_blocks, --spec_adaptive); the keys here tune the adaptive
// planner, the mode selector and the draft model's catch-up, and their defaults are the ones the
// benchmarks chose (docs/spec-config.md lists every key with its default and reason; the
// measurements behind them are in docs/speculative-decoding.md).
//
// The file is a JSON object whose keys are those of SpecConfigKeys(), e.g.
//   {"select_max_length": 8, "trial_run_tokens": "auto", "probe_past_stop": true}
// A key left out takes its default. An unknown key, a value of the wrong JSON type or out of its
// range is kInvalidArgument naming the key: `spec_config: <key>: expected ..., got ...`.
//
// Thread-safety: free functions without shared state.
#ifndef DEEPINFER_NODE_SPEC_CONFIG_H_
#define DEEPINFER_NODE_SPEC_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/llm_engine.h"
#include "nlohmann/json.hpp"

namespace deepinfer::node {

// One key of the file: its name, its default as JSON text, and why that default.
struct SpecConfigKey {
  const char* name;
  const char* default_json;
  const char* why;
};

// Every key the file accepts, in the order docs/spec-config.md lists them.
const std::vector<SpecConfigKey>& SpecConfigKeys();

// Sets every knob of `spec` from `config` (a JSON object; null: all defaults), the defaults of
// SpecConfigKeys() for keys it leaves out. "auto" values resolve from fields of `spec` the caller
// set before: drafter, adaptive and num_speculative_tokens. On error `spec` may be partly set.
absl::Status ApplySpecConfig(const nlohmann::json& config, engine::SpecOptions* spec);

// ApplySpecConfig of the file at `path`; an empty path applies the defaults. kNotFound when the
// file cannot be read, kInvalidArgument ("spec_config: <path>: ...") when it is not a JSON object.
absl::Status LoadSpecConfig(const std::string& path, engine::SpecOptions* spec);

}  // namespace deepinfer::node

#endif  // DEEPINFER_NODE_SPEC_CONFIG_H_
