// The AMX path of LinearCpu (kernels/linear_cpu.h) for bf16 weights: Intel AMX tiles multiply
// 16 weight rows by 16 activation rows over 32 k at a time (TDPBF16PS, f32 accumulation).
//
// Layout. The weights are the tiles' first operand as they are stored ([n, k] row-major, 16 rows
// of 64 bytes a tile, read in place: nothing is repacked at load time); the activations are packed
// per call as the second operand (pairs of k for 16 rows), so a tile computes y^T for 16 outputs
// by 16 rows. Every output element is one tile element accumulated over the k blocks in order:
// its value depends neither on m, nor on the other rows, nor on the thread split.
//
// Precision. Products are exact (bf16 by bf16 in f32); only the f32 summation order differs from
// the other paths. Activations that are bf16 values (the engine's activations of a bf16 model)
// are multiplied as they are; otherwise each is split into three bf16 parts (hi + mid + lo, 24
// significant bits, an f32's) whose products are accumulated one after the other, so an f32
// activation loses nothing either. A row of bf16 values gives bit-identical results whether or not
// other rows of its call needed the split (the extra parts are zero for it).
//
// Tiles may only be used after CpuSupports(CpuIsa::kAmx) (which obtains the tile state from the
// kernel). Thread-safety: thread-compatible; parallelises internally on `pool` (may be null).
#ifndef DEEPINFER_KERNELS_LINEAR_AMX_H_
#define DEEPINFER_KERNELS_LINEAR_AMX_H_

#include "kernels/linear_cpu.h"
#include "kernels/thread_pool.h"

namespace deepinfer::kernels {

// Activation rows of a tile: a call multiplies them per pass over the weights.
inline constexpr int kAmxRowsPerPass = 16;

// Runs params[0..count) (every weight_dtype kBF16) on AMX tiles in one parallel region.
void LinearMultiAmx(const LinearParams* params, int count, ThreadPool* pool);

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_LINEAR_AMX_H_
