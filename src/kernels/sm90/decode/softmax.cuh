// Online softmax over one 64-token block for the two rows a thread holds in an m16n8 C
// fragment (rows g and g + 8; tokens 8 n + 2 q + {0, 1} of n-tile n). Follows the reference
// step for step (docs/reference.md): scores = (raw * (softmax_scale * s_q)) * s_t; a row with
// no visible token in the block leaves its state untouched; FP8 folds s_t into P and
// quantizes P' per row and block with sigma = max P' / 448. (The base-2 score step, a lab
// option, takes the scores' factor in another order: page_scores_folded.)
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
constexpr float kLn2 = 0.6931471805599453f;

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
__device__ __forceinline__ float quad_min(float v) {
  v = fminf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fminf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// The parts of a page's softmax that every tile shares, per element and per row, whatever the
// fragment layout that holds them (the 64-row tiles: rows in registers, tokens across the quad;
// the narrow tile: tokens in registers, rows across the quad).

// One score, the reference's rounding: (raw * (softmax_scale * s_q)) * s_t (kScaled = false,
// decode_bf16: raw * softmax_scale); kPoison: a value that is not finite becomes +inf (the row's
// result is then NaN, docs/reference.md "Bad inputs"); -inf where the row does not see the token.
template <bool kScaled, bool kPoison>
__device__ __forceinline__ float masked_score(float raw, float factor, float ks, bool visible) {
  const float x = __fmul_rn(raw, factor);
  float v = kScaled ? __fmul_rn(x, ks) : x;
  if (kPoison && !(fabsf(v) < INFINITY)) v = INFINITY;
  return visible ? v : -INFINITY;
}

// P = exp(s - m) (x) and P' = P * s_t (y) of one score, from ml = m log2e: one FFMA and one
// MUFU.EX2. Both 0 where kMasked and s is -inf (the token's scale may then be anything);
// kScaled = false (decode_bf16): y = x. `cl` multiplies s in the exponent: log2e, or the row's
// factor times log2e where s is a folded score (page_scores_folded).
template <bool kMasked, bool kScaled = true>
__device__ __forceinline__ float2 page_weight(float s, float ml, float ks, float cl = kLog2e) {
  const bool seen = !kMasked || s != -INFINITY;
  const float pe = seen ? ex2(fmaf(s, cl, -ml)) : 0.f;
  return make_float2(pe, !kScaled ? pe : seen ? __fmul_rn(pe, ks) : 0.f);
}

// The reference's kFp8 step for one row and page: sigma_j = max(max P', 1e-10) / 448 and its
// inverse, without branches, the inverse as MUFU.RCP and a multiply (2 ulp; the reference divides
// exactly - see docs/reference.md); rho_j = alpha_j / sigma_j (0 on a row's first page) and the
// page's row sum over sigma_j. A row that saw nothing of the page (`seen` false): P' = 0, inv and
// sigma_j 0.
struct RowPageScale {
  float sig, rho, lsum, inv;
};

__device__ __forceinline__ RowPageScale per_page_scale(bool seen, float pmax, float sum, float m_prev,
                                                       float m_cur) {
  RowPageScale f;
  const float a = fmaxf(pmax, kMinAmax);
  f.inv = seen ? __fdividef(kE4m3Max, a) : 0.f;
  f.sig = seen ? a * (1.f / kE4m3Max) : 0.f;
  f.rho = fast_exp(m_prev - m_cur) * f.inv;
  f.lsum = sum * f.inv;
  return f;
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

// Whether every factor r of the calling warp (each thread's rows' or columns') is exactly 1: its
// rows' running max did not move, so multiplying the output by them would change no bit (x * 1
// is x for every finite, infinite or zero x; the library builds without flush-to-zero, so for
// subnormals too; a NaN output stays NaN either way and is normalized into the final NaN of its
// row or split). decode_bf16 then skips the rescale under DecodeParams::skip_unit_rescale.
template <int N>
__device__ __forceinline__ bool warp_factors_unit(const float (&r)[N]) {
  bool unit = true;
#pragma unroll
  for (int i = 0; i < N; ++i) unit = unit && r[i] == 1.f;
  return __all_sync(0xffffffffu, unit);
}

// The FP8 softmax (decode_fp8): each consumer warpgroup holds the raw QK scores of a whole
// 64-token page (m64n64 fragment: tokens 8 n + 2 q + {0, 1}). Pages are taken in the
// reference's order with its per-page running max, m_j = max(m_{j-1}, max S_j), and P' is
// quantized per row and page with the page's own sigma; step 3 (apply_page) moves the output
// and l into each page's domain. decode_bf16 uses steps 1 and 2 with kScaled = false and
// pair_alpha instead of step 3.

// The walk of the three steps below over a thread's 32 scores of a page: f(score, row index ri,
// the token's scale s_t (1 where kScaled is false: kscale is not read), token 8 n + 2 q + (e & 1)).
template <bool kScaled, typename F>
__device__ __forceinline__ void for_each_score(float (&s)[8][4], const float* kscale, int q, F&& f) {
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    const float2 ks = kScaled ? *reinterpret_cast<const float2*>(kscale + 8 * n + 2 * q) : make_float2(1.f, 1.f);
#pragma unroll
    for (int e = 0; e < 4; ++e) f(s[n][e], e / 2, e & 1 ? ks.y : ks.x, 8 * n + 2 * q + (e & 1));
  }
}

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
  for_each_score<kScaled>(s, kscale, q, [&](float& x, int ri, float ks, int tok) {
    x = masked_score<kScaled, kPoison>(x, factor[ri], ks, !kMasked || blk + tok < vis[ri]);
    mx[ri] = fmaxf(mx[ri], x);
  });
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) mx[ri] = quad_max(mx[ri]);
}

