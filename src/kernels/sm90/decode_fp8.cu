// decode_fp8, the 64-row tile: TMA page pipeline, warp-specialized, ping-pong consumers.
//
// The parts (decode/): fp8_tile.cuh - configuration, shared-memory plan, named barriers;
// pipeline.cuh - the page ring and its loader; transposer.cuh - V^T for the PV; softmax.cuh - the
// per-page online softmax; scheduler.cuh - grid item -> split; epilogue.cuh - the output.
//
// Per page j, consumer c = j % 2 (its owner) runs the main loop's steps (per_page_iteration):
//   score               QK of page j (HGMMA m64n64k16 for the rope from Q registers, QGMMA
//                       m64n64k32 over the latent), issued one iteration ahead;
//   page_factors_early  the reference's per-page step on its scores: exponentials against the
//                       page's own row max, then the running max after page j - 1 from the other
//                       consumer and the page's factors (sigma, alpha / sigma) per row;
//   rescale_accumulate  both consumers, each for its 256 output dims: O <- O * r + P' V^T for
//                       the other's page j - 1 and its own page j (QGMMA m64n256k32, both
//                       operands in shared memory; r is one multiply per row);
//   store_page_p        P' / sigma (e4m3, sigma per row and page) into the page's P buffer and
//                       the factors published, while the PV of page j - 1 runs.
// The two consumers run half a pair apart: one's softmax under the other's wgmmas. After the
// pages, a sequence with one split writes its bf16 output through shared memory as whole 128-byte
// rows; a split sequence writes fp32 partials for the combine.
// Calls whose rows all fit 16 (h * s_q <= 16) run the narrow tile (decode_fp8_narrow.cu) unless
// DecodeOptions::fp8_tile says otherwise. Design and cycle budget: docs/kernels.md.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/common/check.cuh"
#include "kernels/common/mbarrier.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/tma.cuh"
#include "kernels/common/wgmma.cuh"
#include "kernels/kernels.hpp"
#include "decode/combine_tail.cuh"
#include "decode/epilogue.cuh"
#include "decode/fp8_page_steps.cuh"
#include "decode/fp8_tile.cuh"
#include "decode/fp8_vregs_tile.cuh"
#include "decode/launch.hpp"
#include "decode/tile_launches.hpp"
#include "decode/pipeline.cuh"
#include "decode/profile_stamps.cuh"
#include "decode/scheduler.cuh"
#include "decode/softmax.cuh"
#include "decode/tensor_map.hpp"
#include "decode/transposer.cuh"

