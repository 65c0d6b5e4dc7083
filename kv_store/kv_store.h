// KvStore: a tier of KV-cache blocks shared beyond one process's KV pool (a directory on a shared
// mount that every node reads and writes, or host memory), keyed by content (block_key.h).
//
// Contract (every backend; kv_store_contract.h tests it on each):
//  - Objects. One object per key: the KV bytes of one block, `layout.num_layers` layers of
//    `layout.bytes_per_layer` bytes each (K then V, in the engine's own layout), plus a header
//    (format version, model digest, key, layout) and a CRC-32 per layer and of the header.
//  - Lookup(keys) returns how many keys, from the first, are stored: the longest stored prefix.
//    It is a hint: an object may be evicted between Lookup and a read.
//  - Reads. OpenForRead(key) pins one object and verifies its header; the returned reader copies
//    any range of layers, in any order, as often as asked, always from that same object, into
//    caller memory (so a load can overlap compute layer by layer). Every layer read is checked
//    against its CRC. A read either fills `dst` with the bytes one writer committed for that key
//    or fails with kNotFound (a miss: absent, evicted, partial, corrupt or foreign); never
//    partial or foreign bytes. A pinned object is not evicted under its reader, or (where the
//    backend cannot hold it: a shared mount whose server drops files another client unlinked)
//    its next read reports kNotFound.
//  - Writes are two-phase: Reserve(key) -> WriteLayers(...)* -> Commit(). Nothing is visible
//    before Commit; Commit publishes the whole object atomically. Reserve of a key already
//    committed returns kAlreadyExists (a no-op: the caller skips the write). Writers racing on
//    one key may all reserve; the first Commit wins and later ones return kAlreadyExists with
//    the stored object unchanged, so exactly one intact object remains. A writer destroyed
//    without Commit releases its reservation; a reservation whose writer died (crashed process,
//    leaked writer) is reclaimed once older than `reservation_timeout`, after which its Commit
//    returns kAborted.
//  - Capacity. Bytes held (committed objects plus reservations, full object size) never exceed
//    `capacity_bytes * high_watermark` after a Reserve returns: a Reserve that would cross it
//    first evicts, in one batch, the least recently used objects (written or read; approximate)
//    down to `capacity_bytes * low_watermark`. kResourceExhausted when not even that makes room.
//  - Errors are misses: a slow, full or failing store never fails the caller's request; callers
//    treat every non-OK read as "recompute".
//  - Deadlines. Calls that can block (locks shared with other processes, I/O) take a deadline,
//    checked before each blocking step; kDeadlineExceeded once it has passed. An I/O call already
//    issued to a hung mount is not interrupted.
//
// Thread-safety: every KvStore method is thread-safe. A KvBlockReader or KvBlockWriter is used by
// one thread at a time (it may move between threads) and must not outlive its store.
#ifndef DEEPINFER_KV_STORE_KV_STORE_H_
#define DEEPINFER_KV_STORE_KV_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kv_store/block_key.h"

namespace deepinfer {

// The shape of every object in one store.
struct KvBlockLayout {
  uint32_t num_layers = 0;
  uint64_t bytes_per_layer = 0;  // K and V of one layer of one block
  uint32_t dtype_tag = 0;        // opaque to the store; objects with another tag are foreign

  uint64_t payload_bytes() const { return uint64_t{num_layers} * bytes_per_layer; }
  friend bool operator==(const KvBlockLayout& a, const KvBlockLayout& b) {
    return a.num_layers == b.num_layers && a.bytes_per_layer == b.bytes_per_layer &&
           a.dtype_tag == b.dtype_tag;
  }
};

// What every backend is configured with.
struct KvStoreConfig {
  KvBlockLayout layout;
  // ModelDigest() of the namespace the keys are derived under; objects carrying another digest
  // are foreign (a miss).
  KvBlockKey model_digest;
  // Bytes the store may hold (object headers included). A shared directory's capacity is a
  // property of the directory: every process sharing it must be configured with the same values.
  uint64_t capacity_bytes = 0;
  double high_watermark = 0.95;  // fraction of capacity_bytes that writes never cross
  double low_watermark = 0.85;   // eviction brings the store down to this fraction
  // A reservation not committed this long after Reserve is abandoned and may be reclaimed.
  absl::Duration reservation_timeout = absl::Minutes(5);
  // Time source for recency, reservation age and bandwidth (STYLE.md 9).
  std::function<absl::Time()> clock = [] { return absl::Now(); };
};

// Counters since the store was opened, except `objects` and `bytes_held`, which describe the
// store's content (for a directory shared with other processes: as this process last saw it).
struct KvStoreStats {
  int64_t objects = 0;     // committed objects
  int64_t bytes_held = 0;  // committed objects plus live reservations, full object size
  int64_t capacity_bytes = 0;
  int64_t hits = 0;          // OpenForRead that found a valid object
  int64_t misses = 0;        // OpenForRead and reads that ended in kNotFound
  int64_t evictions = 0;     // objects removed to make room
  int64_t reclaimed = 0;     // abandoned reservations reclaimed
  int64_t errors = 0;        // checksum or header mismatches, I/O errors
  int64_t commits = 0;       // objects this process published
  int64_t read_bytes = 0;    // payload bytes copied out by readers
  int64_t write_bytes = 0;   // payload bytes written by committed writers
  double read_seconds = 0;   // time spent in layer reads (read bandwidth = bytes / seconds)
  double write_seconds = 0;  // time spent writing and committing
};

// One pinned object, open for reading. Destroying it unpins the object.
class KvBlockReader {
 public:
  virtual ~KvBlockReader() = default;

