#include "kv_store/memory_kv_store.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kv_store/internal/object_format.h"

namespace deepinfer {

using kv_store_internal::CheckLayerRange;
using kv_store_internal::Crc32;
using kv_store_internal::EncodeHeader;
using kv_store_internal::HeaderBytes;
using kv_store_internal::ObjectBytes;

class MemoryKvStore::Reader : public KvBlockReader {
 public:
  Reader(MemoryKvStore* store, const KvBlockKey& key, std::shared_ptr<Object> object)
      : KvBlockReader(store->config_.layout),
        store_(store),
        key_(key),
        object_(std::move(object)) {}
  ~Reader() override { store_->Unpin(object_.get()); }

  absl::Status ReadLayers(uint32_t first_layer, uint32_t num_layers, absl::Span<uint8_t> dst,
                          absl::Time deadline) override {
    if (absl::Status s = CheckLayerRange(layout(), first_layer, num_layers, dst.size()); !s.ok()) {
      return s;
    }
    const absl::Time start = store_->config_.clock();
    if (start > deadline) return absl::DeadlineExceededError("kv store: read deadline passed");
    const uint64_t per_layer = layout().bytes_per_layer;
    const uint8_t* src = object_->bytes.data() + HeaderBytes(layout());
    for (uint32_t i = 0; i < num_layers; ++i) {
      const uint32_t layer = first_layer + i;
      uint8_t* out = dst.data() + i * per_layer;
      std::memcpy(out, src + layer * per_layer, per_layer);
      if (Crc32(absl::MakeConstSpan(out, per_layer)) != object_->layer_crcs[layer]) {
        store_->CountRead(0, 0, /*corrupt=*/true);
        store_->Drop(key_, object_.get());
        return absl::NotFoundError(
            absl::StrCat("kv store: layer ", layer, " of ", key_.Hex(), " fails its checksum"));
      }
    }
    store_->CountRead(static_cast<int64_t>(dst.size()),
                      absl::ToDoubleSeconds(store_->config_.clock() - start), false);
    return absl::OkStatus();
  }

 private:
  MemoryKvStore* const store_;
  const KvBlockKey key_;
  const std::shared_ptr<Object> object_;
};

class MemoryKvStore::Writer : public KvBlockWriter {
 public:
  Writer(MemoryKvStore* store, const KvBlockKey& key, uint64_t id)
      : KvBlockWriter(store->config_.layout),
        store_(store),
        key_(key),
        id_(id),
        object_(std::make_shared<Object>()),
        written_(layout().num_layers, false) {
    object_->bytes.resize(store->object_bytes_);
    object_->layer_crcs.resize(layout().num_layers);
  }
  ~Writer() override {
    if (!done_) store_->Release(id_);
  }

  absl::Status WriteLayers(uint32_t first_layer, uint32_t num_layers,
                           absl::Span<const uint8_t> src) override {
    if (absl::Status s = CheckLayerRange(layout(), first_layer, num_layers, src.size()); !s.ok()) {
      return s;
    }
    if (done_) return absl::FailedPreconditionError("kv store: write after Commit");
    if (!store_->ReservationAlive(id_)) return Reclaimed();
    const absl::Time start = store_->config_.clock();
    const uint64_t per_layer = layout().bytes_per_layer;
    uint8_t* dst = object_->bytes.data() + HeaderBytes(layout());
    for (uint32_t i = 0; i < num_layers; ++i) {
      const uint32_t layer = first_layer + i;
      const uint8_t* in = src.data() + i * per_layer;
      std::memcpy(dst + layer * per_layer, in, per_layer);
      object_->layer_crcs[layer] = Crc32(absl::MakeConstSpan(in, per_layer));
      written_[layer] = true;
    }
    seconds_ += absl::ToDoubleSeconds(store_->config_.clock() - start);
    return absl::OkStatus();
  }

  absl::Status Commit(absl::Time deadline) override {
    if (done_) return absl::FailedPreconditionError("kv store: Commit after Commit");
    for (uint32_t layer = 0; layer < layout().num_layers; ++layer) {
      if (!written_[layer]) {
        return absl::FailedPreconditionError(absl::StrCat("kv store: Commit of ", key_.Hex(),
                                                          " before layer ", layer, " was written"));
      }
    }
    done_ = true;
    if (store_->config_.clock() > deadline) {
      store_->Release(id_);
      return absl::DeadlineExceededError("kv store: commit deadline passed");
    }
    const std::vector<uint8_t> header =
        EncodeHeader(key_, store_->config_.model_digest, layout(), object_->layer_crcs);
    std::memcpy(object_->bytes.data(), header.data(), header.size());
    return store_->CommitObject(id_, key_, std::move(object_), seconds_);
  }

