// Intel AMX building blocks shared by the tile paths (kernels/linear_amx.h,
// kernels/attention_amx.h). Every function carries the target attribute itself; callers must only
// reach them after CpuSupports(CpuIsa::kAmx), which also obtains the tile state from the kernel.
//
// Thread-safety: tile configuration is per thread.
#ifndef DEEPINFER_KERNELS_AMX_TILES_H_
#define DEEPINFER_KERNELS_AMX_TILES_H_

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

// AMX tiles plus the AVX-512 every AMX CPU has (and AVX2 for the helpers of simd_avx2.h).
#define DI_AMX \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

namespace deepinfer::kernels::amx {

// Bytes of a tile row, and elements of an operand tile (16 rows of 32 bf16).
inline constexpr int kRowBytes = 64;
inline constexpr int kOperandElems = 16 * 32;

// Palette 1 with every one of the 8 tiles 16 rows of 64 bytes: accumulators of 16 x 16 f32,
// operands of 16 x 32 bf16. Releases the tiles when it goes out of scope, so that a thread that
// stops using them does not carry their state through context switches.
class ScopedTiles {
 public:
  DI_AMX ScopedTiles() {
    Config config;
    for (int t = 0; t < 8; ++t) {
      config.colsb[t] = kRowBytes;
      config.rows[t] = 16;
    }
    _tile_loadconfig(&config);
  }
  DI_AMX ~ScopedTiles() { _tile_release(); }
  ScopedTiles(const ScopedTiles&) = delete;
  ScopedTiles& operator=(const ScopedTiles&) = delete;

 private:
  struct alignas(64) Config {
    uint8_t palette_id = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
  };
};

}  // namespace deepinfer::kernels::amx

#endif  // defined(__x86_64__)

#endif  // DEEPINFER_KERNELS_AMX_TILES_H_
