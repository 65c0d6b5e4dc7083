#include "engine/tokenizer/internal/bpe_model.h"

#include <queue>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "engine/tokenizer/internal/utf8.h"

namespace deepinfer::tokenizer::internal {
namespace {

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  uint32_t len;  // bytes; 0 marks a symbol merged into its left neighbour
};

struct Merge {
  uint32_t rank;
  uint32_t pos;
  int32_t new_id;
};

// Orders the priority queue as a min-heap on (rank, pos).
struct MergeAfter {
  bool operator()(const Merge& a, const Merge& b) const {
    if (a.rank != b.rank) return a.rank > b.rank;
    return a.pos > b.pos;
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(
    std::vector<std::pair<std::string, int32_t>> vocab,
    const std::vector<std::pair<std::string, std::string>>& merges, Options options) {
  std::unique_ptr<BpeModel> m(new BpeModel(std::move(options)));
  int32_t max_id = -1;
  m->vocab_.reserve(vocab.size());
  for (auto& [token, id] : vocab) {
    if (id < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model \"BPE\": expected non-negative vocab ids, found ", id, " for \"", token, "\""));
    }
    max_id = std::max(max_id, id);
    m->vocab_[token] = id;
  }
  m->id_to_token_.resize(max_id + 1);
  m->has_id_.assign(max_id + 1, false);
  for (const auto& [token, id] : m->vocab_) {
    m->id_to_token_[id] = token;
    m->has_id_[id] = true;
  }
  const size_t prefix_len =
      m->options_.continuing_subword_prefix ? m->options_.continuing_subword_prefix->size() : 0;
  m->merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    auto ia = m->vocab_.find(a);
    if (ia == m->vocab_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("model \"BPE\": merge ", rank, " (\"", a, " ",
                                                     b, "\") names token \"", a,
                                                     "\" which is not in the vocab"));
    }
    auto ib = m->vocab_.find(b);
    if (ib == m->vocab_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("model \"BPE\": merge ", rank, " (\"", a, " ",
                                                     b, "\") names token \"", b,
                                                     "\" which is not in the vocab"));
    }
    const std::string merged =
        absl::StrCat(a, b.size() >= prefix_len ? absl::string_view(b).substr(prefix_len) : "");
    auto im = m->vocab_.find(merged);
    if (im == m->vocab_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("model \"BPE\": merge ", rank, " (\"", a, " ",
                                                     b, "\") produces \"", merged,
                                                     "\" which is not in the vocab"));
    }
    // Like tokenizers (a hash map built in rank order), a repeated pair keeps its last rank.
    m->merges_[(static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) |
               static_cast<uint32_t>(ib->second)] =
        MergeValue{static_cast<uint32_t>(rank), im->second};
  }
  if (m->options_.unk_token.has_value()) {
    auto it = m->vocab_.find(*m->options_.unk_token);
    if (it != m->vocab_.end()) m->unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = m->vocab_.find(absl::StrFormat("<0x%02X>", b));
    m->byte_fallback_ids_[b] = it == m->vocab_.end() ? -1 : it->second;
  }
  for (int c = 0; c < 128; ++c) {
    auto it = m->vocab_.find(std::string(1, static_cast<char>(c)));
    m->ascii_ids_[c] = it == m->vocab_.end() ? -1 : it->second;
  }
  return m;
}

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const Json& j) {
  DI_ASSIGN_OR_RETURN(const std::string type, ComponentType(j, "model"));
  if (type != "BPE") {
    return absl::InvalidArgumentError(
        absl::StrCat("model type \"", type, "\" is not supported (supported: BPE)"));
  }
  constexpr absl::string_view kWhere = "model \"BPE\"";
  Options options;
  DI_ASSIGN_OR_RETURN(options.unk_token, GetOptionalString(j, "unk_token", kWhere));
  DI_ASSIGN_OR_RETURN(options.continuing_subword_prefix,
                      GetOptionalString(j, "continuing_subword_prefix", kWhere));
  DI_ASSIGN_OR_RETURN(options.end_of_word_suffix,
                      GetOptionalString(j, "end_of_word_suffix", kWhere));
  DI_ASSIGN_OR_RETURN(options.fuse_unk, GetBool(j, "fuse_unk", false, kWhere));
  DI_ASSIGN_OR_RETURN(options.byte_fallback, GetBool(j, "byte_fallback", false, kWhere));
  DI_ASSIGN_OR_RETURN(options.ignore_merges, GetBool(j, "ignore_merges", false, kWhere));
  auto dropout = j.find("dropout");
  if (dropout != j.end() && !dropout->is_null()) {
    if (!dropout->is_number() || dropout->get<double>() != 0.0) {
      return absl::InvalidArgumentError(
          absl::StrCat(kWhere, ": expected dropout null or 0 (deterministic encoding), found ",
                       dropout->dump()));
    }
  }
  auto vocab_it = j.find("vocab");
  if (vocab_it == j.end()) return MissingField(kWhere, "vocab");
  if (!vocab_it->is_object()) return FieldError(kWhere, "vocab", "an object", *vocab_it);
  std::vector<std::pair<std::string, int32_t>> vocab;
  vocab.reserve(vocab_it->size());
  for (auto it = vocab_it->begin(); it != vocab_it->end(); ++it) {
    if (!it->is_number_integer() || (it->is_number_unsigned() && it->get<uint64_t>() > INT32_MAX) ||
        (!it->is_number_unsigned() && (it->get<int64_t>() < 0 || it->get<int64_t>() > INT32_MAX))) {
      return absl::InvalidArgumentError(absl::StrCat(kWhere, ": expected vocab id of \"", it.key(),
                                                     "\" to be an integer in [0, 2^31), found ",
                                                     it->dump()));
    }
    vocab.emplace_back(it.key(), static_cast<int32_t>(it->get<int64_t>()));
  }
  auto merges_it = j.find("merges");
  if (merges_it == j.end()) return MissingField(kWhere, "merges");
  if (!merges_it->is_array()) return FieldError(kWhere, "merges", "an array", *merges_it);
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(merges_it->size());
  // tokenizers accepts either all "a b" strings or all [a, b] pairs, not a mix.
  const bool strings = !merges_it->empty() && (*merges_it)[0].is_string();
  for (const Json& m : *merges_it) {
    if (m.is_string() && strings) {
      const std::string& line = m.get_ref<const std::string&>();
      if (absl::StartsWith(line, "#version")) continue;
      std::vector<std::string> parts = absl::StrSplit(line, ' ');
      if (parts.size() != 2) {
        return absl::InvalidArgumentError(absl::StrCat(kWhere, ": expected merge ", merges.size(),
                                                       " to be \"a b\", found \"", line, "\""));
      }
      merges.emplace_back(std::move(parts[0]), std::move(parts[1]));
    } else if (!strings && m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          kWhere, ": expected merge ", merges.size(), " to be ",
          strings ? "an \"a b\" string like merge 0" : "an [\"a\", \"b\"] pair like merge 0",
          ", found ", m.dump().substr(0, 100)));
    }
  }
  return Create(std::move(vocab), merges, std::move(options));
}

