// FsKvStore: the KvStore contract (kv_store.h) on a directory that many processes on many
// machines share through a mount (3FS, NFS, CephFS, Lustre, or a local NVMe for one machine),
// with no daemon: every process coordinates through the directory alone.
//
// Layout under `root` (README.md, "On disk"):
//   usage                              shared accounting record; flock()ed for every change
//   objects/<k0k1>/<key hex>.kv        committed objects (fanout by the key's first byte)
//   objects/<k0k1>/<key hex>.<start micros>.<host>.<pid>.<n>.tmp   reservations
//
// Writes. Reserve, under the lock, adds the object's size to the shared record (evicting first
// when it would cross the high watermark) and creates the temporary file at its full size.
// Commit writes the header, sets the object's recency, fsyncs (when `fsync`) and renames the
// file to its key with RENAME_NOREPLACE (falling back to link()+unlink() where the file system
// lacks it), so a key is published once, whole; a second committer gets kAlreadyExists and
// removes its file. A reservation's age is the time in its name: older than
// `reservation_timeout`, it belonged to a dead or stuck writer and the next scan deletes it.
//
// Capacity. Bytes held are counted in the `usage` record, changed only under flock(), by
// reservations (before any byte is written), by failed commits and by scans. A scan lists the
// directory, deletes stale reservations, evicts objects by recency (atime) down to the low
// watermark when needed, and rewrites the record from what it found, so it corrects any drift (a
// process that died between two steps). Scans run when a reservation would cross the high
// watermark, every `rescan_interval`, and on Collect. Why this and not a cached estimate per
// process: a per- process estimate cannot see other machines' writes, so N writers could each
// overshoot by their own share; a reservation counted under one lock bounds the directory at the
// high watermark however many writers there are. The price is one lock round trip per object
// written (a scan holds the lock while it lists the directory). Commits rename without the lock,
// so a scan listing a directory while a file in it is renamed may count that object twice
// (harmless) or not at all (the directory then exceeds the record by one object until the next
// scan).
//
// Recency. Commit sets atime and mtime from the configured clock; a read sets atime again when
// it is more than `touch_interval` old (one metadata write per object and interval, not per
// read). Explicit times work on noatime/relatime mounts.
//
// Reads. OpenForRead opens the file and reads its header; readers then copy layers with pread.
// An evicted file stays readable through its descriptor on POSIX file systems; on NFS the server
// may drop it (ESTALE), which the reader reports as kNotFound. Every layer is checked against
// its CRC, so a torn, partial or overwritten file is a miss, never returned bytes. A corrupt
// object is deleted so that it is written again.
//
// Requirements of the mount: atomic rename within a directory, flock() that works across
// clients (NFSv4, CephFS, Lustre mounted with -o flock, local file systems), settable atime.
//
// Thread-safety: as KvStore.
#ifndef DEEPINFER_KV_STORE_FS_KV_STORE_H_
#define DEEPINFER_KV_STORE_FS_KV_STORE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kv_store/kv_store.h"

namespace deepinfer {

struct FsKvStoreOptions {
  KvStoreConfig config;
  // The shared directory (created if missing). Every process sharing it must use the same
  // capacity and watermarks.
  std::string root;
  // fsync each object before publishing it, so it survives a crash of the machine holding it
  // (without, a crash can leave a published file whose bytes never reached the disk: the
  // checksum turns it into a miss, not into wrong KV).
  bool fsync = true;
  absl::Duration touch_interval = absl::Minutes(1);
  absl::Duration rescan_interval = absl::Minutes(1);
};

class FsKvStore : public KvStore {
 public:
  // kInvalidArgument for a bad config; kUnavailable when the directory cannot be created or
  // opened.
  static absl::StatusOr<std::unique_ptr<FsKvStore>> Create(FsKvStoreOptions options);

  FsKvStore(const FsKvStore&) = delete;
  FsKvStore& operator=(const FsKvStore&) = delete;
  // Requires every reader and writer to be gone.
  ~FsKvStore() override;

  const KvStoreConfig& config() const override { return options_.config; }
  uint64_t object_bytes() const override { return object_bytes_; }
  absl::StatusOr<size_t> Lookup(absl::Span<const KvBlockKey> keys, absl::Time deadline) override;
  absl::StatusOr<std::unique_ptr<KvBlockReader>> OpenForRead(const KvBlockKey& key,
                                                             absl::Time deadline) override;
  absl::StatusOr<std::unique_ptr<KvBlockWriter>> Reserve(const KvBlockKey& key,
                                                         absl::Time deadline) override;
  absl::Status Collect(absl::Time deadline) override;
  // `bytes_held` comes from the shared record (read without the lock), so it covers every
  // process; `objects` is what the last scan (by any process) counted.
  KvStoreStats stats() const override;

  // Where the object for `key` lives once committed (tests corrupt or inspect it).
  std::string ObjectPath(const KvBlockKey& key) const;

 private:
  class Reader;
  class Writer;
  struct Usage {
    uint64_t bytes_held = 0;
    int64_t objects = 0;
    absl::Time last_scan = absl::InfinitePast();
  };

  FsKvStore(FsKvStoreOptions options, int usage_fd, std::string host);

  // Holds mu_ (in-process) and flock (cross-process) until the returned object is destroyed.
  class Lock;
  absl::StatusOr<std::unique_ptr<Lock>> AcquireLock(absl::Time deadline);
  // Both require the lock.
  bool ReadUsage(Usage* usage) const;
  absl::Status WriteUsage(const Usage& usage);
  // Requires the lock. Lists the directory, deletes stale reservations, and, when `incoming` more
  // bytes would cross the high watermark, evicts least recent objects until they fit under the
  // low one. Returns the recomputed usage (without `incoming`).
  Usage ScanLocked(uint64_t incoming);
  // Gives back one object's bytes (a reservation that failed or lost a race) and unlinks `path`
  // under the lock; on lock failure leaves both to the next scan.
  void ReleaseBytes(const std::string& path, absl::Time deadline);
  // Deletes a corrupt object if `path` still names the file `fd` has open.
  void Quarantine(const std::string& path, int fd);
  void CountError();

  const FsKvStoreOptions options_;
  const uint64_t object_bytes_;
  const uint64_t high_bytes_;
  const uint64_t low_bytes_;
  const int usage_fd_;
  const std::string host_;

  absl::Mutex lock_mu_;  // the in-process half of the directory lock (flock is per descriptor)
  mutable absl::Mutex mu_;
  KvStoreStats stats_ ABSL_GUARDED_BY(mu_);
  uint64_t next_temp_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace deepinfer

#endif  // DEEPINFER_KV_STORE_FS_KV_STORE_H_
