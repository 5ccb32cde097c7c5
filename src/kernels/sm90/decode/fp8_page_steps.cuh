// The steps of a 64-row FP8 tile's page that do not depend on how many consumer warpgroups share
// the pages (decode_fp8.cu's two, decode_fp8_trio.cu's three): the score (QK), the owner's softmax
// up to the page's factors with the running max's hand-off, and the P' stores. The consumer that
// owns page j takes the running max after page j - 1 from that page's owner (`prev`) on named
// barrier Fp8Barrier::kMax + prev, and hands its own on kMax + c: two warpgroups, 256 threads, in
// every tile (their barrier enums keep kMax where Fp8Barrier has it).
#pragma once

#include <cstdint>

#include "kernels/common/numeric.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/wgmma.cuh"
#include "fp8_tile.cuh"
#include "params.hpp"
#include "pipeline.cuh"
#include "scheduler.cuh"
#include "softmax.cuh"

namespace snapmla::cuda {

// The running max's hand-off: the owner of page j - 1 arrives on kMax + its index once the max
// after that page is in its slot; the owner of page j waits there.
__device__ __forceinline__ void max_hand_wait(int prev) {
  ptx::named_barrier(int(Fp8Barrier::kMax) + prev, 256);
}
__device__ __forceinline__ void max_hand_arrive(int owner) {
  ptx::named_barrier_arrive(int(Fp8Barrier::kMax) + owner, 256);
}

// The FP8 latent product of a page's scores, acc += Q K^T over the 512 dims: Q and the page's K
// as TMA wrote them (128-byte swizzle, 128 bytes per row): a K step moves 32 bytes along the row,
// or to the next box. Every 64-row tile's score.
__device__ __forceinline__ void latent_product(float (&acc)[8][4], uint64_t qn, uint64_t kl) {
#pragma unroll
  for (int kk = 0; kk < 16; ++kk)
    wg::mma_64x64x32_e4m3_ss(acc, wg::desc_add(qn, (kk / 4) * (kTileRows * kTmaBoxBytes) + (kk % 4) * 32),
                             wg::desc_add(kl, (kk / 4) * (kPageSize * kTmaBoxBytes) + (kk % 4) * 32));
}

// score: S of page j into acc (issued and committed, waited for by the caller). The bf16 rope
// product first (overwriting the accumulator; Q's rope from registers), then the FP8 latent one.
template <typename View>
__device__ __forceinline__ void score(float (&acc)[8][4], const View& sm, const uint32_t (&qa)[4][4],
                                      uint64_t qn, int j) {
  const int s = j % View::kStages;
  sm.ring.wait(j);
  wg::fence_operands(acc);
  wg::fence();
  const uint64_t kr = wg::desc_sw128(sm.kr(s));
  wg::mma_64x64x16_bf16_rs_zero(acc, qa[0], kr);
#pragma unroll
  for (int ks = 1; ks < 4; ++ks) wg::mma_64x64x16_bf16_rs(acc, qa[ks], wg::desc_add(kr, ks * 32));
  latent_product(acc, qn, wg::desc_sw128(sm.kl(s)));
  wg::commit();
}

// score_rope_smem: score with Q's rope from shared memory (qr: its descriptor, the tile as TMA
// wrote it with the 128-byte swizzle, as a page's rope): the tiles whose consumers have no
// registers to keep it (the V^T-register and three-consumer tiles).
template <typename View>
__device__ __forceinline__ void score_rope_smem(float (&acc)[8][4], const View& sm, uint64_t qr, uint64_t qn, int j) {
  const int s = j % View::kStages;
  sm.ring.wait(j);
  wg::fence_operands(acc);
  wg::fence();
  const uint64_t kr = wg::desc_sw128(sm.kr(s));
  wg::mma_64x64x16_bf16_ss_zero(acc, qr, kr);
#pragma unroll
  for (int ks = 1; ks < 4; ++ks) wg::mma_64x64x16_bf16_ss(acc, wg::desc_add(qr, ks * 32), wg::desc_add(kr, ks * 32));
  latent_product(acc, qn, wg::desc_sw128(sm.kl(s)));
  wg::commit();
}

// What a page's softmax step leaves the owner's own PV of the page: per row, sigma_j (0: nothing
// visible), rho_j = alpha_j / sigma_j and the page's row sum over sigma_j. Under CarriedScale:
// sigma_j, the output's factor r_j itself in rho, and lsum (already applied to l).
struct PageFactors {
  float sig[2] = {0.f, 0.f}, rho[2] = {0.f, 0.f}, lsum[2] = {0.f, 0.f};
};

// The consumer thread's fixed view of its rows: the two rows it holds (r0, r0 + 8), their
// visible ends and their score factors (softmax_scale * s_q).
struct RowView {
  int r0, q;
  int vis[2];
  float factor[2];
};

// A consumer thread's RowView from the query scales in global memory (the tiles that do not load
// Q's rope into registers with load_q_rows): rows 16 warp + lane / 4 and + 8 of the tile at row0,
// padding rows past the query rows seeing nothing and taking row 0's scale. kBase2: the factors
// times log2e (the base-2 score step's log2 units).
template <bool kBase2 = false>
__device__ __forceinline__ RowView row_view(const DecodeParams& p, const Work& w, int row0, int warp, int lane) {
  RowView rv;
  rv.q = lane % 4;
  rv.r0 = 16 * warp + lane / 4;
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const int r = row0 + rv.r0 + 8 * ri;
    const bool ok = r < p.rows;
    rv.vis[ri] = ok ? visible_end(p, w, r) : 0;
    rv.factor[ri] = p.softmax_scale * p.q_scale[int64_t(w.seq) * p.rows + (ok ? r : 0)];
    if constexpr (kBase2) rv.factor[ri] *= kLog2e;
  }
  return rv;
}

