#include "kv_store/fs_kv_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kv_store/internal/object_format.h"

namespace deepinfer {
namespace {

using kv_store_internal::CheckLayerRange;
using kv_store_internal::Crc32;
using kv_store_internal::DecodeHeader;
using kv_store_internal::EncodeHeader;
using kv_store_internal::HeaderBytes;
using kv_store_internal::ObjectBytes;

constexpr char kUsageMagic[8] = {'D', 'I', 'K', 'V', 'U', 'S', 'E', '1'};
constexpr size_t kUsageBytes = 36;  // magic, u64 bytes, i64 objects, i64 scan micros, u32 crc

absl::Status Errno(absl::string_view what, const std::string& path, int err) {
  return absl::UnavailableError(absl::StrCat("kv store: ", what, " ", path, ": ", strerror(err)));
}

// pread/pwrite until done; false on error or end of file.
bool PreadFull(int fd, uint8_t* buf, size_t n, uint64_t offset) {
  while (n > 0) {
    const ssize_t r = pread(fd, buf, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    buf += r, n -= static_cast<size_t>(r), offset += static_cast<uint64_t>(r);
  }
  return true;
}

bool PwriteFull(int fd, const uint8_t* buf, size_t n, uint64_t offset) {
  while (n > 0) {
    const ssize_t r = pwrite(fd, buf, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    buf += r, n -= static_cast<size_t>(r), offset += static_cast<uint64_t>(r);
  }
  return true;
}

absl::Time AccessTime(const struct stat& st) { return absl::TimeFromTimespec(st.st_atim); }

std::string FanoutDir(const std::string& root, const KvBlockKey& key) {
  return absl::StrCat(root, "/objects/", key.Hex().substr(0, 2));
}

// Publishes `tmp` as `final` unless `final` exists. 0, EEXIST, or another errno.
int PublishNoReplace(const std::string& tmp, const std::string& final_path) {
  if (renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_NOREPLACE) == 0) {
    return 0;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) return errno;
  // No RENAME_NOREPLACE (NFS, FUSE): link() fails with EEXIST just as atomically.
  if (link(tmp.c_str(), final_path.c_str()) == 0) {
    unlink(tmp.c_str());
    return 0;
  }
  if (errno != EPERM && errno != ENOTSUP && errno != EOPNOTSUPP) return errno;
  // No hard links either: a plain rename. Two racing committers then both publish; the last
  // rename wins and both files are whole objects of the same key.
  struct stat st;
  if (stat(final_path.c_str(), &st) == 0) return EEXIST;
  return rename(tmp.c_str(), final_path.c_str()) == 0 ? 0 : errno;
}

}  // namespace

// ---- Lock ----

class FsKvStore::Lock {
 public:
  Lock(absl::Mutex* mu, int fd) : mu_(mu), fd_(fd) {}
  ~Lock() {
    flock(fd_, LOCK_UN);
    mu_->Unlock();
  }

