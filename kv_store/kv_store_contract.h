// The KvStore contract suite (kv_store.h), run on every backend. A backend's test instantiates it
// with an environment that knows how to open the backend and to do what only the backend can
// (corrupt a stored byte, measure the bytes really held, run writers as real processes):
//
//   INSTANTIATE_TEST_SUITE_P(Memory, KvStoreContractTest,
//                            testing::Values(KvStoreContractParam{"memory", &MakeMemoryEnv}),
//                            KvStoreContractParamName);
#ifndef DEEPINFER_KV_STORE_KV_STORE_CONTRACT_H_
#define DEEPINFER_KV_STORE_KV_STORE_CONTRACT_H_

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/fake_clock.h"
#include "gtest/gtest.h"
#include "kv_store/kv_store.h"

namespace deepinfer::kv_store_testing {

// Writes keys [first_key, first_key + count) (test_blocks.h) with `writer_id`'s payload,
// skipping keys already stored, lost races and a full store, pausing `pause` after each.
struct WriterJob {
  uint64_t first_key = 0;
  uint64_t count = 1;
  uint32_t writer_id = 1;
  absl::Duration pause = absl::ZeroDuration();
};

class KvStoreContractEnv {
 public:
  virtual ~KvStoreContractEnv() = default;

  // Opens the store under test. `config.clock` is the suite's fake clock.
  virtual absl::StatusOr<std::unique_ptr<KvStore>> Open(const KvStoreConfig& config) = 0;
  // Flips one bit of byte `offset` (header first) of the object stored under `key`.
  virtual absl::Status FlipBit(KvStore& store, const KvBlockKey& key, uint64_t offset) = 0;
  // Bytes the backend really occupies (files on disk, memory held): what capacity bounds.
  virtual uint64_t MeasuredBytes(KvStore& store) = 0;
  // A writer that reserves `key`, writes half of its layers and dies without committing (a
  // process killed with SIGKILL, or a writer that the env keeps, uncommitted, until it is
  // destroyed itself, which happens before the store's).
  virtual void AbandonReservation(KvStore& store, const KvStoreConfig& config,
                                  const KvBlockKey& key) = 0;
  // Runs every job at once, each as its own writer (a process where the backend is shared
  // between processes, else a thread on `store`), and returns when all are done.
  virtual void RunWriters(KvStore& store, const KvStoreConfig& config,
                          const std::vector<WriterJob>& jobs) = 0;
};

struct KvStoreContractParam {
  std::string name;
  std::unique_ptr<KvStoreContractEnv> (*make_env)();

  friend void PrintTo(const KvStoreContractParam& param, std::ostream* os) { *os << param.name; }
};

std::string KvStoreContractParamName(const testing::TestParamInfo<KvStoreContractParam>& info);

class KvStoreContractTest : public testing::TestWithParam<KvStoreContractParam> {
 protected:
  void SetUp() override;

  // The suite's config for a store of `objects` objects' capacity, on the fake clock.
  KvStoreConfig ConfigFor(uint64_t objects);
  // Opens the store under test (owned by the fixture); fails the test when it cannot.
  KvStore* OpenStore(const KvStoreConfig& config);

  FakeClock clock_;
  // Declared before env_ so that the env (and whatever it keeps, e.g. abandoned writers) goes
  // first.
  std::vector<std::unique_ptr<KvStore>> stores_;
  std::unique_ptr<KvStoreContractEnv> env_;
};

// Thread-based RunWriters for in-process backends.
void RunWritersInThreads(KvStore& store, const std::vector<WriterJob>& jobs);

}  // namespace deepinfer::kv_store_testing

#endif  // DEEPINFER_KV_STORE_KV_STORE_CONTRACT_H_
