// Safetensors checkpoints: one file (memory-mapped, zero-copy) or a sharded set described by
// `model.safetensors.index.json`.
//
// File layout: 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data area; offsets are relative to the data area.
//
// Every malformed input gives kInvalidArgument (kNotFound for missing files) whose message starts
// with the file name and says what was expected and what was found: header length beyond the
// file, header JSON that does not parse, unknown dtype, shape/offset mismatch, offsets out of
// bounds or overlapping. Never a crash.
//
// Thread-safety: immutable after Open(); all const methods are thread-safe. Tensor data points into
// the mapping and stays valid for the lifetime of the SafetensorsFile / Checkpoint.
#ifndef DEEPINFER_ENGINE_SAFETENSORS_H_
#define DEEPINFER_ENGINE_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deepinfer::engine {

// Element types that may appear in a safetensors file. The engine computes with F32, BF16 and
// F16 weights; others parse (so a file with e.g. an I64 buffer still opens) but are refused when
// a model asks for them.
enum class StDType : uint8_t { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool,
                               kF8E4M3, kF8E5M2 };

int StDTypeSize(StDType t);
const char* StDTypeName(StDType t);

struct TensorView {
  std::string name;
  StDType dtype = StDType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;

  int64_t numel() const;
  // "[4096, 512]"
  std::string ShapeString() const;
};

// Parses a whole file's bytes (header + data) into tensor views pointing into `bytes`.
// `file_name` only labels error messages. Exposed for the fuzzer and for tests.
absl::StatusOr<std::vector<TensorView>> ParseSafetensors(absl::string_view bytes,
                                                         absl::string_view file_name);

class SafetensorsFile {
 public:
  // Memory-maps `path` read-only and validates it completely.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::vector<TensorView>& tensors() const { return tensors_; }
  // nullptr when absent.
  const TensorView* Find(absl::string_view name) const;

 private:
  SafetensorsFile(std::string path, void* map, size_t size);

  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
};

// All tensors of a model directory: `model.safetensors`, or the shards named by
// `model.safetensors.index.json` ("weight_map": {tensor: shard file}), or every `*.safetensors`
// file when neither exists. A tensor name present in two files, or an index entry whose shard
// lacks it, is kInvalidArgument.
class Checkpoint {
 public:
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  const TensorView* Find(absl::string_view name) const;

  // The tensor `name` with exactly `shape`; kInvalidArgument naming the tensor, file, expected
  // and found shape otherwise (kNotFound-like "missing tensor" is also kInvalidArgument: the
  // checkpoint does not fit its config).
  absl::StatusOr<const TensorView*> Get(absl::string_view name,
                                        const std::vector<int64_t>& shape) const;

  size_t tensor_count() const { return by_name_.size(); }
  const std::string& dir() const { return dir_; }

 private:
  explicit Checkpoint(std::string dir) : dir_(std::move(dir)) {}

  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<const TensorView*, const SafetensorsFile*>, std::less<>>
      by_name_;
};

}  // namespace deepinfer::engine

#endif  // DEEPINFER_ENGINE_SAFETENSORS_H_
