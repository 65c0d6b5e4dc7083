// Row-reduction benchmark (not a test): the per-token log-softmax normaliser and arg-max of a
// logits row, each ISA path against the scalar reference in the same run, plus std::max_element
// (what greedy sampling used before). Each figure is the median of --reps timings of --iters
// calls on one row of --vocab normally distributed logits (sd 3).
//
//   bazel run -c opt //kernels:softmax_bench -- --vocab 4096
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "kernels/cpu_features.h"
#include "kernels/softmax_cpu.h"

ABSL_FLAG(int, vocab, 4096, "Row length (vocabulary size).");
ABSL_FLAG(int, iters, 20000, "Calls per timing.");
ABSL_FLAG(int, reps, 5, "Timings per figure (the median is printed).");

namespace {

using deepinfer::kernels::CpuIsa;

// Median microseconds per call of fn(row) over reps timings; `sink` keeps results alive.
template <typename Fn>
double Time(std::vector<float>& row, Fn fn, double* sink) {
  const int iters = absl::GetFlag(FLAGS_iters);
  std::vector<double> us;
  for (int r = 0; r < absl::GetFlag(FLAGS_reps); ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      row[i % row.size()] += 1e-3f;  // a slightly different row each call
      *sink += fn(row);
    }
    const auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / iters);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int vocab = absl::GetFlag(FLAGS_vocab);
  if (vocab < 1 || absl::GetFlag(FLAGS_iters) < 1 || absl::GetFlag(FLAGS_reps) < 1) {
    std::fprintf(stderr, "--vocab, --iters and --reps must be >= 1\n");
    return 2;
  }
  std::vector<float> row(vocab);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (float& v : row) v = dist(rng);
  double sink = 0.0;
  std::printf("vocab %d  iters %d  reps %d (medians, us per row)\n", vocab,
              absl::GetFlag(FLAGS_iters), absl::GetFlag(FLAGS_reps));
  const double max_element = Time(
      row,
      [](const std::vector<float>& x) { return std::max_element(x.begin(), x.end()) - x.begin(); },
      &sink);
  std::printf("%-8s %-26s %8.3f\n", "-", "std::max_element", max_element);
  double scalar_lse = 0.0, scalar_argmax = 0.0;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2}) {
    if (!deepinfer::kernels::CpuSupports(isa)) continue;
    const double lse = Time(
        row,
        [isa](const std::vector<float>& x) {
          const float m = deepinfer::kernels::RowMaxCpuWithIsa(x.data(), x.size(), isa);
          return deepinfer::kernels::SumExpCpuWithIsa(x.data(), x.size(), m, isa);
        },
        &sink);
    const double argmax = Time(
        row,
        [isa](const std::vector<float>& x) {
          return deepinfer::kernels::ArgMaxCpuWithIsa(x.data(), x.size(), isa);
        },
        &sink);
    if (isa == CpuIsa::kScalar) {
      scalar_lse = lse;
      scalar_argmax = argmax;
    }
    std::printf("%-8s %-26s %8.3f  (x%.1f against scalar)\n", deepinfer::kernels::CpuIsaName(isa),
                "max + sum of exp", lse, scalar_lse / lse);
    std::printf("%-8s %-26s %8.3f  (x%.1f against scalar, x%.1f against max_element)\n",
                deepinfer::kernels::CpuIsaName(isa), "arg-max", argmax, scalar_argmax / argmax,
                max_element / argmax);
  }
  std::printf("(checksum %g)\n", sink);
  return 0;
}