  const KvBlockLayout& layout() const { return layout_; }

  // Copies layers [first_layer, first_layer + num_layers) into `dst`, which must hold exactly
  // num_layers * bytes_per_layer bytes. kInvalidArgument for a range or size that does not fit;
  // kNotFound when the object turns out corrupt or gone (counted as a miss and an error);
  // kDeadlineExceeded when `deadline` passed before the copy began. After an error `dst` holds
  // unspecified bytes and must not be used.
  virtual absl::Status ReadLayers(uint32_t first_layer, uint32_t num_layers,
                                  absl::Span<uint8_t> dst, absl::Time deadline) = 0;

  // All layers.
  absl::Status ReadAll(absl::Span<uint8_t> dst, absl::Time deadline) {
    return ReadLayers(0, layout_.num_layers, dst, deadline);
  }

 protected:
  explicit KvBlockReader(const KvBlockLayout& layout) : layout_(layout) {}

 private:
  const KvBlockLayout layout_;
};

// One reservation. Destroying it without a successful Commit abandons the write and releases
// the reservation.
class KvBlockWriter {
 public:
  virtual ~KvBlockWriter() = default;

  const KvBlockLayout& layout() const { return layout_; }

  // Writes layers [first_layer, first_layer + num_layers) from `src` (exactly num_layers *
  // bytes_per_layer bytes). Layers may come in any order; writing a layer again replaces it.
  // kInvalidArgument for a range or size that does not fit; kAborted once the reservation was
  // reclaimed; kUnavailable (I/O failure) leaves the writer usable only for abandoning.
  virtual absl::Status WriteLayers(uint32_t first_layer, uint32_t num_layers,
                                   absl::Span<const uint8_t> src) = 0;

  // Publishes the object. kFailedPrecondition when some layer was never written or after a
  // Commit; kAlreadyExists when another writer committed the key first (nothing changed);
  // kAborted when the reservation was reclaimed; kUnavailable for I/O failures. On any error
  // the reservation is released.
  virtual absl::Status Commit(absl::Time deadline) = 0;

 protected:
  explicit KvBlockWriter(const KvBlockLayout& layout) : layout_(layout) {}

 private:
  const KvBlockLayout layout_;
};

class KvStore {
 public:
  virtual ~KvStore() = default;

  virtual const KvStoreConfig& config() const = 0;
  // Full size of one object (header and payload): the unit of capacity accounting.
  virtual uint64_t object_bytes() const = 0;

  // How many of `keys`, from the first, are stored (0 to keys.size()). Never verifies
  // checksums. kDeadlineExceeded with nothing counted once the deadline passes mid-way.
  virtual absl::StatusOr<size_t> Lookup(absl::Span<const KvBlockKey> keys, absl::Time deadline) = 0;

  // Pins the object stored under `key` and verifies its header (kNotFound: a miss, also for a
  // bad header, which counts as an error). Refreshes the object's recency.
  virtual absl::StatusOr<std::unique_ptr<KvBlockReader>> OpenForRead(const KvBlockKey& key,
                                                                     absl::Time deadline) = 0;

  // Starts a write of `key`, first evicting if the reservation would cross the high watermark.
  // kAlreadyExists when the key is already committed; kResourceExhausted when eviction cannot
  // make room (everything left is pinned by readers or reserved); kDeadlineExceeded.
  virtual absl::StatusOr<std::unique_ptr<KvBlockWriter>> Reserve(const KvBlockKey& key,
                                                                 absl::Time deadline) = 0;

  // Reclaims abandoned reservations older than `reservation_timeout` and, when above the high
  // watermark, evicts down to the low one. Writes do this on their own when they need room; call
  // it periodically (or in tests) to reclaim space without waiting for the next write.
  virtual absl::Status Collect(absl::Time deadline) = 0;

  virtual KvStoreStats stats() const = 0;

  // Convenience: OpenForRead, then the given layers. Two calls may read two different writers'
  // objects for the same key (after an eviction and a rewrite); read a block layer by layer
  // through one KvBlockReader to get all of its layers from one object.
  absl::Status ReadLayers(const KvBlockKey& key, uint32_t first_layer, uint32_t num_layers,
                          absl::Span<uint8_t> dst, absl::Time deadline);
  absl::Status Read(const KvBlockKey& key, absl::Span<uint8_t> dst, absl::Time deadline);

  // Convenience: Reserve, all layers from `src`, Commit. kAlreadyExists when the key was
  // already stored (by anyone).
  absl::Status Write(const KvBlockKey& key, absl::Span<const uint8_t> src, absl::Time deadline);
};

// `fraction` of `capacity` in bytes, rounded to the nearest byte.
inline uint64_t WatermarkBytes(uint64_t capacity, double fraction) {
  return static_cast<uint64_t>(static_cast<double>(capacity) * fraction + 0.5);
}

// kInvalidArgument naming what is wrong with `config` (empty layout, watermarks out of order, a
// capacity smaller than one object, no clock).
absl::Status ValidateKvStoreConfig(const KvStoreConfig& config, uint64_t object_bytes);

}  // namespace deepinfer

#endif  // DEEPINFER_KV_STORE_KV_STORE_H_
