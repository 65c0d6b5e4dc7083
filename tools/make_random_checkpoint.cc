// Writes a Hugging Face-style Llama checkpoint with random weights (config.json,
// generation_config.json, model.safetensors) for benchmarks and smoke tests at realistic sizes.
// Weights ~ N(0, std) with a fixed seed; norms are 1. No tokenizer is written.
//
//   make_random_checkpoint --out DIR [--hidden 512 --layers 8 --heads 8 --kv_heads 2
//                          --intermediate 1408 --vocab 32000 --dtype bfloat16 --seed 1]
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "kernels/dtype.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, out, "", "Output directory (created).");
ABSL_FLAG(int, hidden, 512, "hidden_size");
ABSL_FLAG(int, layers, 8, "num_hidden_layers");
ABSL_FLAG(int, heads, 8, "num_attention_heads");
ABSL_FLAG(int, kv_heads, 2, "num_key_value_heads");
ABSL_FLAG(int, intermediate, 1408, "intermediate_size");
ABSL_FLAG(int, vocab, 32000, "vocab_size");
ABSL_FLAG(int, max_positions, 8192, "max_position_embeddings");
ABSL_FLAG(std::string, dtype, "bfloat16", "bfloat16 or float32");
ABSL_FLAG(double, init_std, 0.05, "Standard deviation of the random weights.");
ABSL_FLAG(uint64_t, seed, 1, "Random seed.");

namespace {

using json = nlohmann::json;
using deepinfer::kernels::DType;

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  bool ones = false;
};

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Writes a random-weight Llama checkpoint.");
  absl::ParseCommandLine(argc, argv);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::fprintf(stderr, "--out: expected a directory\n");
    return 2;
  }
  const std::string dtype_name = absl::GetFlag(FLAGS_dtype);
  if (dtype_name != "bfloat16" && dtype_name != "float32") {
    std::fprintf(stderr, "--dtype: expected bfloat16 or float32, got %s\n", dtype_name.c_str());
    return 2;
  }
  const DType dtype = dtype_name == "bfloat16" ? DType::kBF16 : DType::kF32;
  const int64_t h = absl::GetFlag(FLAGS_hidden), L = absl::GetFlag(FLAGS_layers),
                nh = absl::GetFlag(FLAGS_heads), nkv = absl::GetFlag(FLAGS_kv_heads),
                inter = absl::GetFlag(FLAGS_intermediate), vocab = absl::GetFlag(FLAGS_vocab);
  if (h <= 0 || L <= 0 || nh <= 0 || nkv <= 0 || nh % nkv != 0 || h % nh != 0 || inter <= 0 ||
      vocab <= 2) {
    std::fprintf(stderr, "invalid dimensions: need positive sizes, heads %% kv_heads == 0, "
                         "hidden %% heads == 0\n");
    return 2;
  }
  const int64_t hd = h / nh;
  std::vector<Tensor> tensors = {{"model.embed_tokens.weight", {vocab, h}},
                                 {"model.norm.weight", {h}, true},
                                 {"lm_head.weight", {vocab, h}}};
  for (int64_t i = 0; i < L; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    tensors.push_back({p + "input_layernorm.weight", {h}, true});
    tensors.push_back({p + "post_attention_layernorm.weight", {h}, true});
    tensors.push_back({p + "self_attn.q_proj.weight", {nh * hd, h}});
    tensors.push_back({p + "self_attn.k_proj.weight", {nkv * hd, h}});
    tensors.push_back({p + "self_attn.v_proj.weight", {nkv * hd, h}});
    tensors.push_back({p + "self_attn.o_proj.weight", {h, nh * hd}});
    tensors.push_back({p + "mlp.gate_proj.weight", {inter, h}});
    tensors.push_back({p + "mlp.up_proj.weight", {inter, h}});
    tensors.push_back({p + "mlp.down_proj.weight", {h, inter}});
  }
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  const int elem = deepinfer::kernels::DTypeSize(dtype);
  for (const Tensor& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    header[t.name] = {{"dtype", dtype == DType::kBF16 ? "BF16" : "F32"},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + n * elem}}};
    offset += n * elem;
  }
  std::string header_text = header.dump();
  while ((header_text.size() + 8) % 8 != 0) header_text.push_back(' ');
  std::filesystem::create_directories(out);
  std::ofstream f(out + "/model.safetensors", std::ios::binary);
  uint64_t len = header_text.size();
  f.write(reinterpret_cast<const char*>(&len), 8);
  f.write(header_text.data(), header_text.size());
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  std::normal_distribution<float> dist(0.0f, static_cast<float>(absl::GetFlag(FLAGS_init_std)));
  std::vector<uint8_t> buf;
  for (const Tensor& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    buf.resize(n * elem);
    for (int64_t i = 0; i < n; ++i) {
      deepinfer::kernels::StoreFromF32(buf.data(), dtype, i, t.ones ? 1.0f : dist(rng));
    }
    f.write(reinterpret_cast<const char*>(buf.data()), buf.size());
  }
  if (!f) {
    std::fprintf(stderr, "%s/model.safetensors: write failed\n", out.c_str());
    return 1;
  }
  json config = {{"architectures", {"LlamaForCausalLM"}},
                 {"model_type", "llama"},
                 {"hidden_size", h},
                 {"intermediate_size", inter},
                 {"num_hidden_layers", L},
                 {"num_attention_heads", nh},
                 {"num_key_value_heads", nkv},
                 {"head_dim", hd},
                 {"vocab_size", vocab},
                 {"max_position_embeddings", absl::GetFlag(FLAGS_max_positions)},
                 {"rms_norm_eps", 1e-5},
                 {"rope_theta", 10000.0},
                 {"hidden_act", "silu"},
                 {"tie_word_embeddings", false},
                 {"torch_dtype", dtype_name},
                 {"bos_token_id", 1},
                 {"eos_token_id", 2}};
  std::ofstream(out + "/config.json") << config.dump(2) << "\n";
  std::ofstream(out + "/generation_config.json")
      << json{{"bos_token_id", 1}, {"eos_token_id", 2}}.dump(2) << "\n";
  std::printf("wrote %s (%.1f M parameters, %s)\n", out.c_str(),
              static_cast<double>(offset / elem) / 1e6, dtype_name.c_str());
  return 0;
}
