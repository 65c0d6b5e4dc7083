#include "kv_transfer/internal/wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace deepinfer::kv_transfer::internal {
namespace {

constexpr char kMetadataMagic[8] = {'D', 'I', 'K', 'V', 'M', 'E', 'T', 'A'};
constexpr char kNotificationMagic[8] = {'D', 'I', 'K', 'V', 'N', 'O', 'T', 'E'};
// Bounds that keep a hostile blob from making us allocate without limit.
constexpr uint64_t kMaxStringBytes = 1 << 20;
constexpr uint64_t kMaxRegions = 1 << 16;

void PutU64(uint64_t v, std::string* out) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  out->append(b, 8);
}
void PutU32(uint32_t v, std::string* out) {
  char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  out->append(b, 4);
}
void PutString(absl::string_view s, std::string* out) {
  PutU64(s.size(), out);
  out->append(s.data(), s.size());
}

class Reader {
 public:
  Reader(absl::string_view data, absl::string_view what) : data_(data), what_(what) {}

  absl::Status U64(uint64_t* v) {
    if (data_.size() < 8) return Truncated(8);
    uint64_t r = 0;
    for (int i = 0; i < 8; ++i) r |= uint64_t{static_cast<uint8_t>(data_[i])} << (8 * i);
    data_.remove_prefix(8);
    *v = r;
    return absl::OkStatus();
  }
  absl::Status U32(uint32_t* v) {
    if (data_.size() < 4) return Truncated(4);
    uint32_t r = 0;
    for (int i = 0; i < 4; ++i) r |= uint32_t{static_cast<uint8_t>(data_[i])} << (8 * i);
    data_.remove_prefix(4);
    *v = r;
    return absl::OkStatus();
  }
  absl::Status String(std::string* s) {
    uint64_t n = 0;
    if (auto st = U64(&n); !st.ok()) return st;
    if (n > kMaxStringBytes || n > data_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what_, ": expected a string of at most ", data_.size(),
                       " remaining bytes (limit ", kMaxStringBytes, "), found length ", n));
    }
    s->assign(data_.data(), n);
    data_.remove_prefix(n);
    return absl::OkStatus();
  }
  absl::Status Magic(const char (&magic)[8]) {
    if (data_.size() < 8 || std::memcmp(data_.data(), magic, 8) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what_, ": expected magic '", absl::string_view(magic, 8), "', found ",
          data_.size() < 8 ? "a blob shorter than 8 bytes" : "other bytes"));
    }
    data_.remove_prefix(8);
    return absl::OkStatus();
  }
  absl::Status Done() const {
    if (!data_.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what_, ": expected end of data, found ", data_.size(), " trailing bytes"));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Truncated(size_t need) const {
    return absl::InvalidArgumentError(absl::StrCat(what_, ": truncated, expected ", need,
                                                   " more bytes, found ", data_.size()));
  }
  absl::string_view data_;
  absl::string_view what_;
};

#define WIRE_RETURN_IF_ERROR(expr)         \
  do {                                     \
    absl::Status wire_status_ = (expr);    \
    if (!wire_status_.ok()) return wire_status_; \
  } while (false)

}  // namespace

std::string EncodeMetadata(const PeerMetadata& m) {
  std::string out(kMetadataMagic, 8);
  PutU32(kMetadataVersion, &out);
  PutString(m.name, &out);
  PutU64(m.incarnation, &out);
  PutU32(static_cast<uint32_t>(m.backend), &out);
  PutString(m.address, &out);
  PutU64(m.regions.size(), &out);
  for (const RegionMetadata& r : m.regions) {
    PutU64(r.id, &out);
    PutU64(r.base, &out);
    PutU64(r.length, &out);
    PutU32(static_cast<uint32_t>(r.kind), &out);
    PutString(r.remote_key, &out);
  }
  return out;
}

absl::StatusOr<PeerMetadata> DecodeMetadata(absl::string_view blob) {
  Reader in(blob, "kv_transfer metadata");
  WIRE_RETURN_IF_ERROR(in.Magic(kMetadataMagic));
  uint32_t version = 0;
  WIRE_RETURN_IF_ERROR(in.U32(&version));
  if (version != kMetadataVersion) {
    return absl::FailedPreconditionError(absl::StrCat("kv_transfer metadata: expected version ",
                                                      kMetadataVersion, ", found ", version));
  }
  PeerMetadata m;
  WIRE_RETURN_IF_ERROR(in.String(&m.name));
  WIRE_RETURN_IF_ERROR(in.U64(&m.incarnation));
  uint32_t backend = 0;
  WIRE_RETURN_IF_ERROR(in.U32(&backend));
  if (backend > static_cast<uint32_t>(Backend::kUcx)) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_transfer metadata: expected backend 0 or 1, found ", backend));
  }
  m.backend = static_cast<Backend>(backend);
  WIRE_RETURN_IF_ERROR(in.String(&m.address));
  uint64_t n = 0;
  WIRE_RETURN_IF_ERROR(in.U64(&n));
  if (n > kMaxRegions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_transfer metadata: expected at most ", kMaxRegions, " regions, found ", n));
  }
  m.regions.resize(n);
  for (RegionMetadata& r : m.regions) {
    WIRE_RETURN_IF_ERROR(in.U64(&r.id));
    WIRE_RETURN_IF_ERROR(in.U64(&r.base));
    WIRE_RETURN_IF_ERROR(in.U64(&r.length));
    uint32_t kind = 0;
    WIRE_RETURN_IF_ERROR(in.U32(&kind));
    if (kind > static_cast<uint32_t>(MemoryKind::kCudaDevice)) {
      return absl::InvalidArgumentError(
          absl::StrCat("kv_transfer metadata: expected memory kind 0 or 1, found ", kind));
    }
    r.kind = static_cast<MemoryKind>(kind);
    WIRE_RETURN_IF_ERROR(in.String(&r.remote_key));
  }
  WIRE_RETURN_IF_ERROR(in.Done());
  if (m.name.empty() || m.incarnation == 0) {
    return absl::InvalidArgumentError(
        "kv_transfer metadata: expected a non-empty name and a non-zero incarnation");
  }
  return m;
}

void EncodeNotification(const Notification& n, absl::string_view sender,
                        uint64_t sender_incarnation, std::string* out) {
  out->assign(kNotificationMagic, 8);
  PutU32(kNotificationVersion, out);
  PutString(sender, out);
  PutU64(sender_incarnation, out);
  PutU64(n.request_id, out);
  PutU32(n.seq, out);
  PutU32(n.total, out);
  PutString(n.payload, out);
}

absl::StatusOr<Notification> DecodeNotification(absl::string_view bytes) {
  Reader in(bytes, "kv_transfer notification");
  WIRE_RETURN_IF_ERROR(in.Magic(kNotificationMagic));
  uint32_t version = 0;
  WIRE_RETURN_IF_ERROR(in.U32(&version));
  if (version != kNotificationVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "kv_transfer notification: expected version ", kNotificationVersion, ", found ", version));
  }
  Notification n;
  WIRE_RETURN_IF_ERROR(in.String(&n.sender));
  WIRE_RETURN_IF_ERROR(in.U64(&n.sender_incarnation));
  WIRE_RETURN_IF_ERROR(in.U64(&n.request_id));
  WIRE_RETURN_IF_ERROR(in.U32(&n.seq));
  WIRE_RETURN_IF_ERROR(in.U32(&n.total));
  WIRE_RETURN_IF_ERROR(in.String(&n.payload));
  WIRE_RETURN_IF_ERROR(in.Done());
  return n;
}

}  // namespace deepinfer::kv_transfer::internal
