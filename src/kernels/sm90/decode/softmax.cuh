// Online softmax over one 64-token block for the two rows a thread holds in an m16n8 C
// fragment (rows g and g + 8; tokens 8 n + 2 q + {0, 1} of n-tile n). Follows the reference
// step for step (docs/reference.md): scores = (raw * (softmax_scale * s_q)) * s_t; a row with
// no visible token in the block leaves its state untouched; FP8 folds s_t into P and
// quantizes P' per row and block with sigma = max P' / 448.
#pragma once

#include "../../common/numeric.cuh"
#include "../../common/ptx.cuh"

namespace snapmla::cuda {

struct SoftmaxState {
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};
  float sigma[2] = {1.f, 1.f};
};

// exp(x) as one MUFU.EX2 plus a multiply; differs from the reference's std::exp by a few fp32
// ulps, within the fp32-rounding allowance of docs/reference.md.
__device__ __forceinline__ float fast_exp(float x) { return exp2f(x * 1.4426950408889634f); }

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// The BF16 kernel's softmax over one 64-token block: s holds the raw QK accumulators (one
// 64 x 64 S tile per consumer) and returns P, rounded to bf16 by the caller. rescale: what to
// multiply the output accumulator by before adding this block's PV. (The FP8 kernel, whose
// consumers each hold half of the block's tokens, uses softmax_block_half below.)
__device__ __forceinline__ void softmax_block_bf16(SoftmaxState& st, float (&s)[8][4],
                                                   const float (&factor)[2], const int (&vis)[2],
                                                   int blk, int q, float (&rescale)[2]) {
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 2 * ri; e < 2 * ri + 2; ++e) {
        const int tok = 8 * n + 2 * q + (e & 1);
        const float sc = blk + tok < vis[ri] ? __fmul_rn(s[n][e], factor[ri]) : -INFINITY;
        s[n][e] = sc;
        mx = fmaxf(mx, sc);
      }
    mx = quad_max(mx);
    if (mx == -INFINITY) {  // nothing visible in this block for this row
      rescale[ri] = 1.f;
#pragma unroll
      for (int n = 0; n < 8; ++n) s[n][2 * ri] = s[n][2 * ri + 1] = 0.f;
      continue;
    }
    const float m_new = fmaxf(st.m[ri], mx);
    const float alpha = fast_exp(st.m[ri] - m_new);
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 2 * ri; e < 2 * ri + 2; ++e) {
        const float p = fast_exp(s[n][e] - m_new);  // exp(-inf) = 0 for masked tokens
        sum += p;
        s[n][e] = p;
      }
    st.l[ri] = st.l[ri] * alpha + quad_sum(sum);
    rescale[ri] = alpha;
    st.m[ri] = m_new;
  }
}

// The FP8 softmax of one 64-token block when the two consumer warpgroups each hold the scores
// of half of its tokens (warpgroup c: tokens 32 c .. 32 c + 31 of the block) for the same 64
// rows. The row max and the max of P' are exchanged through shared memory (xmax, xpmax:
// [2][64] floats, row-indexed) across a 256-thread named barrier each, so both warpgroups
// apply the same m, sigma and rescale factors; each keeps its own part of the running sum l
// (the parts are added once, at the end). acc: this warpgroup's raw scores (m64n32 fragment:
// tokens 8 n + 2 q + {0, 1}); s: P' / sigma out. tok0 = first token of this half, kscale its
// 32 token scales, r0 = the thread's first row in the tile (16 warp + g).
__device__ __forceinline__ void softmax_block_half(SoftmaxState& st, const float (&acc)[4][4],
                                                   float (&s)[4][4], const float (&factor)[2],
                                                   const int (&vis)[2], int tok0,
                                                   const float* kscale, int q, int r0, int c,
                                                   float* xmax, float* xpmax, float (&rescale)[2]) {
  constexpr int kExchangeBarrier = 1;
  float ks[4][2];
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    const float2 v = *reinterpret_cast<const float2*>(kscale + 8 * n + 2 * q);
    ks[n][0] = v.x;
    ks[n][1] = v.y;
  }
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int ri = e / 2, tok = 8 * n + 2 * q + (e & 1);
      float sc = -INFINITY;
      if (tok0 + tok < vis[ri]) sc = __fmul_rn(__fmul_rn(acc[n][e], factor[ri]), ks[n][e & 1]);
      s[n][e] = sc;
      mx[ri] = fmaxf(mx[ri], sc);
    }
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) mx[ri] = quad_max(mx[ri]);
  if (q == 0) {
    xmax[c * 64 + r0] = mx[0];
    xmax[c * 64 + r0 + 8] = mx[1];
  }
  ptx::named_barrier(kExchangeBarrier, 256);
  float m_new[2], sum[2] = {0.f, 0.f}, pmax[2] = {0.f, 0.f};
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    mx[ri] = fmaxf(mx[ri], xmax[(1 - c) * 64 + r0 + 8 * ri]);
    m_new[ri] = fmaxf(st.m[ri], mx[ri]);  // -inf only if nothing was ever visible
  }
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int ri = e / 2;
      // exp(-inf) = 0 for masked tokens; a row with nothing visible yet gets 0 everywhere.
      const bool seen = s[n][e] != -INFINITY;  // masked tokens' scales may be anything
      const float pe = seen ? fast_exp(s[n][e] - m_new[ri]) : 0.f;
      sum[ri] += pe;
      const float pv = seen ? __fmul_rn(pe, ks[n][e & 1]) : 0.f;
      pmax[ri] = fmaxf(pmax[ri], pv);
      s[n][e] = pv;
    }
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    sum[ri] = quad_sum(sum[ri]);
    pmax[ri] = quad_max(pmax[ri]);
  }
  if (q == 0) {
    xpmax[c * 64 + r0] = pmax[0];
    xpmax[c * 64 + r0 + 8] = pmax[1];
  }
  ptx::named_barrier(kExchangeBarrier, 256);
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    if (mx[ri] == -INFINITY) {  // nothing visible in this block for this row: state unchanged
      rescale[ri] = 1.f;
      continue;
    }
    pmax[ri] = fmaxf(pmax[ri], xpmax[(1 - c) * 64 + r0 + 8 * ri]);
    const float alpha = fast_exp(st.m[ri] - m_new[ri]);
    const DevScale sig = device_token_scale(pmax[ri]);
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 2 * ri; e < 2 * ri + 2; ++e) s[n][e] = __fmul_rn(s[n][e], sig.inv_scale);
    st.l[ri] = st.l[ri] * alpha + sum[ri];
    rescale[ri] = alpha * __fdiv_rn(st.sigma[ri], sig.scale);
    st.sigma[ri] = sig.scale;
    st.m[ri] = m_new[ri];
  }
}

}  // namespace snapmla::cuda
