// decode_fp8, the three-consumer 64-row tile (Fp8Tile::kRows64Trio; not the default until the
// H200 has checked and timed it).
//
// The parts (decode/): fp8_trio_tile.cuh - configuration, shared-memory plan, named barriers;
// fp8_page_steps.cuh - the score and the owner's softmax step, shared with the transposing tile
// (decode_fp8.cu); transposer.cuh - V^T for the PV; pipeline.cuh - the page ring; epilogue.cuh -
// the output.
//
// The transposing tile's arithmetic, page for page, with the pages dealt to three consumers: page
// j's owner is c = j % 3, and each consumer's iteration over its own page j takes the steps
// (trio_iteration):
//   apply_page_pv(j - 2)  the P' of page j - 2 (from its owner) applied: the output slice rescaled
//                         and its PV issued (QGMMA m64n176k32), to run under this page's softmax;
//   page_factors_early    the owner's softmax of page j up to its factors, the running max taken
//                         from page j - 1's owner and handed to page j + 1's;
//   apply_page_pv(j - 1)  once the PV of page j - 2 has retired;
//   write_page_p          page j's P' into its buffer (once the other two consumers' PVs of page
//                         j - 2 have left it) and its factors published, under that PV;
//   own PV, score         page j's PV, then the QK of page j + 3 (its stage refilled by then).
// (TrioOrder::kSoftmaxFirst, a lab option, swaps the first two steps.) Every consumer applies every page in order (its l and sigma follow the reference's chain); the
// parts of l are summed after the pages in consumer order. A sequence with one split assembles its
// bf16 rows in the page stages and writes them whole; a split sequence writes fp32 partials.
// Cycle budget and the counts behind the design: docs/kernels.md.
#include <cuda.h>
#include <cuda_runtime.h>

#include "kernels/common/check.cuh"
#include "kernels/common/mbarrier.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/tma.cuh"
#include "kernels/common/wgmma.cuh"
#include "decode/epilogue.cuh"
#include "decode/fp8_page_steps.cuh"
#include "decode/fp8_trio_tile.cuh"
#include "decode/launch.hpp"
#include "decode/pipeline.cuh"
#include "decode/scheduler.cuh"
#include "decode/softmax.cuh"
#include "decode/tile_launches.hpp"
#include "decode/transposer.cuh"
#include "decode/trio_schedule.hpp"

