#include "engine/tokenizer/internal/nfc.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/tokenizer/internal/utf8.h"

namespace deepinfer::tokenizer::internal {
namespace {

struct CombiningClassEntry {
  char32_t cp;
  uint8_t ccc;
};
struct DecompositionEntry {
  char32_t cp;
  uint16_t offset;
  uint8_t length;
};
struct CompositionEntry {
  char32_t first;
  char32_t second;
  char32_t composite;
};

#include "engine/tokenizer/internal/nfc_tables.inc"

constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr char32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

// Per code point facts the algorithm needs, gathered into one hash map at first use.
constexpr uint8_t kFlagUnstable = 1;  // may change under NFC (quick check fails)

struct Info {
  uint8_t ccc = 0;
  uint8_t flags = 0;
  int32_t decomposition = -1;  // index into kDecompositions
};

struct Tables {
  absl::flat_hash_map<char32_t, Info> info;
  absl::flat_hash_map<uint64_t, char32_t> compose;

  Tables() {
    for (const auto& e : kCombiningClasses) {
      Info& i = info[e.cp];
      i.ccc = e.ccc;
      i.flags |= kFlagUnstable;
    }
    absl::flat_hash_map<char32_t, bool> primary;
    for (const auto& e : kCompositions) {
      compose[(static_cast<uint64_t>(e.first) << 32) | e.second] = e.composite;
      primary[e.composite] = true;
      info[e.second].flags |= kFlagUnstable;  // may compose with what precedes it
    }
    for (size_t k = 0; k < sizeof(kDecompositions) / sizeof(kDecompositions[0]); ++k) {
      const auto& e = kDecompositions[k];
      Info& i = info[e.cp];
      i.decomposition = static_cast<int32_t>(k);
      if (!primary.contains(e.cp)) i.flags |= kFlagUnstable;
    }
    // Hangul vowels and trailing consonants compose with a preceding L or LV.
    for (char32_t cp = kVBase; cp < kVBase + kVCount; ++cp) info[cp].flags |= kFlagUnstable;
    for (char32_t cp = kTBase + 1; cp < kTBase + kTCount; ++cp) info[cp].flags |= kFlagUnstable;
  }

  const Info* Find(char32_t cp) const {
    auto it = info.find(cp);
    return it == info.end() ? nullptr : &it->second;
  }
  uint8_t Ccc(char32_t cp) const {
    const Info* i = Find(cp);
    return i ? i->ccc : 0;
  }
  // The primary composite of (a, b), or 0 if there is none.
  char32_t Compose(char32_t a, char32_t b) const {
    if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
      return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
    }
    if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
        b < kTBase + kTCount) {
      return a + (b - kTBase);
    }
    auto it = compose.find((static_cast<uint64_t>(a) << 32) | b);
    return it == compose.end() ? 0 : it->second;
  }
};

const Tables& GetTables() {
  static const Tables* tables = new Tables();
  return *tables;
}

}  // namespace

absl::string_view NfcUnicodeVersion() { return kNfcUnicodeVersion; }

bool IsNfcQuick(absl::string_view s) {
  size_t pos = 0;
  while (pos < s.size() && static_cast<unsigned char>(s[pos]) < 0x80) ++pos;
  if (pos == s.size()) return true;
  const Tables& t = GetTables();
  while (pos < s.size()) {
    const char32_t cp = NextCodePoint(s, pos);
    if (cp < 0x300) continue;  // nothing below U+0300 changes under NFC or combines
    if (cp >= kSBase && cp < kSBase + kSCount) continue;
    const Info* i = t.Find(cp);
    if (i != nullptr && (i->flags & kFlagUnstable)) return false;
  }
  return true;
}

std::string ToNfc(absl::string_view s) {
  if (IsNfcQuick(s)) return std::string(s);
  const Tables& t = GetTables();
  // 1. Full canonical decomposition.
  std::vector<char32_t> buf;
  buf.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    const char32_t cp = NextCodePoint(s, pos);
    if (cp >= kSBase && cp < kSBase + kSCount) {
      const char32_t index = cp - kSBase;
      buf.push_back(kLBase + index / kNCount);
      buf.push_back(kVBase + (index % kNCount) / kTCount);
      if (index % kTCount != 0) buf.push_back(kTBase + index % kTCount);
      continue;
    }
    const Info* i = cp < 0xC0 ? nullptr : t.Find(cp);
    if (i != nullptr && i->decomposition >= 0) {
      const DecompositionEntry& e = kDecompositions[i->decomposition];
      buf.insert(buf.end(), kDecompositionData + e.offset,
                 kDecompositionData + e.offset + e.length);
    } else {
      buf.push_back(cp);
    }
  }
  // 2. Canonical ordering: stable sort of each run of non-starters by combining class.
  std::vector<uint8_t> ccc(buf.size());
  for (size_t k = 0; k < buf.size(); ++k) ccc[k] = t.Ccc(buf[k]);
  for (size_t k = 0; k < buf.size();) {
    if (ccc[k] == 0) {
      ++k;
      continue;
    }
    size_t end = k;
    while (end < buf.size() && ccc[end] != 0) ++end;
    if (end - k > 1) {
      std::vector<std::pair<uint8_t, char32_t>> run;
      for (size_t m = k; m < end; ++m) run.emplace_back(ccc[m], buf[m]);
      std::stable_sort(run.begin(), run.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      for (size_t m = k; m < end; ++m) {
        ccc[m] = run[m - k].first;
        buf[m] = run[m - k].second;
      }
    }
    k = end;
  }
  // 3. Canonical composition.
  std::string out;
  out.reserve(s.size());
  if (!buf.empty()) {
    size_t starter = 0;
    int last_class = ccc[0] == 0 ? 0 : 256;
    size_t target = 1;
    for (size_t k = 1; k < buf.size(); ++k) {
      const char32_t ch = buf[k];
      const int cc = ccc[k];
      const char32_t composite = t.Compose(buf[starter], ch);
      if (composite != 0 && (last_class < cc || last_class == 0)) {
        buf[starter] = composite;
        continue;
      }
      if (cc == 0) starter = target;
      last_class = cc;
      buf[target++] = ch;
    }
    buf.resize(target);
  }
  for (char32_t cp : buf) AppendUtf8(cp, &out);
  return out;
}

}  // namespace deepinfer::tokenizer::internal
