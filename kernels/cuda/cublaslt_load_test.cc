// cuBLASLt is loaded at run time (kernels/cuda/linear_launch.h): it must be found where the CUDA
// toolkit installs it, every entry point the matmul calls must resolve, and a missing library or
// entry point must be named. No device needed.
#include <string>

#include "gtest/gtest.h"
#include "kernels/cuda/linear_cuda.h"
#include "kernels/cuda/linear_launch.h"

namespace deepinfer::kernels {
namespace {

TEST(CublasLtLoad, TheProcessLoadsTheToolkitsLibrary) {
  EXPECT_STREQ(cuda_raw::CublasLtLoadError(), "");
  EXPECT_TRUE(CublasLtAvailable().ok()) << CublasLtAvailable();
  // Asked again: the same answer, nothing loaded twice.
  EXPECT_STREQ(cuda_raw::CublasLtLoadError(), "");
}

TEST(CublasLtLoad, EveryEntryPointResolvesInTheToolkitsLibrary) {
  EXPECT_EQ(cuda_raw::ProbeCublasLt("/usr/local/cuda/lib64/libcublasLt.so"), "");
}

TEST(CublasLtLoad, AMissingLibraryIsNamed) {
  const std::string error = cuda_raw::ProbeCublasLt("/nonexistent/libcublasLt.so.13");
  EXPECT_NE(error.find("cannot load /nonexistent/libcublasLt.so.13"), std::string::npos) << error;
}

TEST(CublasLtLoad, ALibraryWithoutTheEntryPointsIsNamed) {
  // libm is everywhere and has no cuBLASLt entry points: the first one looked up is named.
  const std::string error = cuda_raw::ProbeCublasLt("libm.so.6");
  EXPECT_EQ(error, "libm.so.6 has no cublasLtCreate");
}

TEST(CublasLtLoad, StatusNamesComeFromTheLibrary) {
  EXPECT_STREQ(cuda_raw::CublasStatusName(0), "CUBLAS_STATUS_SUCCESS");
}

}  // namespace
}  // namespace deepinfer::kernels