namespace snapmla::cuda {
namespace {

using Cfg = Fp8TileConfig;
using Smem = Fp8TileView;
constexpr int kRows = Cfg::kRows;
constexpr int kVtStages = Cfg::kVtStages;
constexpr int kConsumerThreads = 128 * Cfg::kConsumers;

// Hand-off `kBase + which` over both consumers (which: the page's owner). The id stays in a
// register: immediate ids need a predicated pair per hand-off, measured 4% slower at h = 128.
template <Fp8Barrier kBase>
__device__ __forceinline__ void hand_sync(int which) {
  ptx::named_barrier(int(kBase) + which, kConsumerThreads);
}
template <Fp8Barrier kBase>
__device__ __forceinline__ void hand_arrive(int which) {
  ptx::named_barrier_arrive(int(kBase) + which, kConsumerThreads);
}

// rescale_accumulate: o = o * r (per row) + P' V^T of page jj for output half c (issued and
// committed, not waited for); page jj's P' is in P buffer jj % 2. kCarried: most pages keep their
// sigma and have r = 1 on every row, so a warp whose rows all have r = 1 skips the 128 multiplies.
template <bool kCarried = false>
__device__ __forceinline__ void rescale_accumulate(float (&o)[32][4], const float (&r)[2], const Smem& sm, int jj, int c) {
  if (!kCarried || __any_sync(0xffffffffu, r[0] != 1.f || r[1] != 1.f)) scale_rows(o, r);
  const uint8_t* pt = sm.p_tile(jj);
  const uint8_t* vt = sm.vt_half(jj, c);
  mbar::wait(&sm.vt_full[jj % kVtStages], (jj / kVtStages) & 1);
  wg::fence_operands(o);
  wg::fence();
  wg::mma_64x256x32_e4m3_ss(o, wg::desc(pt, 128, 512), wg::desc(vt, 128, 512));
  wg::mma_64x256x32_e4m3_ss(o, wg::desc(pt + 256, 128, 512), wg::desc(vt + 256, 128, 512));
  wg::commit();
}

// The rule of P's scale per row and page (Fp8PScale), given the page's running max, its row max,
// max P' and row sum: the page's factors and the multiplier of P' (inv). PerPageScale: sigma_j =
// max P' / 448 from the page alone (the reference's kFp8 step), applied by both consumers later.
struct PerPageScale {
  __device__ __forceinline__ void none(PageFactors&) const {}
  __device__ __forceinline__ void operator()(PageFactors& f, float (&inv)[2], const float (&mx)[2],
                                             const float (&pmax)[2], const float (&sum)[2],
                                             const float (&m_prev)[2], const float (&m_cur)[2]) const {
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      const RowPageScale x = per_page_scale(mx[ri] != -INFINITY, pmax[ri], sum[ri], m_prev[ri], m_cur[ri]);
      inv[ri] = x.inv;
      f.sig[ri] = x.sig;
      f.rho[ri] = x.rho;
      f.lsum[ri] = x.lsum;
    }
  }
};

// softmax_page: page j's scores (in acc) -> P' in the page's P buffer (for the PV's async proxy)
// and the page's factors (returned), the running max after page j in its xmax slot; releases the
// page's stage where the view says the owner does, and signals the other consumer's next page
// (Max, after the running max). The exponentials wait for the running max here: the carried P'
// scales' rule (CarriedScale) needs it before P', and the V^T-register tile takes this step as it
// is; the per-page rule's transposing tile runs page_factors_early and store_page_p. The P
// hand-off is the caller's (publish_page, or the V^T-register tile's, which publishes other
// factors).
template <typename View, typename PageScale = PerPageScale>
__device__ __forceinline__ PageFactors softmax_page(float (&acc)[8][4], const View& sm,
                                                           const RowView& rv, const Work& w, int j, int c,
                                                           int nblk, const PageScale& page_scale = {}) {
  PageFactors f;
  const int s = j % View::kStages;
  const int blk = w.begin + j * Cfg::kPageTokens;
  const int r0 = rv.r0, q = rv.q;
  // The common case, every token of the page visible to every row of the warp, skips the masks;
  // a warp whose rows see nothing of the page (padding rows past h * s_q, causal rows) skips
  // the softmax.
  const bool full = __all_sync(0xffffffffu, blk + Cfg::kPageTokens <= min(rv.vis[0], rv.vis[1]));
  const bool none = __all_sync(0xffffffffu, blk >= max(rv.vis[0], rv.vis[1]));
  float mx[2] = {-INFINITY, -INFINITY};
  // kPoison: a non-finite visible score makes its row NaN, as in the reference.
  if (full) page_scores<false, true, true>(acc, rv.factor, rv.vis, blk, sm.scale(s), q, mx);
  else if (!none) page_scores<true, true, true>(acc, rv.factor, rv.vis, blk, sm.scale(s), q, mx);
  float m_prev[2], m_cur[2];
  running_max_step(sm, rv, mx, j, 1 - c, c, nblk, m_prev, m_cur);
  // P' / sigma as e4m3: token 8 n + 2 q + e of 32-token chunk h sits at slot
  // 32 h + 16 (n / 2 % 2) + 4 q + 2 (n % 2) + e, so each row's 4 bytes are one word.
  uint8_t* pt = sm.p_tile(j);
  auto p_word = [&](int ri, int hh) { return pt + km_offset(r0 + 8 * ri, 16 * hh + 4 * q, Cfg::kPageTokens); };
  if (none) {
    if constexpr (View::kOwnerReleasesStage) sm.ring.release(j);
    page_scale.none(f);
    if (j >= 2) hand_sync<Fp8Barrier::kFree>(c);  // the other's PV of page j - 2 is done
#pragma unroll
    for (int ri = 0; ri < 2; ++ri)
#pragma unroll
      for (int hh = 0; hh < 4; ++hh) ptx::sts32(p_word(ri, hh), 0u);
  } else {
    float pmax[2] = {0.f, 0.f}, sum[2] = {0.f, 0.f};
    if (full) page_probs<false>(acc, m_cur, sm.scale(s), q, sum, pmax);
    else page_probs<true>(acc, m_cur, sm.scale(s), q, sum, pmax);
    // QK operands and scales are read: the loader may refill the stage (unless V is still read there)
    if constexpr (View::kOwnerReleasesStage) sm.ring.release(j);
    float inv[2];
    page_scale(f, inv, mx, pmax, sum, m_prev, m_cur);
    if (j >= 2) hand_sync<Fp8Barrier::kFree>(c);  // the other's PV of page j - 2 is done
#pragma unroll
    for (int ri = 0; ri < 2; ++ri)
#pragma unroll
      for (int hh = 0; hh < 4; ++hh)
        ptx::sts32(p_word(ri, hh), e4m3x4(__fmul_rn(acc[2 * hh][2 * ri], inv[ri]),
                                          __fmul_rn(acc[2 * hh][2 * ri + 1], inv[ri]),
                                          __fmul_rn(acc[2 * hh + 1][2 * ri], inv[ri]),
                                          __fmul_rn(acc[2 * hh + 1][2 * ri + 1], inv[ri])));
  }
  wg::fence_proxy_async();  // P written with st.shared, read by wgmma
  return f;
}

// publish_page: page j's per-row factors (sigma, rho) into its xsig slot and the P hand-off (the
// other consumer applies every page).
__device__ __forceinline__ void publish_page(const Smem& sm, const RowView& rv, const PageFactors& f, int j, int c) {
  if (rv.q == 0) {
    sm.factors_of(j, rv.r0) = make_float2(f.sig[0], f.rho[0]);
    sm.factors_of(j, rv.r0 + 8) = make_float2(f.sig[1], f.rho[1]);
  }
  hand_arrive<Fp8Barrier::kP>(c);
}

// store_page_p: page j's P' into its P buffer, once the other consumer's PV of page j - 2 has left
// it (Free).
__device__ __forceinline__ void store_page_p(const float (&acc)[8][4], const Smem& sm, const RowView& rv,
                                             const EarlyPage& e, int j, int c) {
  if (j >= 2) hand_sync<Fp8Barrier::kFree>(c);  // the other's PV of page j - 2 is done
  write_page_p(acc, sm, rv, e, j);
}

// Fp8PScale::kCarried's step per page. The owner of page j decides its sigma from the state after
// page j - 1, so it first takes page j - 1's (sigma, r) from the other consumer (the P hand-off,
// before its own P' instead of after) and applies them to its l and sigma; then page j's, which
// it publishes as (sigma_j, r_j) for the other consumer to apply as they are.
__device__ __forceinline__ void take_previous_page(SoftmaxState& st, const Smem& sm, int r0, int j, int c,
                                                   float (&r)[2]) {
  r[0] = r[1] = 1.f;
  if (j == 0) return;
  hand_sync<Fp8Barrier::kP>(1 - c);  // page j - 1's P' and (sigma, r), from its owner
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const float2 x = sm.factors_of(j - 1, r0 + 8 * ri);
    st.l[ri] *= x.y;
    st.sigma[ri] = x.x;
    r[ri] = x.y;
  }
}