std::optional<int32_t> BpeModel::TokenToId(absl::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(id_to_token_.size()) || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

absl::Status BpeModel::Tokenize(absl::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return absl::OkStatus();
  if (options_.ignore_merges) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      ids->push_back(it->second);
      return absl::OkStatus();
    }
  }
  const bool cacheable = options_.cache_capacity > 0 && word.size() < kMaxCachedWordBytes;
  if (!cacheable) return MergeWord(word, ids);
  const size_t hash = absl::Hash<absl::string_view>()(word);
  CacheShard& shard = cache_[(hash >> 7) % kCacheShards];
  {
    absl::ReaderMutexLock lock(&shard.mu);
    auto it = shard.map.find(word);
    if (it != shard.map.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return absl::OkStatus();
    }
  }
  const size_t before = ids->size();
  DI_RETURN_IF_ERROR(MergeWord(word, ids));
  absl::MutexLock lock(&shard.mu);
  if (shard.map.size() < options_.cache_capacity / kCacheShards) {
    shard.map.try_emplace(word, ids->begin() + before, ids->end());
  }
  return absl::OkStatus();
}

absl::Status BpeModel::MergeWord(absl::string_view w, std::vector<int32_t>* ids) const {
  std::vector<Symbol> symbols;
  symbols.reserve(w.size());
  const bool plain = !options_.continuing_subword_prefix && !options_.end_of_word_suffix;
  std::optional<std::pair<int32_t, uint32_t>> unk;  // pending unknown (id, byte length)
  auto add = [&symbols](int32_t id, uint32_t len) {
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{id, index - 1, -1, len});
    if (index > 0) symbols[index - 1].next = index;
  };
  std::string scratch;
  size_t pos = 0;
  while (pos < w.size()) {
    const size_t start = pos;
    const unsigned char lead = static_cast<unsigned char>(w[pos]);
    pos += SequenceLengthFromLead(lead);
    const uint32_t byte_len = static_cast<uint32_t>(pos - start);
    absl::string_view s = w.substr(start, byte_len);
    int32_t id = -1;
    if (plain) {
      if (lead < 0x80) {
        id = ascii_ids_[lead];
      } else {
        auto it = vocab_.find(s);
        if (it != vocab_.end()) id = it->second;
      }
    } else {
      scratch.clear();
      if (start != 0 && options_.continuing_subword_prefix) {
        scratch.append(*options_.continuing_subword_prefix);
      }
      scratch.append(s.data(), s.size());
      if (pos == w.size() && options_.end_of_word_suffix)
        scratch.append(*options_.end_of_word_suffix);
      s = scratch;
      auto it = vocab_.find(s);
      if (it != vocab_.end()) id = it->second;
    }
    if (id >= 0) {
      if (unk) {
        add(unk->first, unk->second);
        unk.reset();
      }
      add(id, byte_len);
      continue;
    }
    if (options_.byte_fallback) {
      bool all = true;
      for (char c : s) all = all && byte_fallback_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (char c : s) add(byte_fallback_ids_[static_cast<unsigned char>(c)], 1);
        continue;
      }
    }
    if (options_.unk_token) {
      if (!unk_id_) {
        return absl::InvalidArgumentError(absl::StrCat("model \"BPE\": unk_token \"",
                                                       *options_.unk_token,
                                                       "\" is needed but is not in the vocab"));
      }
      if (unk && options_.fuse_unk) {
        unk->second += byte_len;
      } else {
        if (unk) add(unk->first, unk->second);
        unk = std::make_pair(*unk_id_, byte_len);
      }
    }
    // Without an unk token, tokenizers drops the character.
  }
  if (unk) add(unk->first, unk->second);

  if (symbols.size() > 1) {
    std::vector<Merge> heap_storage;
    heap_storage.reserve(symbols.size());
    std::priority_queue<Merge, std::vector<Merge>, MergeAfter> queue(MergeAfter(),
                                                                     std::move(heap_storage));
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      if (const MergeValue* m = FindMerge(symbols[i].id, symbols[i + 1].id)) {
        queue.push(Merge{m->rank, static_cast<uint32_t>(i), m->new_id});
      }
    }
    while (!queue.empty()) {
      const Merge top = queue.top();
      queue.pop();
      Symbol& cur = symbols[top.pos];
      if (cur.len == 0 || cur.next == -1) continue;
      const int32_t next_pos = cur.next;
      const Symbol right = symbols[next_pos];
      const MergeValue* target = FindMerge(cur.id, right.id);
      if (target == nullptr || target->new_id != top.new_id) continue;  // stale entry
      cur.id = top.new_id;
      cur.len += right.len;
      cur.next = right.next;
      symbols[next_pos].len = 0;
      if (right.next >= 0) symbols[right.next].prev = static_cast<int32_t>(top.pos);
      if (cur.prev >= 0) {
        if (const MergeValue* m = FindMerge(symbols[cur.prev].id, cur.id)) {
          queue.push(Merge{m->rank, static_cast<uint32_t>(cur.prev), m->new_id});
        }
      }
      if (cur.next >= 0) {
        if (const MergeValue* m = FindMerge(cur.id, symbols[cur.next].id)) {
          queue.push(Merge{m->rank, top.pos, m->new_id});
        }
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (s.len != 0) ids->push_back(s.id);
  }
  return absl::OkStatus();
}

}  // namespace deepinfer::tokenizer::internal
