// The narrow tiles' rows (decode_fp8_narrow.cu, decode_bf16_narrow.cu): the products are
// transposed (S^T = K Q^T, O^T += V^T P^T), so the up to 16 query rows are the wgmma N and a
// thread holds, for each of its kNarrowCols row columns 8 n + 2 q + e (i = 2 n + e), two tokens
// (S^T rows 16 w + g and + 8) or two output dims. A row's reduction over a page runs over the
// thread's two values (the caller's), the warp's eight g (shuffles) and the consumer's four warps
// (shared memory, one named barrier).
#pragma once

#include "kernels/common/ptx.cuh"
#include "tile_launches.hpp"

namespace snapmla::cuda {

inline constexpr int kNarrowCols = kNarrowTileRows / 4;  // row columns per thread

// The row (S^T / O^T column) of a thread's column slot i: 8 n + 2 q + e with i = 2 n + e.
__device__ __forceinline__ int narrow_col(int i, int q) { return 8 * (i / 2) + 2 * q + i % 2; }

// v[i] reduced over the consumer warpgroup's 64 tokens for each of the thread's rows, every thread
// getting its rows' results: op over the warp's g with shuffles, then the four warps' values
// through `red` ([4 warps][kNarrowTileRows] floats of the caller's) and named barrier `barrier` over
// the warpgroup's 128 threads, combined as op(op(w0, w1), op(w2, w3)). `red` may be written again
// once every thread of the warpgroup has passed a later barrier of its own.
template <typename Op>
__device__ __forceinline__ void narrow_rows_reduce(float (&v)[kNarrowCols], float* red, int barrier, int warp,
                                                   int lane, Op op) {
#pragma unroll
  for (int i = 0; i < kNarrowCols; ++i)
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) v[i] = op(v[i], __shfl_xor_sync(0xffffffffu, v[i], o));
  if (lane < 4)
#pragma unroll
    for (int i = 0; i < kNarrowCols; ++i) red[warp * kNarrowTileRows + narrow_col(i, lane)] = v[i];
  ptx::named_barrier(barrier, 128);
  const int q = lane % 4;
#pragma unroll
  for (int i = 0; i < kNarrowCols; ++i) {
    const int col = narrow_col(i, q);
    v[i] = op(op(red[col], red[kNarrowTileRows + col]), op(red[2 * kNarrowTileRows + col], red[3 * kNarrowTileRows + col]));
  }
}

struct NarrowMax {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct NarrowSum {
  __device__ float operator()(float a, float b) const { return a + b; }
};

}  // namespace snapmla::cuda