// After a split's last page: l, kept over sigma, back in the plain domain, and m the running max
// after the last page (the lse's; from its slot, visible past the barrier that summed the
// consumers' l), back from log2 units under the base-2 step (kBase2).
template <bool kBase2, typename View>
__device__ __forceinline__ void finish_rows(SoftmaxState& st, const View& sm, const RowView& rv, int nblk) {
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    st.l[ri] *= st.sigma[ri];
    if (nblk > 0) st.m[ri] = sm.max_after(nblk - 1, rv.r0 + 8 * ri) * (kBase2 ? kLn2 : 1.f);
  }
}

// The running max after page j (the chain of the reference): page j - 1's from its owner (`prev`;
// -inf before the first page), max'd with the page's own row max mx, put in its slot and handed to
// page j + 1's owner.
template <typename View>
__device__ __forceinline__ void running_max_step(const View& sm, const RowView& rv, const float (&mx)[2], int j,
                                                 int prev, int c, int nblk, float (&m_prev)[2], float (&m_cur)[2]) {
  m_prev[0] = m_prev[1] = -INFINITY;
  if (j > 0) {
    max_hand_wait(prev);
    m_prev[0] = sm.max_after(j - 1, rv.r0);
    m_prev[1] = sm.max_after(j - 1, rv.r0 + 8);
  }
  m_cur[0] = fmaxf(m_prev[0], mx[0]);
  m_cur[1] = fmaxf(m_prev[1], mx[1]);
  if (rv.q == 0) {
    sm.max_after(j, rv.r0) = m_cur[0];
    sm.max_after(j, rv.r0 + 8) = m_cur[1];
  }
  if (j + 1 < nblk) max_hand_arrive(c);
}

// The per-page P' scales' step (the transposing tiles'): decode_fp8.cu's softmax_page's result up
// to fp32 rounding, with the exponentials taken against the page's own row max before the running
// max arrives from the owner of the page before. Against the running max m the page's weights are
// w lift with w = exp(s - max_page s) s_t and lift = exp(max_page s - m), so the reference's max P'
// is lift max w and its P' = w lift / sigma: after the hand-off only the row's factors and one
// multiply per weight (lift / sigma, folded into one factor) remain. Two steps, page_factors_early
// (up to the factors; the Max hand-off) and write_page_p (the P' stores, behind the caller's Free
// hand-off), so that the loop can issue other pages' PVs between them.
struct EarlyPage {
  PageFactors f;
  float by[2];  // P' = w x by
  bool none;    // no row of the warp sees the page
};