// The reference's kFp8Carried step (docs/reference.md): the previous sigma moved into page j's
// running max, `carried`, is kept while max P' / carried lies in [448 / kCarryFall, 448] (r = 1:
// the output is not rescaled); else sigma_j = max P' kCarryHeadroom / 448 and r = carried / sigma_j.
struct CarriedScale {
  SoftmaxState& st;
  const Smem& sm;
  int r0, j, c;
  float (&r_prev)[2];  // the output's factor for page j - 1 (1 where j = 0)

  __device__ __forceinline__ void none(PageFactors& f) const {
    take_previous_page(st, sm, r0, j, c, r_prev);
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      f.sig[ri] = st.sigma[ri];
      f.rho[ri] = 1.f;
      f.lsum[ri] = 0.f;
    }
  }
  __device__ __forceinline__ void operator()(PageFactors& f, float (&inv)[2], const float (&mx)[2],
                                             const float (&pmax)[2], const float (&sum)[2],
                                             const float (&m_prev)[2], const float (&m_cur)[2]) const {
    take_previous_page(st, sm, r0, j, c, r_prev);
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      const bool seen = mx[ri] != -INFINITY;
      const float a = fmaxf(pmax[ri], kMinAmax);
      const float ideal = a * (1.f / kE4m3Max);
      const float carried = st.sigma[ri] * fast_exp(m_prev[ri] - m_cur[ri]);  // 0 on a row's first page
      const bool kept = ideal <= carried && ideal * kCarryFall >= carried;
      const float iv = kept ? __fdividef(1.f, carried) : __fdividef(kE4m3Max / kCarryHeadroom, a);
      inv[ri] = seen ? iv : 0.f;
      f.sig[ri] = seen ? (kept ? carried : ideal * kCarryHeadroom) : st.sigma[ri];
      f.rho[ri] = seen && !kept ? carried * iv : 1.f;
      f.lsum[ri] = seen ? sum[ri] * iv : 0.f;
      st.l[ri] = st.l[ri] * f.rho[ri] + f.lsum[ri];
      st.sigma[ri] = f.sig[ri];
    }
  }
};

// One iteration of the consumers' loop under the per-page P' scales: the owner's page j up to its
// factors; the PV of the other's page j - 1 issued; page j's P' stored and published while that
// PV runs; the PV of page j once page j - 1's has retired; the QK of page j + 2. (Storing P'
// before issuing the PV of page j - 1 left the stores in the chain: 1-4% slower at h = 64-128 on
// the H200.) The P(j - 1) hand-off comes before the P' stores, so a barrier of the owner's own
// warps orders them before its PV (kOwnPage).
template <ScoreStep kStep>
__device__ __forceinline__ void per_page_iteration(float (&o)[32][4], float (&acc)[8][4], SoftmaxState& st,
                                                   const Smem& sm, const RowView& rv, const Work& w,
                                                   const uint32_t (&qa)[4][4], uint64_t qn, int j, int c, int nblk) {
  const bool mine = j < nblk;
  EarlyPage e;
  if (mine) e = page_factors_early<kStep>(acc, sm, rv, w, j, 1 - c, c, nblk);
  if (j > 0) {
    hand_sync<Fp8Barrier::kP>(1 - c);  // page j - 1's P' and factors, from its owner
    float r[2];
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      const float2 x = sm.factors_of(j - 1, rv.r0 + 8 * ri);
      r[ri] = apply_page(st, ri, x.x, x.y, 0.f);
    }
    rescale_accumulate(o, r, sm, j - 1, c);
  }
  float r_own[2] = {1.f, 1.f};  // the output's factor for page j (applied to l and sigma here)
  if (mine) {
    store_page_p(acc, sm, rv, e, j, c);
    publish_page(sm, rv, e.f, j, c);
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) r_own[ri] = apply_page(st, ri, e.f.sig[ri], e.f.rho[ri], e.f.lsum[ri]);
  }
  wg::wait<0>();
  wg::fence_operands(o);
  if (j > 0) {
    mbar::arrive(&sm.vt_empty[(j - 1) % kVtStages]);
    if (j + 1 < nblk) hand_arrive<Fp8Barrier::kFree>(1 - c);  // page j + 1's P' may go there
  }
  if (mine) {
    ptx::named_barrier(int(Fp8Barrier::kOwnPage) + c, 128);  // all of this consumer's P'(j) is stored
    rescale_accumulate(o, r_own, sm, j, c);
  }
  score(acc, sm, qa, qn, min(j + 2, nblk - 1));
  wg::wait<1>();
  wg::fence_operands(o);
  if (mine) mbar::arrive(&sm.vt_empty[j % kVtStages]);
}

