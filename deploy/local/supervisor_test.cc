#include "deploy/local/supervisor.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace deepinfer::deploy {
namespace {

using internal::v1::GetPlanResponse;

class FakePlanSource : public PlanSource {
 public:
  void Set(int prefill, int decode, bool planned = true) {
    absl::MutexLock lock(&mu_);
    plan_.Clear();
    for (auto [role, desired] : {std::pair{internal::v1::WORKER_ROLE_PREFILL, prefill},
                                 std::pair{internal::v1::WORKER_ROLE_DECODE, decode}}) {
      internal::v1::PoolPlan* p = plan_.add_pools();
      p->set_pool(role);
      p->set_planned(planned);
      p->set_desired_replicas(static_cast<uint32_t>(desired));
    }
    status_ = absl::OkStatus();
  }
  void Fail(absl::Status status) {
    absl::MutexLock lock(&mu_);
    status_ = std::move(status);
  }
  absl::StatusOr<GetPlanResponse> GetPlan() override {
    absl::MutexLock lock(&mu_);
    if (!status_.ok()) return status_;
    return plan_;
  }

 private:
  absl::Mutex mu_;
  GetPlanResponse plan_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// An in-memory cluster: workers are entries with a busyness the test sets.
class FakeCluster : public ClusterControl {
 public:
  void Add(ClusterRole role, int busy = 0, bool running = true) {
    absl::MutexLock lock(&mu_);
    AddLocked(role, busy, running);
  }
  void SetBusy(const std::string& name, int busy) {
    absl::MutexLock lock(&mu_);
    for (auto& w : workers_) {
      if (w.info.name == name) w.busy = busy;
    }
  }
  void FailAdds(int n) {
    absl::MutexLock lock(&mu_);
    fail_adds_ = n;
  }
  void FailStats(const std::string& name) {
    absl::MutexLock lock(&mu_);
    fail_stats_ = name;
  }
  std::vector<std::string> Names(ClusterRole role) const {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out;
    for (const auto& w : workers_) {
      if (w.info.role == role) out.push_back(w.info.name);
    }
    return out;
  }
  std::vector<std::pair<std::string, absl::Duration>> removals() const {
    absl::MutexLock lock(&mu_);
    return removals_;
  }

  std::vector<ClusterProcessInfo> workers() const override {
    absl::MutexLock lock(&mu_);
    std::vector<ClusterProcessInfo> out;
    for (const auto& w : workers_) out.push_back(w.info);
    return out;
  }
  absl::StatusOr<int> AddWorker(ClusterRole role) override {
    absl::MutexLock lock(&mu_);
    if (fail_adds_ > 0) {
      --fail_adds_;
      return absl::UnavailableError("worker exited during start-up");
    }
    AddLocked(role, 0, true);
    return static_cast<int>(workers_.size()) - 1;
  }
  absl::StatusOr<ExitStatus> RemoveWorker(int index, absl::Duration grace) override {
    absl::MutexLock lock(&mu_);
    if (index < 0 || index >= static_cast<int>(workers_.size())) {
      return absl::OutOfRangeError("index");
    }
    removals_.push_back({workers_[index].info.name, grace});
    workers_.erase(workers_.begin() + index);
    ExitStatus exit;
    exit.exited = true;
    return exit;
  }
  absl::StatusOr<internal::v1::WorkerStats> GetStats(int index, absl::Duration) override {
    absl::MutexLock lock(&mu_);
    if (index < 0 || index >= static_cast<int>(workers_.size())) {
      return absl::OutOfRangeError("index");
    }
    if (workers_[index].info.name == fail_stats_) return absl::UnavailableError("no answer");
    internal::v1::WorkerStats s;
    s.set_worker_id(workers_[index].info.name);
    s.set_active_requests(static_cast<uint32_t>(workers_[index].busy));
    return s;
  }