 private:
  absl::Status Reclaimed() const {
    return absl::AbortedError(
        absl::StrCat("kv store: reservation of ", key_.Hex(), " was reclaimed (too old)"));
  }

  MemoryKvStore* const store_;
  const KvBlockKey key_;
  const uint64_t id_;
  std::shared_ptr<Object> object_;
  std::vector<bool> written_;
  double seconds_ = 0;
  bool done_ = false;
};

absl::StatusOr<std::unique_ptr<MemoryKvStore>> MemoryKvStore::Create(KvStoreConfig config) {
  if (absl::Status s = ValidateKvStoreConfig(config, ObjectBytes(config.layout)); !s.ok()) {
    return s;
  }
  return std::unique_ptr<MemoryKvStore>(new MemoryKvStore(std::move(config)));
}

MemoryKvStore::MemoryKvStore(KvStoreConfig config)
    : config_(std::move(config)),
      object_bytes_(ObjectBytes(config_.layout)),
      high_bytes_(WatermarkBytes(config_.capacity_bytes, config_.high_watermark)),
      low_bytes_(WatermarkBytes(config_.capacity_bytes, config_.low_watermark)) {
  stats_.capacity_bytes = static_cast<int64_t>(config_.capacity_bytes);
}

absl::StatusOr<size_t> MemoryKvStore::Lookup(absl::Span<const KvBlockKey> keys,
                                             absl::Time deadline) {
  if (config_.clock() > deadline) return absl::DeadlineExceededError("kv store: lookup deadline");
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  while (n < keys.size() && objects_.contains(keys[n])) ++n;
  return n;
}

absl::StatusOr<std::unique_ptr<KvBlockReader>> MemoryKvStore::OpenForRead(const KvBlockKey& key,
                                                                          absl::Time deadline) {
  if (config_.clock() > deadline) return absl::DeadlineExceededError("kv store: open deadline");
  absl::MutexLock lock(&mu_);
  auto it = objects_.find(key);
  if (it == objects_.end()) {
    ++stats_.misses;
    return absl::NotFoundError(absl::StrCat("kv store: no object ", key.Hex()));
  }
  const std::shared_ptr<Object>& object = it->second.object;
  // The header is checked like a backend that reads it back from storage would.
  absl::StatusOr<std::vector<uint32_t>> crcs =
      kv_store_internal::DecodeHeader(object->bytes, key, config_.model_digest, config_.layout);
  if (!crcs.ok() || *crcs != object->layer_crcs) {
    ++stats_.misses;
    ++stats_.errors;
    if (object->pins == 0) {
      bytes_held_ -= object_bytes_;
      lru_.erase(it->second.lru);
      objects_.erase(it);
    }
    return absl::NotFoundError(
        absl::StrCat("kv store: object ", key.Hex(),
                     " is corrupt: ", crcs.ok() ? "layer checksums" : crcs.status().message()));
  }
  ++object->pins;
  ++stats_.hits;
  TouchLocked(it->second);
  return std::unique_ptr<KvBlockReader>(new Reader(this, key, object));
}

absl::StatusOr<std::unique_ptr<KvBlockWriter>> MemoryKvStore::Reserve(const KvBlockKey& key,
                                                                      absl::Time deadline) {
  const absl::Time now = config_.clock();
  if (now > deadline) return absl::DeadlineExceededError("kv store: reserve deadline");
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    if (objects_.contains(key)) {
      return absl::AlreadyExistsError(absl::StrCat("kv store: ", key.Hex(), " is stored"));
    }
    ReclaimLocked(now);
    MakeRoomLocked(object_bytes_);
    if (bytes_held_ + object_bytes_ > high_bytes_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("kv store: ", bytes_held_, " bytes held (pinned or reserved), no room for ",
                       object_bytes_, " more under the high watermark of ", high_bytes_));
    }
    bytes_held_ += object_bytes_;
    id = next_reservation_++;
    reservations_[id] = Reservation{now};
  }
  return std::unique_ptr<KvBlockWriter>(new Writer(this, key, id));
}

