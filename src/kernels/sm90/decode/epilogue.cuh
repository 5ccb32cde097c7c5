// Writes a warp's output tile (the 64-row decode kernels; sigma is 1 in decode_bf16): normalized
// rows as bf16 into `out` (a sequence with one split) or as fp32 partials for the combine kernel
// (from the fragment, or staged through shared memory), and the lse. A row that saw no token gets
// 0 and -inf; a CTA that met an out-of-range page index writes NaN, so the fault is visible. The
// narrow tile writes its own layout (O^T) with the same row_scale and row_lse.
#pragma once

#include "kernels/common/numeric.cuh"
#include "kernels/common/ptx.cuh"
#include "params.hpp"
#include "scheduler.cuh"
#include "softmax.cuh"

namespace snapmla::cuda {

// A finished row's result, for every decode tile: the multiplier of its output accumulator
// (which holds O / num: num = sigma in decode_fp8's 64-row tiles, 1 elsewhere) and its lse, from
// its running max m and sum l. NaN both where the CTA faulted (a bad page or length); 0 and -inf
// for a row that saw no token (l = 0).
__device__ __forceinline__ float row_scale(float l, float num, bool fault) {
  return fault ? NAN : (l == 0.f ? 0.f : __fdiv_rn(num, l));
}
// The same, given empty = (l == 0) where the caller has it (a row that saw no token).
__device__ __forceinline__ float row_scale(bool empty, float l, float num, bool fault) {
  return fault ? NAN : (empty ? 0.f : __fdiv_rn(num, l));
}
__device__ __forceinline__ float row_lse(float m, float l, bool fault) {
  return fault ? NAN : (l == 0.f ? -INFINITY : m + logf(l));
}

// Row r's lse: into lse ([b, h, s_q], r = i * h + head) for a sequence with one split (-inf,
// a row that saw no token, as the caller's empty_lse), else into the split's partial lse for
// the combine (-inf there: the combine's rule for an empty split).
__device__ __forceinline__ void store_lse(const DecodeParams& p, const Work& w, int r, float lse) {
  if (w.single) {
    const int i = r / p.num_heads, h = r % p.num_heads;
    p.lse[(int64_t(w.seq) * p.num_heads + h) * p.seqlen_q + i] = lse == -INFINITY ? p.empty_lse : lse;
  } else {
    p.partial_lse[int64_t(w.split) * p.rows + r] = lse;
  }
}

// Where a work item's rows go as bf16 ([rows, 512] from the returned element): a sequence with
// one split, its output; a split of a split sequence under SNAPMLA_PARTIALS=bf16
// (DecodeParams::partial_bf16), its bf16 partials, the same rows rounded the same way (RNE), for
// the combine. as_bf16_rows says which work items store so.
__device__ __forceinline__ bool as_bf16_rows(const DecodeParams& p, const Work& w) {
  return w.single || p.partial_bf16 != nullptr;
}
__device__ __forceinline__ uint16_t* bf16_rows_of(const DecodeParams& p, const Work& w) {
  return w.single ? p.out + int64_t(w.seq) * p.rows * kLatentDim
                  : p.partial_bf16 + int64_t(w.split) * p.rows * kLatentDim;
}

// The fp32 partials of a split for the combine (a sequence with one split goes through
// write_rows_staged): the C fragment's NT n-tiles of 8 dims from dim0 (those from n_from on),
// rows row0 + g and row0 + g + 8, one 8-byte store per row and n-tile (whole 32-byte sectors per
// instruction).
template <int NT = 32>
__device__ __forceinline__ void write_partials(const DecodeParams& p, const Work& w, const SoftmaxState& st,
                                               const float (&o)[NT][4], int row0, int dim0, int lane,
                                               bool write_lse, bool fault, int n_from = 0) {
  const int g = lane / 4, q = lane % 4;
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const int r = row0 + g + 8 * ri;
    if (r >= p.rows) continue;
    const bool empty = st.l[ri] == 0.f;
    const float scale = row_scale(empty, st.l[ri], st.sigma[ri], fault);
    const float lse = row_lse(st.m[ri], st.l[ri], fault);
    float* dst = p.partial_out + (int64_t(w.split) * p.rows + r) * kLatentDim + dim0 + 2 * q;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      if (n < n_from) continue;
      const float a = empty && !fault ? 0.f : o[n][2 * ri] * scale;
      const float b = empty && !fault ? 0.f : o[n][2 * ri + 1] * scale;
      *reinterpret_cast<float2*>(dst + 8 * n) = make_float2(a, b);
    }
    if (write_lse && q == 0) store_lse(p, w, r, lse);
  }
}