 private:
  absl::Mutex* const mu_;
  const int fd_;
};

absl::StatusOr<std::unique_ptr<FsKvStore::Lock>> FsKvStore::AcquireLock(absl::Time deadline) {
  // Polling, because neither flock() nor absl::Mutex waits with a deadline on a caller's clock.
  absl::Duration pause = absl::Microseconds(100);
  bool have_mu = false;
  while (true) {
    if (!have_mu) have_mu = lock_mu_.TryLock();
    if (have_mu) {
      if (flock(usage_fd_, LOCK_EX | LOCK_NB) == 0) {
        return std::make_unique<Lock>(&lock_mu_, usage_fd_);
      }
      if (errno != EWOULDBLOCK && errno != EINTR) {
        const int err = errno;
        lock_mu_.Unlock();
        return Errno("flock", options_.root + "/usage", err);
      }
    }
    if (options_.config.clock() > deadline) {
      if (have_mu) lock_mu_.Unlock();
      return absl::DeadlineExceededError("kv store: deadline passed waiting for the store lock");
    }
    if (have_mu) {
      // Let this process's other threads in while another process holds the flock.
      lock_mu_.Unlock();
      have_mu = false;
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(5));
  }
}

// ---- Usage record ----

bool FsKvStore::ReadUsage(Usage* usage) const {
  uint8_t b[kUsageBytes];
  if (!PreadFull(usage_fd_, b, sizeof(b), 0)) return false;
  if (std::memcmp(b, kUsageMagic, 8) != 0) return false;
  uint32_t crc;
  std::memcpy(&crc, b + 32, 4);
  if (crc != Crc32(absl::MakeConstSpan(b, 32))) return false;
  int64_t micros;
  std::memcpy(&usage->bytes_held, b + 8, 8);
  std::memcpy(&usage->objects, b + 16, 8);
  std::memcpy(&micros, b + 24, 8);
  usage->last_scan = absl::FromUnixMicros(micros);
  return true;
}

absl::Status FsKvStore::WriteUsage(const Usage& usage) {
  uint8_t b[kUsageBytes];
  std::memcpy(b, kUsageMagic, 8);
  std::memcpy(b + 8, &usage.bytes_held, 8);
  std::memcpy(b + 16, &usage.objects, 8);
  const int64_t micros = absl::ToUnixMicros(usage.last_scan);
  std::memcpy(b + 24, &micros, 8);
  const uint32_t crc = Crc32(absl::MakeConstSpan(b, 32));
  std::memcpy(b + 32, &crc, 4);
  if (!PwriteFull(usage_fd_, b, sizeof(b), 0)) {
    return Errno("write", options_.root + "/usage", errno);
  }
  return absl::OkStatus();
}

// ---- Scan ----

FsKvStore::Usage FsKvStore::ScanLocked(uint64_t incoming) {
  struct Candidate {
    absl::Time atime;
    uint64_t size;
    std::string path;
  };
  const absl::Time now = options_.config.clock();
  std::vector<Candidate> objects;
  uint64_t held = 0;
  int64_t reclaimed = 0;
  const std::string objects_dir = options_.root + "/objects";
  DIR* top = opendir(objects_dir.c_str());
  while (top != nullptr) {
    const dirent* sub = readdir(top);
    if (sub == nullptr) break;
    if (sub->d_name[0] == '.') continue;
    const std::string dir = absl::StrCat(objects_dir, "/", sub->d_name);
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) continue;
    while (const dirent* e = readdir(d)) {
      const absl::string_view name = e->d_name;
      if (name[0] == '.') continue;
      const std::string path = absl::StrCat(dir, "/", name);
      struct stat st;
      if (stat(path.c_str(), &st) != 0) continue;  // removed meanwhile
      const uint64_t size = static_cast<uint64_t>(st.st_size);
      if (absl::EndsWith(name, ".kv")) {
        held += size;
        objects.push_back({AccessTime(st), size, path});
      } else if (absl::EndsWith(name, ".tmp")) {
        // <key>.<start micros>.<host>.<pid>.<n>.tmp
        const std::vector<absl::string_view> parts = absl::StrSplit(name, '.');
        int64_t start_micros = 0;
        if (parts.size() >= 3 && absl::SimpleAtoi(parts[1], &start_micros) &&
            now - absl::FromUnixMicros(start_micros) > options_.config.reservation_timeout) {
          if (unlink(path.c_str()) == 0) ++reclaimed;
          continue;
        }
        held += size;
      }
    }
    closedir(d);
  }
  if (top != nullptr) closedir(top);

  int64_t evicted = 0;
  if (held + incoming > high_bytes_) {
    std::sort(objects.begin(), objects.end(),
              [](const Candidate& a, const Candidate& b) { return a.atime < b.atime; });
    for (const Candidate& c : objects) {
      if (held + incoming <= low_bytes_) break;
      if (unlink(c.path.c_str()) == 0) {
        held -= c.size;
        ++evicted;
      }
    }
  }
  {
    absl::MutexLock lock(&mu_);
    stats_.evictions += evicted;
    stats_.reclaimed += reclaimed;
  }
  Usage usage;
  usage.bytes_held = held;
  usage.objects = static_cast<int64_t>(objects.size()) - evicted;
  usage.last_scan = now;
  return usage;
}

// ---- Reader ----

class FsKvStore::Reader : public KvBlockReader {
 public:
  Reader(FsKvStore* store, std::string path, int fd, std::vector<uint32_t> crcs)
      : KvBlockReader(store->options_.config.layout),
        store_(store),
        path_(std::move(path)),
        fd_(fd),
        crcs_(std::move(crcs)) {}
  ~Reader() override { close(fd_); }

