// Online softmax over one 64-token block for the two rows a thread holds in an m16n8 C
// fragment (rows g and g + 8; tokens 8 n + 2 q + {0, 1} of n-tile n). Follows the reference
// step for step (docs/reference.md): scores = (raw * (softmax_scale * s_q)) * s_t; a row with
// no visible token in the block leaves its state untouched; FP8 folds s_t into P and
// quantizes P' per row and block with sigma = max P' / 448.
#pragma once

#include "kernels/common/numeric.cuh"
#include "kernels/common/ptx.cuh"
#include "params.hpp"

namespace snapmla::cuda {

struct SoftmaxState {
  float m[2] = {-INFINITY, -INFINITY};  // running max (decode_fp8 sets it once, after the pages)
  float l[2] = {0.f, 0.f};              // running sum (decode_fp8: over sigma until the end)
  float sigma[2] = {1.f, 1.f};          // decode_fp8: the output accumulator holds O / sigma
};

constexpr float kLog2e = 1.4426950408889634f;

// 2^x as one MUFU.EX2 (results below 2^-126 flush to 0: such weights are far below what e4m3
// or bf16 P can hold). exp2f would add a range fix-up of four instructions around it.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// exp(x) as a multiply and one MUFU.EX2; differs from the reference's std::exp by a few fp32
// ulps, within the fp32-rounding allowance of docs/reference.md.
__device__ __forceinline__ float fast_exp(float x) { return ex2(x * kLog2e); }

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// The output accumulator's rows rescaled: rows g (columns 0, 1 of each n-tile) by r[0], rows
// g + 8 (columns 2, 3) by r[1].
template <int NT>
__device__ __forceinline__ void scale_rows(float (&o)[NT][4], const float (&r)[2]) {
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    o[n][0] *= r[0];
    o[n][1] *= r[0];
    o[n][2] *= r[1];
    o[n][3] *= r[1];
  }
}

// The FP8 softmax (decode_fp8): each consumer warpgroup holds the raw QK scores of a whole
// 64-token page (m64n64 fragment: tokens 8 n + 2 q + {0, 1}). Pages are taken in the
// reference's order with its per-page running max, m_j = max(m_{j-1}, max S_j), and P' is
// quantized per row and page with the page's own sigma; step 3 (apply_page) moves the output
// and l into each page's domain. decode_bf16 uses steps 1 and 2 with kScaled = false and
// pair_alpha instead of step 3.

// Step 1: scaled, masked scores in place (scores = (raw * (softmax_scale * s_q)) * s_t, -inf
// where not visible) and their row max over the page (quad-reduced). kMasked = false: the caller
// knows every token of the page is visible to both rows (no compares, no -inf). kScaled = false
// (decode_bf16): no per-token scale, scores = raw * softmax_scale, and kscale is not read.
// kPoison: a visible score that is not finite (NaN / Inf in q or in the token) becomes +inf, so
// the row's max is +inf from then on, its l and output NaN and its lse NaN (docs/reference.md,
// "Bad inputs"); without it a -inf score would just weigh 0 and a NaN one drop out of the max.
template <bool kMasked, bool kScaled = true, bool kPoison = false>
__device__ __forceinline__ void page_scores(float (&s)[8][4], const float (&factor)[2],
                                            const int (&vis)[2], int blk, const float* kscale,
                                            int q, float (&mx)[2]) {
  mx[0] = mx[1] = -INFINITY;
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    const float2 ks = kScaled ? *reinterpret_cast<const float2*>(kscale + 8 * n + 2 * q) : make_float2(1.f, 1.f);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int ri = e / 2, tok = 8 * n + 2 * q + (e & 1);
      const float raw = __fmul_rn(s[n][e], factor[ri]);
      float v = kScaled ? __fmul_rn(raw, e & 1 ? ks.y : ks.x) : raw;
      if (kPoison && !(fabsf(v) < INFINITY)) v = INFINITY;
      const float sc = !kMasked || blk + tok < vis[ri] ? v : -INFINITY;
      s[n][e] = sc;
      mx[ri] = fmaxf(mx[ri], sc);
    }
  }
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) mx[ri] = quad_max(mx[ri]);
}