// write_partials through shared memory (DecodeParams::staged_partials; SNAPMLA_PARTIALS=staged, a
// lab option): the warp's 16 rows x 256 fp32 go into `stage` (kPartialStageBytes of shared memory
// of its own) and back out as whole row segments, one 16-byte store per lane, 512 contiguous bytes
// per instruction. The fragment's own 8-byte stores write 8 rows x 32 bytes per instruction: four
// times the write requests for the same bytes, at the end of every CTA of a split sequence (every
// CTA at small batches, where they stand between the last page and the combine). Staged rows are
// kPartialStageStride floats apart, so each half-warp's fragment store (4 rows x 32 bytes) covers
// the 32 banks once. The same values at the same addresses as write_partials.
inline constexpr int kPartialStageStride = 256 + 8;  // floats per staged row
inline constexpr int kPartialStageBytes = 16 * kPartialStageStride * int(sizeof(float));

__device__ __forceinline__ void write_partials_staged(const DecodeParams& p, const Work& w, const SoftmaxState& st,
                                                      const float (&o)[32][4], float* stage, int row0, int dim0,
                                                      int lane, bool write_lse, bool fault) {
  const int g = lane / 4, q = lane % 4;
  float scale[2];
  bool zero[2];
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const int r = row0 + g + 8 * ri;
    const bool empty = st.l[ri] == 0.f;
    zero[ri] = empty && !fault;
    scale[ri] = row_scale(empty, st.l[ri], st.sigma[ri], fault);
    if (write_lse && q == 0 && r < p.rows) store_lse(p, w, r, row_lse(st.m[ri], st.l[ri], fault));
  }
#pragma unroll
  for (int n = 0; n < 32; ++n)
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      const float a = zero[ri] ? 0.f : o[n][2 * ri] * scale[ri];
      const float b = zero[ri] ? 0.f : o[n][2 * ri + 1] * scale[ri];
      *reinterpret_cast<float2*>(stage + (g + 8 * ri) * kPartialStageStride + 8 * n + 2 * q) = make_float2(a, b);
    }
  __syncwarp();
  float* dst = p.partial_out + (int64_t(w.split) * p.rows + row0) * kLatentDim + dim0 + 4 * lane;
#pragma unroll
  for (int rr = 0; rr < 16; ++rr) {
    if (row0 + rr >= p.rows) break;  // the same in every lane
#pragma unroll
    for (int half = 0; half < 2; ++half)
      *reinterpret_cast<float4*>(dst + rr * kLatentDim + 128 * half) =
          *reinterpret_cast<const float4*>(stage + rr * kPartialStageStride + 128 * half + 4 * lane);
  }
}

// write_rows for a sequence with one split (bf16 into `out`) or a split's bf16 partials
// (bf16_rows_of), by a whole warp, through `stage`
// (8 KB of shared memory of its own): the warp's 16 rows x NT = 32 n-tiles go there with stmatrix
// (four 8 x 8 tiles per instruction; 16-byte chunk x of a 128-byte row r stored at x ^ (r % 8), so
// the eight rows of a tile fall in eight bank groups) and back out as whole 128-byte row segments,
// one 16-byte store per lane. The fragment's own 4-byte stores write 16 bytes per row and
// instruction: eight times the write requests, which made a CTA's last stores take 4-8 us (clock64
// stamps; docs/archive/kernel_history.md).
__device__ __forceinline__ void write_rows_staged(const DecodeParams& p, const Work& w, const SoftmaxState& st,
                                                  const float (&o)[32][4], uint8_t* stage, int row0, int dim0,
                                                  int lane, bool write_lse, bool fault) {
  const int q = lane % 4;
  float scale[2];
  bool empty[2];
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const int r = row0 + lane / 4 + 8 * ri;
    empty[ri] = st.l[ri] == 0.f && !fault;
    scale[ri] = row_scale(empty[ri], st.l[ri], st.sigma[ri], fault);
    if (write_lse && q == 0 && r < p.rows) store_lse(p, w, r, row_lse(st.m[ri], st.l[ri], fault));
  }
  auto v = [&](int n, int e) {
    const int ri = e / 2;
    return empty[ri] ? 0.f : o[n][e] * scale[ri];
  };
  // Lane l addresses row l % 8 of tile l / 8: rows 8 (tile % 2) + l % 8, n-tile n + tile / 2.
  const int tile = lane / 8, i = lane % 8, rw = 8 * (tile % 2) + i;