  absl::Status ReadLayers(uint32_t first_layer, uint32_t num_layers, absl::Span<uint8_t> dst,
                          absl::Time deadline) override {
    if (absl::Status s = CheckLayerRange(layout(), first_layer, num_layers, dst.size()); !s.ok()) {
      return s;
    }
    const absl::Time start = store_->options_.config.clock();
    if (start > deadline) return absl::DeadlineExceededError("kv store: read deadline passed");
    const uint64_t per_layer = layout().bytes_per_layer;
    const uint64_t offset = HeaderBytes(layout()) + first_layer * per_layer;
    errno = 0;
    if (!PreadFull(fd_, dst.data(), dst.size(), offset)) {
      // ESTALE (evicted on an NFS server), EIO, or a file cut short.
      store_->CountError();
      return absl::NotFoundError(
          absl::StrCat("kv store: reading ", path_, ": ", errno ? strerror(errno) : "short file"));
    }
    for (uint32_t i = 0; i < num_layers; ++i) {
      const uint32_t layer = first_layer + i;
      if (Crc32(dst.subspan(i * per_layer, per_layer)) != crcs_[layer]) {
        store_->CountError();
        store_->Quarantine(path_, fd_);
        return absl::NotFoundError(
            absl::StrCat("kv store: layer ", layer, " of ", path_, " fails its checksum"));
      }
    }
    const double seconds = absl::ToDoubleSeconds(store_->options_.config.clock() - start);
    absl::MutexLock lock(&store_->mu_);
    store_->stats_.read_bytes += static_cast<int64_t>(dst.size());
    store_->stats_.read_seconds += seconds;
    return absl::OkStatus();
  }

 private:
  FsKvStore* const store_;
  const std::string path_;
  const int fd_;
  const std::vector<uint32_t> crcs_;
};

// ---- Writer ----

class FsKvStore::Writer : public KvBlockWriter {
 public:
  Writer(FsKvStore* store, const KvBlockKey& key, std::string temp_path, int fd)
      : KvBlockWriter(store->options_.config.layout),
        store_(store),
        key_(key),
        temp_path_(std::move(temp_path)),
        fd_(fd),
        crcs_(layout().num_layers),
        written_(layout().num_layers, false) {}
  ~Writer() override {
    close(fd_);
    if (!done_)
      store_->ReleaseBytes(temp_path_, store_->options_.config.clock() + absl::Seconds(5));
  }

  absl::Status WriteLayers(uint32_t first_layer, uint32_t num_layers,
                           absl::Span<const uint8_t> src) override {
    if (absl::Status s = CheckLayerRange(layout(), first_layer, num_layers, src.size()); !s.ok()) {
      return s;
    }
    if (done_) return absl::FailedPreconditionError("kv store: write after Commit");
    const absl::Time start = store_->options_.config.clock();
    const uint64_t per_layer = layout().bytes_per_layer;
    if (!PwriteFull(fd_, src.data(), src.size(), HeaderBytes(layout()) + first_layer * per_layer)) {
      return Errno("write", temp_path_, errno);
    }
    for (uint32_t i = 0; i < num_layers; ++i) {
      crcs_[first_layer + i] = Crc32(src.subspan(i * per_layer, per_layer));
      written_[first_layer + i] = true;
    }
    seconds_ += absl::ToDoubleSeconds(store_->options_.config.clock() - start);
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
    const absl::Time start = store_->options_.config.clock();
    absl::Status status = Publish(start, deadline);
    if (!status.ok()) {
      // kAborted: the file is gone (reclaimed by a scan, which already took its bytes back).
      if (status.code() != absl::StatusCode::kAborted) {
        store_->ReleaseBytes(temp_path_, store_->options_.config.clock() + absl::Seconds(5));
      }
      return status;
    }
    const double seconds =
        seconds_ + absl::ToDoubleSeconds(store_->options_.config.clock() - start);
    absl::MutexLock lock(&store_->mu_);
    ++store_->stats_.commits;
    store_->stats_.write_bytes += static_cast<int64_t>(layout().payload_bytes());
    store_->stats_.write_seconds += seconds;
    return absl::OkStatus();
  }

 private:
  absl::Status Publish(absl::Time now, absl::Time deadline) {
    if (now > deadline) return absl::DeadlineExceededError("kv store: commit deadline passed");
    const std::vector<uint8_t> header =
        EncodeHeader(key_, store_->options_.config.model_digest, layout(), crcs_);
    if (!PwriteFull(fd_, header.data(), header.size(), 0)) {
      return Errno("write", temp_path_, errno);
    }
    const timespec times[2] = {absl::ToTimespec(now), absl::ToTimespec(now)};
    futimens(fd_, times);  // recency only: a failure leaves the write time, which is close
    if (store_->options_.fsync && fsync(fd_) != 0) return Errno("fsync", temp_path_, errno);
    const std::string final_path = store_->ObjectPath(key_);
    const int err = PublishNoReplace(temp_path_, final_path);
    if (err == EEXIST) {
      return absl::AlreadyExistsError(
          absl::StrCat("kv store: ", key_.Hex(), " was committed by another writer"));
    }
    if (err == ENOENT) {
      return absl::AbortedError(
          absl::StrCat("kv store: reservation ", temp_path_, " was reclaimed (too old)"));
    }
    if (err != 0) return Errno("rename to", final_path, err);
    return absl::OkStatus();
  }

