// The arithmetic of the split-KV combine on one query row, shared by the combine kernels
// (combine.cu) and the decode kernels' own combine tail (sm90/decode/combine_tail.cuh), so that
// both give a row the same bits: the splits summed in groups of kGroup, each group's partial rows
// weighed in split order, the groups' sums added in group order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common/numeric.cuh"
#include "kernels/common/ptx.cuh"
#include "combine.hpp"
#include "snapmla/types.hpp"

namespace snapmla::cuda {

constexpr int kQuarters = 4;  // quarter tasks per row: 128 dims each
constexpr int kGroup = 8;     // splits whose partial rows are in flight at once in one warp

// A partial result: a plain load, or with kFromL2 one that bypasses L1 (ld.global.cg).
template <bool kFromL2, typename T>
__device__ __forceinline__ T load_partial(const T* p) {
  if constexpr (kFromL2) return __ldcg(p);
  else return *p;
}

// Four consecutive dims of a partial row as floats: fp32 partials (T = float), or bf16 partials
// (T = uint16_t: SNAPMLA_PARTIALS=bf16, one 8-byte load; a bf16 value widens to fp32 exactly).
template <bool kFromL2, typename T>
__device__ __forceinline__ float4 load_partial4(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return load_partial<kFromL2>(reinterpret_cast<const float4*>(p));
  } else {
    static_assert(std::is_same_v<T, uint16_t>, "partials are fp32 or bf16");
    const uint2 v = load_partial<kFromL2>(reinterpret_cast<const uint2*>(p));
    return make_float4(bf16_bits_to_float(uint16_t(v.x)), bf16_bits_to_float(uint16_t(v.x >> 16)),
                       bf16_bits_to_float(uint16_t(v.y)), bf16_bits_to_float(uint16_t(v.y >> 16)));
  }
}

// The combine's partial rows of type T (load_partial4): fp32 in partial_out, bf16 in partial_bf16.
template <typename T>
__device__ __forceinline__ const T* partials_of(const CombineParams& p) {
  if constexpr (std::is_same_v<T, float>) return p.partial_out;
  else return p.partial_bf16;
}

// s += w v per component: both task shapes weigh a partial row with it, so their bits agree.
__device__ __forceinline__ void add_weighted(float4& s, float w, const float4& v) {
  s.x += w * v.x;
  s.y += w * v.y;
  s.z += w * v.z;
  s.w += w * v.w;
}

__device__ __forceinline__ void add(float4& a, const float4& b) {
  a.x += b.x;
  a.y += b.y;
  a.z += b.z;
  a.w += b.w;
}

// Sequence b's splits [lo, hi) in the plan. `broken`: the range is empty or leaves the plan's
// capacity, which plan_splits never makes (every sequence has a split) but device tables written
// by anything else can: the combine then writes the sequence's rows as NaN (store_row_nan) and
// reads no partial, as a bad length or page index does (the decode kernels keep their own reads
// and writes inside the capacity: scheduler.cuh, splits_of_worker).
struct SplitSpan {
  int lo = 0, hi = 0;
  bool broken = false;
};

__device__ __forceinline__ SplitSpan split_span(const CombineParams& p, int b) {
  SplitSpan s;
  s.lo = p.split_offsets[b];
  s.hi = p.split_offsets[b + 1];
  s.broken = s.lo < 0 || s.hi <= s.lo || s.hi > p.capacity;
  return s;
}

// The row's lse over splits lo .. hi - 1 (each warp of a task forms it alike): NaN where a split
// faulted (a bad page or length, a non-finite score: the row is NaN), -inf where every split is
// empty. kFromL2: the partials were written by other CTAs of the running grid (the decode's own
// combine tail), so they are read from L2 past this SM's L1, which may hold an earlier call's.
template <bool kFromL2 = false>
__device__ __forceinline__ float combined_lse(const float* lse_of, int rows, int lo, int hi, int lane) {
  float m = -INFINITY;
  bool faulted = false;
  for (int k = lo + lane; k < hi; k += 32) {
    const float v = load_partial<kFromL2>(lse_of + int64_t(k) * rows);
    faulted |= isnan(v);
    m = fmaxf(m, v);
  }
  m = warp_max(m);
  if (__any_sync(0xffffffffu, faulted)) return NAN;
  if (m == -INFINITY) return m;
  float sum = 0.f;
  for (int k = lo + lane; k < hi; k += 32) sum += expf(load_partial<kFromL2>(lse_of + int64_t(k) * rows) - m);
  return m + logf(warp_sum(sum));
}