// Step 2, given the running max m: s <- P' = exp(s - m) * s_t (0 where not visible); sum: the row
// sums of P = exp(s - m), pmax: the row max of P' (both quad-reduced; the caller zeroes them).
// kScaled = false (decode_bf16): s <- P, and pmax is not needed.
template <bool kMasked, bool kScaled = true>
__device__ __forceinline__ void page_probs(float (&s)[8][4], const float (&m)[2], const float* kscale,
                                           int q, float (&sum)[2], float (&pmax)[2]) {
  // exp(s - m) as 2^(s log2e - m log2e), one FFMA and one MUFU.EX2 per element.
  const float ml[2] = {m[0] * kLog2e, m[1] * kLog2e};
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    const float2 ks = kScaled ? *reinterpret_cast<const float2*>(kscale + 8 * n + 2 * q) : make_float2(1.f, 1.f);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int ri = e / 2;
      const bool seen = !kMasked || s[n][e] != -INFINITY;  // masked tokens' scales may be anything
      const float pe = seen ? ex2(fmaf(s[n][e], kLog2e, -ml[ri])) : 0.f;
      sum[ri] += pe;
      const float pv = !kScaled ? pe : seen ? __fmul_rn(pe, e & 1 ? ks.y : ks.x) : 0.f;
      if (kScaled) pmax[ri] = fmaxf(pmax[ri], pv);
      s[n][e] = pv;
    }
  }
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    sum[ri] = quad_sum(sum[ri]);
    if (kScaled) pmax[ri] = quad_max(pmax[ri]);
  }
}

// Step 3, decode_fp8's step per page, in page order, by both consumers (each applies every
// page to its output half). The page's owner publishes sigma_j (0: the page showed the row
// nothing, so the previous sigma stays, as the reference leaves such a block's state untouched)
// and rho_j = alpha_j / sigma_j; the output's factor sigma_{j-1} alpha_j / sigma_j is then one
// multiply (no exponential or division between a page's P hand-off and its PV). l is kept in
// the sigma domain (l / sigma): it takes the same factor, plus `own_lsum` = the page's row sum /
// sigma_j if this consumer computed the page's P, else 0 (each keeps its own part of l).
__device__ __forceinline__ float apply_page(SoftmaxState& st, int ri, float sig, float rho, float own_lsum) {
  const bool seen = sig > 0.f;
  const float r = seen ? st.sigma[ri] * rho : 1.f;
  st.l[ri] = st.l[ri] * r + own_lsum;
  st.sigma[ri] = seen ? sig : st.sigma[ri];
  return r;
}

// decode_bf16's step per page (no sigma): the factor for the output before the page's PV and
// the state after it, given the running max after the page; `own_sum`: this page's row sums if
// this consumer computed its P (each consumer keeps its own part of l, added at the end).
__device__ __forceinline__ float pair_alpha(SoftmaxState& st, int ri, float m_new, float own_sum) {
  if (m_new == -INFINITY) return 1.f;  // nothing visible to this row so far
  const float alpha = fast_exp(st.m[ri] - m_new);
  st.l[ri] = st.l[ri] * alpha + own_sum;
  st.m[ri] = m_new;
  return alpha;
}

// After the pages: each consumer summed P over the pages whose P it computed; add the other's
// part of l through `xchg` ([2][kTileRows] floats, free to overwrite). `barrier`: the named
// barrier id over both consumers (256 threads) that the calling kernel reserves for it.
__device__ __forceinline__ void add_other_sums(SoftmaxState& st, float* xchg, int c, int r0, int q, int barrier) {
  if (q == 0) {
    xchg[c * kTileRows + r0] = st.l[0];
    xchg[c * kTileRows + r0 + 8] = st.l[1];
  }
  ptx::named_barrier(barrier, 256);
  st.l[0] += xchg[(1 - c) * kTileRows + r0];
  st.l[1] += xchg[(1 - c) * kTileRows + r0 + 8];
}

}  // namespace snapmla::cuda
