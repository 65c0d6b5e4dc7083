// CUDA next-token sampling against the host's algorithm (engine/sampler.h's LogitsProcessor::
// Distribution and Sampler::Sample for a request without penalties, restated here): rows with
// temperature 0, a plain softmax, top-k, top-p, min-p and all three together, top_k = 1 and
// = vocab, a top_p below the largest probability; logits on a 0.25 grid (ties) with some -inf;
// vocabularies 7, 4096 and 128257; each row with its own uniform draw, many draws per setting.
// Tokens must be identical and logprobs within 1e-4. Needs a GPU (tag "gpu").
#include "kernels/cuda/sample_cuda.h"

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

struct RowParams {
  float temperature;
  int top_k;
  float top_p;
  float min_p;
};

// The host's choice (engine/sampler.cc), for one row.
int32_t HostChoice(const float* x, int vocab, const RowParams& rp, double u) {
  std::vector<double> probs(vocab, 0.0);
  if (rp.temperature == 0.0f) {
    return static_cast<int32_t>(std::max_element(x, x + vocab) - x);
  }
  std::vector<float> l(x, x + vocab);
  for (float& v : l) v /= rp.temperature;
  const bool truncates = (rp.top_k > 0 && rp.top_k < vocab) || rp.top_p < 1.0f || rp.min_p > 0.0f;
  if (!truncates) {
    const float mx = *std::max_element(l.begin(), l.end());
    double sum = 0.0;
    for (int i = 0; i < vocab; ++i) sum += probs[i] = std::exp(static_cast<double>(l[i] - mx));
    for (double& p : probs) p /= sum;
  } else {
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    int keep = vocab;
    if (rp.top_k > 0 && rp.top_k < vocab) keep = rp.top_k;
    std::partial_sort(order.begin(), order.begin() + keep, order.end(),
                      [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    const float mx = l[order[0]];
    std::vector<double> sorted(keep);
    double sum = 0.0;
    for (int i = 0; i < keep; ++i)
      sum += sorted[i] = std::exp(static_cast<double>(l[order[i]] - mx));
    for (double& p : sorted) p /= sum;
    if (rp.top_p < 1.0f) {
      double cum = 0.0;
      int n = 0;
      while (n < keep) {
        cum += sorted[n++];
        if (cum >= rp.top_p) break;
      }
      keep = std::max(1, n);
    }
    if (rp.min_p > 0.0f) {
      const double threshold = rp.min_p * sorted[0];
      int n = 1;
      while (n < keep && sorted[n] >= threshold) ++n;
      keep = n;
    }
    double total = 0.0;
    for (int i = 0; i < keep; ++i) total += sorted[i];
    for (int i = 0; i < keep; ++i) probs[order[i]] = sorted[i] / total;
  }
  double cum = 0.0;
  int32_t last_nonzero = 0;
  for (int i = 0; i < vocab; ++i) {
    if (probs[i] <= 0.0) continue;
    last_nonzero = i;
    cum += probs[i];
    if (u < cum) return i;
  }
  return last_nonzero;
}

class SampleCudaTest : public CudaParamTest<int> {};

TEST_P(SampleCudaTest, MatchesHost) {
  const int vocab = GetParam();
  const std::vector<RowParams> settings = {{0.0f, 0, 1.0f, 0.0f},  {1.0f, 0, 1.0f, 0.0f},
                                           {0.7f, 50, 1.0f, 0.0f}, {1.3f, 0, 0.9f, 0.0f},
                                           {1.0f, 0, 1.0f, 0.05f}, {0.8f, 200, 0.8f, 0.02f},
                                           {1.0f, 1, 1.0f, 0.0f},  {1.0f, vocab, 1.0f, 0.0f},
                                           {1.0f, 0, 0.01f, 0.0f}, {2.0f, -1, 0.95f, 0.1f}};
  const int draws = 8;  // rows per setting, each with its own logits and draw
  const int64_t rows = static_cast<int64_t>(settings.size()) * draws;
  std::mt19937 rng(vocab);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::vector<float> logits(rows * vocab), temperature(rows), top_p(rows), min_p(rows);
  std::vector<int32_t> top_k(rows);
  std::vector<double> uniform(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const RowParams& rp = settings[r / draws];
    temperature[r] = rp.temperature;
    top_k[r] = rp.top_k;
    top_p[r] = rp.top_p;
    min_p[r] = rp.min_p;
    uniform[r] = uni(rng);
    for (int i = 0; i < vocab; ++i) {
      float v = std::round(dist(rng) * 4.0f) / 4.0f;
      if (rng() % 20 == 0) v = -std::numeric_limits<float>::infinity();
      logits[r * vocab + i] = v;
    }
    logits[r * vocab + r % vocab] = 3.0f;  // at least one finite logit
  }
  absl::StatusOr<size_t> ws_bytes = SampleWorkspaceBytes(rows, vocab);
  ASSERT_TRUE(ws_bytes.ok()) << ws_bytes.status();
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> ws = DeviceBuffer::Allocate(*ws_bytes);
  ASSERT_TRUE(ws.ok()) << ws.status();
  auto dl = Upload(logits);
  auto dt = Upload(temperature);
  auto dk = Upload(top_k);
  auto dp = Upload(top_p);
  auto dm = Upload(min_p);
  auto du = Upload(uniform);
  auto dtok = Upload(std::vector<int32_t>(rows, -1));
  auto dlp = Upload(std::vector<float>(rows, 0.0f));
  SampleParams p;
  p.logits = static_cast<const float*>(dl->data());
  p.rows = rows;
  p.vocab = vocab;
  p.temperature = static_cast<const float*>(dt->data());
  p.top_k = static_cast<const int32_t*>(dk->data());
  p.top_p = static_cast<const float*>(dp->data());
  p.min_p = static_cast<const float*>(dm->data());
  p.uniform = static_cast<const double*>(du->data());
  p.tokens = static_cast<int32_t*>(dtok->data());
  p.logprobs = static_cast<float*>(dlp->data());
  p.workspace = (*ws)->data();
  p.workspace_bytes = *ws_bytes;
  const absl::Status s = SampleCuda(p, nullptr);
  ASSERT_TRUE(s.ok()) << s;
  const std::vector<int32_t> tokens = DownloadAs<int32_t>(*dtok);
  const std::vector<float> lps = DownloadAs<float>(*dlp);
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits.data() + r * vocab;
    const int32_t want = HostChoice(x, vocab, settings[r / draws], uniform[r]);
    EXPECT_EQ(tokens[r], want) << "row " << r << " setting " << r / draws << " u " << uniform[r];
    const float mx = *std::max_element(x, x + vocab);
    double sum = 0.0;
    for (int i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(x[i] - mx));
    const float log_z = mx + static_cast<float>(std::log(sum));
    EXPECT_NEAR(lps[r], x[want] - log_z, 1e-4f) << "row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, SampleCudaTest, ::testing::Values(7, 4096, 128257));

}  // namespace
}  // namespace deepinfer::kernels
