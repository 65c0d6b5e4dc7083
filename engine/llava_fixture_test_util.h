// Test helper: the LLaVA fixture's prompts (engine/testdata/vision/llava, made by
// tools/fixtures/make_vision_fixtures.py) with their image runs and transformers' projected image
// embeddings, for tests that feed image embeddings to the language model.
#ifndef DEEPINFER_ENGINE_LLAVA_FIXTURE_TEST_UTIL_H_
#define DEEPINFER_ENGINE_LLAVA_FIXTURE_TEST_UTIL_H_

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/safetensors.h"
#include "nlohmann/json.hpp"

namespace deepinfer::engine::testing {

inline constexpr char kLlavaDir[] = "engine/testdata/vision/llava";

struct LlavaImage {
  std::string file;          // e.g. "rgb_32x32.png"
  int64_t position = 0;      // first placeholder token in the prompt
  int64_t num_tokens = 0;
  std::vector<float> embeddings;  // num_tokens x hidden, transformers' projector output
  // A stand-in for the image's SHA-256 (32 bytes, distinct per file).
  std::string content_hash;
};

struct LlavaPrompt {
  std::vector<int32_t> ids;
  std::vector<LlavaImage> images;  // in prompt order
  std::vector<int32_t> greedy;     // transformers' greedy continuation
  std::vector<float> logits;       // ids.size() x vocab
};

inline std::string FakeContentHash(const std::string& name) {
  std::string h(32, '\0');
  for (size_t i = 0; i < name.size(); ++i) h[i % 32] = static_cast<char>(h[i % 32] * 31 + name[i]);
  return h;
}

// Every prompt of reference.json: its ids, image runs (consecutive image_token_id tokens, one run
// per image, images taken in order) with their embeddings, the greedy continuation and logits.
inline absl::StatusOr<std::vector<LlavaPrompt>> LoadLlavaPrompts() {
  const std::string dir = kLlavaDir;
  std::ifstream in(dir + "/reference.json");
  const nlohmann::json ref = nlohmann::json::parse(in, nullptr, false);
  if (ref.is_discarded()) return absl::NotFoundError(dir + "/reference.json: cannot parse");
  auto tensors = SafetensorsFile::Open(dir + "/reference.safetensors");
  if (!tensors.ok()) return tensors.status();
  const int image_token = ref["image_token_id"].get<int>();
  const int64_t per_image = ref["num_image_tokens"].get<int64_t>();
  std::vector<LlavaPrompt> out;
  for (size_t p = 0; p < ref["prompts"].size(); ++p) {
    const nlohmann::json& pj = ref["prompts"][p];
    LlavaPrompt prompt;
    prompt.ids = pj["input_ids"].get<std::vector<int32_t>>();
    prompt.greedy = pj["greedy"].get<std::vector<int32_t>>();
    const std::vector<std::string> files = pj["images"].get<std::vector<std::string>>();
    size_t next = 0;
    for (size_t i = 0; i < prompt.ids.size(); ++i) {
      if (prompt.ids[i] != image_token) continue;
      if (next >= files.size()) return absl::InternalError("more image runs than images");
      LlavaImage image;
      image.file = files[next++];
      image.position = static_cast<int64_t>(i);
      image.num_tokens = per_image;
      std::string key = image.file;
      for (char& c : key) c = c == '.' ? '_' : c;
      const TensorView* t = (*tensors)->Find(key + ".embeddings");
      if (t == nullptr || t->dtype != StDType::kF32 || t->shape.size() != 2 ||
          t->shape[0] != per_image) {
        return absl::InternalError(absl::StrCat(key, ".embeddings: missing or mis-shaped"));
      }
      const float* data = static_cast<const float*>(t->data);
      image.embeddings.assign(data, data + t->numel());
      image.content_hash = FakeContentHash(image.file);
      prompt.images.push_back(std::move(image));
      i += per_image - 1;
    }
    const TensorView* logits = (*tensors)->Find(absl::StrCat("prompt", p, ".logits"));
    if (logits == nullptr || logits->dtype != StDType::kF32) {
      return absl::InternalError(absl::StrCat("prompt", p, ".logits: missing"));
    }
    const float* l = static_cast<const float*>(logits->data);
    prompt.logits.assign(l, l + logits->numel());
    out.push_back(std::move(prompt));
  }
  return out;
}

}  // namespace deepinfer::engine::testing

#endif  // DEEPINFER_ENGINE_LLAVA_FIXTURE_TEST_UTIL_H_
