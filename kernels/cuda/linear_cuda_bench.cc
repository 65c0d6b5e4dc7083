// GPU benchmark (not a test): cuBLASLt bf16 projections (kernels/cuda/linear_cuda.h) at the
// shapes of a Llama-3-8B layer, as achieved TFLOP/s (2 m n k / time) and weight-read GB/s
// (n k 2 bytes / time). Prefill-sized m (4096 tokens) is compute-bound: its best figure is the
// machine's measured bf16 GEMM peak, the baseline issue 10's prefill ratio divides by. Decode-sized
// m (1, 64) is bound by reading the weights: compare the GB/s with the device's bandwidth.
// Each figure: the median of 5 timings of back-to-back calls (at least 0.1 s each) after warm-up.
//
//   linear_cuda_bench [--m 1,64,4096]       (prints one line per shape, then the peak)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/linear_cuda.h"

namespace deepinfer::kernels {
namespace {

struct Shape {
  const char* name;
  int64_t n, k;
};

// Llama-3-8B: hidden 4096, 32 query / 8 KV heads of 128, MLP 14336 (gate and up fused).
constexpr Shape kShapes[] = {
    {"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336}};

std::unique_ptr<DeviceBuffer> Alloc(size_t bytes) {
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> b = DeviceBuffer::Allocate(bytes);
  if (!b.ok()) {
    std::fprintf(stderr, "%s\n", b.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(b);
}

void Fill(DeviceBuffer& b) {
  // Small bf16 values (0x3c00..0x3cff: about 0.008): finite sums whatever k.
  std::vector<uint16_t> host(b.size() / 2);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint16_t>(0x3c00 + (i * 37) % 256);
  if (absl::Status s = b.CopyFromHost(host.data(), host.size() * 2); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    std::exit(1);
  }
}

double Seconds(const LinearCudaParams& p, int calls) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) {
    if (absl::Status s = LinearCuda(p, nullptr); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      std::exit(1);
    }
  }
  if (absl::Status s = CudaStatus(cuda_raw::StreamSynchronize(nullptr), "synchronize"); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    std::exit(1);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int Main(int argc, char** argv) {
  std::vector<int64_t> ms = {1, 64, 4096};
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--m") == 0) {
      ms.clear();
      for (char* tok = std::strtok(argv[i + 1], ","); tok != nullptr;
           tok = std::strtok(nullptr, ","))
        ms.push_back(std::atoll(tok));
    }
  }
  if (absl::Status s = CudaAvailable(); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  const int64_t max_m = *std::max_element(ms.begin(), ms.end());
  int64_t max_n = 0, max_k = 0;
  for (const Shape& s : kShapes) {
    max_n = std::max(max_n, s.n);
    max_k = std::max(max_k, s.k);
  }
  auto x = Alloc(static_cast<size_t>(max_m * max_k * 2));
  auto w = Alloc(static_cast<size_t>(max_n * max_k * 2));
  auto y = Alloc(static_cast<size_t>(max_m * max_n * 2));
  auto ws = Alloc(kLinearCudaWorkspaceBytes);
  Fill(*x);
  Fill(*w);
  double peak = 0.0;
  for (int64_t m : ms) {
    for (const Shape& s : kShapes) {
      LinearCudaParams p;
      p.x = x->data();
      p.weight = w->data();
      p.y = y->data();
      p.m = m;
      p.n = s.n;
      p.k = s.k;
      p.dtype = DType::kBF16;
      p.workspace = ws->data();
      p.workspace_bytes = ws->size();
      Seconds(p, 3);  // warm-up (and the algorithm choice)
      int calls = 1;
      while (Seconds(p, calls) < 0.1 && calls < (1 << 20)) calls *= 2;
      std::vector<double> per_call;
      for (int r = 0; r < 5; ++r) per_call.push_back(Seconds(p, calls) / calls);
      std::sort(per_call.begin(), per_call.end());
      const double t = per_call[2];
      const double tflops = 2.0 * m * s.n * s.k / t / 1e12;
      const double gbs = 2.0 * s.n * s.k / t / 1e9;
      if (m >= 1024) peak = std::max(peak, tflops);
      std::printf(
          "linear bf16 %-8s m=%-5lld n=%-6lld k=%-6lld %9.1f us %8.1f TFLOP/s %8.1f GB/s "
          "(weights)\n",
          s.name, static_cast<long long>(m), static_cast<long long>(s.n),
          static_cast<long long>(s.k), t * 1e6, tflops, gbs);
    }
  }
  if (peak > 0.0) std::printf("measured bf16 GEMM peak (m >= 1024): %.1f TFLOP/s\n", peak);
  return 0;
}

}  // namespace
}  // namespace deepinfer::kernels

int main(int argc, char** argv) { return deepinfer::kernels::Main(argc, argv); }