template <ScoreStep kStep, typename View>
__device__ __forceinline__ EarlyPage page_factors_early(float (&acc)[8][4], const View& sm, const RowView& rv,
                                                        const Work& w, int j, int prev, int c, int nblk) {
  EarlyPage e;
  const int s = j % View::kStages;
  const int blk = w.begin + j * kPageSize;
  const int q = rv.q;
  const bool full = __all_sync(0xffffffffu, blk + kPageSize <= min(rv.vis[0], rv.vis[1]));
  e.none = __all_sync(0xffffffffu, blk >= max(rv.vis[0], rv.vis[1]));
  float mx[2] = {-INFINITY, -INFINITY}, sum[2] = {0.f, 0.f}, wmax[2] = {0.f, 0.f};
  // w, against the page's own max. Under the base-2 step (kFolded) scores and maxima are in log2
  // units (rv.factor includes log2e), so exponentials take differences as they are (kUnit).
  constexpr bool kBase2 = kStep == ScoreStep::kFolded;
  constexpr float kUnit = kBase2 ? 1.f : kLog2e;
  if (full && kBase2) {
    page_scores_folded(acc, rv.factor, sm.scale(s), q, mx);
    page_probs_by<false, true>(acc, mx, rv.factor, sm.scale(s), q, sum, wmax);
  } else if (full) {
    page_scores<false, true, true>(acc, rv.factor, rv.vis, blk, sm.scale(s), q, mx);
    page_probs<false>(acc, mx, sm.scale(s), q, sum, wmax);
  } else if (!e.none) {
    page_scores<true, true, true>(acc, rv.factor, rv.vis, blk, sm.scale(s), q, mx);
    if constexpr (kBase2) page_probs_by<true, true>(acc, mx, {1.f, 1.f}, sm.scale(s), q, sum, wmax);
    else page_probs<true>(acc, mx, sm.scale(s), q, sum, wmax);
  }
  sm.ring.release(j);  // QK operands and scales are read
  float m_prev[2], m_cur[2];
  running_max_step(sm, rv, mx, j, prev, c, nblk, m_prev, m_cur);
  // The factors as per_page_scale makes them, without its compares (ptxas ran out of predicates
  // and spilled here): lift = exp(max_page s - m) is 0 where the row saw nothing (mx = -inf), and
  // also where the page's weights are below 2^-126 of the running max's, which the reference
  // quantizes to 0 anyway (P' < 448 x 2^-126 / kMinAmax), so such a page leaves the row as it is.
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const float lift = ex2(fmaxf(mx[ri] - m_cur[ri], -128.f) * kUnit);  // mx = m = -inf: NaN, then -128
    const float seen = fminf(lift * 0x1p126f, 1.f);                      // 0 or 1 (ex2 flushes to zero)
    const float a = fmaxf(lift * wmax[ri], kMinAmax);                     // max P' against the running max
    const float inv = __fdividef(kE4m3Max, a) * seen;
    e.f.sig[ri] = a * (1.f / kE4m3Max) * seen;
    e.f.rho[ri] = ex2((m_prev[ri] - m_cur[ri]) * kUnit) * inv;
    e.f.lsum[ri] = sum[ri] * lift * inv;
    e.by[ri] = inv * lift;
  }
  return e;
}

// write_page_p: page j's P' (e4m3, from the weights in acc) into its P buffer, which the caller
// has seen left by every PV of the page that held it before (its Free hand-off).
template <typename View>
__device__ __forceinline__ void write_page_p(const float (&acc)[8][4], const View& sm, const RowView& rv,
                                             const EarlyPage& e, int j) {
  uint8_t* pt = sm.p_tile(j);
  const int r0 = rv.r0, q = rv.q;
  auto p_word = [&](int ri, int hh) { return pt + km_offset(r0 + 8 * ri, 16 * hh + 4 * q, kPageSize); };
  if (e.none) {
#pragma unroll
    for (int ri = 0; ri < 2; ++ri)
#pragma unroll
      for (int hh = 0; hh < 4; ++hh) ptx::sts32(p_word(ri, hh), 0u);
  } else {
#pragma unroll
    for (int ri = 0; ri < 2; ++ri)
#pragma unroll
      for (int hh = 0; hh < 4; ++hh)
        ptx::sts32(p_word(ri, hh), e4m3x4(__fmul_rn(acc[2 * hh][2 * ri], e.by[ri]),
                                          __fmul_rn(acc[2 * hh][2 * ri + 1], e.by[ri]),
                                          __fmul_rn(acc[2 * hh + 1][2 * ri], e.by[ri]),
                                          __fmul_rn(acc[2 * hh + 1][2 * ri + 1], e.by[ri])));
  }
  wg::fence_proxy_async();  // P written with st.shared, read by wgmma
}

}  // namespace snapmla::cuda