// Step 2, given the running max m: s <- P' = exp(s - m) * s_t (0 where not visible); sum: the row
// sums of P = exp(s - m), pmax: the row max of P' (both quad-reduced; the caller zeroes them).
// kScaled = false (decode_bf16): s <- P, and pmax is not needed. page_probs_by: the same with the
// exponent as 2^(s cl - ml) for each row's multiplier cl and max ml in the exponent's units
// (page_probs: cl = log2e, ml = m log2e; the base-2 score step: ScoreStep::kFolded).
template <bool kMasked, bool kScaled>
__device__ __forceinline__ void page_probs_by(float (&s)[8][4], const float (&ml)[2], const float (&cl)[2],
                                              const float* kscale, int q, float (&sum)[2], float (&pmax)[2]) {
  for_each_score<kScaled>(s, kscale, q, [&](float& x, int ri, float ks, int) {
    const float2 p = page_weight<kMasked, kScaled>(x, ml[ri], ks, cl[ri]);
    sum[ri] += p.x;
    if (kScaled) pmax[ri] = fmaxf(pmax[ri], p.y);
    x = p.y;
  });
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    sum[ri] = quad_sum(sum[ri]);
    if (kScaled) pmax[ri] = quad_max(pmax[ri]);
  }
}

template <bool kMasked, bool kScaled = true>
__device__ __forceinline__ void page_probs(float (&s)[8][4], const float (&m)[2], const float* kscale, int q,
                                           float (&sum)[2], float (&pmax)[2]) {
  // exp(s - m) as 2^(s log2e - m log2e), one FFMA and one MUFU.EX2 per element.
  page_probs_by<kMasked, kScaled>(s, {m[0] * kLog2e, m[1] * kLog2e}, {kLog2e, kLog2e}, kscale, q, sum, pmax);
}

