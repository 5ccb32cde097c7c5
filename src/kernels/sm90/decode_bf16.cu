// decode_bf16 (version 4b): the BF16 baseline, FlashMLA's arithmetic (bf16 QK and PV, P rounded
// to bf16 per 64-token page at the running max, fp32 accumulators) on a TMA page pipeline with
// paired pages; decode_fp8's plan minus what FP8 needs (no V transposition: BF16 wgmma reads V
// MN-major straight from the page; no P' scales).
//
// CTA = one split of one sequence x 64 query rows, 3 warpgroups:
//   WG0  producer. One thread requests the Q latent tile (TMA, eight 64 x 64 boxes, the pages'
//        layout), then streams pages into a 2-stage ring with TMA, each page as 9 boxes of 64 tokens x 64
//        dims (128-byte swizzle) in three groups with their own full / empty barriers: the rope
//        box, V half 0 (dims 0-255) and V half 1. Then the warpgroup zeroes the tokens past the
//        split end of a partial last page (cache slots there may hold anything, and 0 x NaN is
//        NaN in PV).
//   WG1, WG2  consumers on pairs of pages (A, B). Consumer c computes S for page A (c = 0) or
//        B (c = 1): the rope product from Q registers, then the latent from the Q tile. Both
//        accumulate PV of both pages for their 256 output dims (HGMMA m64n256k16, P and V from
//        shared memory), in page order, as the reference does:
//          consumer 0: P_A at m_a = max(m, max S_A), hands P_A and m_a over, PV(A);
//          consumer 1: takes m_a, PV(A), and under it P_B at m_b = max(m_a, max S_B), hands
//          P_B and m_b over; both rescale by exp(m_a - m_b) and add PV(B).
//        So consumer 1's softmax runs under consumer 0's first PV and the two hand-offs are
//        one-way (bar.arrive / bar.sync). P goes into the rope box of its page (the QK has read
//        it; the box is released after both PVs). (Under Bf16MaxHandOff::kEarly, a lab option,
//        consumer 0 hands m_a over before its exponentials and the two softmaxes run together.)
// Why the groups: Q (64 KB) and two 72 KB stages fill shared memory, so there is no third stage
// to load into while a pair is computed; a group is loaded again as soon as its last reader is
// done (page A's halves after the first PVs), and the QK takes the rope and its own half first.
// Page B's cycle (load, QK, softmax, PVs) sets the pace, so consumer 0 issues its next QK only
// once B is released, leaving the tensor cores to PV(B).
// Design: docs/design.md; measurements: docs/kernels.md.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <type_traits>

#include "kernels/common/check.cuh"
#include "kernels/common/mbarrier.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/tma.cuh"
#include "kernels/common/wgmma.cuh"
#include "kernels/kernels.hpp"
#include "decode/combine_tail.cuh"
#include "decode/epilogue.cuh"
#include "decode/launch.hpp"
#include "decode/tile_launches.hpp"
#include "decode/pipeline.cuh"
#include "decode/scheduler.cuh"
#include "decode/softmax.cuh"
#include "decode/tensor_map.hpp"