// The same iteration under Fp8PScale::kCarried: the owner takes page j - 1's factor before page
// j's P' (take_previous_page, inside CarriedScale), so its P' stores precede both PVs; a warp whose
// rows all keep their sigma skips the output's rescale (rescale_accumulate<true>).
__device__ __forceinline__ void carried_iteration(float (&o)[32][4], float (&acc)[8][4], SoftmaxState& st,
                                                  const Smem& sm, const RowView& rv, const Work& w,
                                                  const uint32_t (&qa)[4][4], uint64_t qn, int j, int c, int nblk) {
  const bool mine = j < nblk;
  PageFactors f;
  float r_prev[2];
  if (mine) {
    f = softmax_page(acc, sm, rv, w, j, c, nblk, CarriedScale{st, sm, rv.r0, j, c, r_prev});
    publish_page(sm, rv, f, j, c);
  } else {
    take_previous_page(st, sm, rv.r0, j, c, r_prev);
  }
  // PV of page j - 1 (the other's P', in place once its owner arrived), then of page j.
  if (j > 0) {
    rescale_accumulate<true>(o, r_prev, sm, j - 1, c);
    wg::wait<0>();
    wg::fence_operands(o);
    mbar::arrive(&sm.vt_empty[(j - 1) % kVtStages]);
    if (j + 1 < nblk) hand_arrive<Fp8Barrier::kFree>(1 - c);  // page j + 1's P' may go there
  }
  if (mine) {
    // All of this page's P' is written (the P(j - 1) sync came before the writes); its r is in
    // rho, applied to l and sigma already.
    ptx::named_barrier(int(Fp8Barrier::kOwnPage) + c, 128);
    rescale_accumulate<true>(o, f.rho, sm, j, c);
  }
  score(acc, sm, qa, qn, min(j + 2, nblk - 1));
  wg::wait<1>();
  wg::fence_operands(o);
  if (mine) mbar::arrive(&sm.vt_empty[j % kVtStages]);
}