namespace snapmla::cuda {
namespace {

using Cfg = Fp8TrioConfig;
using Smem = Fp8TrioView;
constexpr int kConsumers = Cfg::kConsumers;
constexpr int kConsumerThreads = 128 * kConsumers;

// The P and Free hand-offs (`kBase + owner`) over all three consumers.
template <Fp8TrioBarrier kBase>
__device__ __forceinline__ void trio_sync(int owner) {
  ptx::named_barrier(int(kBase) + owner, kConsumerThreads);
}
template <Fp8TrioBarrier kBase>
__device__ __forceinline__ void trio_arrive(int owner) {
  ptx::named_barrier_arrive(int(kBase) + owner, kConsumerThreads);
}

// rescale_accumulate: o = o * r (per row) + P' V^T of page jj (its V^T slot and phase: vs) for
// consumer c's slice (issued and committed, not waited for).
__device__ __forceinline__ void rescale_accumulate(float (&o)[Cfg::kOutTiles][4], const float (&r)[2], const Smem& sm,
                                                   int jj, trio::PageSlot vs, int c) {
  scale_rows(o, r);
  const uint8_t* pt = sm.p_tile(jj);
  const uint8_t* vt = sm.vt_slice(vs.slot, c);
  mbar::wait(&sm.vt_full[vs.slot], vs.parity);
  wg::fence_operands(o);
  wg::fence();
  wg::mma_64x176x32_e4m3_ss(o, wg::desc(pt, 128, 512), wg::desc(vt, 128, 512));
  wg::mma_64x176x32_e4m3_ss(o, wg::desc(pt + 256, 128, 512), wg::desc(vt + 256, 128, 512));
  wg::commit();
}

// apply_page_pv: another consumer's page jj (vs: its V^T slot, which is also its owner's index, and
// phase) applied to this consumer's state and slice: its P' and factors taken (P hand-off), l and
// sigma moved into its domain, and its PV issued.
__device__ __forceinline__ void apply_page_pv(float (&o)[Cfg::kOutTiles][4], SoftmaxState& st, const Smem& sm,
                                              const RowView& rv, int jj, trio::PageSlot vs, int c) {
  trio_sync<Fp8TrioBarrier::kP>(vs.slot);
  float r[2];
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const float2 x = sm.factors_of(jj, rv.r0 + 8 * ri);
    r[ri] = apply_page(st, ri, x.x, x.y, 0.f);
  }
  rescale_accumulate(o, r, sm, jj, vs, c);
}

// After this consumer's PV of page jj = j + d (its V^T slot: vs) has retired: the slot released,
// and, unless this consumer takes the page's P' slot next (it owns page jj + 2: d = -2), the owner
// of page jj + 2 told that its P' and factors may go there (Free).
__device__ __forceinline__ void retire_page_pv(const Smem& sm, int jj, trio::PageSlot vs, int taker, int c, int nblk) {
  mbar::arrive(&sm.vt_empty[vs.slot]);
  if (taker != c && jj + 2 < nblk) trio_arrive<Fp8TrioBarrier::kFree>(taker);
}

// next_score: the QK of page jn (issued and committed). The ring's full barrier of page jn's stage
// tells phases apart by parity only, and with two stages and pages dealt three ways this consumer
// may come to it while the stage still holds page jn - 4 (page jn - 2 not landed yet): the wait
// would then pass on the old phase. So where `guard`, it first waits for page jn - 2's V^T (vs),
// which is written only after that page landed and cannot move on to page jn + 1 before this
// consumer's PV of page jn - 2, which comes later (page jn - 2 is the next page it applies). The
// callers guard the QK of page j + 3 and the first QK of consumer 2 (page 2): the QK past the
// last page repeats page nblk - 1, whose page nblk - 3 this consumer has applied already.
__device__ __forceinline__ void next_score(float (&acc)[8][4], const Smem& sm, uint64_t qr, uint64_t qn, int jn,
                                           bool guard, trio::PageSlot vs) {
  if (guard) mbar::wait(&sm.vt_full[vs.slot], vs.parity);
  score_rope_smem(acc, sm, qr, qn, jn);
}

// One iteration k of consumer c over its page j = 3 k + c (past the last page, j <= nblk + 1, only
// the other consumers' last pages), in kOrder (TrioOrder: the PV of page j - 2 before or after the
// softmax of page j). Pages j + d's V^T slots (also their owners) and phases: trio_schedule.hpp.
// The waits are on every path: ptxas serializes every wgmma when it cannot see a group retired
// before its registers are used.
template <ScoreStep kStep, TrioOrder kOrder>
__device__ __forceinline__ void trio_iteration(float (&o)[Cfg::kOutTiles][4], float (&acc)[8][4], SoftmaxState& st,
                                               const Smem& sm, const RowView& rv, const Work& w,
                                               uint64_t qr, uint64_t qn, int j, int k, int c, int nblk) {
  const bool mine = j < nblk;
  const bool before2 = j >= 2 && j - 2 < nblk, before1 = j >= 1 && j - 1 < nblk;
  const trio::PageSlot page2 = trio::page_slot(c, k, -2), page1 = trio::page_slot(c, k, -1);
  const trio::PageSlot page0 = trio::page_slot(c, k, 0), next1 = trio::page_slot(c, k, 1);
  constexpr bool kPvFirst = kOrder == TrioOrder::kPvFirst;
  if (kPvFirst && before2) apply_page_pv(o, st, sm, rv, j - 2, page2, c);
  EarlyPage e;
  if (mine) e = page_factors_early<kStep>(acc, sm, rv, w, j, page1.slot, c, nblk);
  if (!kPvFirst && before2) apply_page_pv(o, st, sm, rv, j - 2, page2, c);
  wg::wait<0>();
  wg::fence_operands(o);
  if (before2) retire_page_pv(sm, j - 2, page2, trio::slot_taker(c, -2), c, nblk);
  if (before1) apply_page_pv(o, st, sm, rv, j - 1, page1, c);
  float r_own[2] = {1.f, 1.f};
  if (mine) {
    if (j >= 2) trio_sync<Fp8TrioBarrier::kFree>(c);  // the others' PVs of page j - 2 are done
    write_page_p(acc, sm, rv, e, j);
    if (rv.q == 0) {
      sm.factors_of(j, rv.r0) = make_float2(e.f.sig[0], e.f.rho[0]);
      sm.factors_of(j, rv.r0 + 8) = make_float2(e.f.sig[1], e.f.rho[1]);
    }
    trio_arrive<Fp8TrioBarrier::kP>(c);
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) r_own[ri] = apply_page(st, ri, e.f.sig[ri], e.f.rho[ri], e.f.lsum[ri]);
  }
  wg::wait<0>();
  wg::fence_operands(o);
  if (before1) retire_page_pv(sm, j - 1, page1, trio::slot_taker(c, -1), c, nblk);
  if (mine) {
    ptx::named_barrier(int(Fp8TrioBarrier::kOwnPage) + c, 128);  // all of this consumer's P'(j) is stored
    rescale_accumulate(o, r_own, sm, j, page0, c);
  }
  next_score(acc, sm, qr, qn, min(j + 3, nblk - 1), j + 3 < nblk, next1);
  wg::wait<1>();
  wg::fence_operands(o);
  if (mine) retire_page_pv(sm, j, page0, trio::slot_taker(c, 0), c, nblk);
}