namespace snapmla::cuda {
namespace {

constexpr int kRows = kTileRows;
// The CTA: a producer warpgroup (loads) and two consumer warpgroups (a page each, in turn).
struct Bf16Config : WarpgroupRoles<2, 40, 232> {};
// Under OwnPagePv::kRegisters: the owner's P (16 registers) stays live under the PV it feeds, and
// ptxas cannot tell the two consumers' roles apart (the owner's softmax of page B meets page A's P
// of the other role), which spilled 24 bytes at 232; the producer fits in setmaxnreg's least.
struct Bf16OwnRegsConfig : WarpgroupRoles<2, 24, 240> {};
template <OwnPagePv kOwnPv>
using Bf16ConfigOf = std::conditional_t<kOwnPv == OwnPagePv::kRegisters, Bf16OwnRegsConfig, Bf16Config>;
// Named barrier ids (id 0 is __syncthreads'). The page hand-off of consumer `owner` takes
// kHandOff + 2 owner (both consumers: the owner's P and max are written) and kOwnerWarps +
// 2 owner (the owner's own warps); kTailZero is the producer's (a partial last page's zeroing).
// add_other_sums runs after the page loop, when no hand-off is pending, on kHandOff's first id.
enum class Bf16Barrier : int {
  kHandOff = 1,    // 1, 3
  kOwnerWarps = 2, // 2, 4
  kTailZero = 5,
  kAddSums = 1,
  kQkIssued = 6,  // Bf16QkOrder::kPageAFirst: consumer 0 has issued its next QK (both consumers)
  kEarlyMax = 7,  // Bf16MaxHandOff::kEarly: page A's running max is written (both consumers)
};
constexpr int kBoxBytes = kBf16BoxBytes;             // 8 KB: 64 tokens x 64 dims (pipeline.cuh)
constexpr int kBoxes = kBf16Boxes;                   // 9: latent dims 64 b .. 64 b + 63, then rope
constexpr int kRopeBox = kBoxes - 1;
constexpr int kStageBytes = kBf16PageBytes;          // 72 KB
constexpr int kQnBytes = kRows * kLatentDim * 2;     // 64 KB: 8 boxes of 64 rows x 64 dims, as a page's
static_assert(kCombineTailScratchBytes<128 * Bf16Config::kConsumers> <= kQnBytes, "the combine tail's scratch fits the Q tile");
// Load groups of a stage: 0 the rope box, 1 + h the latent boxes 4 h .. 4 h + 3 (V half h).
constexpr int kGroups = 3;
// The shared-memory plan: offsets and size from this struct, not from hand-kept sums. The Q tile
// and the stages come by TMA with the 128-byte swizzle (1024-byte alignment, given by the
// dynamic shared memory's base).
struct Bf16SmemLayout {
  uint8_t qn[kQnBytes];
  uint8_t stages[2][kStageBytes];
  uint64_t full[2][kGroups];   // the producer's arrival with the group's bytes
  uint64_t empty[2][kGroups];  // one arrival per warp of its readers (rope box and P: both)
  uint64_t qbar;               // one arrival with the Q tile's bytes
  uint64_t tail;               // 128 arrivals: the partial last page's excess tokens are zero
  float xmax[4 * kRows];       // [2][64]: each consumer's running max after its page; [2][64]: row sums
};
static_assert(offsetof(Bf16SmemLayout, stages) % 1024 == 0, "TMA boxes with the 128-byte swizzle");
static_assert(offsetof(Bf16SmemLayout, full) % 8 == 0, "mbarriers are 8-byte aligned");
static_assert(offsetof(Bf16SmemLayout, stages) == kQnBytes && 8 * kPartialStageBytes <= offsetof(Bf16SmemLayout, full),
              "the staged partials fit the Q tile and the stages, which follow it");
constexpr int kSmemBytes = int(sizeof(Bf16SmemLayout));
static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on sm_90");

// The kernel's view of the plan: pointers into it, with the stages' and barriers' addressing.
struct Smem {
  uint8_t* qn;
  uint8_t* stages;
  uint64_t* full;   // [2][kGroups]
  uint64_t* empty;  // [2][kGroups]
  uint64_t* qbar;
  uint64_t* tail;
  float* xmax;      // [4][64]
  __device__ explicit Smem(uint8_t* base)
      : qn(reinterpret_cast<Bf16SmemLayout*>(base)->qn),
        stages(&reinterpret_cast<Bf16SmemLayout*>(base)->stages[0][0]),
        full(&reinterpret_cast<Bf16SmemLayout*>(base)->full[0][0]),
        empty(&reinterpret_cast<Bf16SmemLayout*>(base)->empty[0][0]),
        qbar(&reinterpret_cast<Bf16SmemLayout*>(base)->qbar),
        tail(&reinterpret_cast<Bf16SmemLayout*>(base)->tail),
        xmax(reinterpret_cast<Bf16SmemLayout*>(base)->xmax) {}
  __device__ uint8_t* box(int j, int b) const { return stages + (j % 2) * kStageBytes + b * kBoxBytes; }
  __device__ uint64_t* full_of(int j, int g) const { return &full[(j % 2) * kGroups + g]; }
  __device__ uint64_t* empty_of(int j, int g) const { return &empty[(j % 2) * kGroups + g]; }
  __device__ void init() const {
    for (int i = 0; i < 2 * kGroups; ++i) {
      mbar::init(&full[i], 1);
      mbar::init(&empty[i], i % kGroups == 0 ? 8 : 4);  // the rope box (then P): both consumers
    }
    mbar::init(qbar, 1);
    mbar::init(tail, 128);
  }
};

// Page j's phase of its stage's barriers.
__device__ __forceinline__ uint32_t phase(int j) { return (j / 2) & 1; }

// Loader (one thread): group g of page j (cache page `page`) into its stage, once its last
// reader of page j - 2 released it. An out-of-range page index loads nothing (the stage keeps
// stale data): the consumers check every index of the split at the end and turn their rows
// into NaN.
__device__ __forceinline__ void load_group(const CUtensorMap* tm, const Smem& sm, int j, int g, int32_t page,
                                           bool ok) {
  if (j >= 2) mbar::wait(sm.empty_of(j, g), phase(j) ^ 1);
  uint64_t* bar = sm.full_of(j, g);
  if (!ok) {
    mbar::arrive_expect_tx(bar, 0);
    return;
  }
  const int y = page * kPageSize;
  if (g == 0) {
    mbar::arrive_expect_tx(bar, kBoxBytes);
    tma::load_2d(sm.box(j, kRopeBox), tm, kRopeBox * (kTmaBoxBytes / 2), y, bar);
    return;
  }
  mbar::arrive_expect_tx(bar, 4 * kBoxBytes);
#pragma unroll
  for (int b = 4 * (g - 1); b < 4 * g; ++b) tma::load_2d(sm.box(j, b), tm, b * (kTmaBoxBytes / 2), y, bar);
}

// O = O + P V for output half c: P (64 rows x 64 tokens) from a P buffer, V the page's latent
// boxes 4 c .. 4 c + 3 read MN-major (issued and committed, not waited for).
__device__ __forceinline__ void pv_page(float (&o)[32][4], const uint8_t* pt, const Smem& sm, int j, int c) {
  const uint8_t* v = sm.box(j, 4 * c);
  wg::fence_operands(o);
  wg::fence();
#pragma unroll
  for (int ks = 0; ks < kPageSize / 16; ++ks)
    wg::mma_64x256x16_bf16_ss_tb(o, wg::desc(pt + ks * 256, 128, 1024), wg::desc_sw128_mn(v + ks * 2048, kBoxBytes));
  wg::commit();
}

// The same with P from registers (OwnPagePv::kRegisters, the owner's own page): pr[ks] is tokens
// 16 ks .. 16 ks + 15 of the thread's rows in the m16n8k16 A layout.
__device__ __forceinline__ void pv_page_regs(float (&o)[32][4], const uint32_t (&pr)[4][4], const Smem& sm, int j,
                                             int c) {
  const uint8_t* v = sm.box(j, 4 * c);
  wg::fence_operands(o);
  wg::fence();
#pragma unroll
  for (int ks = 0; ks < kPageSize / 16; ++ks)
    wg::mma_64x256x16_bf16_rs_tb(o, pr[ks], wg::desc_sw128_mn(v + ks * 2048, kBoxBytes));
  wg::commit();
}

// Latent values of tokens [from, to) of page j that are not finite (bf16 exponent all ones) set
// to 0, by the 128 threads of one consumer (t: its thread). The latent boxes hold 64 dims of 64
// tokens each, 128-byte rows with the 128-byte swizzle (16-byte chunk x of row r at x ^ r % 8).
__device__ __forceinline__ void zero_nonfinite_tokens(const Smem& sm, int j, int from, int to, int t) {
  for (int tt = from; tt < to; ++tt)
    for (int d = t; d < kLatentDim; d += 128) {
      uint16_t* v = reinterpret_cast<uint16_t*>(sm.box(j, d / 64) + tt * kTmaBoxBytes +
                                                ((((d % 64) / 8) ^ (tt % 8)) * 16) + (d % 8) * 2);
      if ((*v & 0x7F80u) == 0x7F80u) *v = 0;
    }
}

// kStep: the score step on fully visible pages (ScoreStep, a lab option; softmax.cuh). kOwnPv:
// where the owner's PV of its own page reads P (OwnPagePv, a lab option; params.hpp). kRole:
// where the consumers' indices come from (RoleIndex, a lab option; params.hpp). kTail: the split
// sequences merged by the kernel's own combine tail (SNAPMLA_COMBINE_FUSED, a lab option). kStore:
// how a split's partials are stored (PartialStore, a lab option; params.hpp). kQkOrder: the
// order of the next pair's QKs (Bf16QkOrder, a lab option; params.hpp). kMaxHandOff: when page A's
// running max goes to consumer 1 (Bf16MaxHandOff, a lab option; params.hpp).
template <ScoreStep kStep, OwnPagePv kOwnPv, RoleIndex kRole, bool kTail = false,
          PartialStore kStore = PartialStore::kFragments, Bf16QkOrder kQkOrder = Bf16QkOrder::kOnRelease,
          Bf16MaxHandOff kMaxHandOff = Bf16MaxHandOff::kWithP>
__global__ void __launch_bounds__(Bf16Config::kThreads, 1)
    decode_bf16_kernel(const __grid_constant__ DecodeParams p, const __grid_constant__ CUtensorMap tm_kv,
                       const __grid_constant__ CUtensorMap tm_q) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  using Cfg = Bf16ConfigOf<kOwnPv>;
  dependents_at_start(p);  // a programmatic combine's blocks may start (they wait for this grid)
  const SplitRange range = cta_splits(p, reinterpret_cast<int*>(smem_raw));  // (a word of the stages, loaded later)
  if (range.first >= range.last) return;
  const Smem sm(smem_raw);
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  const int row0 = grid_row0(p);
  // Again before each further split of the worker (split_boundary).
  const auto init_barriers = [&] { sm.init(); };
  start_cta(smem_raw, init_barriers);