// The base-2 score step (ScoreStep::kFolded, a lab option): the kernel keeps its scores and maxima
// in log2 units, its row factor being softmax_scale x s_q x log2e, so an exponential is one MUFU.EX2
// of a difference. On pages that both rows see whole (page_scores_folded) the scores stay raw x s_t
// and the factor goes into the exponent's FFMA (page_probs_by with cl = the factor): a score costs
// a multiply, a max and a min instead of two multiplies, a compare, a select and a max. Either way
// the reference's rounding order, (raw x factor) x s_t, holds within a few fp32 ulps of the
// exponent, far inside the GPU tests' bounds (set by the FP8 accumulator). The row's max is
// factor x the max or the min of raw x s_t, by the factor's sign. A row that meets an infinite
// score, or whose factor is not finite, gets the max NaN: its weights and sum are NaN, its l
// stays NaN (the running max passes over it: fmaxf), and its output and lse are NaN, as the
// reference's poisoned row; a NaN score makes its own weight, and so the sum, NaN.
template <bool kScaled = true>
__device__ __forceinline__ void page_scores_folded(float (&s)[8][4], const float (&factor)[2], const float* kscale,
                                                   int q, float (&mx)[2]) {
  float hi[2] = {-INFINITY, -INFINITY}, lo[2] = {INFINITY, INFINITY};
  for_each_score<kScaled>(s, kscale, q, [&](float& x, int ri, float ks, int) {
    if (kScaled) x = __fmul_rn(x, ks);
    hi[ri] = fmaxf(hi[ri], x);
    lo[ri] = fminf(lo[ri], x);
  });
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const float h = quad_max(hi[ri]), l = quad_min(lo[ri]), f = factor[ri];
    const bool poisoned = !(h < INFINITY && l > -INFINITY && fabsf(f) < INFINITY);
    mx[ri] = poisoned ? NAN : __fmul_rn(f >= 0.f ? h : l, f);
  }
}

// Step 3, decode_fp8's step per page, in page order, by both consumers (each applies every
// page to its output half). The page's owner publishes sigma_j (0: the page showed the row
// nothing, so the previous sigma stays, as the reference leaves such a block's state untouched)
// and rho_j = alpha_j / sigma_j; the output's factor sigma_{j-1} alpha_j / sigma_j is then one
// multiply (no exponential or division between a page's P hand-off and its PV). l is kept in
// the sigma domain (l / sigma): it takes the same factor, plus `own_lsum` = the page's row sum /
// sigma_j if this consumer computed the page's P, else 0 (each keeps its own part of l).
// apply_row_page is the step on one row's (l, sigma), which the narrow tile keeps per column,
// given whether the page showed the row anything (sig > 0 where only the factors are at hand).
__device__ __forceinline__ float apply_row_page(float& l, float& sigma, bool seen, float sig, float rho,
                                                float own_lsum) {
  const float r = seen ? sigma * rho : 1.f;
  l = l * r + own_lsum;
  sigma = seen ? sig : sigma;
  return r;
}

__device__ __forceinline__ float apply_page(SoftmaxState& st, int ri, float sig, float rho, float own_lsum) {
  return apply_row_page(st.l[ri], st.sigma[ri], sig > 0.f, sig, rho, own_lsum);
}

// decode_bf16's step per page (no sigma): the factor for the output before the page's PV and
// the state after it, given the running max after the page; `own_sum`: this page's row sums if
// this consumer computed its P (each consumer keeps its own part of l, added at the end).
// `unit`: the exponent's multiplier of a max difference (log2e; 1 where the maxima are in log2
// units, ScoreStep::kFolded). row_alpha is the step on one row's (m, l), which decode_bf16's
// narrow tile keeps per column.
__device__ __forceinline__ float row_alpha(float& m, float& l, float m_new, float own_sum, float unit = kLog2e) {
  if (m_new == -INFINITY) return 1.f;  // nothing visible to this row so far
  const float alpha = ex2((m - m_new) * unit);
  l = l * alpha + own_sum;
  m = m_new;
  return alpha;
}

__device__ __forceinline__ float pair_alpha(SoftmaxState& st, int ri, float m_new, float own_sum,
                                            float unit = kLog2e) {
  return row_alpha(st.m[ri], st.l[ri], m_new, own_sum, unit);
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

// The same for tiles of more than two consumers: l is the consumers' parts summed in consumer
// order, so that every consumer holds the same bits for the row (each one normalizes its own
// output dims by it). `barrier`: a named barrier id over all kConsumers consumers.
template <int kConsumers>
__device__ __forceinline__ void sum_consumer_parts(SoftmaxState& st, float* xchg, int c, int r0, int q, int barrier) {
  if (q == 0) {
    xchg[c * kTileRows + r0] = st.l[0];
    xchg[c * kTileRows + r0 + 8] = st.l[1];
  }
  ptx::named_barrier(barrier, 128 * kConsumers);
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    float l = xchg[r0 + 8 * ri];
#pragma unroll
    for (int k = 1; k < kConsumers; ++k) l += xchg[k * kTileRows + r0 + 8 * ri];
    st.l[ri] = l;
  }
}

}  // namespace snapmla::cuda