// kCarried: Fp8PScale::kCarried's P' scales (carried_iteration) instead of the per-page ones;
// kStep: the per-page rule's score step on fully visible pages (ScoreStep, a lab option); kRole:
// where the consumers' indices come from (RoleIndex, a lab option); kTail: the split sequences
// merged by the kernel's own combine tail (SNAPMLA_COMBINE_FUSED, a lab option); kStore: how a
// split's partials are stored (PartialStore, a lab option).
template <bool kCarried, ScoreStep kStep, RoleIndex kRole, bool kTail = false,
          PartialStore kStore = PartialStore::kFragments>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    decode_fp8_kernel(const __grid_constant__ DecodeParams p, const __grid_constant__ CUtensorMap tm_latent,
                      const __grid_constant__ CUtensorMap tm_rope, const __grid_constant__ CUtensorMap tm_q) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  dependents_at_start(p);  // a programmatic combine's blocks may start (they wait for this grid)
  if (threadIdx.x == 0) SNAPMLA_MARK(kStart);  // profiling builds only (decode/profile_stamps.cuh)
  const SplitRange range = cta_splits(p, reinterpret_cast<int*>(smem_raw));  // (a word of the stages, loaded later)
  if (range.first >= range.last) return;
  const Smem sm(smem_raw);
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  const int row0 = grid_row0(p);
  // A stage is read by its page's owner (QK, scales) and the transposers; the Q tile comes with
  // one arrival and its bytes. Again before each further split of the worker (split_boundary).
  const auto init_barriers = [&] {
    sm.ring.init(128 + Cfg::kTransposers, 1);
    sm.init_vt();
  };
  start_cta(smem_raw, init_barriers, &tm_latent, &tm_rope, &tm_q);

  // Each role looks its work up after its register reallocation (values live across setmaxnreg
  // have to fit the producer's budget), and runs the worker's splits in turn.
  if (wg == 0) {
    ptx::setmaxnreg_dec<Cfg::kProducerRegs>();
    if (t >= Cfg::kLoaderThreads) {
      transpose_splits<Cfg::kThreads>(p, range, sm, (t - Cfg::kLoaderThreads) / 32, TransposeLanes(t % 32));
      return;
    }
    for (int item = range.first; item < range.last; ++item) {
      if (item > range.first) split_boundary<Cfg::kThreads>(init_barriers);
      const Work w = lookup_work(p, item);
      if (t == 0) {
        if (item == range.first) {
          SNAPMLA_MARK(kWorkKnown);
          SNAPMLA_NOTE_WORK(range.last - range.first, w.pages());
        }
        SNAPMLA_NOTE_SPLIT(w.pages());
        // The Q latent tile first (one TMA request; it needs no page index), then the pages:
        // both stand between the split's start and its first QK.
        load_q_tile<kLatentDim, 1>(&tm_q, sm.q_latent, int(int64_t(w.seq) * p.rows + row0), sm.ring.qbar);
        if (item == range.first) SNAPMLA_MARK(kQIssued);
        sm.ring.stream(p, w, &tm_latent, &tm_rope, sm, 0, w.pages());
      }
    }
    return;
  }

  ptx::setmaxnreg_inc<Cfg::kConsumerRegs>();
  for (int item = range.first; item < range.last; ++item) {
    if (item > range.first) split_boundary<Cfg::kThreads>(NoInit{});
    const Work w = work_of(p, item);
    const int nblk = w.pages();
    const int c = uniform_in_warp<kRole>(wg) - 1;  // owns pages j = c (mod 2); output half c
    const int warp = uniform_in_warp<kRole>(t / 32), lane = t % 32, g = lane / 4;
    RowView rv;
    rv.q = lane % 4;
    rv.r0 = 16 * warp + g;  // the thread's first row in the tile (and r0 + 8)
    int64_t row[2];
    uint32_t qa[4][4];  // Q rope, the rope product's A operand
    load_q_rows(p, w, row0, rv.r0, rv.q, p.q_rope, kRopeDim, row, rv.vis, qa);
    // Score factors; in log2 units under the base-2 step (page_factors_early), back at the end.
    constexpr bool kBase2 = kStep == ScoreStep::kFolded;
    rv.factor[0] = p.softmax_scale * p.q_scale[row[0]];
    rv.factor[1] = p.softmax_scale * p.q_scale[row[1]];
    if constexpr (kBase2) {
      rv.factor[0] *= kLog2e;
      rv.factor[1] *= kLog2e;
    }
    SoftmaxState st;
    float o[32][4];
#pragma unroll
    for (int n = 0; n < 32; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    mbar::wait(sm.ring.qbar, 0);
    const bool stamps = threadIdx.x == 128 && item == range.first;  // consumer 0's thread 0, first split
    if (stamps) SNAPMLA_MARK(kQLanded);

    float acc[8][4];  // S of this consumer's page, issued behind the previous iteration's PVs
    const uint64_t qn = wg::desc_sw128(sm.q_latent);
    // Iteration j: the softmax of page j (if j < nblk), rescale_accumulate of pages j - 1 (the
    // other consumer's) and j for this output half, then score of page j + 2. Every
    // iteration issues exactly one QK and waits for it (past the last page it repeats the last one,
    // whose stage still holds it); the PVs depend only on j and nblk, and every wait is on all
    // paths (ptxas serializes every wgmma when it cannot see a group retired before its registers
    // are used). Consumer c's last iteration is page nblk - 1 or nblk (the PV of the other's last
    // page).
    const int jlast = nblk > 0 ? nblk : -1;
    if (nblk > 0) score(acc, sm, qa, qn, min(c, nblk - 1));
    for (int j = c; j <= jlast; j += 2) {
      wg::wait<0>();
      wg::fence_operands(acc);
      if (stamps && j == 0) SNAPMLA_MARK(kFirstScore);
      if constexpr (kCarried) carried_iteration(o, acc, st, sm, rv, w, qa, qn, j, c, nblk);
      else per_page_iteration<kStep>(o, acc, st, sm, rv, w, qa, qn, j, c, nblk);
    }
    wg::wait<0>();
    wg::fence_operands(acc);
    add_other_sums(st, sm.xl, c, rv.r0, rv.q, int(Fp8Barrier::kAddSums));
    dependents_after_pages(p, range, item);
    if (threadIdx.x == 128) SNAPMLA_MARK(kLoopDone);  // the CTA's last split's, in the end
    // Every page was acquired before add_other_sums' barrier; a bad length faults the whole sequence.
    const bool fault = sm.ring.faulted() || w.bad_len;
    // l was kept over sigma; the running max after the last page (lse) is in its xmax slot (the
    // barrier in add_other_sums made it visible to every thread).
    finish_rows<kBase2>(st, sm, rv, nblk);
    // Past add_other_sums' barrier no wgmma is in flight and every page was consumed: each warp
    // stages its 8 KB of bf16 in the page stages (its 16.5 KB of fp32 partials, where staged, from
    // the Q tile on).
    if (w.single || kStore == PartialStore::kBf16Rows)
      write_rows_staged(p, w, st, o, sm.stage + (4 * c + warp) * 8192, row0 + 16 * warp, Cfg::kOutHalf * c,
                        lane, c == 0, fault);
    else if (kStore == PartialStore::kStaged)
      write_partials_staged(p, w, st, o, reinterpret_cast<float*>(sm.q_latent + (4 * c + warp) * kPartialStageBytes),
                            row0 + 16 * warp, Cfg::kOutHalf * c, lane, c == 0, fault);
    else
      write_partials(p, w, st, o, row0 + 16 * warp, Cfg::kOutHalf * c, lane, c == 0, fault);
    if (threadIdx.x == 128) SNAPMLA_MARK(kStored);
  }
  // SNAPMLA_COMBINE_FUSED: the split sequences' rows merged here, not by the combine kernel.
  // Its scratch: the page stages, free once the CTA's splits are done.
  if constexpr (kTail) combine_tail<kConsumerThreads>(p, kRows, threadIdx.x - 128, reinterpret_cast<float4*>(sm.stage));
}
static_assert(8 * 8192 <= Cfg::kStages * int(sizeof(Fp8TileSmem::Stage)), "the staged output fits the page stages");
static_assert(kCombineTailScratchBytes<kConsumerThreads> <= Cfg::kStages * int(sizeof(Fp8TileSmem::Stage)),
              "the combine tail's scratch fits the page stages");
