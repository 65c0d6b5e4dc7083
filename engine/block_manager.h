// KV block allocation with prefix reuse.
//
// Blocks are fixed-size (block_size tokens) slots of the KV cache, named by index. A sequence
// owns a block table; full blocks whose KV has been computed are "committed": their hash (see
// block_hash.h) enters the prefix index, and any later sequence whose prompt starts with the same
// blocks (same tokens, extra keys and cache salt) shares them copy-free (reference counts).
// When a block's last reference goes, a committed block stays cached (evictable, LRU); an
// uncommitted one returns to the free list. Allocation takes free blocks first, then evicts the
// least recently used cached block.
//
// KV events: every commit that adds a hash to the index is a STORED event, every eviction a
// REMOVED event; subscribers (the worker's event publisher, the router's global index) drain
// them in order.
//
// Invariants (checked by CheckInvariants, tested under random load): every block is in exactly
// one of {free, cached-free (ref 0, hashed), in use (ref > 0)}; the counts add up to num_blocks;
// ref counts equal the number of sequence tables naming the block.
//
// Thread-safety: not thread-safe; the engine's scheduler thread owns it.
#ifndef DEEPINFER_ENGINE_BLOCK_MANAGER_H_
#define DEEPINFER_ENGINE_BLOCK_MANAGER_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace deepinfer::engine {

struct KvEvent {
  enum class Kind { kStored, kRemoved };
  Kind kind = Kind::kStored;
  uint64_t block_hash = 0;
  uint64_t parent_hash = 0;  // kStored only; 0 for a first block
};

struct BlockManagerStats {
  int64_t num_blocks = 0;
  int64_t free_blocks = 0;    // never used or released uncommitted
  int64_t cached_blocks = 0;  // ref 0 but holding reusable KV
  int64_t used_blocks = 0;    // ref > 0
  int64_t prefix_queries_tokens = 0;  // prompt tokens looked up
  int64_t prefix_hit_tokens = 0;      // of those, served from cache
  int64_t evictions = 0;
};

class BlockManager {
 public:
  BlockManager(int num_blocks, int block_size);

  BlockManager(const BlockManager&) = delete;
  BlockManager& operator=(const BlockManager&) = delete;

  int block_size() const { return block_size_; }
  int num_blocks() const { return num_blocks_; }

  // Blocks that an allocation could obtain now (free + evictable cached).
  int64_t AvailableBlocks() const;

  // Number of leading full blocks of `block_hashes` present in the index (no state change).
  int64_t CountCachedPrefix(const std::vector<uint64_t>& block_hashes) const;

  // Reserves blocks for a new sequence `seq_id` that will hold `num_tokens` tokens: shares the
  // cached prefix of `block_hashes` (hashes of the prompt's full blocks) and allocates the rest.
  // Returns the number of tokens whose KV is already present (a multiple of block_size; at most
  // num_tokens - 1, so at least one token is always computed to produce logits).
  // kResourceExhausted (no state change) when not enough blocks are available;
  // kAlreadyExists when seq_id is live.
  absl::StatusOr<int64_t> AllocateSequence(uint64_t seq_id, int64_t num_tokens,
                                           const std::vector<uint64_t>& block_hashes);

  // Grows `seq_id` so it can hold `num_tokens` tokens. kResourceExhausted (no state change).
  absl::Status Grow(uint64_t seq_id, int64_t num_tokens);

  // Marks the sequence's block `block_index` as holding computed KV with hash `hash` (parent
  // `parent_hash`) and publishes it for reuse. Idempotent. If another block already holds that
  // hash, this block stays private (no duplicate in the index).
  absl::Status Commit(uint64_t seq_id, int64_t block_index, uint64_t hash, uint64_t parent_hash);

  // Shrinks `seq_id`'s table to the blocks needed for `num_tokens` tokens, releasing the trailing
  // ones (speculative decoding rolls back the KV of rejected draft positions this way). Released
  // blocks that were never committed return to the free list. Returns the number released;
  // kNotFound when unknown.
  absl::StatusOr<int64_t> Truncate(uint64_t seq_id, int64_t num_tokens);

  // Releases every block of the sequence. kNotFound when unknown.
  absl::Status Free(uint64_t seq_id);

  // Releases the sequence's blocks [0, end_index) that no future step will read (sliding-window
  // models: keys older than the window). Their table entries become -1 (holes); committed ones
  // stay cached for other sequences. Idempotent over already released entries. Returns the
  // number of blocks released.
  absl::StatusOr<int64_t> ReleasePrefix(uint64_t seq_id, int64_t end_index);

  // The sequence's block table (nullptr when unknown); released entries are -1. Valid until the
  // next mutating call.
  const std::vector<int32_t>* Table(uint64_t seq_id) const;

  // Moves pending KV events out, oldest first.
  std::vector<KvEvent> DrainEvents();

  BlockManagerStats stats() const;

  // Verifies the invariants above; kInternal describing the first violation.
  absl::Status CheckInvariants() const;

 private:
  struct Block {
    int32_t ref = 0;
    bool hashed = false;
    uint64_t hash = 0;
    std::list<int32_t>::iterator lru_pos;  // valid when ref == 0 && hashed
  };

  // Takes one block: free list first, else evict the LRU cached block. -1 when none.
  int32_t TakeBlock();
  void Release(int32_t block);

  const int num_blocks_;
  const int block_size_;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_list_;
  std::list<int32_t> lru_;  // ref-0 hashed blocks, least recently used first
  std::unordered_map<uint64_t, int32_t> index_;  // hash -> block
  std::unordered_map<uint64_t, std::vector<int32_t>> tables_;
  std::vector<KvEvent> events_;
  int64_t query_tokens_ = 0;
  int64_t hit_tokens_ = 0;
  int64_t evictions_ = 0;
};

}  // namespace deepinfer::engine

#endif  // DEEPINFER_ENGINE_BLOCK_MANAGER_H_
