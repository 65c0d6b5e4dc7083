// cuBLASLt matmul for kernels/cuda/linear_launch.h. Row-major y[m, ldy] = x[m, ldx] · W[n, k]^T
// is computed as the column-major D[n, m] = op(A) · B with A = W seen column-major as [k, n]
// (lda = k) transposed, B = x seen column-major as [k, m] (ldb = ldx), D with ldd = ldy: no data
// is moved, only the views change.
//
// cuBLASLt is loaded at run time (dlopen), not linked: a worker built with the CUDA backend then
// starts on a machine without the CUDA toolkit's libraries (serving on the CPU), and only
// --device=cuda needs them (refused with CublasLtLoadError's reason when they are missing).
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>

#include "kernels/cuda/linear_launch.h"

namespace deepinfer::kernels::cuda_raw {
namespace {

#define DI_STR2(x) #x
#define DI_STR(x) DI_STR2(x)
// The soname of the cuBLASLt these headers belong to, e.g. libcublasLt.so.13.
constexpr const char* kCublasLtSoname = "libcublasLt.so." DI_STR(CUBLAS_VER_MAJOR);
// Tried when the soname is not found through LD_LIBRARY_PATH, the executable's run path or the
// loader's cache: where the CUDA toolkit installs it (third_party/bazel/cuda.bzl's CUDA_HOME).
constexpr const char* kCublasLtInToolkit = "/usr/local/cuda/lib64/libcublasLt.so." DI_STR(
    CUBLAS_VER_MAJOR);

// Every cuBLASLt entry point this file calls (X(name) for cublasLt<name>).
#define DI_CUBLASLT_ENTRY_POINTS(X)                                                            \
  X(Create)                                                                                    \
  X(GetStatusName)                                                                             \
  X(GetStatusString)                                                                           \
  X(Matmul)                                                                                    \
  X(MatmulAlgoGetHeuristic)                                                                    \
  X(MatmulDescCreate)                                                                          \
  X(MatmulDescDestroy)                                                                         \
  X(MatmulDescSetAttribute)                                                                    \
  X(MatmulPreferenceCreate)                                                                    \
  X(MatmulPreferenceDestroy)                                                                   \
  X(MatmulPreferenceSetAttribute)                                                              \
  X(MatrixLayoutCreate)                                                                        \
  X(MatrixLayoutDestroy)

struct Api {
#define DI_API_FIELD(name) decltype(&cublasLt##name) name = nullptr;
  DI_CUBLASLT_ENTRY_POINTS(DI_API_FIELD)
#undef DI_API_FIELD
};

// Opens `path` and resolves every entry point into `api`; the handle, or null with `error` set.
void* Open(const char* path, Api* api, std::string* error) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    *error = std::string("cannot load ") + path + ": " + (why != nullptr ? why : "unknown error");
    return nullptr;
  }
  bool ok = true;
  auto resolve = [&](auto* fn, const char* name) {
    if (!ok) return;
    void* sym = dlsym(lib, name);
    if (sym == nullptr) {
      *error = std::string(path) + " has no " + name;
      ok = false;
      return;
    }
    *fn = reinterpret_cast<std::remove_reference_t<decltype(*fn)>>(sym);
  };
#define DI_RESOLVE(name) resolve(&api->name, "cublasLt" #name);
  DI_CUBLASLT_ENTRY_POINTS(DI_RESOLVE)
#undef DI_RESOLVE
  if (!ok) {
    dlclose(lib);
    *api = Api();
    return nullptr;
  }
  return lib;
}

// The process's cuBLASLt (loaded once, never unloaded) and why it is not there ("" when it is).
struct Loaded {
  Api api;
  std::string error;
};

const Loaded& Library() {
  static const Loaded* loaded = [] {
    auto* out = new Loaded();
    std::string first;
    if (Open(kCublasLtSoname, &out->api, &first) != nullptr) return out;
    std::string second;
    if (Open(kCublasLtInToolkit, &out->api, &second) != nullptr) return out;
    out->error = "cuBLASLt: " + first + "; " + second +
                 " (install the CUDA toolkit's cuBLAS, or add the directory holding " +
                 kCublasLtSoname + " to LD_LIBRARY_PATH)";
    return out;
  }();
  return *loaded;
}

const Api& Lt() { return Library().api; }

struct Handle {
  cublasLtHandle_t handle = nullptr;
  cublasStatus_t status = CUBLAS_STATUS_NOT_INITIALIZED;
};