static_assert(offsetof(Fp8TileSmem, stages) == sizeof(Fp8TileSmem::q_latent) &&
                  8 * kPartialStageBytes <= offsetof(Fp8TileSmem, vt),
              "the staged partials fit the Q tile and the page stages, which follow it");

// The V^T-register tile (fp8_vregs_tile.cuh; Fp8Tile::kRows64VRegs): the consumers' softmax step
// above, the Q rope from shared memory and the PV transposed.
namespace vt {
using VCfg = Fp8VRegsConfig;
using VSmem = Fp8VRegsView;

// The accumulator pinned around wgmma issue and wait (wg::fence_operands, per M tile).
__device__ __forceinline__ void fence_all(float (&o)[4][8][4]) {
#pragma unroll
  for (int mt = 0; mt < VCfg::kMTiles; ++mt) wg::fence_operands(o[mt]);
}

// pv_accumulate: O^T <- O^T * r (per column) + V^T P'^T of page jj for consumer c's 256 dims
// (8 QGMMA m64n64k32, V^T from registers; issued and committed, not waited for).
__device__ __forceinline__ void pv_accumulate(float (&o)[4][8][4], const VSmem& sm, const Work& w, int band, int jj,
                                              int c, int warp, int lane) {
  {
    float r[8][2];
    column_factors(r, sm, jj, lane % 4);
#pragma unroll
    for (int mt = 0; mt < VCfg::kMTiles; ++mt)
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        o[mt][n][0] *= r[n][0];
        o[mt][n][1] *= r[n][1];
        o[mt][n][2] *= r[n][0];
        o[mt][n][3] *= r[n][1];
      }
  }
  const int blk = w.begin + jj * VCfg::kPageTokens;
  sm.ring.wait(jj);  // complete for the owner already; the other consumer reads the stage too
  uint32_t a[4][2][4];
  load_vt(a, sm.kl(jj % VCfg::kStages), c, warp, lane, min(VCfg::kPageTokens, w.end - blk), band - blk);
  const uint8_t* pt = sm.p_tile(jj);
  fence_all(o);
  wg::fence();
#pragma unroll
  for (int mt = 0; mt < VCfg::kMTiles; ++mt)
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) wg::mma_64x64x32_e4m3_rs(o[mt], a[mt][ks], wg::desc(pt + 256 * ks, 128, 512));
  wg::commit();
}

}  // namespace vt

