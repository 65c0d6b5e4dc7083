// CUDA greedy choice and logprobs against the host's arithmetic (engine/sampler.h's Sampler at
// temperature 0: arg-max with the lowest id on ties, log Z summed in f64, top-n by partial_sort on
// (logit descending, id ascending)), computed here: vocabularies of 1, 7, 4096 and 128257 (past a
// multiple of the block), logits on a 0.25 grid so that ties are common, some -inf (masked)
// entries, padded rows, top_n 0, 1, 5 and 20, and more top_n than vocabulary. Needs a GPU (tag
// "gpu").
#include "kernels/cuda/greedy_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"

namespace deepinfer::kernels {
namespace {

using testing::CudaParamTest;
using testing::DownloadAs;
using testing::Upload;

struct Case {
  int vocab;
  int64_t rows;
  int top_n;
  int pad;  // row_stride = vocab + pad (0: row_stride left 0)
};

std::string Name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return "v" + std::to_string(c.vocab) + "_r" + std::to_string(c.rows) + "_top" +
         std::to_string(c.top_n) + (c.pad ? "_pad" : "");
}

class GreedyCudaTest : public CudaParamTest<Case> {};

TEST_P(GreedyCudaTest, MatchesHost) {
  const Case c = GetParam();
  std::mt19937 rng(c.vocab + c.top_n);
  const int64_t stride = c.vocab + c.pad;
  std::vector<float> logits(c.rows * stride, 1e30f);  // padding would win if it were read
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int i = 0; i < c.vocab; ++i) {
      float v = std::round(dist(rng) * 4.0f) / 4.0f;
      if (c.vocab > 1 && rng() % 10 == 0) v = -std::numeric_limits<float>::infinity();
      logits[r * stride + i] = v;
    }
  }
  auto dl = Upload(logits);
  const int n = std::min(c.top_n, c.vocab);
  auto dtok = Upload(std::vector<int32_t>(c.rows, -7));
  auto dlp = Upload(std::vector<float>(c.rows, 0.0f));
  auto dtt = Upload(std::vector<int32_t>(std::max<int64_t>(1, c.rows * c.top_n), -7));
  auto dtl = Upload(std::vector<float>(std::max<int64_t>(1, c.rows * c.top_n), 0.0f));
  GreedyParams p;
  p.logits = static_cast<const float*>(dl->data());
  p.rows = c.rows;
  p.vocab = c.vocab;
  p.row_stride = c.pad ? stride : 0;
  p.tokens = static_cast<int32_t*>(dtok->data());
  p.logprobs = static_cast<float*>(dlp->data());
  p.top_n = c.top_n;
  p.top_tokens = static_cast<int32_t*>(dtt->data());
  p.top_logprobs = static_cast<float*>(dtl->data());
  const absl::Status s = GreedyCuda(p, nullptr);
  ASSERT_TRUE(s.ok()) << s;
  const std::vector<int32_t> tokens = DownloadAs<int32_t>(*dtok);
  const std::vector<float> lps = DownloadAs<float>(*dlp);
  const std::vector<int32_t> top_tokens = DownloadAs<int32_t>(*dtt);
  const std::vector<float> top_lps = DownloadAs<float>(*dtl);

  for (int64_t r = 0; r < c.rows; ++r) {
    const float* x = logits.data() + r * stride;
    const float mx = *std::max_element(x, x + c.vocab);
    double sum = 0.0;
    for (int i = 0; i < c.vocab; ++i) sum += std::exp(static_cast<double>(x[i] - mx));
    const float log_z = mx + static_cast<float>(std::log(sum));
    const int32_t want = static_cast<int32_t>(std::max_element(x, x + c.vocab) - x);
    ASSERT_EQ(tokens[r], want) << "row " << r;
    EXPECT_NEAR(lps[r], x[want] - log_z, 1e-4f) << "row " << r;
    std::vector<int32_t> order(c.vocab);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + n, order.end(),
                      [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
    for (int t = 0; t < n; ++t) {
      ASSERT_EQ(top_tokens[r * c.top_n + t], order[t]) << "row " << r << " rank " << t;
      const float want_lp = x[order[t]] - log_z;
      if (std::isinf(want_lp)) {
        EXPECT_EQ(top_lps[r * c.top_n + t], want_lp) << "row " << r << " rank " << t;
      } else {
        EXPECT_NEAR(top_lps[r * c.top_n + t], want_lp, 1e-4f) << "row " << r << " rank " << t;
      }
    }
    for (int t = n; t < c.top_n; ++t) {
      EXPECT_EQ(top_tokens[r * c.top_n + t], -7) << "row " << r << ": past min(top_n, vocab)";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GreedyCudaTest,
                         ::testing::Values(Case{1, 3, 1, 0}, Case{7, 5, 20, 0},
                                           Case{4096, 17, 5, 0}, Case{4096, 4, 0, 3},
                                           Case{128257, 9, 20, 0}, Case{128257, 2, 1, 64},
                                           Case{50, 0, 5, 0}),
                         Name);

}  // namespace
}  // namespace deepinfer::kernels
