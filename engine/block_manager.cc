#include "engine/block_manager.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace deepinfer::engine {

BlockManager::BlockManager(int num_blocks, int block_size)
    : num_blocks_(num_blocks), block_size_(block_size), blocks_(num_blocks) {
  free_list_.reserve(num_blocks);
  // Pop from the back: hand out low block ids first.
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_list_.push_back(b);
}

int64_t BlockManager::AvailableBlocks() const {
  return static_cast<int64_t>(free_list_.size() + lru_.size());
}

int64_t BlockManager::CountCachedPrefix(const std::vector<uint64_t>& hashes) const {
  int64_t n = 0;
  for (uint64_t h : hashes) {
    if (index_.find(h) == index_.end()) break;
    ++n;
  }
  return n;
}

int32_t BlockManager::TakeBlock() {
  if (!free_list_.empty()) {
    const int32_t b = free_list_.back();
    free_list_.pop_back();
    return b;
  }
  if (lru_.empty()) return -1;
  const int32_t b = lru_.front();
  lru_.pop_front();
  Block& blk = blocks_[b];
  index_.erase(blk.hash);
  events_.push_back({KvEvent::Kind::kRemoved, blk.hash, 0});
  blk.hashed = false;
  blk.hash = 0;
  ++evictions_;
  return b;
}

absl::StatusOr<int64_t> BlockManager::AllocateSequence(uint64_t seq_id, int64_t num_tokens,
                                                       const std::vector<uint64_t>& hashes) {
  if (tables_.count(seq_id) != 0) {
    return absl::AlreadyExistsError(absl::StrCat("sequence ", seq_id, " already has blocks"));
  }
  if (num_tokens <= 0) {
    return absl::InvalidArgumentError("num_tokens: expected >= 1");
  }
  const int64_t needed = (num_tokens + block_size_ - 1) / block_size_;
  // Reuse at most the blocks strictly before the last token, so that one token is computed.
  const int64_t reusable_limit = (num_tokens - 1) / block_size_;
  std::vector<int32_t> hits;
  for (int64_t i = 0; i < std::min<int64_t>(reusable_limit, hashes.size()); ++i) {
    auto it = index_.find(hashes[i]);
    if (it == index_.end()) break;
    hits.push_back(it->second);
  }
  // Cached hits with ref 0 sit in the LRU; taking them removes them from the available pool.
  int64_t hits_from_lru = 0;
  for (int32_t b : hits) hits_from_lru += blocks_[b].ref == 0 ? 1 : 0;
  const int64_t fresh = needed - static_cast<int64_t>(hits.size());
  if (fresh > AvailableBlocks() - hits_from_lru) {
    return absl::ResourceExhaustedError(absl::StrCat("kv cache: need ", fresh,
                                                     " free blocks, ",
                                                     AvailableBlocks() - hits_from_lru,
                                                     " available"));
  }
  std::vector<int32_t> table;
  table.reserve(needed);
  for (int32_t b : hits) {
    Block& blk = blocks_[b];
    if (blk.ref++ == 0) lru_.erase(blk.lru_pos);
    table.push_back(b);
  }
  for (int64_t i = 0; i < fresh; ++i) {
    const int32_t b = TakeBlock();
    blocks_[b].ref = 1;
    table.push_back(b);
  }
  query_tokens_ += num_tokens;
  hit_tokens_ += static_cast<int64_t>(hits.size()) * block_size_;
  tables_.emplace(seq_id, std::move(table));
  return static_cast<int64_t>(hits.size()) * block_size_;
}

absl::Status BlockManager::Grow(uint64_t seq_id, int64_t num_tokens) {
  auto it = tables_.find(seq_id);
  if (it == tables_.end()) return absl::NotFoundError(absl::StrCat("sequence ", seq_id, " unknown"));
  const int64_t needed = (num_tokens + block_size_ - 1) / block_size_;
  const int64_t extra = needed - static_cast<int64_t>(it->second.size());
  if (extra <= 0) return absl::OkStatus();
  if (extra > AvailableBlocks()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("kv cache: need ", extra, " free blocks, ", AvailableBlocks(), " available"));
  }
  for (int64_t i = 0; i < extra; ++i) {
    const int32_t b = TakeBlock();
    blocks_[b].ref = 1;
    it->second.push_back(b);
  }
  return absl::OkStatus();
}

absl::Status BlockManager::Commit(uint64_t seq_id, int64_t block_index, uint64_t hash,
                                  uint64_t parent_hash) {
  auto it = tables_.find(seq_id);
  if (it == tables_.end()) return absl::NotFoundError(absl::StrCat("sequence ", seq_id, " unknown"));
  if (block_index < 0 || block_index >= static_cast<int64_t>(it->second.size())) {
    return absl::OutOfRangeError(absl::StrCat("block_index ", block_index, " outside the table"));
  }
  const int32_t b = it->second[block_index];
  if (b < 0) return absl::OkStatus();  // released (outside the window): nothing to publish
  Block& blk = blocks_[b];
  if (blk.hashed) return absl::OkStatus();  // shared from the cache, or committed before
  if (index_.count(hash) != 0) return absl::OkStatus();  // another copy already serves it
  blk.hashed = true;
  blk.hash = hash;
  index_.emplace(hash, b);
  events_.push_back({KvEvent::Kind::kStored, hash, parent_hash});
  return absl::OkStatus();
}

