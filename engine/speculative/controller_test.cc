#include "engine/speculative/controller.h"

#include <chrono>
#include <memory>
#include <numeric>
#include <utility>
#include <vector>

#include "engine/speculative/fake_drafter.h"
#include "gtest/gtest.h"

namespace deepinfer::engine::speculative {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kVocab = 1000;

// The fake drafter proposes oracle[context.size() ...]: long enough for every run here.
std::vector<int32_t> Oracle() {
  std::vector<int32_t> oracle(4 * kVocab);
  for (size_t i = 0; i < oracle.size(); ++i) oracle[i] = static_cast<int32_t>(i % kVocab);
  return oracle;
}

EngineLimits Limits(int max_batch_tokens = 64) {
  EngineLimits l;
  l.vocab_size = kVocab;
  l.num_blocks = 256;
  l.block_size = 16;
  l.max_batch_tokens = max_batch_tokens;
  l.max_running = 8;
  l.max_position_embeddings = 4096;
  return l;
}

SpecOptions Options(int k, bool adaptive) {
  SpecOptions o;
  o.enabled = true;
  o.num_speculative_tokens = k;
  o.adaptive = adaptive;
  o.select_mode = false;
  o.min_n = 1;
  o.max_n = 1;
  return o;
}

// Step time base + slope x tokens, at 1 and 8 requests.
CostTable LinearCostTable(double base, double slope) {
  std::vector<CostTable::Sample> samples;
  for (int requests : {1, 8}) {
    for (int tokens : {1, 64}) {
      for (int run = 0; run < 5; ++run)
        samples.push_back({tokens, requests, base + slope * tokens});
    }
  }
  return CostTable::FromSamples(samples).value();
}

ProfileStepFn NoProfile() {
  return [](int, int, int64_t) -> absl::StatusOr<double> {
    return absl::FailedPreconditionError("no profile in this test");
  };
}

struct Made {
  std::unique_ptr<SpeculativeController> controller;
  FakeDrafter* drafter = nullptr;
};

Made Make(const SpecOptions& options, std::vector<int> wrong_positions = {},
          int max_batch_tokens = 64) {
  auto drafter = std::make_unique<FakeDrafter>(Oracle(), kVocab, std::move(wrong_positions));
  Made m;
  m.drafter = drafter.get();
  auto c = SpeculativeController::Create(options, Limits(max_batch_tokens), NoProfile(),
                                         std::move(drafter));
  EXPECT_TRUE(c.ok()) << c.status();
  if (c.ok()) m.controller = *std::move(c);
  return m;
}

DecodeView View(int64_t id, const std::vector<int32_t>& context, int64_t room) {
  DecodeView v;
  v.seq_id = id;
  v.context = context;
  v.room = room;
  return v;
}

std::vector<int32_t> Prefix(int n) {
  std::vector<int32_t> out(n);
  std::iota(out.begin(), out.end(), 0);
  return out;
}

// Without the adaptive plan every decoding sequence drafts k tokens, capped by what it may still
// emit (room) and by the step's token budget (in order), and only when nothing is in flight.
TEST(SpeculativeControllerTest, FixedDraftsAreCappedByRoomAndBudget) {
  Made m = Make(Options(4, /*adaptive=*/false));
  ASSERT_NE(m.controller, nullptr);
  const std::vector<int32_t> a = Prefix(3), b = Prefix(5);
  const std::vector<DecodeView> decodes = {View(1, a, 10), View(2, b, 2)};
  const StepPlan plan = m.controller->Plan(decodes, 0, 0);
  EXPECT_TRUE(plan.may_draft);
  EXPECT_FALSE(plan.probe);
  EXPECT_EQ(plan.mode, -1);

  StepRecord record;
  std::vector<DraftProposal> drafts;
  m.controller->PrepareStep(plan, decodes, /*all_known=*/true, 0, 0, /*budget=*/64, Clock::now(),
                            &record, &drafts);
  ASSERT_EQ(drafts.size(), 2u);
  EXPECT_EQ(drafts[0].tokens, (std::vector<int32_t>{3, 4, 5, 6}));
  EXPECT_EQ(drafts[1].tokens, (std::vector<int32_t>{5, 6}));  // room 2
  EXPECT_FALSE(record.timed);
  EXPECT_EQ(m.controller->stats().spec_drafted_tokens, 6);

  // A budget of 7 leaves 7 - 2 = 5 draft tokens: the first sequence takes 4, the second 1.
  m.controller->PrepareStep(plan, decodes, true, 0, 0, /*budget=*/7, Clock::now(), &record,
                            &drafts);
  EXPECT_EQ(drafts[0].tokens.size(), 4u);
  EXPECT_EQ(drafts[1].tokens, (std::vector<int32_t>{5}));
  // Prompt tokens beside the decodes take their share first: 7 - 2 - 4 = 1 draft token.
  m.controller->PrepareStep(plan, decodes, true, /*prefill_tokens=*/4, 1, 7, Clock::now(), &record,
                            &drafts);
  EXPECT_EQ(drafts[0].tokens.size(), 1u);
  EXPECT_TRUE(drafts[1].tokens.empty());

  // A step in flight (a decode's latest token unknown): no drafts at all.
  m.controller->PrepareStep(plan, decodes, /*all_known=*/false, 0, 0, 64, Clock::now(), &record,
                            &drafts);
  ASSERT_EQ(drafts.size(), 2u);
  EXPECT_TRUE(drafts[0].tokens.empty());
  EXPECT_TRUE(drafts[1].tokens.empty());

  // Nothing may be drafted: no room left, or a budget that the decodes fill.
  EXPECT_FALSE(m.controller->Plan({View(1, a, 0)}, 0, 0).may_draft);
  EXPECT_FALSE(m.controller->Plan(decodes, /*prefill_tokens=*/62, 1).may_draft);
  EXPECT_FALSE(m.controller->Plan({}, 0, 0).may_draft);
}

// Verification outcomes reach the drafter and the counters; Release reaches the drafter.
TEST(SpeculativeControllerTest, VerificationsAndReleasesReachTheDrafterAndStats) {
  Made m = Make(Options(4, false));
  ASSERT_NE(m.controller, nullptr);
  DraftProposal draft;
  draft.tokens = {3, 4, 5};
  m.controller->OnVerified(7, draft, 3, 1);
  draft.tokens = {9};
  m.controller->OnVerified(8, draft, 1, 1);
  m.controller->Release(7);
  ASSERT_EQ(m.drafter->feedback().size(), 2u);
  EXPECT_EQ(m.drafter->feedback()[0].seq_id, 7);
  EXPECT_EQ(m.drafter->feedback()[0].proposed, 3);
  EXPECT_EQ(m.drafter->feedback()[0].verified, 3);
  EXPECT_EQ(m.drafter->feedback()[0].accepted, 1);
  EXPECT_EQ(m.drafter->released(), (std::vector<int64_t>{7}));
  const SpecStats& st = m.controller->stats();
  EXPECT_EQ(st.spec_steps, 2);
  EXPECT_EQ(st.spec_verified_tokens, 4);
  EXPECT_EQ(st.spec_accepted_tokens, 2);
  EXPECT_EQ(st.spec_longest_verified, 3);
}

TEST(SpeculativeControllerTest, BadOptionsNameTheirField) {
  struct Case {
    void (*set)(SpecOptions*);
    const char* field;
  } cases[] = {
      {[](SpecOptions* o) { o->num_speculative_tokens = 0; }, "num_speculative_tokens"},
      {[](SpecOptions* o) { o->drafter = "oracle"; }, "speculative.drafter"},
      {[](SpecOptions* o) { o->select_max_length = 9; }, "select_max_length"},
      {[](SpecOptions* o) { o->probe_interval = -1; }, "probe_interval"},
      {[](SpecOptions* o) { o->draft_stop_extend = 1.0; }, "draft_stop_extend"},
      {[](SpecOptions* o) { o->drafter = "draft_model"; }, "draft_model_path"},
  };
  for (const Case& c : cases) {
    SpecOptions o = Options(4, true);
    c.set(&o);
    auto made = SpeculativeController::Create(o, Limits(), NoProfile());
    ASSERT_FALSE(made.ok()) << c.field;
    EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(made.status().message().find(c.field), std::string::npos) << made.status();
  }
  // A failed profile only turns the adaptive plan off.
  auto made = SpeculativeController::Create(Options(4, true), Limits(), NoProfile());
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_FALSE((*made)->stats().spec_adaptive_active);
}

// Runs `steps` decode steps of one sequence through the controller as the engine would, on a
// synthetic clock (forward time from `table`, 50 us overhead); returns the draft tokens verified
// in each step and whether it probed.
struct DriveResult {
  std::vector<int> verified;
  std::vector<bool> probed;
};
DriveResult Drive(SpeculativeController& c, const CostTable& table, int steps, bool drafts_right) {
  DriveResult run;
  std::vector<int32_t> context = Prefix(4);
  Clock::time_point now = Clock::now();
  for (int i = 0; i < steps; ++i) {
    const std::vector<DecodeView> decodes = {View(1, context, 1000)};
    const StepPlan plan = c.Plan(decodes, 0, 0);
    StepRecord record;
    std::vector<DraftProposal> drafts;
    c.PrepareStep(plan, decodes, true, 0, 0, 64, now, &record, &drafts);
    const int verified = static_cast<int>(drafts[0].tokens.size());
    const int accepted = drafts_right ? verified : 0;
    if (verified > 0) c.OnVerified(1, drafts[0], verified, accepted);
    const double forward = table.StepSeconds(1.0 + verified, 1);
    now += std::chrono::microseconds(static_cast<int64_t>((forward + 50e-6) * 1e6));
    c.OnStepProcessed(record, {1 + verified, 1, forward, 1.0 + accepted}, now);
    for (int t = 0; t <= accepted; ++t) context.push_back(static_cast<int32_t>(context.size()));
    run.verified.push_back(verified);
    run.probed.push_back(plan.probe);
  }
  return run;
}

// The adaptive plan learns from verifications: drafts that are always rejected stop being
// verified (only probes verify one), drafts that are always accepted are verified whole, and
// every adaptive step is timed against the cost table.
TEST(SpeculativeControllerTest, AdaptivePlanFollowsMeasuredAcceptance) {
  const CostTable table = LinearCostTable(1e-3, 1e-5);
  SpecOptions o = Options(4, /*adaptive=*/true);
  o.cost_table = &table;
  for (const bool right : {false, true}) {
    SCOPED_TRACE(right ? "drafts accepted" : "drafts rejected");
    Made m = Make(o, right ? std::vector<int>{} : std::vector<int>{0, 1, 2, 3});
    ASSERT_NE(m.controller, nullptr);
    ASSERT_TRUE(m.controller->stats().spec_adaptive_active);
    const DriveResult run = Drive(*m.controller, table, 300, right);
    int late_verified = 0, late_probes = 0;
    for (int i = 200; i < 300; ++i) {
      late_verified += run.verified[i];
      late_probes += run.probed[i] ? 1 : 0;
    }
    const SpecStats& st = m.controller->stats();
    EXPECT_EQ(st.spec_timed_steps, 300);
    EXPECT_GT(st.spec_measured_step_seconds, 300 * 1e-3);
    EXPECT_NEAR(st.spec_overhead_seconds, 50e-6, 5e-6);
    if (right) {
      EXPECT_EQ(late_verified, 4 * 100);
    } else {
      EXPECT_LE(late_verified, late_probes);
      EXPECT_GT(st.spec_probe_steps, 0);
    }
  }
}

}  // namespace
}  // namespace deepinfer::engine::speculative
