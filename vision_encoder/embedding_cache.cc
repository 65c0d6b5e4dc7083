#include "vision_encoder/embedding_cache.h"

#include <utility>

namespace deepinfer::vision_encoder {

// A computation in progress; waiters block on `mu_` until `done`.
struct EmbeddingCache::Flight {
  bool done = false;
  absl::StatusOr<std::shared_ptr<const Embedding>> result = absl::UnknownError("pending");
};

EmbeddingCache::EmbeddingCache(int64_t capacity_bytes)
    : capacity_bytes_(capacity_bytes < 0 ? 0 : capacity_bytes) {
  stats_.capacity_bytes = capacity_bytes_;
}

absl::StatusOr<EmbeddingCache::Result> EmbeddingCache::GetOrCompute(
    const std::string& key, absl::FunctionRef<absl::StatusOr<Embedding>()> compute) {
  std::shared_ptr<Flight> flight;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = entries_.find(key); it != entries_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      ++stats_.hits;
      return Result{it->second.embedding, true};
    }
    if (auto it = flights_.find(key); it != flights_.end()) {
      std::shared_ptr<Flight> waiting = it->second;
      mu_.Await(absl::Condition(
          +[](Flight* f) { return f->done; }, waiting.get()));
      if (!waiting->result.ok()) return waiting->result.status();
      ++stats_.hits;
      return Result{*waiting->result, true};
    }
    flight = std::make_shared<Flight>();
    flights_[key] = flight;
    ++stats_.misses;
  }
  absl::StatusOr<Embedding> computed = compute();
  absl::MutexLock lock(&mu_);
  flights_.erase(key);
  flight->done = true;
  if (!computed.ok()) {
    flight->result = computed.status();
    return computed.status();
  }
  auto embedding = std::make_shared<const Embedding>(*std::move(computed));
  flight->result = embedding;
  InsertLocked(key, embedding);
  return Result{std::move(embedding), false};
}

std::shared_ptr<const Embedding> EmbeddingCache::Peek(const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return it->second.embedding;
}

void EmbeddingCache::InsertLocked(const std::string& key,
                                  std::shared_ptr<const Embedding> embedding) {
  const int64_t bytes = embedding->bytes();
  if (bytes > capacity_bytes_ || entries_.contains(key)) return;
  while (stats_.bytes + bytes > capacity_bytes_ && !lru_.empty()) {
    auto victim = entries_.find(lru_.back());
    stats_.bytes -= victim->second.embedding->bytes();
    entries_.erase(victim);
    lru_.pop_back();
    ++stats_.evictions;
  }
  lru_.push_front(key);
  entries_[key] = Entry{std::move(embedding), lru_.begin()};
  stats_.bytes += bytes;
  stats_.entries = static_cast<int64_t>(entries_.size());
}

EmbeddingCache::Stats EmbeddingCache::stats() const {
  absl::MutexLock lock(&mu_);
  Stats s = stats_;
  s.entries = static_cast<int64_t>(entries_.size());
  return s;
}

}  // namespace deepinfer::vision_encoder