  if (wg == 0) {
    ptx::setmaxnreg_dec<Cfg::kProducerRegs>();
    for (int item = range.first; item < range.last; ++item) {
      if (item > range.first) split_boundary<Cfg::kThreads>(init_barriers);
      // (The own-page PV's 24-register producer keeps the search: the window lookup spills there.)
      const Work w = kOwnPv == OwnPagePv::kRegisters ? work_of(p, item) : lookup_work(p, item);
      const int nblk = w.pages();
      if (t == 0) {
        // The Q latent tile first: eight boxes of the [batch * rows, 576] query plane (the rope part
        // goes to the consumers' registers).
        load_q_tile<kLatentDim * 2, 2>(&tm_q, sm.qn, int(int64_t(w.seq) * p.rows + row0), sm.qbar);
        for (int a = 0; a < nblk; a += 2) {
          const int b = a + 1;
          const int32_t pa = page_of(p, w, w.begin + a * kPageSize);
          const int32_t pb = b < nblk ? page_of(p, w, w.begin + b * kPageSize) : 0;
          const bool oka = page_ok(p, pa), okb = page_ok(p, pb);
          // In the order the groups come free: page A's after both PVs of A, then page B's.
          load_group(&tm_kv, sm, a, 1, pa, oka);
          load_group(&tm_kv, sm, a, 2, pa, oka);
          load_group(&tm_kv, sm, a, 0, pa, oka);
          if (b < nblk) {
            load_group(&tm_kv, sm, b, 2, pb, okb);
            load_group(&tm_kv, sm, b, 0, pb, okb);
            load_group(&tm_kv, sm, b, 1, pb, okb);
          }
        }
      }
      // A partial last page: zero its tokens past the split end in the V boxes once they land.
      // Waited for only after its loads were issued: the stage's full barriers have then completed
      // every earlier phase, so the parity names this page's.
      __syncwarp();
      ptx::named_barrier(int(Bf16Barrier::kTailZero), 128);
      const int last = nblk - 1, ntok = w.end - (w.begin + last * kPageSize);
      if (nblk > 0 && ntok < kPageSize) {
        if (page_ok(p, page_of(p, w, w.begin + last * kPageSize))) {
          mbar::wait(sm.full_of(last, 1), phase(last));
          mbar::wait(sm.full_of(last, 2), phase(last));
          const uint4 zero = make_uint4(0, 0, 0, 0);
          const int per_box = (kPageSize - ntok) * (kTmaBoxBytes / 16);
          for (int i = t; i < 8 * per_box; i += 128) {
            const int b = i / per_box, k = i % per_box;
            *reinterpret_cast<uint4*>(sm.box(last, b) + ntok * kTmaBoxBytes + k * 16) = zero;
          }
          wg::fence_proxy_async();  // written with st.shared, read by wgmma
        }
        mbar::arrive(sm.tail);
      }
    }
    return;
  }

