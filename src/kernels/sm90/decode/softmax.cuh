// Online softmax over one 64-token block for the two rows a thread holds in an m16n8 C
// fragment (rows g and g + 8; tokens 8 n + 2 q + {0, 1} of n-tile n). Follows the reference
// step for step (docs/reference.md): scores = (raw * (softmax_scale * s_q)) * s_t; a row with
// no visible token in the block leaves its state untouched; FP8 mode folds s_t into P and
// quantizes P' per row and block with sigma = max P' / 448.
#pragma once

#include "../../common/numeric.cuh"

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

// s: raw QK accumulators in, P (kFp8: P' / sigma, ready for e4m3) out. kscale: the block's
// 64 token scales (nullptr for BF16: all 1). rescale: what to multiply the output
// accumulator by before adding this block's PV.
template <bool kFp8>
__device__ __forceinline__ void softmax_block(SoftmaxState& st, float (&s)[8][4],
                                              const float (&factor)[2], const int (&vis)[2],
                                              int blk, const float* kscale, int q,
                                              float (&rescale)[2]) {
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 2 * ri; e < 2 * ri + 2; ++e) {
        const int tok = 8 * n + 2 * q + (e & 1);
        float sc = -INFINITY;
        if (blk + tok < vis[ri]) {
          sc = __fmul_rn(s[n][e], factor[ri]);
          if (kFp8) sc = __fmul_rn(sc, kscale[tok]);
        }
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
    float sum = 0.f, pmax = 0.f;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 2 * ri; e < 2 * ri + 2; ++e) {
        const float p = fast_exp(s[n][e] - m_new);  // exp(-inf) = 0 for masked tokens
        sum += p;
        if (kFp8) {
          const float pv = __fmul_rn(p, kscale[8 * n + 2 * q + (e & 1)]);
          pmax = fmaxf(pmax, pv);
          s[n][e] = pv;
        } else {
          s[n][e] = p;
        }
      }
    sum = quad_sum(sum);
    st.l[ri] = st.l[ri] * alpha + sum;
    if (kFp8) {
      pmax = quad_max(pmax);
      const DevScale sig = device_token_scale(pmax);
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 2 * ri; e < 2 * ri + 2; ++e) s[n][e] = __fmul_rn(s[n][e], sig.inv_scale);
      rescale[ri] = alpha * __fdiv_rn(st.sigma[ri], sig.scale);
      st.sigma[ri] = sig.scale;
    } else {
      rescale[ri] = alpha;
    }
    st.m[ri] = m_new;
  }
}

}  // namespace snapmla::cuda
