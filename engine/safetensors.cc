#include "engine/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace deepinfer::engine {
namespace {

using json = nlohmann::json;

// Headers are small (a few MB for the largest checkpoints); anything bigger is corrupt.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DTypeEntry {
  const char* name;
  StDType type;
  int size;
};

constexpr DTypeEntry kDTypes[] = {
    {"F64", StDType::kF64, 8},   {"F32", StDType::kF32, 4},       {"F16", StDType::kF16, 2},
    {"BF16", StDType::kBF16, 2}, {"I64", StDType::kI64, 8},       {"I32", StDType::kI32, 4},
    {"I16", StDType::kI16, 2},   {"I8", StDType::kI8, 1},         {"U8", StDType::kU8, 1},
    {"BOOL", StDType::kBool, 1}, {"F8_E4M3", StDType::kF8E4M3, 1}, {"F8_E5M2", StDType::kF8E5M2, 1},
};

absl::Status Bad(absl::string_view file, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": ", what));
}

}  // namespace

int StDTypeSize(StDType t) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.type == t) return e.size;
  }
  return 0;
}

const char* StDTypeName(StDType t) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.type == t) return e.name;
  }
  return "?";
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::ShapeString() const { return absl::StrCat("[", absl::StrJoin(shape, ", "), "]"); }

absl::StatusOr<std::vector<TensorView>> ParseSafetensors(absl::string_view bytes,
                                                         absl::string_view file_name) {
  if (bytes.size() < 8) {
    return Bad(file_name, absl::StrCat("expected at least 8 bytes (header length), found ",
                                       bytes.size()));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
  if (header_len > bytes.size() - 8 || header_len > kMaxHeaderBytes) {
    return Bad(file_name, absl::StrCat("header length ", header_len, " exceeds the file (",
                                       bytes.size() - 8, " bytes after the length field)"));
  }
  const absl::string_view header_text = bytes.substr(8, header_len);
  const json header = json::parse(header_text.begin(), header_text.end(), nullptr,
                                  /*allow_exceptions=*/false);
  if (header.is_discarded()) return Bad(file_name, "header is not valid JSON");
  if (!header.is_object()) return Bad(file_name, "header JSON must be an object");

  const uint64_t data_size = bytes.size() - 8 - header_len;
  const char* data_base = bytes.data() + 8 + header_len;
  std::vector<TensorView> tensors;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return Bad(file_name, "__metadata__ must be an object");
      continue;
    }
    const std::string where = absl::StrCat("tensor \"", name, "\"");
    if (!entry.is_object()) return Bad(file_name, absl::StrCat(where, ": expected an object"));
    const auto dtype_it = entry.find("dtype");
    const auto shape_it = entry.find("shape");
    const auto offsets_it = entry.find("data_offsets");
    if (dtype_it == entry.end() || !dtype_it->is_string()) {
      return Bad(file_name, absl::StrCat(where, ": missing string \"dtype\""));
    }
    if (shape_it == entry.end() || !shape_it->is_array()) {
      return Bad(file_name, absl::StrCat(where, ": missing array \"shape\""));
    }
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
        !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
      return Bad(file_name,
                 absl::StrCat(where, ": \"data_offsets\" must be [begin, end] unsigned integers"));
    }
    TensorView view;
    view.name = name;
    const std::string dtype_name = dtype_it->get<std::string>();
    int elem_size = 0;
    for (const DTypeEntry& e : kDTypes) {
      if (dtype_name == e.name) {
        view.dtype = e.type;
        elem_size = e.size;
      }
    }
    if (elem_size == 0) {
      return Bad(file_name, absl::StrCat(where, ": unknown dtype \"", dtype_name, "\""));
    }
    uint64_t numel = 1;
    for (const json& d : *shape_it) {
      if (!d.is_number_unsigned()) {
        return Bad(file_name, absl::StrCat(where, ": shape entries must be non-negative integers"));
      }
      const uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / 16 / dim) {
        return Bad(file_name, absl::StrCat(where, ": shape is too large"));
      }
      numel *= dim;
      view.shape.push_back(static_cast<int64_t>(dim));
    }
    const uint64_t begin = (*offsets_it)[0].get<uint64_t>();
    const uint64_t end = (*offsets_it)[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return Bad(file_name, absl::StrCat(where, ": data_offsets [", begin, ", ", end,
                                         "] out of bounds of the data area (", data_size,
                                         " bytes)"));
    }
    if (end - begin != numel * elem_size) {
      return Bad(file_name, absl::StrCat(where, ": shape ", view.ShapeString(), " of ",
                                         dtype_name, " needs ", numel * elem_size,
                                         " bytes, data_offsets span ", end - begin));
    }
    view.data = data_base + begin;
    view.nbytes = end - begin;
    tensors.push_back(std::move(view));
    ranges.emplace_back(begin, end);
  }
  std::vector<size_t> order(ranges.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  for (size_t i = 1; i < order.size(); ++i) {
    const auto& prev = ranges[order[i - 1]];
    const auto& cur = ranges[order[i]];
    if (cur.first < prev.second && cur.first != cur.second && prev.first != prev.second) {
      return Bad(file_name, absl::StrCat("tensors \"", tensors[order[i - 1]].name, "\" and \"",
                                         tensors[order[i]].name, "\" overlap in the data area"));
    }
  }
  return tensors;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot open: ", std::strerror(err)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* map = nullptr;
  if (size > 0) {
    map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat(path, ": mmap failed: ", std::strerror(err)));
    }
  }
  ::close(fd);
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile(path, map, size));
  DI_ASSIGN_OR_RETURN(file->tensors_,
                      ParseSafetensors(absl::string_view(static_cast<const char*>(map), size),
                                       path));
  for (size_t i = 0; i < file->tensors_.size(); ++i) file->index_[file->tensors_[i].name] = i;
  return file;
}

