// GPU benchmark (not a test): paged decode attention (kernels/cuda/decode_attention_cuda.h) at
// Llama-3-8B's attention shape (32 query / 8 KV heads of 128, bf16, 16-token blocks in shuffled
// order) for contexts of 4k to 32k tokens, as the KV bytes it reads per second against the
// device bandwidth measured here (a device-to-device copy): issue 10's goal is >= 0.8.
// Each figure: the median of 7 timed launches after a warm-up.
//
//   decode_attention_cuda_bench [--seqs 16]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cuda/decode_attention_cuda.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/launch.h"

namespace deepinfer::kernels {
namespace {

std::unique_ptr<DeviceBuffer> Alloc(size_t bytes) {
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> b = DeviceBuffer::Allocate(bytes);
  if (!b.ok()) {
    std::printf("FAIL alloc %zu bytes: %s\n", bytes, b.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(b);
}

template <typename Fn>
double Median(Fn&& fn) {
  fn();
  (void)cuda_raw::DeviceSynchronize();
  std::vector<double> t;
  for (int i = 0; i < 7; ++i) {
    const auto a = std::chrono::steady_clock::now();
    fn();
    (void)cuda_raw::DeviceSynchronize();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int Run(int seqs) {
  if (absl::Status s = CudaAvailable(); !s.ok()) {
    std::printf("FAIL device: %s\n", s.ToString().c_str());
    return 1;
  }
  // Bandwidth: 4 GiB copied (read + write).
  const size_t copy = size_t{4} << 30;
  auto a = Alloc(copy), b = Alloc(copy);
  const double bandwidth = 2.0 * copy / Median([&] {
                             (void)cuda_raw::MemcpyDeviceToDevice(b->data(), a->data(), copy);
                           });
  a.reset();
  b.reset();
  std::printf("device bandwidth (copy of 4 GiB): %.0f GB/s\n", bandwidth / 1e9);
  constexpr int kHeads = 32, kKvHeads = 8, kHeadDim = 128, kBlock = 16;
  const int64_t block_elems = int64_t{kBlock} * kKvHeads * kHeadDim;
  for (int context : {4096, 8192, 16384, 32768}) {
    const int blocks_per_seq = context / kBlock;
    const int num_blocks = blocks_per_seq * seqs;
    auto k = Alloc(num_blocks * block_elems * 2), v = Alloc(num_blocks * block_elems * 2);
    (void)cuda_raw::LaunchFillUniform(k->data(), DType::kBF16, num_blocks * block_elems, 1, -1, 1,
                                      nullptr);
    (void)cuda_raw::LaunchFillUniform(v->data(), DType::kBF16, num_blocks * block_elems, 2, -1, 1,
                                      nullptr);
    auto q = Alloc(int64_t{seqs} * kHeads * kHeadDim * 2),
         out = Alloc(int64_t{seqs} * kHeads * kHeadDim * 2);
    (void)cuda_raw::LaunchFillUniform(q->data(), DType::kBF16, int64_t{seqs} * kHeads * kHeadDim, 3,
                                      -1, 1, nullptr);
    std::vector<int32_t> tables(num_blocks);
    std::iota(tables.begin(), tables.end(), 0);
    std::shuffle(tables.begin(), tables.end(), std::mt19937(1));
    std::vector<int32_t> lens(seqs, context);
    auto d_tables = Alloc(tables.size() * 4), d_lens = Alloc(lens.size() * 4);
    (void)d_tables->CopyFromHost(tables.data(), tables.size() * 4);
    (void)d_lens->CopyFromHost(lens.data(), lens.size() * 4);
    DecodeAttentionParams p;
    p.q = q->data();
    p.out = out->data();
    p.k_cache = k->data();
    p.v_cache = v->data();
    p.block_tables = static_cast<const int32_t*>(d_tables->data());
    p.context_lens = static_cast<const int32_t*>(d_lens->data());
    p.num_seqs = seqs;
    p.num_heads = kHeads;
    p.num_kv_heads = kKvHeads;
    p.head_dim = kHeadDim;
    p.block_size = kBlock;
    p.num_blocks = num_blocks;
    p.max_blocks_per_seq = blocks_per_seq;
    p.block_stride = block_elems;
    p.max_context_len = context;
    p.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
    p.dtype = DType::kBF16;
    auto ws = Alloc(std::max<size_t>(DecodeAttentionWorkspaceBytes(p), 256));
    p.workspace = ws->data();
    p.workspace_bytes = ws->size();
    absl::Status status;
    const double t = Median([&] { status.Update(DecodeAttentionCuda(p, nullptr)); });
    if (!status.ok()) {
      std::printf("FAIL decode attention: %s\n", status.ToString().c_str());
      return 1;
    }
    const double bytes = 2.0 * seqs * context * kKvHeads * kHeadDim * 2.0;  // K and V, bf16
    std::printf(
        "decode attention %d seqs x %5d context: %.3f ms, %.0f GB/s of KV, ratio to bandwidth "
        "%.2f (goal >= 0.8)\n",
        seqs, context, t * 1e3, bytes / t / 1e9, bytes / t / bandwidth);
  }
  return 0;
}

}  // namespace
}  // namespace deepinfer::kernels

int main(int argc, char** argv) {
  int seqs = 16;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--seqs") == 0) seqs = std::max(1, std::atoi(argv[i + 1]));
  }
  return deepinfer::kernels::Run(seqs);
}
