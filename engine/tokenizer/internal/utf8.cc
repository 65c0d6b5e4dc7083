#include "engine/tokenizer/internal/utf8.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace deepinfer::tokenizer::internal {
namespace {

inline bool InRange(unsigned char b, unsigned char lo, unsigned char hi) {
  return b >= lo && b <= hi;
}

struct ByteLevelTables {
  std::array<std::string, 256> byte_to_utf8;
  std::array<int16_t, 512> cp_to_byte;  // the alphabet lies below U+0200

  ByteLevelTables() {
    cp_to_byte.fill(-1);
    std::array<bool, 256> direct{};
    for (int b = '!'; b <= '~'; ++b) direct[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      char32_t cp = direct[b] ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      AppendUtf8(cp, &byte_to_utf8[b]);
      cp_to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelTables& Tables() {
  static const ByteLevelTables* tables = new ByteLevelTables();
  return *tables;
}

}  // namespace

size_t ValidSequenceLength(absl::string_view s, size_t* maximal_subpart, bool* incomplete) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  *incomplete = false;
  *maximal_subpart = 1;
  const unsigned char b0 = p[0];
  if (b0 < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (InRange(b0, 0xC2, 0xDF)) {
    need = 2;
  } else if (b0 == 0xE0) {
    need = 3;
    lo = 0xA0;
  } else if (InRange(b0, 0xE1, 0xEC) || InRange(b0, 0xEE, 0xEF)) {
    need = 3;
  } else if (b0 == 0xED) {
    need = 3;
    hi = 0x9F;
  } else if (b0 == 0xF0) {
    need = 4;
    lo = 0x90;
  } else if (InRange(b0, 0xF1, 0xF3)) {
    need = 4;
  } else if (b0 == 0xF4) {
    need = 4;
    hi = 0x8F;
  } else {
    return 0;  // 0x80..0xC1, 0xF5..0xFF never start a sequence
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= n) {
      *incomplete = true;
      *maximal_subpart = i;
      return 0;
    }
    const unsigned char b = p[i];
    const bool ok = (i == 1) ? InRange(b, lo, hi) : InRange(b, 0x80, 0xBF);
    if (!ok) {
      *maximal_subpart = i;
      return 0;
    }
  }
  return need;
}

absl::Status ValidateUtf8(absl::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= n) break;
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t subpart;
    bool incomplete;
    const size_t len = ValidSequenceLength(s.substr(i), &subpart, &incomplete);
    if (len == 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("expected valid UTF-8 text, found %s at byte offset %d (byte 0x%02X)",
                          incomplete ? "a truncated sequence" : "an invalid sequence", i,
                          static_cast<unsigned char>(s[i])));
    }
    i += len;
  }
  return absl::OkStatus();
}

char32_t NextCodePoint(absl::string_view s, size_t& pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + pos;
  const unsigned char b0 = p[0];
  if (b0 < 0x80) {
    pos += 1;
    return b0;
  }
  if (b0 < 0xE0) {
    pos += 2;
    return (static_cast<char32_t>(b0 & 0x1F) << 6) | (p[1] & 0x3F);
  }
  if (b0 < 0xF0) {
    pos += 3;
    return (static_cast<char32_t>(b0 & 0x0F) << 12) | (static_cast<char32_t>(p[1] & 0x3F) << 6) |
           (p[2] & 0x3F);
  }
  pos += 4;
  return (static_cast<char32_t>(b0 & 0x07) << 18) | (static_cast<char32_t>(p[1] & 0x3F) << 12) |
         (static_cast<char32_t>(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsUnicodeWhitespace(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

void Utf8StreamDecoder::Append(absl::string_view bytes, std::string* out) {
  std::string joined;
  absl::string_view s = bytes;
  if (!pending_.empty()) {
    joined = pending_ + std::string(bytes);
    pending_.clear();
    s = joined;
  }
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const size_t start = i;
    while (i < n && static_cast<unsigned char>(s[i]) < 0x80) ++i;
    out->append(s.data() + start, i - start);
    if (i >= n) break;
    size_t subpart;
    bool incomplete;
    const size_t len = ValidSequenceLength(s.substr(i), &subpart, &incomplete);
    if (len > 0) {
      out->append(s.data() + i, len);
      i += len;
    } else if (incomplete) {
      pending_.assign(s.data() + i, n - i);
      return;
    } else {
      out->append(kReplacementUtf8);
      i += subpart;
    }
  }
}

void Utf8StreamDecoder::Finish(std::string* out) {
  if (!pending_.empty()) {
    out->append(kReplacementUtf8);
    pending_.clear();
  }
}

std::string Utf8Lossy(absl::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  Utf8StreamDecoder decoder;
  decoder.Append(bytes, &out);
  decoder.Finish(&out);
  return out;
}

const std::array<std::string, 256>& ByteToUnicodeUtf8() { return Tables().byte_to_utf8; }

int UnicodeToByte(char32_t cp) {
  if (cp >= 512) return -1;
  return Tables().cp_to_byte[cp];
}

}  // namespace deepinfer::tokenizer::internal