// One quarter of row r of sequence b's output from its sum (NaN where the row faulted, zero where
// it saw nothing), and with quarter 0 the row's lse (the empty lse where it saw nothing).
__device__ __forceinline__ void store_row_quarter(const CombineParams& p, int b, int r, int d0, int quarter, int lane,
                                                  bool sums, float total, const float4& acc) {
  uint2* out = reinterpret_cast<uint2*>(p.out + (int64_t(b) * p.rows + r) * kLatentDim + d0);
  *out = sums ? make_uint2(bf16x2_bits(acc.x, acc.y), bf16x2_bits(acc.z, acc.w))
              : isnan(total) ? make_uint2(bf16x2_bits(NAN, NAN), bf16x2_bits(NAN, NAN)) : make_uint2(0u, 0u);
  if (quarter == 0 && lane == 0) {
    const int i = r / p.num_heads, h = r % p.num_heads;
    p.lse[(int64_t(b) * p.num_heads + h) * p.seqlen_q + i] = sums || isnan(total) ? total : p.empty_lse;
  }
}

// Row r of sequence b as NaN (out and lse), by one warp: its splits' range is broken (split_span).
__device__ __forceinline__ void store_row_nan(const CombineParams& p, int b, int r, int lane) {
#pragma unroll
  for (int q = 0; q < kQuarters; ++q)
    store_row_quarter(p, b, r, q * (kLatentDim / kQuarters) + 4 * lane, q, lane, false, NAN,
                      make_float4(0.f, 0.f, 0.f, 0.f));
}

// One group's weighted sums of a row's four quarters: splits g0 .. min(g0 + kGroup, hi) - 1 in
// split order (an empty split, weight 0, adds nothing). lse_of: the row's split lse (split k's at
// k * rows); src: the row's partial (fp32 or bf16, load_partial4), this lane's 4 dims of quarter 0
// (quarter q at q * 128).
template <bool kFromL2, typename T>
__device__ __forceinline__ void row_group_sum(float4 (&s)[kQuarters], const float* lse_of, const T* src, int rows,
                                              int g0, int hi, float total) {
  const int64_t split_stride = int64_t(rows) * kLatentDim;
#pragma unroll
  for (int q = 0; q < kQuarters; ++q) s[q] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int u = 0; u < kGroup; ++u) {
    const int k = g0 + u;
    if (k >= hi) break;
    const float w = expf(load_partial<kFromL2>(lse_of + int64_t(k) * rows) - total);
    float4 v[kQuarters];
#pragma unroll
    for (int q = 0; q < kQuarters; ++q)
      v[q] = load_partial4<kFromL2>(src + k * split_stride + q * (kLatentDim / kQuarters));
    if (w == 0.f) continue;  // an empty split (lse -inf) adds nothing
#pragma unroll
    for (int q = 0; q < kQuarters; ++q) add_weighted(s[q], w, v[q]);
  }
}

// Row r of sequence b (its splits lo .. hi - 1) by one warp, all four quarters at once: a split's
// four quarter loads are in flight together, its weight formed once; the groups' sums added in
// group order. The row's bits are those of the quarter tasks too (combine.cu). T: the partials'
// type (float, or uint16_t for bf16 partials in p.partial_bf16).
template <bool kFromL2, typename T>
__device__ __forceinline__ void combine_row(const CombineParams& p, int b, int r, int lo, int hi, int lane) {
  const float* lse_of = p.partial_lse + r;  // split k's at k * rows
  const float total = combined_lse<kFromL2>(lse_of, p.rows, lo, hi, lane);
  const bool sums = total > -INFINITY;  // false for NaN too
  const T* src = partials_of<T>(p) + int64_t(r) * kLatentDim + 4 * lane;
  float4 acc[kQuarters];
#pragma unroll
  for (int q = 0; q < kQuarters; ++q) acc[q] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int g0 = lo; sums && g0 < hi; g0 += kGroup) {
    float4 s[kQuarters];
    row_group_sum<kFromL2>(s, lse_of, src, p.rows, g0, hi, total);
#pragma unroll
    for (int q = 0; q < kQuarters; ++q) add(acc[q], s[q]);
  }
#pragma unroll
  for (int q = 0; q < kQuarters; ++q)
    store_row_quarter(p, b, r, q * (kLatentDim / kQuarters) + 4 * lane, q, lane, sums, total, acc[q]);
}

}  // namespace snapmla::cuda
