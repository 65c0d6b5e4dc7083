// GPU benchmark (not a test; tools/gpu packs and runs it): the CUDA forward pass on a
// Llama-3-8B-shaped bf16 model with synthetic weights made on the device, reported as ratios to
// the hardware (issue 10's goals):
//   - device memory bandwidth: a device-to-device copy of --bandwidth_gib GiB (read + write);
//   - prefill of --prefill_tokens tokens in one step: its FLOPs (2 x parameters per token + the
//     causal attention's 2 x 2 x tokens^2 / 2 x heads x head_dim) per second against the bf16
//     GEMM peak measured here (cuBLASLt at m = 4096 on the MLP's shapes); goal >= 0.6;
//   - decode at batch 1 after that prefill: the step time against the bound (weight bytes + the
//     KV bytes the step reads) / the measured bandwidth; goal >= 0.7;
//   - decode at batch --batch (64) with --context tokens each: tokens/s.
// Decode steps replay CUDA graphs (CudaModelOptions::graph_max_batch).
// Each timing is the median of --iters runs after one warm-up; the forward pass's host work
// (metadata upload, logits download) is inside the step time, as in serving.
//
//   cuda_model_bench [--prefill_tokens 4096] [--context 1024] [--batch 64] [--iters 10]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "engine/cuda/cuda_model.h"
#include "engine/model.h"
#include "engine/model_config.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/linear_cuda.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(int, prefill_tokens, 4096, "Tokens of the prefill step (and the batch-1 context).");
ABSL_FLAG(int, context, 1024, "Context per sequence of the batched decode.");
ABSL_FLAG(int, batch, 64, "Sequences of the batched decode.");
ABSL_FLAG(int, iters, 10, "Timed runs per figure (median).");
ABSL_FLAG(double, bandwidth_gib, 4.0, "GiB copied to measure device bandwidth.");

namespace deepinfer::engine {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kBlock = 16;

// Llama-3-8B's config.json (the fields the engine reads).
const char kLlama3_8B[] = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
  "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
  "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
  "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
  "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
  "tie_word_embeddings": false, "bos_token_id": 128000, "eos_token_id": 128001
})";

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

template <typename Fn>
double TimeMedian(int iters, Fn&& fn) {
  fn();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const auto a = Clock::now();
    fn();
    (void)kernels::cuda_raw::DeviceSynchronize();
    t.push_back(std::chrono::duration<double>(Clock::now() - a).count());
  }
  return Median(t);
}