  ptx::setmaxnreg_inc<Cfg::kConsumerRegs>();
  for (int item = range.first; item < range.last; ++item) {
    if (item > range.first) split_boundary<Cfg::kThreads>(NoInit{});
    const Work w = lookup_work(p, item);
    const int nblk = w.pages();
    const bool partial_last = nblk > 0 && w.end - (w.begin + (nblk - 1) * kPageSize) < kPageSize;
    const int c = uniform_in_warp<kRole>(wg) - 1;  // owns page 2 k + c of each pair; output half c
    const int warp = uniform_in_warp<kRole>(t / 32), lane = t % 32, g = lane / 4, q = lane % 4;
    const int r0 = 16 * warp + g;  // the thread's first row in the tile (and r0 + 8)
    int64_t row[2];
    int vis[2];
    uint32_t qa[4][4];  // Q rope, the rope product's A operand
    load_q_rows(p, w, row0, r0, q, p.q_bf16 + kLatentDim, kHeadDim, row, vis, qa);
    // Under the base-2 step scores and maxima are in log2 units (back at the end), and a poisoned
    // row's page max is NaN, which the running max must keep (fmaxf would drop it).
    constexpr bool kBase2 = kStep == ScoreStep::kFolded;
    constexpr bool kOwnRegs = kOwnPv == OwnPagePv::kRegisters;
    constexpr float kUnit = kBase2 ? 1.f : kLog2e;
    const float f = kBase2 ? p.softmax_scale * kLog2e : p.softmax_scale;
    const float factor[2] = {f, f};
    SoftmaxState st;
    float o[32][4];
    uint32_t pr[4][4];  // kOwnRegs: the owner's P of its page, the own PV's A operand (16 ks + k)
#pragma unroll
    for (int n = 0; n < 32; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    mbar::wait(sm.qbar, 0);

    // S of page j into acc, in two commit groups: the rope box and this consumer's V half (the
    // groups that come free first), then the other half.
    float acc[8][4];
    auto qk_half = [&](int j, int h) {
#pragma unroll
      for (int b = 4 * h; b < 4 * h + 4; ++b) {
        const uint64_t qb = wg::desc_sw128(sm.qn + b * kBoxBytes), kb = wg::desc_sw128(sm.box(j, b));
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          wg::mma_64x64x16_bf16_ss(acc, wg::desc_add(qb, kk * 32), wg::desc_add(kb, kk * 32));
      }
    };
    // `real`: the product is used. A discarded one (see below) waits for nothing: it may read a
    // stage while a copy lands, and waiting could deadlock (the stage may be the other
    // consumer's, whose next load waits for this consumer's release).
    auto qk_first = [&](int j, bool real) {
      if (real) {
        mbar::wait(sm.full_of(j, 0), phase(j));
        mbar::wait(sm.full_of(j, 1 + c), phase(j));
      }
      wg::fence_operands(acc);
      wg::fence();
      const uint64_t kr = wg::desc_sw128(sm.box(j, kRopeBox));
      wg::mma_64x64x16_bf16_rs_zero(acc, qa[0], kr);
#pragma unroll
      for (int ks = 1; ks < 4; ++ks) wg::mma_64x64x16_bf16_rs(acc, qa[ks], wg::desc_add(kr, ks * 32));
      qk_half(j, c);
      wg::commit();
    };
    auto qk_second = [&](int j, bool real) {
      if (real) mbar::wait(sm.full_of(j, 2 - c), phase(j));
      wg::fence();
      qk_half(j, 1 - c);
      wg::commit();
    };
    // Under kPageAFirst consumer 1 issues each QK (the first, and each pair's) after consumer 0 has
    // issued its own: both issue one per pair, so the hand-off stays balanced.
    auto before_qk = [&] {
      if constexpr (kQkOrder == Bf16QkOrder::kPageAFirst)
        if (c == 1) ptx::named_barrier(int(Bf16Barrier::kQkIssued), 256);
    };
    auto after_qk = [&] {
      if constexpr (kQkOrder == Bf16QkOrder::kPageAFirst)
        if (c == 0) ptx::named_barrier_arrive(int(Bf16Barrier::kQkIssued), 256);
    };
    // Every pair issues the same wgmmas in every consumer, with no wgmma under a condition that
    // ptxas cannot see is warpgroup-uniform (it would serialize them all): a consumer without a
    // page in the pair (odd page count) computes a discarded product and adds the last page with
    // P = 0, and after the last pair the QK is a discarded repeat of the last page.
    if (nblk > 0) {
      before_qk();
      qk_first(min(c, nblk - 1), c < nblk);
      qk_second(min(c, nblk - 1), c < nblk);
      after_qk();
    }
    const int band = band_start(p, w);  // tokens from here on are not seen by every query row
    for (int k = 0; 2 * k < nblk; ++k) {
      const int ja = 2 * k, jb = 2 * k + 1, j = ja + c;  // the pair's pages; this consumer's
      const bool mine = j < nblk, has_b = jb < nblk;
      const int blk = w.begin + j * kPageSize;
      const bool full = __all_sync(0xffffffffu, blk + kPageSize <= min(vis[0], vis[1]));
      const bool none = __all_sync(0xffffffffu, blk >= max(vis[0], vis[1]));
      const bool live = mine && !none;
      float mx[2] = {-INFINITY, -INFINITY}, sum[2] = {0.f, 0.f}, unused[2], m_a[2], m_b[2], f[2];
      wg::wait<0>();
      wg::fence_operands(acc);
      if (mine) {
        if (full && kBase2) page_scores_folded<false>(acc, factor, nullptr, q, mx);
        else if (full) page_scores<false, false, true>(acc, factor, vis, blk, nullptr, q, mx);
        else if (!none) page_scores<true, false, true>(acc, factor, vis, blk, nullptr, q, mx);
      }
      // The running max after this consumer's page, from the max before it (`prev`): a NaN page max
      // stays NaN under the base-2 step (the reference's poisoned row; fmaxf would drop it).
      const auto page_max = [&](float prev, int ri) {
        return kBase2 && mx[ri] != mx[ri] ? mx[ri] : fmaxf(prev, mx[ri]);
      };
      // This consumer's rows of m into its xmax slot, and consumer `owner`'s out of its slot.
      const auto publish_max = [&](const float (&m)[2]) {
        if (q == 0) {
          sm.xmax[c * kRows + r0] = m[0];
          sm.xmax[c * kRows + r0 + 8] = m[1];
        }
      };
      const auto take_max = [&](int owner, float (&m)[2]) {
#pragma unroll
        for (int ri = 0; ri < 2; ++ri) m[ri] = sm.xmax[owner * kRows + r0 + 8 * ri];
      };
      // P of page j as bf16 into the rope box of its stage (the QK has read it), K-major: row r's
      // tokens 8 n + 2 q, + 1 are one word; zeros without a page. Under kOwnRegs the same words
      // go to pr too. `publish`: m goes to this consumer's xmax slot after them (not where it went
      // there before, Bf16MaxHandOff::kEarly). Returns whether V tokens were zeroed (the same in
      // every thread of the CTA).
      auto write_p = [&](const float (&m)[2], bool publish) {
        if (live) {
          if (full && kBase2) page_probs_by<false, false>(acc, m, factor, nullptr, q, sum, unused);
          else if (kBase2) page_probs_by<true, false>(acc, m, {1.f, 1.f}, nullptr, q, sum, unused);
          else if (full) page_probs<false, false>(acc, m, nullptr, q, sum, unused);
          else page_probs<true, false>(acc, m, nullptr, q, sum, unused);
        }
        uint8_t* pt = sm.box(j, kRopeBox);
#pragma unroll
        for (int ri = 0; ri < 2; ++ri)
#pragma unroll
          for (int n = 0; n < 8; ++n) {
            const uint32_t word = live ? bf16x2_bits(acc[n][2 * ri], acc[n][2 * ri + 1]) : 0u;
            ptx::sts32(pt + km_offset(r0 + 8 * ri, 16 * n + 4 * q, kPageSize * 2), word);
            if constexpr (kOwnRegs) pr[n / 2][2 * (n % 2) + ri] = word;  // A layout: (row, k) = (ri, n % 2)
          }
        // Tokens some query rows do not see (causal, s_q > 1): their non-finite V values set to 0
        // now that this page's QK has read them (those rows' P is 0, and 0 x NaN is NaN in PV; the
        // rows that see them already have a non-finite score).
        const int from = max(band - blk, 0), to = min(kPageSize, w.end - blk);
        const bool zeroed = mine && from < to;
        if (zeroed) zero_nonfinite_tokens(sm, j, from, to, t);
        wg::fence_proxy_async();  // P written with st.shared, read by wgmma
        if (publish) publish_max(m);
        return zeroed;
      };
      // The page of consumer `owner` (0: A, 1: B): the owner turns it into P at m = max(running
      // max, the page's max) and hands P and m over (Bf16Barrier::kHandOff + 2 owner, then kOwnerWarps + 2 owner
      // for its own warps: all of P is written); the other consumer takes m. Under kOwnRegs the
      // owner's PV reads P from its registers, so its own warps wait for each other only where
      // they zeroed V tokens (which that PV reads).
      auto hand_off = [&](int owner, float (&m)[2]) {
        if (c == owner) {
#pragma unroll
          for (int ri = 0; ri < 2; ++ri) m[ri] = page_max(st.m[ri], ri);
          const bool zeroed = write_p(m, true);
          ptx::named_barrier_arrive(int(Bf16Barrier::kHandOff) + 2 * owner, 256);
          if (!kOwnRegs || zeroed) ptx::named_barrier(int(Bf16Barrier::kOwnerWarps) + 2 * owner, 128);
        } else {
          ptx::named_barrier(int(Bf16Barrier::kHandOff) + 2 * owner, 256);
          take_max(owner, m);
        }
      };
      if constexpr (kMaxHandOff == Bf16MaxHandOff::kEarly) {
        // Page A's running max first (kEarlyMax), then both pages' P at once: consumer 0 stores P_A
        // and hands it over (kHandOff) as in hand_off(0); consumer 1 takes m_a, stores P_B at m_b,
        // and hands P_B over (kHandOff + 2) once P_A is there, so that each one-way barrier's next
        // arrival always follows its last wait. m_b is max(m_a, max S_B) as consumer 1's state
        // would give it after page A (row_alpha keeps the max where m_a is -inf).
        if (c == 0) {
#pragma unroll
          for (int ri = 0; ri < 2; ++ri) m_a[ri] = page_max(st.m[ri], ri);
          publish_max(m_a);
          ptx::named_barrier_arrive(int(Bf16Barrier::kEarlyMax), 256);
          const bool zeroed = write_p(m_a, false);
          ptx::named_barrier_arrive(int(Bf16Barrier::kHandOff), 256);
          if (!kOwnRegs || zeroed) ptx::named_barrier(int(Bf16Barrier::kOwnerWarps), 128);
        } else {
          ptx::named_barrier(int(Bf16Barrier::kEarlyMax), 256);
          take_max(0, m_a);
#pragma unroll
          for (int ri = 0; ri < 2; ++ri) m_b[ri] = page_max(m_a[ri] == -INFINITY ? st.m[ri] : m_a[ri], ri);
          const bool zeroed = write_p(m_b, true);
          ptx::named_barrier(int(Bf16Barrier::kHandOff), 256);  // page A's P is written
          ptx::named_barrier_arrive(int(Bf16Barrier::kHandOff) + 2, 256);
          if (!kOwnRegs || zeroed) ptx::named_barrier(int(Bf16Barrier::kOwnerWarps) + 2, 128);
        }
      } else {
        hand_off(0, m_a);
      }
#pragma unroll
      for (int ri = 0; ri < 2; ++ri) f[ri] = pair_alpha(st, ri, m_a[ri], c == 0 ? sum[ri] : 0.f, kUnit);
      if (!(p.skip_unit_rescale && warp_factors_unit(f))) scale_rows(o, f);
      if (partial_last && 2 * k + 2 >= nblk) mbar::wait(sm.tail, 0);
      if (kOwnRegs && c == 0) pv_page_regs(o, pr, sm, ja, c);
      else pv_page(o, sm.box(ja, kRopeBox), sm, ja, c);
      // Page B under page A's PV (st.m is m_a now, so m_b = max(m_a, max S_B)); under kEarly
      // consumer 1 has handed it over already and consumer 0 takes it.
      if constexpr (kMaxHandOff == Bf16MaxHandOff::kEarly) {
        if (c == 0) {
          ptx::named_barrier(int(Bf16Barrier::kHandOff) + 2, 256);
          take_max(1, m_b);
        }
      } else {
        hand_off(1, m_b);
      }
      wg::wait<0>();
      wg::fence_operands(o);
      if (lane == 0) {  // page A: this half and this consumer's share of the rope box are read
        mbar::arrive(sm.empty_of(ja, 1 + c));
        mbar::arrive(sm.empty_of(ja, 0));
      }
#pragma unroll
      for (int ri = 0; ri < 2; ++ri) f[ri] = pair_alpha(st, ri, m_b[ri], c == 1 ? sum[ri] : 0.f, kUnit);
      if (!(p.skip_unit_rescale && warp_factors_unit(f))) scale_rows(o, f);
      if (kOwnRegs && c == 1) pv_page_regs(o, pr, sm, min(jb, nblk - 1), c);
      else pv_page(o, sm.box(jb, kRopeBox), sm, min(jb, nblk - 1), c);
      // Release page B once this PV is done. Its reload is the critical path (each stage's cycle is
      // load, QK, softmax, PVs), so consumer 0's next QK - its page is in page A's stage, loaded
      // early - waits until both consumers released B: it would otherwise share the tensor cores
      // with consumer 1's PV(B) (measured: 630 -> 570 us at h = 128, b = 128, 8K).
      const int jn = min(j + 2, nblk - 1);
      const bool real = j + 2 < nblk;
      wg::wait<0>();
      wg::fence_operands(o);
      if (has_b && lane == 0) {
        mbar::arrive(sm.empty_of(jb, 1 + c));
        mbar::arrive(sm.empty_of(jb, 0));
      }
      if (c == 0 && has_b) mbar::wait(sm.empty_of(jb, 0), phase(jb));
      before_qk();
      qk_first(jn, real);
      qk_second(jn, real);
      after_qk();
    }
    wg::wait<0>();
    wg::fence_operands(acc);
    wg::fence_operands(o);
    const bool fault = split_has_bad_page(p, w, nblk, lane) || w.bad_len;
    // (In a separate area: the other consumer may still be reading this one's last max.)
    add_other_sums(st, sm.xmax + 2 * kRows, c, r0, q, int(Bf16Barrier::kAddSums));
    dependents_after_pages(p, range, item);
    if constexpr (kBase2) {
      st.m[0] *= kLn2;
      st.m[1] *= kLn2;
    }
    // Past add_other_sums' barrier no wgmma is in flight: each warp stages its 8 KB of output in
    // the Q tile (its 16.5 KB of fp32 partials, where staged, from the Q tile on into the stages).
    if (w.single || kStore == PartialStore::kBf16Rows)
      write_rows_staged(p, w, st, o, sm.qn + (4 * c + warp) * 8192, row0 + 16 * warp, 256 * c, lane, c == 0, fault);
    else if (kStore == PartialStore::kStaged)
      write_partials_staged(p, w, st, o, reinterpret_cast<float*>(sm.qn + (4 * c + warp) * kPartialStageBytes),
                            row0 + 16 * warp, 256 * c, lane, c == 0, fault);
    else
      write_partials(p, w, st, o, row0 + 16 * warp, 256 * c, lane, c == 0, fault);
  }
  // SNAPMLA_COMBINE_FUSED: the split sequences' rows merged here, not by the combine kernel.
  // Its scratch: the Q tile, free once the CTA's splits are done.
  if constexpr (kTail) combine_tail<128 * Cfg::kConsumers>(p, kRows, threadIdx.x - 128, reinterpret_cast<float4*>(sm.qn));
}

// The call's lab options (launch.hpp), read once per call.
struct Bf16LabOptions {
  OwnPagePv own_pv = OwnPagePv::kShared;
  Bf16QkOrder qk_order = Bf16QkOrder::kOnRelease;
  Bf16MaxHandOff max_handoff = Bf16MaxHandOff::kWithP;
};

// The kernel of the call's lab options (Bf16QkOrder::kPageAFirst: with the other options' defaults
// only; Bf16MaxHandOff::kEarly: with the broadcast role index, either score step, either source of
// the owner's P and the other options' defaults only; elsewhere the defaults).
template <ScoreStep kStep, RoleIndex kRole>
void launch_bf16(const Bf16LabOptions& lab, const DecodeParams& p, const DecodeOptions& options,
                 const CUtensorMap& tm_kv, const CUtensorMap& tm_q) {
  constexpr auto kRegs = OwnPagePv::kRegisters, kShared = OwnPagePv::kShared;
  constexpr bool kDefault = kStep == ScoreStep::kReference && kRole == RoleIndex::kUniform;
  constexpr auto kStaged = PartialStore::kStaged, kFragments = PartialStore::kFragments;
  constexpr auto kOnRelease = Bf16QkOrder::kOnRelease;
  constexpr auto kEarly = Bf16MaxHandOff::kEarly;
  const bool others_default = lab.own_pv == kShared && lab.qk_order == kOnRelease;
  if constexpr (kRole == RoleIndex::kUniform) {
    if (others_default && lab.max_handoff == kEarly)
      return launch_decode<Bf16Config,
                           SplitKernels<decode_bf16_kernel<kStep, kShared, kRole, false, kFragments, kOnRelease, kEarly>>>(
          "decode_bf16", kSmemBytes, p, options, tm_kv, tm_q);
  }
  if constexpr (kDefault) {
    if (lab.own_pv == kShared && lab.qk_order == Bf16QkOrder::kPageAFirst)
      return launch_decode<Bf16Config, SplitKernels<decode_bf16_kernel<kStep, kShared, kRole, false, kFragments,
                                                                       Bf16QkOrder::kPageAFirst>>>(
          "decode_bf16", kSmemBytes, p, options, tm_kv, tm_q);
  }
  if constexpr (kRole == RoleIndex::kUniform) {
    if (lab.own_pv == kRegs && lab.qk_order == kOnRelease && lab.max_handoff == kEarly)
      return launch_decode<Bf16ConfigOf<kRegs>,
                           SplitKernels<decode_bf16_kernel<kStep, kRegs, kRole, false, kFragments, kOnRelease, kEarly>>>(
          "decode_bf16", kSmemBytes, p, options, tm_kv, tm_q);
  }
  if (lab.own_pv == kRegs)
    launch_decode<Bf16ConfigOf<kRegs>, SplitKernels<decode_bf16_kernel<kStep, kRegs, kRole>>>(
        "decode_bf16", kSmemBytes, p, options, tm_kv, tm_q);
  else if constexpr (kDefault)  // the default kernel: with its split-epilogue twins
    launch_decode<Bf16ConfigOf<kShared>,
                  SplitKernels<decode_bf16_kernel<kStep, kShared, kRole>, decode_bf16_kernel<kStep, kShared, kRole, true>,
                               decode_bf16_kernel<kStep, kShared, kRole, false, kStaged>,
                               decode_bf16_kernel<kStep, kShared, kRole, true, kStaged>,
                               decode_bf16_kernel<kStep, kShared, kRole, false, PartialStore::kBf16Rows>>>(
        "decode_bf16", kSmemBytes, p, options, tm_kv, tm_q);
  else
    launch_decode<Bf16ConfigOf<kShared>, SplitKernels<decode_bf16_kernel<kStep, kShared, kRole>>>(
        "decode_bf16", kSmemBytes, p, options, tm_kv, tm_q);
}

template <ScoreStep kStep>
void launch_bf16(RoleIndex role, const Bf16LabOptions& lab, const DecodeParams& p, const DecodeOptions& options,
                 const CUtensorMap& tm_kv, const CUtensorMap& tm_q) {
  if (role == RoleIndex::kUniform) launch_bf16<kStep, RoleIndex::kUniform>(lab, p, options, tm_kv, tm_q);
  else launch_bf16<kStep, RoleIndex::kThread>(lab, p, options, tm_kv, tm_q);
}

}  // namespace

void decode_bf16(const QueryBf16& q, const PagedBf16Cache& cache, const PageTable& pages,
                 const DecodeOutput& out, const DecodeOptions& options) {
  DecodeParams p = make_params(q.batch, q.seqlen_q, q.num_heads, pages, out, options);
  const ScoreStep step = score_step("decode_bf16");  // the lab options: read (and checked) on every call
  const RoleIndex role = role_index("decode_bf16");
  const Bf16LabOptions lab{own_page_pv("decode_bf16"), bf16_qk_order("decode_bf16"), bf16_max_handoff("decode_bf16")};
  const Bf16Tile tile = bf16_tile("decode_bf16");
  p.skip_unit_rescale = bf16_rescale_changed("decode_bf16");
  if (q.batch == 0) return;
  p.q_bf16 = reinterpret_cast<const uint16_t*>(q.data);
  p.num_pages = cache.num_pages;
  const CUtensorMap tm_kv =
      plane_map(cache.data, cache.num_pages * kPageSize, kHeadDim * 2, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2);
  if (bf16_narrow_tile(tile, p.rows, q.batch)) return launch_decode_bf16_narrow(p, tm_kv, options);
  const CUtensorMap tm_q = plane_map(q.data, int64_t(q.batch) * p.rows, kHeadDim * 2, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2);
  if (step == ScoreStep::kFolded) launch_bf16<ScoreStep::kFolded>(role, lab, p, options, tm_kv, tm_q);
  else launch_bf16<ScoreStep::kReference>(role, lab, p, options, tm_kv, tm_q);
}

}  // namespace snapmla::cuda
