// The vision encoder's embedding cache: image embeddings keyed by the SHA-256 of the encoded
// image, so a repeated image (the same screenshot turn after turn) is encoded once.
//
// Bounded by bytes (the embeddings' size); least recently used entries go first. Concurrent
// lookups of the same key while it is being computed wait for that one computation instead of
// starting their own (single flight); a failed computation is not cached and is returned to
// everyone who waited for it.
//
// Thread-safety: all methods are thread-safe. The compute function runs on the calling thread,
// without the cache's lock held.
#ifndef DEEPINFER_VISION_ENCODER_EMBEDDING_CACHE_H_
#define DEEPINFER_VISION_ENCODER_EMBEDDING_CACHE_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace deepinfer::vision_encoder {

// One image's embeddings: rows x cols float32, row-major.
struct Embedding {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> data;
  int64_t bytes() const { return static_cast<int64_t>(data.size() * sizeof(float)); }
};

class EmbeddingCache {
 public:
  struct Stats {
    int64_t hits = 0;        // lookups served from the cache (waiting on a computation included)
    int64_t misses = 0;      // lookups that computed
    int64_t evictions = 0;
    int64_t entries = 0;
    int64_t bytes = 0;       // held now
    int64_t capacity_bytes = 0;
  };

  // capacity_bytes 0 disables caching (every lookup computes; single flight still applies).
  explicit EmbeddingCache(int64_t capacity_bytes);

  EmbeddingCache(const EmbeddingCache&) = delete;
  EmbeddingCache& operator=(const EmbeddingCache&) = delete;

  struct Result {
    std::shared_ptr<const Embedding> embedding;
    bool hit = false;  // true when this call did not compute
  };

  // The cached embedding for `key`, or the result of `compute` (then cached if it fits).
  absl::StatusOr<Result> GetOrCompute(const std::string& key,
                                      absl::FunctionRef<absl::StatusOr<Embedding>()> compute);

  // The cached embedding, or null (counts neither hit nor miss).
  std::shared_ptr<const Embedding> Peek(const std::string& key);

  Stats stats() const;

 private:
  struct Flight;
  struct Entry {
    std::shared_ptr<const Embedding> embedding;
    std::list<std::string>::iterator lru;  // position in lru_ (front = most recent)
  };

  void InsertLocked(const std::string& key, std::shared_ptr<const Embedding> embedding)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t capacity_bytes_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::list<std::string> lru_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<Flight>> flights_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace deepinfer::vision_encoder

#endif  // DEEPINFER_VISION_ENCODER_EMBEDDING_CACHE_H_