const Handle& SharedHandle() {
  static const Handle h = [] {
    Handle out;
    if (Library().error.empty()) out.status = Lt().Create(&out.handle);
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
    if (pref != nullptr) Lt().MatmulPreferenceDestroy(pref);
    if (d != nullptr) Lt().MatrixLayoutDestroy(d);
    if (b != nullptr) Lt().MatrixLayoutDestroy(b);
    if (a != nullptr) Lt().MatrixLayoutDestroy(a);
    if (op != nullptr) Lt().MatmulDescDestroy(op);
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
  DI_CUBLAS_RETURN_IF_ERROR(Lt().MatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  DI_CUBLAS_RETURN_IF_ERROR(Lt().MatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA,
                                                           &transa, sizeof(transa)));
  DI_CUBLAS_RETURN_IF_ERROR(Lt().MatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB,
                                                           &transb, sizeof(transb)));
  if (p.bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = static_cast<int32_t>(type);
    DI_CUBLAS_RETURN_IF_ERROR(Lt().MatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                             &epilogue, sizeof(epilogue)));
    DI_CUBLAS_RETURN_IF_ERROR(Lt().MatmulDescSetAttribute(
        desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias)));
    DI_CUBLAS_RETURN_IF_ERROR(Lt().MatmulDescSetAttribute(
        desc.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
  }
  DI_CUBLAS_RETURN_IF_ERROR(Lt().MatrixLayoutCreate(&desc.a, type, static_cast<uint64_t>(p.k),
                                                       static_cast<uint64_t>(p.n), p.k));
  DI_CUBLAS_RETURN_IF_ERROR(Lt().MatrixLayoutCreate(&desc.b, type, static_cast<uint64_t>(p.k),
                                                       static_cast<uint64_t>(p.m), ldx));
  DI_CUBLAS_RETURN_IF_ERROR(Lt().MatrixLayoutCreate(&desc.d, type, static_cast<uint64_t>(p.n),
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
    DI_CUBLAS_RETURN_IF_ERROR(Lt().MatmulPreferenceCreate(&desc.pref));
    const uint64_t workspace = p.workspace_bytes;
    DI_CUBLAS_RETURN_IF_ERROR(Lt().MatmulPreferenceSetAttribute(
        desc.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
    DI_CUBLAS_RETURN_IF_ERROR(Lt().MatmulPreferenceSetAttribute(
        desc.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_w, sizeof(align_w)));
    DI_CUBLAS_RETURN_IF_ERROR(Lt().MatmulPreferenceSetAttribute(
        desc.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_x, sizeof(align_x)));
    DI_CUBLAS_RETURN_IF_ERROR(Lt().MatmulPreferenceSetAttribute(
        desc.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_y, sizeof(align_y)));
    DI_CUBLAS_RETURN_IF_ERROR(Lt().MatmulPreferenceSetAttribute(
        desc.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_y, sizeof(align_y)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    DI_CUBLAS_RETURN_IF_ERROR(Lt().MatmulAlgoGetHeuristic(
        h.handle, desc.op, desc.a, desc.b, desc.d, desc.d, desc.pref, 1, &result, &found));
    if (found < 1 || result.state != CUBLAS_STATUS_SUCCESS) {
      return static_cast<int>(CUBLAS_STATUS_NOT_SUPPORTED);
    }
    algo = result.algo;
    std::lock_guard<std::mutex> lock(PlanMutex());
    Plans().emplace(key, algo);
  }
  const float alpha = 1.0f, beta = 0.0f;
  return static_cast<int>(Lt().Matmul(h.handle, desc.op, &alpha, p.weight, desc.a, p.x, desc.b,
                                         &beta, p.y, desc.d, p.y, desc.d, &algo, p.workspace,
                                         p.workspace_bytes, static_cast<cudaStream_t>(stream)));
}

const char* CublasLtLoadError() { return Library().error.c_str(); }

std::string ProbeCublasLt(const char* path) {
  Api api;
  std::string error;
  void* lib = Open(path, &api, &error);
  if (lib != nullptr) dlclose(lib);
  return error;
}

const char* CublasStatusName(int status) {
  if (!Library().error.empty()) return "CUBLAS_STATUS_NOT_INITIALIZED";
  return Lt().GetStatusName(static_cast<cublasStatus_t>(status));
}

const char* CublasStatusString(int status) {
  if (!Library().error.empty()) return Library().error.c_str();
  return Lt().GetStatusString(static_cast<cublasStatus_t>(status));
}

}  // namespace deepinfer::kernels::cuda_raw
