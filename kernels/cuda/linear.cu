// cuBLASLt matmul for kernels/cuda/linear_launch.h. Row-major y[m, ldy] = x[m, ldx] · W[n, k]^T
// is computed as the column-major D[n, m] = op(A) · B with A = W seen column-major as [k, n]
// (lda = k) transposed, B = x seen column-major as [k, m] (ldb = ldx), D with ldd = ldy: no data
// is moved, only the views change.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/cuda/linear_launch.h"

namespace deepinfer::kernels::cuda_raw {
namespace {

struct Handle {
  cublasLtHandle_t handle = nullptr;
  cublasStatus_t status = CUBLAS_STATUS_NOT_INITIALIZED;
};

const Handle& SharedHandle() {
  static const Handle h = [] {
    Handle out;
    out.status = cublasLtCreate(&out.handle);
    return out;
  }();
  return h;
}

cudaDataType_t DataType(DType t) {
  switch (t) {
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kF32:
      return CUDA_R_32F;
  }
  return CUDA_R_32F;
}

// The largest power of two (<= 256) dividing the address: cuBLASLt's heuristic must not pick a
// kernel that assumes more alignment than the buffers have.
uint32_t Alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

// Descriptors of one call, destroyed with it.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

// m, n, k, ldx, ldy, dtype, bias, workspace bytes, alignments of x, W, y.
using PlanKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int, bool, size_t, uint32_t,
                           uint32_t, uint32_t>;

std::mutex& PlanMutex() {
  static std::mutex mu;
  return mu;
}

std::map<PlanKey, cublasLtMatmulAlgo_t>& Plans() {
  static auto* plans = new std::map<PlanKey, cublasLtMatmulAlgo_t>();
  return *plans;
}

#define DI_CUBLAS_RETURN_IF_ERROR(expr)        \
  do {                                         \
    const cublasStatus_t di_status_ = (expr);  \
    if (di_status_ != CUBLAS_STATUS_SUCCESS) { \
      return static_cast<int>(di_status_);     \
    }                                          \
  } while (false)

}  // namespace

int LaunchLinearCublasLt(const LinearCudaParams& p, void* stream) {
  if (p.m == 0) return 0;
  const Handle& h = SharedHandle();
  if (h.status != CUBLAS_STATUS_SUCCESS) return static_cast<int>(h.status);
  const int64_t ldx = p.ldx == 0 ? p.k : p.ldx;
  const int64_t ldy = p.ldy == 0 ? p.n : p.ldy;
  const cudaDataType_t type = DataType(p.dtype);

  Descriptors desc;
  DI_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  DI_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA,
                                                           &transa, sizeof(transa)));
  DI_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB,
                                                           &transb, sizeof(transb)));
  if (p.bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = static_cast<int32_t>(type);
    DI_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                             &epilogue, sizeof(epilogue)));
    DI_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias)));
    DI_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        desc.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
  }
  DI_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&desc.a, type, static_cast<uint64_t>(p.k),
                                                       static_cast<uint64_t>(p.n), p.k));
  DI_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&desc.b, type, static_cast<uint64_t>(p.k),
                                                       static_cast<uint64_t>(p.m), ldx));
  DI_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&desc.d, type, static_cast<uint64_t>(p.n),
                                                       static_cast<uint64_t>(p.m), ldy));

  const uint32_t align_x = Alignment(p.x), align_w = Alignment(p.weight), align_y = Alignment(p.y);
  const PlanKey key{p.m,
                    p.n,
                    p.k,
                    ldx,
                    ldy,
                    static_cast<int>(p.dtype),
                    p.bias != nullptr,
                    p.workspace_bytes,
                    align_x,
                    align_w,
                    align_y};
  cublasLtMatmulAlgo_t algo;
  bool have = false;
  {
    std::lock_guard<std::mutex> lock(PlanMutex());
    auto it = Plans().find(key);
    if (it != Plans().end()) {
      algo = it->second;
      have = true;
    }
  }
  if (!have) {
    DI_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&desc.pref));
    const uint64_t workspace = p.workspace_bytes;
    DI_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
        desc.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
    DI_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
        desc.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_w, sizeof(align_w)));
    DI_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
        desc.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_x, sizeof(align_x)));
    DI_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
        desc.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_y, sizeof(align_y)));
    DI_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
        desc.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_y, sizeof(align_y)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    DI_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulAlgoGetHeuristic(
        h.handle, desc.op, desc.a, desc.b, desc.d, desc.d, desc.pref, 1, &result, &found));
    if (found < 1 || result.state != CUBLAS_STATUS_SUCCESS) {
      return static_cast<int>(CUBLAS_STATUS_NOT_SUPPORTED);
    }
    algo = result.algo;
    std::lock_guard<std::mutex> lock(PlanMutex());
    Plans().emplace(key, algo);
  }
  const float alpha = 1.0f, beta = 0.0f;
  return static_cast<int>(cublasLtMatmul(h.handle, desc.op, &alpha, p.weight, desc.a, p.x, desc.b,
                                         &beta, p.y, desc.d, p.y, desc.d, &algo, p.workspace,
                                         p.workspace_bytes, static_cast<cudaStream_t>(stream)));
}

const char* CublasStatusName(int status) {
  return cublasLtGetStatusName(static_cast<cublasStatus_t>(status));
}

const char* CublasStatusString(int status) {
  return cublasLtGetStatusString(static_cast<cublasStatus_t>(status));
}

}  // namespace deepinfer::kernels::cuda_raw
