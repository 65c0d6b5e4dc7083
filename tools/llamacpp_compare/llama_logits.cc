// Prints llama.cpp's logits for the last of the given token ids as one JSON line:
//   llama_logits MODEL.gguf THREADS ID [ID ...]   ->  {"logits": [...]}
// Built by compare.py --check_logits against a llama.cpp build (never part of the Bazel build):
// it shows whether a GGUF reproduces the Hugging Face checkpoint (e.g. the Q/K permutation).
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s MODEL.gguf THREADS ID [ID ...]\n", argv[0]);
    return 2;
  }
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (model == nullptr) {
    std::fprintf(stderr, "cannot load %s\n", argv[1]);
    return 1;
  }
  std::vector<llama_token> tokens;
  for (int i = 3; i < argc; ++i) tokens.push_back(std::atoi(argv[i]));
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = tokens.size() + 16;
  cp.n_batch = tokens.size();
  cp.n_ubatch = tokens.size();
  cp.n_threads = std::atoi(argv[2]);
  cp.n_threads_batch = cp.n_threads;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr || llama_decode(ctx, llama_batch_get_one(tokens.data(), tokens.size())) != 0) {
    std::fprintf(stderr, "decode failed\n");
    return 1;
  }
  const float* logits = llama_get_logits_ith(ctx, -1);
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  std::printf("{\"logits\": [");
  for (int i = 0; i < n_vocab; ++i) std::printf(i == 0 ? "%.7g" : ",%.7g", logits[i]);
  std::printf("]}\n");
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