int Fail(const std::string& what, const absl::Status& s) {
  std::printf("FAIL %s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

int Run() {
  const int iters = std::max(1, absl::GetFlag(FLAGS_iters));
  const int prefill = absl::GetFlag(FLAGS_prefill_tokens);
  const int context = absl::GetFlag(FLAGS_context);
  const int batch = absl::GetFlag(FLAGS_batch);
  absl::Status available = kernels::CudaAvailable();
  if (!available.ok()) return Fail("device", available);
  auto config = ParseModelConfig(nlohmann::json::parse(kLlama3_8B), "llama3-8b config");
  if (!config.ok()) return Fail("config", config.status());
  const ModelConfig& c = *config;

  // Bandwidth: device-to-device copy, bytes read + written per second.
  const size_t copy_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_bandwidth_gib) * (1 << 30));
  double bandwidth = 0.0;
  {
    auto a = kernels::DeviceBuffer::Allocate(copy_bytes);
    auto b = kernels::DeviceBuffer::Allocate(copy_bytes);
    if (!a.ok()) return Fail("bandwidth buffer", a.status());
    if (!b.ok()) return Fail("bandwidth buffer", b.status());
    const double t = TimeMedian(iters, [&] {
      (void)kernels::cuda_raw::MemcpyDeviceToDevice((*b)->data(), (*a)->data(), copy_bytes);
    });
    bandwidth = 2.0 * copy_bytes / t;
    std::printf("device bandwidth (copy of %.1f GiB): %.0f GB/s\n", copy_bytes / double(1 << 30),
                bandwidth / 1e9);
  }

  // bf16 GEMM peak: the MLP's gate projection at m = 4096 (14336 x 4096 weights).
  double peak = 0.0;
  {
    const int64_t m = 4096, n = c.intermediate_size, k = c.hidden_size;
    auto x = kernels::DeviceBuffer::Allocate(m * k * 2);
    auto w = kernels::DeviceBuffer::Allocate(n * k * 2);
    auto y = kernels::DeviceBuffer::Allocate(m * n * 2);
    auto ws = kernels::DeviceBuffer::Allocate(kernels::kLinearCudaWorkspaceBytes);
    if (!x.ok() || !w.ok() || !y.ok() || !ws.ok()) {
      return Fail("gemm buffers", absl::ResourceExhaustedError("cudaMalloc"));
    }
    (void)kernels::cuda_raw::LaunchFillUniform((*x)->data(), kernels::DType::kBF16, m * k, 1, -1, 1,
                                               nullptr);
    (void)kernels::cuda_raw::LaunchFillUniform((*w)->data(), kernels::DType::kBF16, n * k, 2,
                                               -0.02f, 0.02f, nullptr);
    kernels::LinearCudaParams p;
    p.x = (*x)->data();
    p.weight = (*w)->data();
    p.y = (*y)->data();
    p.m = m;
    p.n = n;
    p.k = k;
    p.dtype = kernels::DType::kBF16;
    p.workspace = (*ws)->data();
    p.workspace_bytes = (*ws)->size();
    absl::Status s;
    const double t = TimeMedian(iters, [&] { s.Update(kernels::LinearCuda(p, nullptr)); });
    if (!s.ok()) return Fail("gemm", s);
    peak = 2.0 * m * n * k / t;
    std::printf("bf16 GEMM peak (cuBLASLt %lldx%lldx%lld): %.0f TFLOP/s\n",
                static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
                peak / 1e12);
  }

  // The model: KV for the prefill sequence (+ its decode steps) and the batched decode.
  const int prefill_blocks = (prefill + iters + 2 + kBlock - 1) / kBlock;
  const int seq_blocks = (context + iters + 2 + kBlock - 1) / kBlock;
  CudaModelOptions options;
  options.block_size = kBlock;
  options.num_blocks = prefill_blocks + batch * seq_blocks;
  // Decode steps replay CUDA graphs (one per batch bucket), as serving would.
  options.graph_max_batch = batch;
  options.graph_max_blocks_per_seq = std::max(prefill_blocks, seq_blocks);
  auto model = CudaModel::CreateRandom(c, options, 1);
  if (!model.ok()) return Fail("model", model.status());
  const double weight_bytes = static_cast<double>((*model)->weight_bytes());
  std::printf("model: Llama-3-8B shapes, bf16, %.2f GB of weights, %.2f GB of KV pools\n",
              weight_bytes / 1e9, (*model)->kv_bytes() / 1e9);
  std::vector<float> logits;

  // Prefill: one sequence, one step (re-run over the same blocks for the timing).
  std::vector<int32_t> tokens(prefill + iters + 2);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<int32_t>((i * 7919) % c.vocab_size);
  std::vector<int32_t> table(prefill_blocks);
  std::iota(table.begin(), table.end(), 0);
  absl::Status s;
  SequenceInput in;
  in.tokens = tokens.data();
  in.num_tokens = prefill;
  in.block_table = table.data();
  in.num_blocks = prefill_blocks;
  const double t_prefill = TimeMedian(iters, [&] { s.Update((*model)->Forward({in}, &logits)); });
  if (!s.ok()) return Fail("prefill", s);
  const double params = weight_bytes / 2.0;  // bf16
  const double attn_flops =
      2.0 * 2.0 * prefill * (prefill / 2.0) * c.num_heads * c.head_dim * c.num_layers;
  const double prefill_flops = 2.0 * params * prefill + attn_flops;
  std::printf("prefill %d tokens: %.1f ms, %.0f TFLOP/s, ratio to GEMM peak %.2f (goal >= 0.6)\n",
              prefill, t_prefill * 1e3, prefill_flops / t_prefill / 1e12,
              prefill_flops / t_prefill / peak);

  // Decode at batch 1 over that context: each timed step appends one token.
  int64_t pos = prefill;
  in.num_tokens = 1;
  const double t_decode1 = TimeMedian(iters, [&] {
    in.tokens = tokens.data() + pos;
    in.start_position = pos;
    ++pos;
    s.Update((*model)->Forward({in}, &logits));
  });
  if (!s.ok()) return Fail("decode batch 1", s);
  const double kv_read = 2.0 * c.num_layers * pos * c.num_kv_heads * c.head_dim * 2.0;
  const double bound = (weight_bytes + kv_read) / bandwidth;
  std::printf(
      "decode batch 1 (context %lld): %.3f ms; bound (%.2f GB weights + %.3f GB KV) / bandwidth "
      "= %.3f ms; ratio %.2f (goal >= 0.7)\n",
      static_cast<long long>(pos), t_decode1 * 1e3, weight_bytes / 1e9, kv_read / 1e9, bound * 1e3,
      bound / t_decode1);

  // Batched decode: `batch` sequences of `context` tokens (prefilled 8 at a time), then steps.
  std::vector<std::vector<int32_t>> tables(batch), seq_tokens(batch);
  for (int b = 0; b < batch; ++b) {
    tables[b].resize(seq_blocks);
    std::iota(tables[b].begin(), tables[b].end(), prefill_blocks + b * seq_blocks);
    seq_tokens[b].resize(context + iters + 2);
    for (size_t i = 0; i < seq_tokens[b].size(); ++i) {
      seq_tokens[b][i] = static_cast<int32_t>((i * 104729 + b * 31) % c.vocab_size);
    }
  }
  for (int b0 = 0; b0 < batch; b0 += 8) {
    std::vector<SequenceInput> group;
    for (int b = b0; b < std::min(batch, b0 + 8); ++b) {
      SequenceInput q;
      q.tokens = seq_tokens[b].data();
      q.num_tokens = context;
      q.block_table = tables[b].data();
      q.num_blocks = seq_blocks;
      group.push_back(q);
    }
    s.Update((*model)->Forward(group, &logits));
  }
  if (!s.ok()) return Fail("batched prefill", s);
  int64_t at = context;
  std::vector<SequenceInput> step(batch);
  const double t_batch = TimeMedian(iters, [&] {
    for (int b = 0; b < batch; ++b) {
      step[b].tokens = seq_tokens[b].data() + at;
      step[b].num_tokens = 1;
      step[b].start_position = at;
      step[b].block_table = tables[b].data();
      step[b].num_blocks = seq_blocks;
    }
    ++at;
    s.Update((*model)->Forward(step, &logits));
  });
  if (!s.ok()) return Fail("decode batch", s);
  std::printf(
      "decode batch %d (context %d): %.3f ms per step, %.0f tokens/s (%lld steps from %d "
      "CUDA graphs)\n",
      batch, context, t_batch * 1e3, batch / t_batch,
      static_cast<long long>((*model)->graph_steps()), (*model)->graphs_captured());
  return 0;
}

}  // namespace
}  // namespace deepinfer::engine

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return deepinfer::engine::Run();
}