 private:
  struct Worker {
    ClusterProcessInfo info;
    int busy = 0;
  };
  void AddLocked(ClusterRole role, int busy, bool running) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Worker w;
    w.info.role = role;
    w.info.name = absl::StrCat(ClusterRoleName(role), "-", next_[role]++);
    w.info.running = running;
    w.busy = busy;
    workers_.push_back(w);
  }

  mutable absl::Mutex mu_;
  std::vector<Worker> workers_ ABSL_GUARDED_BY(mu_);
  std::map<ClusterRole, int> next_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, absl::Duration>> removals_ ABSL_GUARDED_BY(mu_);
  int fail_adds_ ABSL_GUARDED_BY(mu_) = 0;
  std::string fail_stats_ ABSL_GUARDED_BY(mu_);
};

class SupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_.Add(ClusterRole::kPrefill);
    cluster_.Add(ClusterRole::kDecode);
    SupervisorOptions o;
    o.prefill = {1, 3};
    o.decode = {1, 2};
    o.drain_grace = absl::Seconds(7);
    auto s = Supervisor::Create(&plans_, &cluster_, o);
    ASSERT_TRUE(s.ok()) << s.status();
    supervisor_ = *std::move(s);
  }

  FakePlanSource plans_;
  FakeCluster cluster_;
  std::unique_ptr<Supervisor> supervisor_;
};

using Names = std::vector<std::string>;

TEST_F(SupervisorTest, AddsWorkersUpToThePlan) {
  plans_.Set(3, 1);
  SupervisorStep step;
  ASSERT_TRUE(supervisor_->Step(&step).ok());
  EXPECT_EQ(step.added, (Names{"prefill-1", "prefill-2"}));
  EXPECT_TRUE(step.removed.empty());
  EXPECT_EQ(cluster_.Names(ClusterRole::kPrefill).size(), 3u);
  EXPECT_EQ(cluster_.Names(ClusterRole::kDecode).size(), 1u);
  // Following an unchanged plan does nothing.
  step = {};
  ASSERT_TRUE(supervisor_->Step(&step).ok());
  EXPECT_TRUE(step.added.empty() && step.removed.empty());
  EXPECT_EQ(supervisor_->added(), 2);
  EXPECT_EQ(supervisor_->steps(), 2);
}

TEST_F(SupervisorTest, StaysWithinItsOwnBounds) {
  plans_.Set(10, 0);  // above prefill max 3, below decode min 1
  ASSERT_TRUE(supervisor_->Step().ok());
  EXPECT_EQ(cluster_.Names(ClusterRole::kPrefill).size(), 3u);
  EXPECT_EQ(cluster_.Names(ClusterRole::kDecode).size(), 1u);
  plans_.Set(0, 5);
  ASSERT_TRUE(supervisor_->Step().ok());
  EXPECT_EQ(cluster_.Names(ClusterRole::kPrefill).size(), 1u);
  EXPECT_EQ(cluster_.Names(ClusterRole::kDecode).size(), 2u);
}

TEST_F(SupervisorTest, RemovesTheLeastBusyThenTheNewest) {
  plans_.Set(3, 1);
  ASSERT_TRUE(supervisor_->Step().ok());  // prefill-0, -1, -2
  cluster_.SetBusy("prefill-0", 5);
  cluster_.SetBusy("prefill-1", 0);
  cluster_.SetBusy("prefill-2", 2);
  plans_.Set(2, 1);
  SupervisorStep step;
  ASSERT_TRUE(supervisor_->Step(&step).ok());
  EXPECT_EQ(step.removed, (Names{"prefill-1"}));  // least busy
  // Equal load: the newest goes.
  ASSERT_TRUE(supervisor_->Step().ok());
  cluster_.SetBusy("prefill-0", 0);
  cluster_.SetBusy("prefill-2", 0);
  plans_.Set(1, 1);
  step = {};
  ASSERT_TRUE(supervisor_->Step(&step).ok());
  EXPECT_EQ(step.removed, (Names{"prefill-2"}));
  EXPECT_EQ(cluster_.Names(ClusterRole::kPrefill), (Names{"prefill-0"}));
  // Every removal drained with the configured grace.
  for (const auto& [name, grace] : cluster_.removals()) EXPECT_EQ(grace, absl::Seconds(7)) << name;
  EXPECT_EQ(supervisor_->removed(), 2);
}