__global__ void __launch_bounds__(Fp8VRegsConfig::kThreads, 1)
    decode_fp8_vregs_kernel(const __grid_constant__ DecodeParams p, const __grid_constant__ CUtensorMap tm_latent,
                            const __grid_constant__ CUtensorMap tm_rope, const __grid_constant__ CUtensorMap tm_q,
                            const __grid_constant__ CUtensorMap tm_q_rope) {
  using VCfg = Fp8VRegsConfig;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  dependents_at_start(p);  // a programmatic combine's blocks may start (they wait for this grid)
  const SplitRange range = cta_splits(p, reinterpret_cast<int*>(smem_raw));  // (a word of the stages, loaded later)
  if (range.first >= range.last) return;
  const vt::VSmem sm(smem_raw);
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  const int row0 = grid_row0(p);
  // Every consumer thread reads every stage (V^T); the Q tiles come with two TMA arrivals (latent,
  // rope), each with its bytes.
  const auto init_barriers = [&] { sm.ring.init(VCfg::kStageReaders, 2); };
  start_cta(smem_raw, init_barriers, &tm_latent, &tm_rope, &tm_q, &tm_q_rope);

  if (wg == 0) {
    ptx::setmaxnreg_dec<VCfg::kProducerRegs>();
    // Warp 0 looks each split up (work_of is a whole warp's lookup: thread 0 alone would wait in its
    // ballot forever, as the third H200 run did with a plan) and its thread 0 loads; warps 1-3 only
    // keep the split boundaries' count.
    if (t >= 32) {
      for (int item = range.first + 1; item < range.last; ++item) split_boundary<VCfg::kThreads>(NoInit{});
      return;
    }
    for (int item = range.first; item < range.last; ++item) {
      if (item > range.first) split_boundary<VCfg::kThreads>(init_barriers);
      const Work w = lookup_work(p, item);
      if (t == 0) {
        const int row = int(int64_t(w.seq) * p.rows + row0);
        load_q_tile<kLatentDim, 1>(&tm_q, sm.q_latent, row, sm.ring.qbar);
        mbar::arrive_expect_tx(sm.ring.qbar, VCfg::kRows * kRopeDim * 2);
        tma::load_2d(sm.q_rope, &tm_q_rope, 0, row, sm.ring.qbar);
        sm.ring.stream(p, w, &tm_latent, &tm_rope, sm, 0, w.pages());
      }
    }
    return;
  }

  ptx::setmaxnreg_inc<VCfg::kConsumerRegs>();
  for (int item = range.first; item < range.last; ++item) {
    if (item > range.first) split_boundary<VCfg::kThreads>(NoInit{});
    const Work w = lookup_work(p, item);
    const int nblk = w.pages();
    const int c = wg - 1;
    const int warp = t / 32, lane = t % 32, g = lane / 4;
    const int band = band_start(p, w);
    // row_view's rows, written out here: through the helper ptxas spills 8 bytes in this kernel.
    RowView rv;
    rv.q = lane % 4;
    rv.r0 = 16 * warp + g;
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      const int r = row0 + rv.r0 + 8 * ri;
      const bool ok = r < p.rows;
      rv.vis[ri] = ok ? visible_end(p, w, r) : 0;
      rv.factor[ri] = p.softmax_scale * p.q_scale[int64_t(w.seq) * p.rows + (ok ? r : 0)];
    }
    if (c == 0 && t == 0) *sm.split_flags = (w.single ? 1u : 0u) | (w.bad_len ? 2u : 0u);
    SoftmaxState st;  // l and sigma of the thread's two S rows
    float o[4][8][4];  // O^T / sigma: dims row_dim(c, mt, .) x query rows 8 n + 2 q + e
#pragma unroll
    for (int mt = 0; mt < VCfg::kMTiles; ++mt)
#pragma unroll
      for (int n = 0; n < 8; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
    mbar::wait(sm.ring.qbar, 0);

    float acc[8][4];
    const uint64_t qn = wg::desc_sw128(sm.q_latent), qr = wg::desc_sw128(sm.q_rope);
    // decode_fp8_kernel's iteration, with the factors published after the page before is applied:
    // softmax_page of page j; the other's page j - 1 applied to l and sigma; page j's r and sigma
    // published and handed off; the PVs of pages j - 1 and j; the QK of page j + 2. Each consumer
    // thread releases a page's stage once its PV of the page has retired.
    const int jlast = nblk > 0 ? nblk : -1;
    if (nblk > 0) score_rope_smem(acc, sm, qr, qn, min(c, nblk - 1));
    for (int j = c; j <= jlast; j += 2) {
      const bool mine = j < nblk;
      wg::wait<0>();
      wg::fence_operands(acc);
      PageFactors f;
      if (mine) f = softmax_page(acc, sm, rv, w, j, c, nblk);
      if (j > 0) {
        hand_sync<Fp8Barrier::kP>(1 - c);  // page j - 1's P' and (r, sigma)
#pragma unroll
        for (int ri = 0; ri < 2; ++ri) {
          const float2 x = sm.factors_of(j - 1, rv.r0 + 8 * ri);
          st.l[ri] *= x.x;
          st.sigma[ri] = x.y;
        }
      }
      if (mine) {
#pragma unroll
        for (int ri = 0; ri < 2; ++ri) {
          const float r = apply_page(st, ri, f.sig[ri], f.rho[ri], f.lsum[ri]);
          if (rv.q == 0) sm.factors_of(j, rv.r0 + 8 * ri) = make_float2(r, st.sigma[ri]);
        }
        hand_arrive<Fp8Barrier::kP>(c);
        // This consumer's warps read each other's rows' factors (and, on page 0, P'): a barrier of
        // its own per consumer.
        ptx::named_barrier(int(Fp8Barrier::kOwnRows) + c, 128);
      }
      if (j > 0) {
        const int jo = j - 1;
        vt::pv_accumulate(o, sm, w, band, jo, c, warp, lane);
        wg::wait<0>();
        vt::fence_all(o);
        sm.ring.release(jo);
        if (j + 1 < nblk) hand_arrive<Fp8Barrier::kFree>(1 - c);
      }
      if (mine) vt::pv_accumulate(o, sm, w, band, j, c, warp, lane);
      score_rope_smem(acc, sm, qr, qn, min(j + 2, nblk - 1));
      wg::wait<1>();
      vt::fence_all(o);
      if (mine) sm.ring.release(j);
    }
    wg::wait<0>();
    wg::fence_operands(acc);
    add_other_sums(st, sm.xl, c, rv.r0, rv.q, int(Fp8Barrier::kAddSums));  // its barrier also publishes split_flags
    dependents_after_pages(p, range, item);
    const uint32_t flags = *static_cast<volatile uint32_t*>(sm.split_flags);
    const bool fault = sm.ring.faulted() || (flags & 2u) != 0u;
    Work wo = w;
    wo.single = (flags & 1u) != 0u;
    // Per row, from consumer 0's S rows: the output's scale for the accumulator columns and the lse.
    if (c == 0 && rv.q == 0) {
#pragma unroll
      for (int ri = 0; ri < 2; ++ri) {
        const int r = rv.r0 + 8 * ri;
        const float l = st.l[ri] * st.sigma[ri];
        sm.out_scale[r] = row_scale(l, st.sigma[ri], fault);
        if (row0 + r < p.rows) {
          const float m = nblk > 0 ? sm.max_after(nblk - 1, r) : -INFINITY;
          store_lse(p, wo, row0 + r, row_lse(m, l, fault));
        }
      }
    }
    ptx::named_barrier(int(Fp8Barrier::kRowTotals), 128 * VCfg::kConsumers);
    // out_scale is rewritten only after the next split's boundary, which every thread passes first.
    write_columns(p, wo, o, sm.out_scale, row0, c, warp, lane);
  }
}

// The default kernel and its twins with the split epilogue's lab options: the combine tail, the
// staged partials, both.
template <bool kTail, PartialStore kStore>
constexpr auto kDefaultFp8Kernel = decode_fp8_kernel<false, ScoreStep::kReference, RoleIndex::kUniform, kTail, kStore>;
using DefaultFp8Kernels =
    SplitKernels<kDefaultFp8Kernel<false, PartialStore::kFragments>, kDefaultFp8Kernel<true, PartialStore::kFragments>,
                 kDefaultFp8Kernel<false, PartialStore::kStaged>, kDefaultFp8Kernel<true, PartialStore::kStaged>,
                 kDefaultFp8Kernel<false, PartialStore::kBf16Rows>>;

