// RMSNorm: y = w * (x / sqrt(mean(x^2) + eps)), row by row, optionally fused with a residual add
// (x := x + residual, written back to `residual_out` for the next layer's skip connection).
//
// Numerics follow Hugging Face transformers' LlamaRMSNorm, so outputs match it bit for bit in
// bf16: the mean of squares is accumulated in f32, the normalised row is rounded to the tensor
// type, and the product with the weight is rounded again. With `weight_offset` = 1 the weight is
// (1 + w) and the whole product is computed in f32 and rounded once (Gemma's convention).
//
// The parameter struct is shared by the CPU implementation (here) and the CUDA one
// (kernels/cuda/rmsnorm_cuda.h), which are tested against each other.
#ifndef DEEPINFER_KERNELS_RMSNORM_H_
#define DEEPINFER_KERNELS_RMSNORM_H_

#include <cstdint>

#include "kernels/dtype.h"

namespace deepinfer::kernels {

struct RmsNormParams {
  const void* input = nullptr;   // [rows, hidden], dtype
  const void* weight = nullptr;  // [hidden], dtype
  void* output = nullptr;        // [rows, hidden], dtype; may alias input
  // Optional fused residual add: input + residual is normalised and also stored to
  // residual_out ([rows, hidden], dtype, may alias residual). Both null to disable.
  const void* residual = nullptr;
  void* residual_out = nullptr;
  int64_t rows = 0;
  int64_t hidden = 0;  // > 0
  float eps = 1e-6f;   // > 0
  float weight_offset = 0.0f;
  DType dtype = DType::kBF16;
  // For f32 buffers that hold values of a narrower model type (the CPU engine keeps activations
  // in f32): round every stored intermediate to this type, exactly as if the buffers were of it.
  // Must be kF32 or equal to `dtype` unless dtype is kF32.
  DType round_to = DType::kF32;
};

// Plain-C++ check shared by both backends: nullptr when the parameters are usable, else a
// static message naming the offending field.
const char* ValidateRmsNormParams(const RmsNormParams& p);

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_RMSNORM_H_
