// Typed, non-throwing accessors over nlohmann::json for tokenizer.json parsing: every mismatch
// becomes kInvalidArgument saying which component and field, what was expected and what was
// found. Thread-safe (pure functions).
#ifndef DEEPINFER_ENGINE_TOKENIZER_INTERNAL_JSON_UTIL_H_
#define DEEPINFER_ENGINE_TOKENIZER_INTERNAL_JSON_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace deepinfer::tokenizer::internal {

using Json = nlohmann::json;

// Deepest Sequence-in-Sequence nesting accepted in tokenizer.json components.
inline constexpr int kMaxNesting = 16;

inline std::string JsonTypeName(const Json& j) { return j.type_name(); }

inline absl::Status FieldError(absl::string_view where, absl::string_view key,
                               absl::string_view expected, const Json& found) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": expected field \"", key, "\" to be ",
                                                 expected, ", found ", JsonTypeName(found)));
}

inline absl::Status MissingField(absl::string_view where, absl::string_view key) {
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": expected a field \"", key, "\", found none"));
}

// The "type" of a component object, e.g. "BPE" or "Split".
inline absl::StatusOr<std::string> ComponentType(const Json& j, absl::string_view where) {
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected an object, found ", JsonTypeName(j)));
  }
  auto it = j.find("type");
  if (it == j.end()) return MissingField(where, "type");
  if (!it->is_string()) return FieldError(where, "type", "a string", *it);
  return it->get<std::string>();
}

inline absl::StatusOr<std::string> GetString(const Json& j, const char* key,
                                             absl::string_view where) {
  auto it = j.find(key);
  if (it == j.end()) return MissingField(where, key);
  if (!it->is_string()) return FieldError(where, key, "a string", *it);
  return it->get<std::string>();
}

// Missing or null gives nullopt.
inline absl::StatusOr<std::optional<std::string>> GetOptionalString(const Json& j, const char* key,
                                                                    absl::string_view where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string()) return FieldError(where, key, "a string or null", *it);
  return std::optional<std::string>(it->get<std::string>());
}

// Missing or null gives `default_value`.
inline absl::StatusOr<bool> GetBool(const Json& j, const char* key, bool default_value,
                                    absl::string_view where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return default_value;
  if (!it->is_boolean()) return FieldError(where, key, "a boolean", *it);
  return it->get<bool>();
}

// Missing or null gives `default_value`; the value must be an integer in [lo, hi].
inline absl::StatusOr<int64_t> GetInt(const Json& j, const char* key, int64_t default_value,
                                      int64_t lo, int64_t hi, absl::string_view where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return default_value;
  if (!it->is_number_integer()) return FieldError(where, key, "an integer", *it);
  const int64_t v = it->is_number_unsigned()
                        ? static_cast<int64_t>(std::min<uint64_t>(it->get<uint64_t>(), INT64_MAX))
                        : it->get<int64_t>();
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected field \"", key, "\" in [", lo, ", ", hi, "], found ", v));
  }
  return v;
}

// A pattern object {"String": "..."} or {"Regex": "..."}.
struct PatternSpec {
  bool is_regex = false;
  std::string text;
};

inline absl::StatusOr<PatternSpec> GetPattern(const Json& j, const char* key,
                                              absl::string_view where) {
  auto it = j.find(key);
  if (it == j.end()) return MissingField(where, key);
  const Json& p = *it;
  if (p.is_object() && p.size() == 1) {
    auto s = p.find("String");
    if (s != p.end() && s->is_string()) return PatternSpec{false, s->get<std::string>()};
    auto r = p.find("Regex");
    if (r != p.end() && r->is_string()) return PatternSpec{true, r->get<std::string>()};
  }
  return absl::InvalidArgumentError(absl::StrCat(
      where, ": expected field \"", key, "\" to be {\"String\": ...} or {\"Regex\": ...}, found ",
      p.dump().substr(0, 200)));
}

}  // namespace deepinfer::tokenizer::internal

#endif  // DEEPINFER_ENGINE_TOKENIZER_INTERNAL_JSON_UTIL_H_