TEST_F(SupervisorTest, AWorkerWhoseStatsFailCountsAsBusiest) {
  plans_.Set(3, 1);
  ASSERT_TRUE(supervisor_->Step().ok());
  cluster_.SetBusy("prefill-0", 9);
  cluster_.FailStats("prefill-2");
  plans_.Set(2, 1);
  SupervisorStep step;
  ASSERT_TRUE(supervisor_->Step(&step).ok());
  EXPECT_EQ(step.removed, (Names{"prefill-1"}));
}

TEST_F(SupervisorTest, ExitedWorkersDoNotCountAsRunning) {
  cluster_.Add(ClusterRole::kDecode, 0, /*running=*/false);  // decode-1 crashed
  plans_.Set(1, 2);
  SupervisorStep step;
  ASSERT_TRUE(supervisor_->Step(&step).ok());
  EXPECT_EQ(step.added, (Names{"decode-2"}));
}

TEST_F(SupervisorTest, UnplannedPoolsAreLeftAlone) {
  plans_.Set(3, 2, /*planned=*/false);
  SupervisorStep step;
  ASSERT_TRUE(supervisor_->Step(&step).ok());
  EXPECT_TRUE(step.added.empty() && step.removed.empty());
}

TEST_F(SupervisorTest, FailuresAreCountedAndTheNextPassRetries) {
  plans_.Fail(absl::FailedPreconditionError("autoscaling is off"));
  EXPECT_EQ(supervisor_->Step().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(supervisor_->errors(), 1);
  EXPECT_TRUE(absl::StrContains(supervisor_->last_error(), "autoscaling is off"));

  plans_.Set(2, 2);
  cluster_.FailAdds(1);  // the prefill add fails; decode is still handled in the same pass
  SupervisorStep step;
  absl::Status s = supervisor_->Step(&step);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(s.message(), "adding a prefill worker")) << s;
  EXPECT_EQ(step.added, (Names{"decode-1"}));
  EXPECT_EQ(supervisor_->errors(), 2);

  step = {};
  ASSERT_TRUE(supervisor_->Step(&step).ok());
  EXPECT_EQ(step.added, (Names{"prefill-1"}));
}

TEST_F(SupervisorTest, StartFollowsThePlanUntilStop) {
  SupervisorOptions o;
  o.interval = absl::Milliseconds(5);
  auto s = Supervisor::Create(&plans_, &cluster_, o);
  ASSERT_TRUE(s.ok());
  plans_.Set(2, 1);
  (*s)->Start();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (cluster_.Names(ClusterRole::kPrefill).size() < 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  (*s)->Stop();
  EXPECT_EQ(cluster_.Names(ClusterRole::kPrefill).size(), 2u);
  const int64_t steps = (*s)->steps();
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_EQ((*s)->steps(), steps);
}

TEST(SupervisorCreateTest, RejectsBadOptions) {
  FakePlanSource plans;
  FakeCluster cluster;
  SupervisorOptions o;
  o.decode = {0, 2};
  EXPECT_TRUE(absl::StrContains(Supervisor::Create(&plans, &cluster, o).status().message(),
                                "decode.min_replicas"));
  o = SupervisorOptions();
  o.prefill = {2, 1};
  EXPECT_TRUE(absl::StrContains(Supervisor::Create(&plans, &cluster, o).status().message(),
                                "prefill.max_replicas"));
  o = SupervisorOptions();
  o.interval = absl::ZeroDuration();
  EXPECT_EQ(Supervisor::Create(&plans, &cluster, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Supervisor::Create(nullptr, &cluster, SupervisorOptions()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deepinfer::deploy