#pragma unroll
  for (int n = 0; n < 32; n += 2) {
    const int nn = n + tile / 2;
    ptx::stsm_x4(stage + (nn / 8) * 2048 + rw * 128 + (((nn % 8) ^ i) * 16), bf16x2_bits(v(n, 0), v(n, 1)),
                 bf16x2_bits(v(n, 2), v(n, 3)), bf16x2_bits(v(n + 1, 0), v(n + 1, 1)),
                 bf16x2_bits(v(n + 1, 2), v(n + 1, 3)));
  }
  __syncwarp();
  uint16_t* out = bf16_rows_of(p, w) + int64_t(row0) * kLatentDim + dim0;
#pragma unroll
  for (int it = 0; it < 16; ++it) {
    const int k = it * 32 + lane, bb = k / 128, r = (k % 128) / 8, x = k % 8;
    const uint4 val = *reinterpret_cast<const uint4*>(stage + bb * 2048 + r * 128 + ((x ^ (r % 8)) * 16));
    if (row0 + r < p.rows) *reinterpret_cast<uint4*>(out + int64_t(r) * kLatentDim + bb * 64 + x * 8) = val;
  }
}

// write_rows (into bf16_rows_of) where the consumers hold output slices of any width
// (the three-consumer tile's 176 dims): each consumer thread puts its two rows' bf16 values for
// dims dim0 + 8 n_from .. dim0 + 8 NT - 1 into `tile` (64 rows x 1024 bytes in shared memory of the
// CTA's own; 16-byte chunk x of row r at x ^ (r % 8), so a warp's 4-byte stores of one n-tile fall
// in 32 different banks), and after named barrier `barrier` over the `threads` consumer threads
// (tid: this one's index among them) they copy whole rows out, one 16-byte load and store per
// lane and chunk. r0: the thread's first row in the tile (and r0 + 8); row0: the tile's first row.
template <int NT>
__device__ __forceinline__ void write_rows_assembled(const DecodeParams& p, const Work& w, const SoftmaxState& st,
                                                     const float (&o)[NT][4], uint8_t* tile, int row0, int r0,
                                                     int dim0, int n_from, int q, bool write_lse, bool fault,
                                                     int barrier, int threads, int tid) {
  constexpr int kRowBytes = kLatentDim * 2, kChunks = kRowBytes / 16;
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const int r = r0 + 8 * ri;
    const bool empty = st.l[ri] == 0.f && !fault;
    const float scale = row_scale(empty, st.l[ri], st.sigma[ri], fault);
    if (write_lse && q == 0 && row0 + r < p.rows) store_lse(p, w, row0 + r, row_lse(st.m[ri], st.l[ri], fault));
    uint8_t* row = tile + r * kRowBytes;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      if (n < n_from) continue;
      const int x = dim0 / 8 + n;  // the 16-byte chunk of dims 8 x .. 8 x + 7
      const float a = empty ? 0.f : o[n][2 * ri] * scale, b = empty ? 0.f : o[n][2 * ri + 1] * scale;
      ptx::sts32(row + ((x ^ (r % 8)) * 16) + 4 * q, bf16x2_bits(a, b));
    }
  }
  ptx::named_barrier(barrier, threads);
  uint16_t* out = bf16_rows_of(p, w) + int64_t(row0) * kLatentDim;
  for (int k = tid; k < kTileRows * kChunks; k += threads) {
    const int r = k / kChunks, x = k % kChunks;
    if (row0 + r >= p.rows) break;  // rows past the query rows: every later k too
    *reinterpret_cast<uint4*>(out + int64_t(r) * kLatentDim + 8 * x) =
        *reinterpret_cast<const uint4*>(tile + r * kRowBytes + ((x ^ (r % 8)) * 16));
  }
}

}  // namespace snapmla::cuda