// The transposing tile's kernel of the call's lab options.
template <RoleIndex kRole>
void launch_rows64(Fp8PScale p_scale, ScoreStep step, const DecodeParams& p, const DecodeOptions& options,
                   const CUtensorMap& tm_latent, const CUtensorMap& tm_rope, const CUtensorMap& tm_q) {
  constexpr int kSmem = int(sizeof(Fp8TileSmem));
  if (p_scale == Fp8PScale::kCarried) {
    if constexpr (kRole == RoleIndex::kUniform)  // with its bf16-partials twin
      launch_decode<Fp8TileConfig,
                    SplitKernels<decode_fp8_kernel<true, ScoreStep::kReference, kRole>, nullptr, nullptr, nullptr,
                                 decode_fp8_kernel<true, ScoreStep::kReference, kRole, false, PartialStore::kBf16Rows>>>(
          "decode_fp8", kSmem, p, options, tm_latent, tm_rope, tm_q);
    else
      launch_decode<Fp8TileConfig, SplitKernels<decode_fp8_kernel<true, ScoreStep::kReference, kRole>>>(
          "decode_fp8", kSmem, p, options, tm_latent, tm_rope, tm_q);
  } else if (step == ScoreStep::kFolded)
    launch_decode<Fp8TileConfig, SplitKernels<decode_fp8_kernel<false, ScoreStep::kFolded, kRole>>>(
        "decode_fp8", kSmem, p, options, tm_latent, tm_rope, tm_q);
  else if constexpr (kRole == RoleIndex::kUniform)  // the default kernel: with its split-epilogue twins
    launch_decode<Fp8TileConfig, DefaultFp8Kernels>("decode_fp8", kSmem, p, options, tm_latent, tm_rope, tm_q);
  else
    launch_decode<Fp8TileConfig, SplitKernels<decode_fp8_kernel<false, ScoreStep::kReference, kRole>>>(
        "decode_fp8", kSmem, p, options, tm_latent, tm_rope, tm_q);
}

}  // namespace

void decode_fp8(const QuantizedQuery& q, const PagedFp8Cache& cache, const PageTable& pages,
                const DecodeOutput& out, const DecodeOptions& options) {
  DecodeParams p = make_params(q.batch, q.seqlen_q, q.num_heads, pages, out, options);
  const Fp8PScale p_scale = detail::resolved_p_scale("decode_fp8", options, p.rows);
  const Fp8Tile tile = detail::fp8_tile_of_call("decode_fp8", p.rows, options.fp8_tile, p_scale);
  const ScoreStep step = score_step("decode_fp8");  // the lab options: read (and checked) on every call
  const RoleIndex role = role_index("decode_fp8");
  if (q.batch == 0) return;
  p.q_nope = reinterpret_cast<const uint8_t*>(q.nope);
  p.q_rope = reinterpret_cast<const uint16_t*>(q.rope);
  p.q_scale = q.scale;
  p.k_scale = cache.scale;
  p.num_pages = cache.num_pages;
  const int64_t rows = cache.num_pages * kPageSize;
  const CUtensorMap tm_latent = plane_map(cache.latent, rows, kLatentDim, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1);
  const CUtensorMap tm_rope = plane_map(cache.rope, rows, kRopeDim * 2, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2);
  if (tile == Fp8Tile::kNarrow16) {
    launch_decode_fp8_narrow(role, p, tm_latent, tm_rope, options);
    return;
  }
  // The query latent as one more plane: [batch * rows, 512] bytes, a tile's 64 rows per box row.
  const CUtensorMap tm_q = plane_map(q.nope, int64_t(q.batch) * p.rows, kLatentDim, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1);
  if (tile == Fp8Tile::kRows64Trio || tile == Fp8Tile::kRows64VRegs) {
    // These tiles read the Q rope through shared memory too: one more plane.
    const CUtensorMap tm_q_rope =
        plane_map(q.rope, int64_t(q.batch) * p.rows, kRopeDim * 2, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2);
    if (tile == Fp8Tile::kRows64Trio) {
      launch_decode_fp8_trio(step, p, options, tm_latent, tm_rope, tm_q, tm_q_rope);
      return;
    }
    // The role index stays per thread here: the broadcast one leaves ptxas 4 bytes of spills.
    // (Its own kernel stores bf16 partials where DecodeParams::partial_bf16 says so.)
    launch_decode<Fp8VRegsConfig, SplitKernels<decode_fp8_vregs_kernel, nullptr, nullptr, nullptr, decode_fp8_vregs_kernel>>(
        "decode_fp8", int(sizeof(Fp8VRegsSmem)), p, options, tm_latent, tm_rope, tm_q, tm_q_rope);
  } else {
    profile::before_launch();  // profiling builds only: the stamps' table and report
    if (role == RoleIndex::kUniform)
      launch_rows64<RoleIndex::kUniform>(p_scale, step, p, options, tm_latent, tm_rope, tm_q);
    else
      launch_rows64<RoleIndex::kThread>(p_scale, step, p, options, tm_latent, tm_rope, tm_q);
    profile::after_launch("decode_fp8");
  }
}

}  // namespace snapmla::cuda