void BlockManager::Release(int32_t b) {
  Block& blk = blocks_[b];
  if (--blk.ref > 0) return;
  if (blk.hashed) {
    lru_.push_back(b);
    blk.lru_pos = std::prev(lru_.end());
  } else {
    free_list_.push_back(b);
  }
}

absl::Status BlockManager::Free(uint64_t seq_id) {
  auto it = tables_.find(seq_id);
  if (it == tables_.end()) return absl::NotFoundError(absl::StrCat("sequence ", seq_id, " unknown"));
  // Release the tail first so that, among equally old blocks, prefix blocks (more reusable)
  // are evicted last.
  for (auto b = it->second.rbegin(); b != it->second.rend(); ++b) {
    if (*b >= 0) Release(*b);
  }
  tables_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> BlockManager::Truncate(uint64_t seq_id, int64_t num_tokens) {
  auto it = tables_.find(seq_id);
  if (it == tables_.end()) return absl::NotFoundError(absl::StrCat("sequence ", seq_id, " unknown"));
  std::vector<int32_t>& table = it->second;
  const int64_t keep = (std::max<int64_t>(num_tokens, 0) + block_size_ - 1) / block_size_;
  int64_t released = 0;
  while (static_cast<int64_t>(table.size()) > keep) {
    if (table.back() >= 0) {
      Release(table.back());
      ++released;
    }
    table.pop_back();
  }
  return released;
}

absl::StatusOr<int64_t> BlockManager::ReleasePrefix(uint64_t seq_id, int64_t end_index) {
  auto it = tables_.find(seq_id);
  if (it == tables_.end()) return absl::NotFoundError(absl::StrCat("sequence ", seq_id, " unknown"));
  std::vector<int32_t>& table = it->second;
  end_index = std::min<int64_t>(end_index, static_cast<int64_t>(table.size()));
  int64_t released = 0;
  for (int64_t i = end_index - 1; i >= 0; --i) {
    if (table[i] < 0) break;  // everything before was released earlier
    Release(table[i]);
    table[i] = -1;
    ++released;
  }
  return released;
}

const std::vector<int32_t>* BlockManager::Table(uint64_t seq_id) const {
  auto it = tables_.find(seq_id);
  return it == tables_.end() ? nullptr : &it->second;
}

std::vector<KvEvent> BlockManager::DrainEvents() {
  std::vector<KvEvent> out;
  out.swap(events_);
  return out;
}

BlockManagerStats BlockManager::stats() const {
  BlockManagerStats s;
  s.num_blocks = num_blocks_;
  s.free_blocks = static_cast<int64_t>(free_list_.size());
  s.cached_blocks = static_cast<int64_t>(lru_.size());
  s.used_blocks = num_blocks_ - s.free_blocks - s.cached_blocks;
  s.prefix_queries_tokens = query_tokens_;
  s.prefix_hit_tokens = hit_tokens_;
  s.evictions = evictions_;
  return s;
}

absl::Status BlockManager::CheckInvariants() const {
  std::vector<int32_t> refs(num_blocks_, 0);
  for (const auto& [seq, table] : tables_) {
    for (int32_t b : table) {
      if (b == -1) continue;  // released prefix
      if (b < 0 || b >= num_blocks_) return absl::InternalError(absl::StrCat("bad block ", b));
      ++refs[b];
    }
  }
  std::vector<int> where(num_blocks_, 0);
  for (int32_t b : free_list_) where[b] |= 1;
  for (int32_t b : lru_) where[b] |= 2;
  for (int32_t b = 0; b < num_blocks_; ++b) {
    const Block& blk = blocks_[b];
    if (blk.ref != refs[b]) {
      return absl::InternalError(absl::StrCat("block ", b, " ref ", blk.ref, " but ", refs[b],
                                              " tables name it"));
    }
    const int expected = blk.ref > 0 ? 0 : (blk.hashed ? 2 : 1);
    if (where[b] != expected) {
      return absl::InternalError(absl::StrCat("block ", b, " (ref ", blk.ref, ", hashed ",
                                              blk.hashed, ") is in lists ", where[b],
                                              ", expected ", expected));
    }
    if (blk.hashed) {
      auto it = index_.find(blk.hash);
      if (it == index_.end() || it->second != b) {
        return absl::InternalError(absl::StrCat("block ", b, " hashed but not indexed"));
      }
    }
  }
  if (index_.size() > static_cast<size_t>(num_blocks_)) return absl::InternalError("index too big");
  for (const auto& [hash, b] : index_) {
    if (!blocks_[b].hashed || blocks_[b].hash != hash) {
      return absl::InternalError(absl::StrCat("index names block ", b, " for a hash it lacks"));
    }
  }
  return absl::OkStatus();
}

}  // namespace deepinfer::engine