absl::Status MemoryKvStore::Collect(absl::Time deadline) {
  const absl::Time now = config_.clock();
  if (now > deadline) return absl::DeadlineExceededError("kv store: collect deadline");
  absl::MutexLock lock(&mu_);
  ReclaimLocked(now);
  MakeRoomLocked(0);
  return absl::OkStatus();
}

KvStoreStats MemoryKvStore::stats() const {
  absl::MutexLock lock(&mu_);
  KvStoreStats s = stats_;
  s.objects = static_cast<int64_t>(objects_.size());
  s.bytes_held = static_cast<int64_t>(bytes_held_);
  return s;
}

absl::Status MemoryKvStore::FlipBitForTesting(const KvBlockKey& key, uint64_t offset) {
  absl::MutexLock lock(&mu_);
  auto it = objects_.find(key);
  if (it == objects_.end()) return absl::NotFoundError("no such object");
  std::vector<uint8_t>& bytes = it->second.object->bytes;
  if (offset >= bytes.size()) return absl::InvalidArgumentError("offset past the object");
  bytes[offset] ^= 1;
  return absl::OkStatus();
}

void MemoryKvStore::ReclaimLocked(absl::Time now) {
  for (auto it = reservations_.begin(); it != reservations_.end();) {
    if (now - it->second.started > config_.reservation_timeout) {
      bytes_held_ -= object_bytes_;
      ++stats_.reclaimed;
      reservations_.erase(it++);
    } else {
      ++it;
    }
  }
}

void MemoryKvStore::MakeRoomLocked(uint64_t incoming) {
  if (bytes_held_ + incoming <= high_bytes_) return;
  for (auto it = lru_.begin(); it != lru_.end() && bytes_held_ + incoming > low_bytes_;) {
    auto entry = objects_.find(*it);
    if (entry->second.object->pins > 0) {
      ++it;
      continue;
    }
    objects_.erase(entry);
    it = lru_.erase(it);
    bytes_held_ -= object_bytes_;
    ++stats_.evictions;
  }
}

void MemoryKvStore::TouchLocked(Entry& entry) { lru_.splice(lru_.end(), lru_, entry.lru); }

void MemoryKvStore::Unpin(Object* object) {
  absl::MutexLock lock(&mu_);
  --object->pins;
}

void MemoryKvStore::Drop(const KvBlockKey& key, const Object* object) {
  absl::MutexLock lock(&mu_);
  auto it = objects_.find(key);
  if (it == objects_.end() || it->second.object.get() != object) return;
  bytes_held_ -= object_bytes_;
  lru_.erase(it->second.lru);
  objects_.erase(it);
}

bool MemoryKvStore::ReservationAlive(uint64_t id) {
  absl::MutexLock lock(&mu_);
  return reservations_.contains(id);
}

absl::Status MemoryKvStore::CommitObject(uint64_t id, const KvBlockKey& key,
                                         std::shared_ptr<Object> object, double seconds) {
  absl::MutexLock lock(&mu_);
  if (reservations_.erase(id) == 0) {
    return absl::AbortedError(
        absl::StrCat("kv store: reservation of ", key.Hex(), " was reclaimed (too old)"));
  }
  if (objects_.contains(key)) {
    bytes_held_ -= object_bytes_;
    return absl::AlreadyExistsError(
        absl::StrCat("kv store: ", key.Hex(), " was committed by another writer"));
  }
  lru_.push_back(key);
  objects_[key] = Entry{std::move(object), std::prev(lru_.end())};
  ++stats_.commits;
  stats_.write_bytes += static_cast<int64_t>(config_.layout.payload_bytes());
  stats_.write_seconds += seconds;
  return absl::OkStatus();
}

void MemoryKvStore::Release(uint64_t id) {
  absl::MutexLock lock(&mu_);
  if (reservations_.erase(id) > 0) bytes_held_ -= object_bytes_;
}

void MemoryKvStore::CountRead(int64_t bytes, double seconds, bool corrupt) {
  absl::MutexLock lock(&mu_);
  if (corrupt) {
    ++stats_.errors;
    ++stats_.misses;
    return;
  }
  stats_.read_bytes += bytes;
  stats_.read_seconds += seconds;
}

}  // namespace deepinfer