template <ScoreStep kStep, TrioOrder kOrder>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    decode_fp8_trio_kernel(const __grid_constant__ DecodeParams p, const __grid_constant__ CUtensorMap tm_latent,
                           const __grid_constant__ CUtensorMap tm_rope, const __grid_constant__ CUtensorMap tm_q,
                           const __grid_constant__ CUtensorMap tm_q_rope) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  dependents_at_start(p);  // a programmatic combine's blocks may start (they wait for this grid)
  const SplitRange range = cta_splits(p, reinterpret_cast<int*>(smem_raw));  // (a word of the stages, loaded later)
  if (range.first >= range.last) return;
  const Smem sm(smem_raw);
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  const int row0 = grid_row0(p);
  // A stage is read by its page's owner (QK, scales) and the transposers; the Q tiles come with two
  // arrivals (latent, rope), each with its bytes. Again before each further split of the worker
  // (split_boundary).
  const auto init_barriers = [&] {
    sm.ring.init(128 + Cfg::kTransposers, 2);
    sm.init_vt();
  };
  start_cta(smem_raw, init_barriers, &tm_latent, &tm_rope, &tm_q, &tm_q_rope);

  if (wg == 0) {
    ptx::setmaxnreg_dec<Cfg::kProducerRegs>();
    if (t >= Cfg::kLoaderThreads) {
      // 32 registers: two of a unit's ldmatrix in flight (Fp8TrioView).
      const int tw = uniform_in_warp<RoleIndex::kUniform>((t - Cfg::kLoaderThreads) / 32);
      transpose_splits<Cfg::kThreads>(p, range, sm, tw, TransposeLanes(t % 32));
      return;
    }
    for (int item = range.first; item < range.last; ++item) {
      if (item > range.first) split_boundary<Cfg::kThreads>(init_barriers);
      const Work w = work_of(p, item);
      if (t == 0) {
        const int row = int(int64_t(w.seq) * p.rows + row0);
        load_q_tile<kLatentDim, 1>(&tm_q, sm.q_latent, row, sm.ring.qbar);
        mbar::arrive_expect_tx(sm.ring.qbar, Cfg::kRows * kRopeDim * 2);
        tma::load_2d(sm.q_rope, &tm_q_rope, 0, row, sm.ring.qbar);
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
    const int c = uniform_in_warp<RoleIndex::kUniform>(wg) - 1;  // owns pages j = c (mod 3); output slice c
    const int warp = uniform_in_warp<RoleIndex::kUniform>(t / 32), lane = t % 32;
    // Score factors; in log2 units under the base-2 step (page_factors_early), back at the end.
    constexpr bool kBase2 = kStep == ScoreStep::kFolded;
    const RowView rv = row_view<kBase2>(p, w, row0, warp, lane);
    SoftmaxState st;
    float o[Cfg::kOutTiles][4];
#pragma unroll
    for (int n = 0; n < Cfg::kOutTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    mbar::wait(sm.ring.qbar, 0);

    float acc[8][4];  // S of this consumer's page, issued behind the previous iteration's PVs
    const uint64_t qn = wg::desc_sw128(sm.q_latent), qr = wg::desc_sw128(sm.q_rope);
    // Every iteration issues exactly one QK and waits for it (past the last page it repeats the
    // last one, whose stage still holds it: no page of the split follows it into the ring).
    const int jlast = nblk > 0 ? nblk + 1 : -1;
    // Consumer 2's first QK (page 2) guards against the stage's page 0 as next_score says (page 0's
    // V^T: slot 0, phase 0).
    if (nblk > 0) next_score(acc, sm, qr, qn, min(c, nblk - 1), c == 2 && nblk > 2, trio::PageSlot{0, 0});
    for (int j = c, k = 0; j <= jlast; j += kConsumers, ++k) {
      wg::wait<0>();
      wg::fence_operands(acc);
      trio_iteration<kStep, kOrder>(o, acc, st, sm, rv, w, qr, qn, j, k, c, nblk);
    }
    wg::wait<0>();
    wg::fence_operands(acc);
    sum_consumer_parts<kConsumers>(st, sm.xl, c, rv.r0, rv.q, int(Fp8TrioBarrier::kAllConsumers));
    dependents_after_pages(p, range, item);
    // Every page was acquired before that barrier; a bad length faults the whole sequence.
    const bool fault = sm.ring.faulted() || w.bad_len;
    finish_rows<kBase2>(st, sm, rv, nblk);
    // Past that barrier no wgmma is in flight and every page was consumed: the page stages are free.
    const int n_from = c == kConsumers - 1 ? Cfg::kLastOverlapTiles : 0;
    if (w.single)
      write_rows_assembled(p, w, st, o, sm.stage, row0, rv.r0, Cfg::dim0(c), n_from, rv.q, c == 0, fault,
                           int(Fp8TrioBarrier::kAllConsumers), kConsumerThreads, threadIdx.x - 128);
    else
      write_partials(p, w, st, o, row0 + 16 * warp, Cfg::dim0(c), lane, c == 0, fault, n_from);
  }
}

// The kernel of the score step and the iteration order (lab options), plus the combine.
template <ScoreStep kStep>
void launch_trio(TrioOrder order, const DecodeParams& p, const DecodeOptions& options, const CUtensorMap& tm_latent,
                 const CUtensorMap& tm_rope, const CUtensorMap& tm_q, const CUtensorMap& tm_q_rope) {
  constexpr int kSmem = int(sizeof(Fp8TrioSmem));
  if (order == TrioOrder::kSoftmaxFirst)
    launch_decode<Fp8TrioConfig, SplitKernels<decode_fp8_trio_kernel<kStep, TrioOrder::kSoftmaxFirst>>>(
        "decode_fp8", kSmem, p, options, tm_latent, tm_rope, tm_q, tm_q_rope);
  else
    launch_decode<Fp8TrioConfig, SplitKernels<decode_fp8_trio_kernel<kStep, TrioOrder::kPvFirst>>>(
        "decode_fp8", kSmem, p, options, tm_latent, tm_rope, tm_q, tm_q_rope);
}

}  // namespace

void launch_decode_fp8_trio(ScoreStep step, const DecodeParams& p, const DecodeOptions& options,
                            const CUtensorMap& tm_latent, const CUtensorMap& tm_rope, const CUtensorMap& tm_q,
                            const CUtensorMap& tm_q_rope) {
  const TrioOrder order = trio_order("decode_fp8");  // a lab option: read (and checked) on every call
  if (step == ScoreStep::kFolded)
    launch_trio<ScoreStep::kFolded>(order, p, options, tm_latent, tm_rope, tm_q, tm_q_rope);
  else
    launch_trio<ScoreStep::kReference>(order, p, options, tm_latent, tm_rope, tm_q, tm_q_rope);
}

}  // namespace snapmla::cuda