SafetensorsFile::SafetensorsFile(std::string path, void* map, size_t size)
    : path_(std::move(path)), map_(map), map_size_(size) {}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

const TensorView* SafetensorsFile::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(dir, ": not a directory"));
  }
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint(dir));
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single_path = fs::path(dir) / "model.safetensors";
  std::vector<std::string> shard_names;
  json weight_map;
  if (fs::exists(index_path, ec)) {
    std::ifstream in(index_path);
    const json index = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": not valid JSON"));
    }
    auto it = index.find("weight_map");
    if (it == index.end() || !it->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path.string(), ": missing object \"weight_map\""));
    }
    weight_map = *it;
    std::set<std::string> unique;
    for (const auto& [tensor, shard] : weight_map.items()) {
      if (!shard.is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(
            index_path.string(), ": weight_map[\"", tensor, "\"] must be a file name"));
      }
      const std::string shard_name = shard.get<std::string>();
      if (shard_name.find('/') != std::string::npos || shard_name == "..") {
        return absl::InvalidArgumentError(absl::StrCat(
            index_path.string(), ": shard \"", shard_name, "\" must be a file in the directory"));
      }
      unique.insert(shard_name);
    }
    shard_names.assign(unique.begin(), unique.end());
  } else if (fs::exists(single_path, ec)) {
    shard_names.push_back("model.safetensors");
  } else {
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      if (entry.path().extension() == ".safetensors" &&
          entry.path().filename().string().rfind("reference", 0) != 0) {
        shard_names.push_back(entry.path().filename().string());
      }
    }
    std::sort(shard_names.begin(), shard_names.end());
  }
  if (shard_names.empty()) {
    return absl::NotFoundError(absl::StrCat(dir, ": no *.safetensors files"));
  }
  for (const std::string& shard : shard_names) {
    DI_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                        SafetensorsFile::Open((fs::path(dir) / shard).string()));
    for (const TensorView& t : file->tensors()) {
      auto [it, inserted] = ckpt->by_name_.emplace(t.name, std::make_pair(&t, file.get()));
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(dir, ": tensor \"", t.name,
                                                       "\" appears in both ",
                                                       it->second.second->path(), " and ",
                                                       file->path()));
      }
    }
    ckpt->files_.push_back(std::move(file));
  }
  if (!weight_map.is_null()) {
    for (const auto& [tensor, shard] : weight_map.items()) {
      auto it = ckpt->by_name_.find(tensor);
      if (it == ckpt->by_name_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": tensor \"", tensor,
                                                       "\" is not in ", shard.get<std::string>()));
      }
    }
  }
  return ckpt;
}

const TensorView* Checkpoint::Find(absl::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second.first;
}

absl::StatusOr<const TensorView*> Checkpoint::Get(absl::string_view name,
                                                  const std::vector<int64_t>& shape) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir_, ": missing tensor \"", name, "\" (expected shape [",
                     absl::StrJoin(shape, ", "), "])"));
  }
  const TensorView* t = it->second.first;
  if (t->shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        it->second.second->path(), ": tensor \"", name, "\" has shape ", t->ShapeString(),
        ", expected [", absl::StrJoin(shape, ", "), "]"));
  }
  return t;
}

}  // namespace deepinfer::engine
