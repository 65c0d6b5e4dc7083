#include "engine/sampler.h"

#include <cmath>
#include <map>
#include <vector>

#include "gtest/gtest.h"

namespace deepinfer::engine {
namespace {

SamplingParams Seeded(float temperature, uint64_t seed = 7) {
  SamplingParams p;
  p.temperature = temperature;
  p.has_seed = true;
  p.seed = seed;
  return p;
}

TEST(SamplerTest, GreedyTakesArgmaxLowestIdOnTies) {
  Sampler s(Seeded(0.0f));
  const std::vector<float> logits = {0.1f, 2.0f, 2.0f, -1.0f};
  EXPECT_EQ(s.Sample(logits.data(), 4).token, 1);
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedDiffers) {
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[i] = std::sin(i * 0.7f);
  auto run = [&](uint64_t seed) {
    Sampler s(Seeded(1.0f, seed));
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.Sample(logits.data(), 50).token);
    return out;
  };
  EXPECT_EQ(run(123), run(123));
  EXPECT_NE(run(123), run(124));
}

TEST(SamplerTest, SamplesFollowTheDistribution) {
  // probs ~ [0.5, 0.3, 0.2]
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  Sampler s(Seeded(1.0f));
  std::map<int, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) counts[s.Sample(logits.data(), 3).token]++;
  EXPECT_NEAR(counts[0] / double(n), 0.5, 0.02);
  EXPECT_NEAR(counts[1] / double(n), 0.3, 0.02);
  EXPECT_NEAR(counts[2] / double(n), 0.2, 0.02);
}

TEST(SamplerTest, TopKTopPMinPRestrictTheSupport) {
  const std::vector<float> logits = {std::log(0.4f), std::log(0.3f), std::log(0.2f), std::log(0.1f)};
  SamplingParams k = Seeded(1.0f);
  k.top_k = 2;
  SamplingParams p = Seeded(1.0f);
  p.top_p = 0.65f;  // 0.4 + 0.3 reaches it: {0, 1}
  SamplingParams m = Seeded(1.0f);
  m.min_p = 0.6f;  // keep p >= 0.24: {0, 1}
  for (const SamplingParams& params : {k, p, m}) {
    Sampler s(params);
    std::map<int, int> counts;
    for (int i = 0; i < 4000; ++i) counts[s.Sample(logits.data(), 4).token]++;
    EXPECT_EQ(counts.count(2) + counts.count(3), 0u);
    EXPECT_NEAR(counts[0] / 4000.0, 0.4 / 0.7, 0.04);
  }
  SamplingParams tiny = Seeded(1.0f);
  tiny.top_p = 1e-6f;
  Sampler s(tiny);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(s.Sample(logits.data(), 4).token, 0);
}

TEST(SamplerTest, LowTemperatureApproachesGreedy) {
  const std::vector<float> logits = {1.0f, 1.5f, 0.5f};
  Sampler s(Seeded(0.01f));
  for (int i = 0; i < 100; ++i) EXPECT_EQ(s.Sample(logits.data(), 3).token, 1);
}

TEST(SamplerTest, Penalties) {
  const std::vector<float> logits = {2.0f, 1.9f, -1.0f};
  SamplingParams rep = Seeded(0.0f);
  rep.repetition_penalty = 1.2f;  // 2.0 / 1.2 < 1.9
  Sampler r(rep);
  const int32_t prompt[] = {0};
  r.AddPromptTokens(prompt, 1);
  EXPECT_EQ(r.Sample(logits.data(), 3).token, 1);

  SamplingParams freq = Seeded(0.0f);
  freq.frequency_penalty = 0.06f;
  Sampler f(freq);
  EXPECT_EQ(f.Sample(logits.data(), 3).token, 0);
  f.AddOutputToken(0);
  EXPECT_EQ(f.Sample(logits.data(), 3).token, 0);  // 2.0 - 0.06 > 1.9
  f.AddOutputToken(0);
  EXPECT_EQ(f.Sample(logits.data(), 3).token, 1);  // 2.0 - 0.12 < 1.9

  SamplingParams pres = Seeded(0.0f);
  pres.presence_penalty = 0.2f;
  Sampler ps(pres);
  ps.AddPromptTokens(prompt, 1);  // prompt does not count for presence
  EXPECT_EQ(ps.Sample(logits.data(), 3).token, 0);
  ps.AddOutputToken(0);
  EXPECT_EQ(ps.Sample(logits.data(), 3).token, 1);
}

TEST(SamplerTest, LogprobsAreRawLogSoftmax) {
  const std::vector<float> logits = {0.0f, std::log(3.0f), std::log(6.0f)};  // probs 0.1 .3 .6
  SamplingParams p = Seeded(0.0f);
  p.logprobs = 2;
  p.repetition_penalty = 1.5f;  // does not affect reported logprobs
  Sampler s(p);
  SampleResult r = s.Sample(logits.data(), 3);
  EXPECT_EQ(r.token, 2);
  EXPECT_NEAR(r.logprob, std::log(0.6), 1e-6);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].token, 2);
  EXPECT_EQ(r.top[1].token, 1);
  EXPECT_NEAR(r.top[1].logprob, std::log(0.3), 1e-6);
}

TEST(SamplerTest, ValidationNamesTheField) {
  struct Case {
    SamplingParams p;
    const char* field;
  };
  std::vector<Case> cases;
  SamplingParams p;
  p.temperature = -1;
  cases.push_back({p, "sampling.temperature"});
  p = {};
  p.top_p = 1.5f;
  cases.push_back({p, "sampling.top_p"});
  p = {};
  p.top_p = 0.0f;
  cases.push_back({p, "sampling.top_p"});
  p = {};
  p.top_k = -5;
  cases.push_back({p, "sampling.top_k"});
  p = {};
  p.min_p = 2;
  cases.push_back({p, "sampling.min_p"});
  p = {};
  p.repetition_penalty = 0;
  cases.push_back({p, "sampling.repetition_penalty"});
  p = {};
  p.presence_penalty = 3;
  cases.push_back({p, "sampling.presence_penalty"});
  p = {};
  p.frequency_penalty = -3;
  cases.push_back({p, "sampling.frequency_penalty"});
  p = {};
  p.max_tokens = 0;
  cases.push_back({p, "sampling.max_tokens"});
  p = {};
  p.logprobs = 21;
  cases.push_back({p, "sampling.logprobs"});
  p = {};
  p.stop = {""};
  cases.push_back({p, "sampling.stop[0]"});
  p = {};
  p.stop_token_ids = {1, 100};
  cases.push_back({p, "sampling.stop_token_ids[1]"});
  for (const Case& c : cases) {
    absl::Status s = ValidateSamplingParams(c.p, 100);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(s.message().find(c.field), absl::string_view::npos) << s;
  }
  EXPECT_TRUE(ValidateSamplingParams(SamplingParams(), 100).ok());
}

}  // namespace
}  // namespace deepinfer::engine