  FsKvStore* const store_;
  const KvBlockKey key_;
  const std::string temp_path_;
  const int fd_;
  std::vector<uint32_t> crcs_;
  std::vector<bool> written_;
  double seconds_ = 0;
  bool done_ = false;
};

// ---- FsKvStore ----

absl::StatusOr<std::unique_ptr<FsKvStore>> FsKvStore::Create(FsKvStoreOptions options) {
  if (absl::Status s = ValidateKvStoreConfig(options.config, ObjectBytes(options.config.layout));
      !s.ok()) {
    return s;
  }
  if (options.root.empty()) return absl::InvalidArgumentError("kv store: empty root directory");
  for (const std::string& dir : {options.root, options.root + "/objects"}) {
    if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return Errno("mkdir", dir, errno);
  }
  const std::string usage_path = options.root + "/usage";
  const int fd = open(usage_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("open", usage_path, errno);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string host_name = host;
  // The host goes into file names split on '.'.
  std::replace(host_name.begin(), host_name.end(), '.', '_');
  std::replace(host_name.begin(), host_name.end(), '/', '_');
  if (host_name.empty()) host_name = "host";
  return std::unique_ptr<FsKvStore>(new FsKvStore(std::move(options), fd, host_name));
}

FsKvStore::FsKvStore(FsKvStoreOptions options, int usage_fd, std::string host)
    : options_(std::move(options)),
      object_bytes_(ObjectBytes(options_.config.layout)),
      high_bytes_(WatermarkBytes(options_.config.capacity_bytes, options_.config.high_watermark)),
      low_bytes_(WatermarkBytes(options_.config.capacity_bytes, options_.config.low_watermark)),
      usage_fd_(usage_fd),
      host_(std::move(host)) {
  stats_.capacity_bytes = static_cast<int64_t>(options_.config.capacity_bytes);
}

FsKvStore::~FsKvStore() { close(usage_fd_); }

std::string FsKvStore::ObjectPath(const KvBlockKey& key) const {
  return absl::StrCat(FanoutDir(options_.root, key), "/", key.Hex(), ".kv");
}

absl::StatusOr<size_t> FsKvStore::Lookup(absl::Span<const KvBlockKey> keys, absl::Time deadline) {
  size_t n = 0;
  for (; n < keys.size(); ++n) {
    if (options_.config.clock() > deadline) {
      return absl::DeadlineExceededError("kv store: lookup deadline passed");
    }
    struct stat st;
    if (stat(ObjectPath(keys[n]).c_str(), &st) != 0) break;
  }
  return n;
}

absl::StatusOr<std::unique_ptr<KvBlockReader>> FsKvStore::OpenForRead(const KvBlockKey& key,
                                                                      absl::Time deadline) {
  const absl::Time now = options_.config.clock();
  if (now > deadline) return absl::DeadlineExceededError("kv store: open deadline passed");
  const std::string path = ObjectPath(key);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    absl::MutexLock lock(&mu_);
    ++stats_.misses;
    if (err != ENOENT) ++stats_.errors;
    return absl::NotFoundError(absl::StrCat("kv store: no object ", path, ": ", strerror(err)));
  }
  const KvBlockLayout& layout = options_.config.layout;
  std::vector<uint8_t> header(HeaderBytes(layout));
  absl::StatusOr<std::vector<uint32_t>> crcs =
      PreadFull(fd, header.data(), header.size(), 0)
          ? DecodeHeader(header, key, options_.config.model_digest, layout)
          : absl::DataLossError("kv object: short header");
  struct stat st;
  if (crcs.ok() && (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != object_bytes_)) {
    crcs = absl::DataLossError("kv object: wrong size");
  }
  if (!crcs.ok()) {
    CountError();
    Quarantine(path, fd);
    close(fd);
    return absl::NotFoundError(absl::StrCat("kv store: ", path, ": ", crcs.status().message()));
  }
  if (now - AccessTime(st) > options_.touch_interval) {
    const timespec times[2] = {absl::ToTimespec(now), {0, UTIME_OMIT}};
    futimens(fd, times);  // recency is approximate; a read-only mount keeps the old time
  }
  {
    absl::MutexLock lock(&mu_);
    ++stats_.hits;
  }
  return std::unique_ptr<KvBlockReader>(new Reader(this, path, fd, *std::move(crcs)));
}

absl::StatusOr<std::unique_ptr<KvBlockWriter>> FsKvStore::Reserve(const KvBlockKey& key,
                                                                  absl::Time deadline) {
  const absl::Time now = options_.config.clock();
  if (now > deadline) return absl::DeadlineExceededError("kv store: reserve deadline passed");
  struct stat st;
  if (stat(ObjectPath(key).c_str(), &st) == 0) {
    return absl::AlreadyExistsError(absl::StrCat("kv store: ", key.Hex(), " is stored"));
  }
  // The temporary file is created at its full size under the lock, in the same step as its
  // bytes are counted, so the bytes on disk never run ahead of the record and a scan never
  // sees a reservation half made.
  const std::string dir = FanoutDir(options_.root, key);
  std::string temp;
  int fd = -1;
  absl::Status status = [&]() -> absl::Status {
    absl::StatusOr<std::unique_ptr<Lock>> lock = AcquireLock(deadline);
    if (!lock.ok()) return lock.status();
    Usage usage;
    if (!ReadUsage(&usage) || now - usage.last_scan > options_.rescan_interval ||
        usage.bytes_held + object_bytes_ > high_bytes_) {
      usage = ScanLocked(object_bytes_);
    }
    if (usage.bytes_held + object_bytes_ > high_bytes_) {
      (void)WriteUsage(usage);
      return absl::ResourceExhaustedError(
          absl::StrCat("kv store: ", usage.bytes_held, " bytes held (reservations), no room for ",
                       object_bytes_, " more under the high watermark of ", high_bytes_));
    }
    for (int attempt = 0; fd < 0 && attempt < 3; ++attempt) {
      uint64_t n;
      {
        absl::MutexLock l(&mu_);
        n = next_temp_++;
      }
      temp = absl::StrCat(dir, "/", key.Hex(), ".", absl::ToUnixMicros(now), ".", host_, ".",
                          getpid(), ".", n, ".tmp");
      fd = open(temp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd < 0 && errno == ENOENT) {
        if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return Errno("mkdir", dir, errno);
      } else if (fd < 0 && errno != EEXIST) {
        return Errno("create", temp, errno);
      }
    }
    if (fd < 0) return Errno("create", temp, EEXIST);
    if (ftruncate(fd, static_cast<off_t>(object_bytes_)) != 0) {
      return Errno("truncate", temp, errno);
    }
    usage.bytes_held += object_bytes_;
    return WriteUsage(usage);
  }();
  if (!status.ok()) {
    if (fd >= 0) {
      close(fd);
      unlink(temp.c_str());
    }
    return status;
  }
  return std::unique_ptr<KvBlockWriter>(new Writer(this, key, temp, fd));
}

absl::Status FsKvStore::Collect(absl::Time deadline) {
  absl::StatusOr<std::unique_ptr<Lock>> lock = AcquireLock(deadline);
  if (!lock.ok()) return lock.status();
  return WriteUsage(ScanLocked(0));
}

KvStoreStats FsKvStore::stats() const {
  Usage usage;
  const bool have_usage = ReadUsage(&usage);
  absl::MutexLock lock(&mu_);
  KvStoreStats s = stats_;
  if (have_usage) {
    s.objects = usage.objects;
    s.bytes_held = static_cast<int64_t>(usage.bytes_held);
  }
  return s;
}

void FsKvStore::ReleaseBytes(const std::string& path, absl::Time deadline) {
  absl::StatusOr<std::unique_ptr<Lock>> lock = AcquireLock(deadline);
  if (!lock.ok()) return;  // the next scan finds the file (or its absence) and recounts
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return;  // a scan already took it (and its bytes) away
  if (unlink(path.c_str()) != 0) return;
  Usage usage;
  if (ReadUsage(&usage)) {
    usage.bytes_held -= std::min<uint64_t>(usage.bytes_held, static_cast<uint64_t>(st.st_size));
    (void)WriteUsage(usage);
  }
}

void FsKvStore::Quarantine(const std::string& path, int fd) {
  struct stat open_st, path_st;
  if (fstat(fd, &open_st) != 0 || stat(path.c_str(), &path_st) != 0) return;
  if (open_st.st_dev != path_st.st_dev || open_st.st_ino != path_st.st_ino) return;
  ReleaseBytes(path, options_.config.clock() + absl::Seconds(1));
}

void FsKvStore::CountError() {
  absl::MutexLock lock(&mu_);
  ++stats_.errors;
  ++stats_.misses;
}

}  // namespace deepinfer
