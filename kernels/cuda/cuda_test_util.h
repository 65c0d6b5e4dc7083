// Helpers for the GPU tests of kernels/cuda (testonly): random tensors on the host and copies to
// and from device buffers, failing the test with the Status on error.
#ifndef DEEPINFER_KERNELS_CUDA_CUDA_TEST_UTIL_H_
#define DEEPINFER_KERNELS_CUDA_CUDA_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/launch.h"
#include "kernels/dtype.h"

namespace deepinfer::kernels::testing {

// Skips the test (GTEST_SKIP in SetUp) when no device is usable.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::Status available = CudaAvailable();
    if (!available.ok()) GTEST_SKIP() << available;
  }
};

template <typename Param>
class CudaParamTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    absl::Status available = CudaAvailable();
    if (!available.ok()) GTEST_SKIP() << available;
  }
};

// n elements of type t drawn from N(mean, stddev), stored rounded.
inline std::vector<uint8_t> RandomTensor(DType t, int64_t n, std::mt19937& rng, float mean = 0.0f,
                                         float stddev = 1.0f) {
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<uint8_t> out(n * DTypeSize(t));
  for (int64_t i = 0; i < n; ++i) StoreFromF32(out.data(), t, i, dist(rng));
  return out;
}

inline std::vector<float> ToF32(const std::vector<uint8_t>& data, DType t) {
  std::vector<float> out(data.size() / DTypeSize(t));
  for (size_t i = 0; i < out.size(); ++i) out[i] = LoadAsF32(data.data(), t, i);
  return out;
}

// A device copy of `bytes` bytes of host memory; aborts the test on failure.
inline std::unique_ptr<DeviceBuffer> Upload(const void* data, size_t bytes) {
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> buf = DeviceBuffer::Allocate(bytes);
  EXPECT_TRUE(buf.ok()) << buf.status();
  if (!buf.ok()) return nullptr;
  if (bytes > 0) {
    absl::Status s = (*buf)->CopyFromHost(data, bytes);
    EXPECT_TRUE(s.ok()) << s;
  }
  return *std::move(buf);
}

template <typename T>
std::unique_ptr<DeviceBuffer> Upload(const std::vector<T>& v) {
  return Upload(v.data(), v.size() * sizeof(T));
}

// Synchronises the default stream, then copies `buf` back.
inline std::vector<uint8_t> Download(const DeviceBuffer& buf) {
  absl::Status s = CudaStatus(cuda_raw::StreamSynchronize(nullptr), "cudaStreamSynchronize");
  EXPECT_TRUE(s.ok()) << s;
  std::vector<uint8_t> out(buf.size());
  s = buf.CopyToHost(out.data(), out.size());
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// Download, as elements of T.
template <typename T>
std::vector<T> DownloadAs(const DeviceBuffer& buf) {
  const std::vector<uint8_t> bytes = Download(buf);
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

// Block tables of a paged KV pool for sequences of `contexts[i]` positions: each sequence gets
// ceil(contexts[i] / block_size) blocks in row i of a [contexts.size(), max_blocks] table (-1
// past them), the ids shuffled over the pool, and one spare block per sequence is left
// unreferenced. *total_blocks receives the pool's size.
inline std::vector<int32_t> ShuffledBlockTables(const std::vector<int32_t>& contexts,
                                                int block_size, int max_blocks, std::mt19937& rng,
                                                int* total_blocks) {
  *total_blocks = 0;
  for (int32_t ctx : contexts) *total_blocks += (ctx + block_size - 1) / block_size + 1;
  std::vector<int32_t> ids(*total_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> tables(contexts.size() * max_blocks, -1);
  int next = 0;
  for (size_t s = 0; s < contexts.size(); ++s) {
    const int used = (contexts[s] + block_size - 1) / block_size;
    for (int b = 0; b < used; ++b) tables[s * max_blocks + b] = ids[next++];
    ++next;
  }
  return tables;
}

// |a - b| <= atol + rtol * |a|, reporting the worst element.
inline void ExpectNear(const std::vector<float>& want, const std::vector<float>& got, float atol,
                       float rtol, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  int64_t worst = -1;
  float worst_excess = 0.0f;
  for (size_t i = 0; i < want.size(); ++i) {
    const float err = std::fabs(want[i] - got[i]);
    const float excess = err - (atol + rtol * std::fabs(want[i]));
    if (!(excess <= 0.0f) && (worst < 0 || !(excess <= worst_excess))) {
      worst = static_cast<int64_t>(i);
      worst_excess = excess;
    }
  }
  if (worst >= 0) {
    ADD_FAILURE() << what << ": element " << worst << " want " << want[worst] << " got "
                  << got[worst] << " (atol " << atol << ", rtol " << rtol << ")";
  }
}

}  // namespace deepinfer::kernels::testing

#endif  // DEEPINFER_KERNELS_CUDA_CUDA_TEST_UTIL_H_
