// MemoryKvStore: the KvStore contract (kv_store.h) in process memory. For tests, and as a
// single-node host-memory tier.
//
// Objects are kept in the shared object format (internal/object_format.h), checksums included,
// so a bit flipped in host memory is caught like one flipped on disk. A reader pins its object:
// eviction skips pinned objects (a Reserve that can only make room by evicting pinned objects
// fails with kResourceExhausted). Abandoned reservations are those whose writer was neither
// committed nor destroyed within `reservation_timeout` (a leaked writer, a stuck thread).
//
// Thread-safety: as KvStore; all state is guarded by one mutex, and object bytes are copied out
// without holding it.
#ifndef DEEPINFER_KV_STORE_MEMORY_KV_STORE_H_
#define DEEPINFER_KV_STORE_MEMORY_KV_STORE_H_

#include <cstdint>
#include <list>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kv_store/kv_store.h"

namespace deepinfer {

class MemoryKvStore : public KvStore {
 public:
  // kInvalidArgument for a bad config (ValidateKvStoreConfig).
  static absl::StatusOr<std::unique_ptr<MemoryKvStore>> Create(KvStoreConfig config);

  MemoryKvStore(const MemoryKvStore&) = delete;
  MemoryKvStore& operator=(const MemoryKvStore&) = delete;
  // Requires every reader and writer to be gone.
  ~MemoryKvStore() override = default;

  const KvStoreConfig& config() const override { return config_; }
  uint64_t object_bytes() const override { return object_bytes_; }
  absl::StatusOr<size_t> Lookup(absl::Span<const KvBlockKey> keys, absl::Time deadline) override;
  absl::StatusOr<std::unique_ptr<KvBlockReader>> OpenForRead(const KvBlockKey& key,
                                                             absl::Time deadline) override;
  absl::StatusOr<std::unique_ptr<KvBlockWriter>> Reserve(const KvBlockKey& key,
                                                         absl::Time deadline) override;
  absl::Status Collect(absl::Time deadline) override;
  KvStoreStats stats() const override;

  // Test hook: flips the low bit of byte `offset` (header first, then payload) of the object
  // stored under `key`. kNotFound when there is none; kInvalidArgument past its end.
  absl::Status FlipBitForTesting(const KvBlockKey& key, uint64_t offset);

 private:
  class Reader;
  class Writer;
  struct Object {
    std::vector<uint8_t> bytes;  // immutable once committed (but for FlipBitForTesting)
    std::vector<uint32_t> layer_crcs;
    int pins = 0;  // guarded by mu_
  };
  struct Entry {
    std::shared_ptr<Object> object;
    std::list<KvBlockKey>::iterator lru;  // position in lru_
  };
  struct Reservation {
    absl::Time started;
  };

  explicit MemoryKvStore(KvStoreConfig config);

  // Drops reservations older than the timeout.
  void ReclaimLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts unpinned objects, least recent first, until `incoming` more bytes fit under the low
  // watermark (or nothing evictable is left). Only when they do not fit under the high one.
  void MakeRoomLocked(uint64_t incoming) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TouchLocked(Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Called by readers and writers.
  void Unpin(Object* object);
  // Removes `object` from the index if it is still stored under `key` (a corrupt object).
  void Drop(const KvBlockKey& key, const Object* object);
  bool ReservationAlive(uint64_t id);
  absl::Status CommitObject(uint64_t id, const KvBlockKey& key, std::shared_ptr<Object> object,
                            double seconds);
  void Release(uint64_t id);
  void CountRead(int64_t bytes, double seconds, bool corrupt);

  const KvStoreConfig config_;
  const uint64_t object_bytes_;
  const uint64_t high_bytes_;
  const uint64_t low_bytes_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<KvBlockKey, Entry> objects_ ABSL_GUARDED_BY(mu_);
  std::list<KvBlockKey> lru_ ABSL_GUARDED_BY(mu_);  // least recent first
  absl::flat_hash_map<uint64_t, Reservation> reservations_ ABSL_GUARDED_BY(mu_);
  uint64_t next_reservation_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t bytes_held_ ABSL_GUARDED_BY(mu_) = 0;
  KvStoreStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace deepinfer

#endif  // DEEPINFER_KV_STORE_MEMORY_KV_STORE_H_
