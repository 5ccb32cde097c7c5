// decode_fp8's 64-row tile: its configuration, shared-memory plan and named barriers.
//
// One CTA = one split of one sequence x 64 query rows, three warpgroups:
//   WG0, the producer: warp 0 loads (TMA), warps 1-3 transpose each page's latent into V^T;
//   WG1, WG2, the consumers: consumer c owns the pages j = c (mod 2) (QK and softmax of its own
//   pages) and holds output dims [256 c, 256 c + 256) of all 64 rows (PV of every page).
// The kernel (decode_fp8.cu) is written against these constants; every fragment that hard-wires
// one of them says so with a static_assert here.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/mbarrier.cuh"
#include "kernels/common/wgmma.cuh"
#include "params.hpp"
#include "pipeline.cuh"

namespace snapmla::cuda {

// Warpgroups: a producer (a loading warp and three transposer warps, 56 registers) and two
// consumers (one output half each, 224 registers).
struct Fp8TileConfig : WarpgroupRoles<2, 56, 224> {
  static constexpr int kRows = kTileRows;     // query rows per CTA: one wgmma M tile
  static constexpr int kPageTokens = kPageSize;  // tokens per page, per softmax step and per P' block
  static constexpr int kStages = 3;           // pages in flight (latent, rope, scales)
  static constexpr int kVtStages = 2;         // transposed latents (V^T) ready for PV
  static constexpr int kLoaderThreads = 32;   // warp 0 of the producer
  static constexpr int kTransposerWarps = 3;  // warps 1-3 of the producer
  static constexpr int kTransposers = 32 * kTransposerWarps;
  static constexpr int kOutHalf = kLatentDim / kConsumers;  // output dims per consumer

  // The fragments below hard-wire these: an m64n64 S fragment per page (8 n-tiles of 8 tokens,
  // two rows per thread), two k32 steps of PV per page, m64n256 output halves, the consumers'
  // page parity (j % 2) and the two P buffers (the registers: WarpgroupRoles).
  static_assert(kRows == 64, "wgmma M tile: the S and O fragments assume 64 rows");
  static_assert(kPageTokens == 64, "S fragment m64n64 and two PV k-steps of 32 per page");
  static_assert(kConsumers == 2, "page ownership by parity, two P buffers, two output halves");
  static_assert(kOutHalf == 256, "one m64n256 accumulator per consumer");
  static_assert(kStages >= 2 && kVtStages == 2, "V^T slots indexed by page parity in the consumers");
};

// Named barrier ids (bar.sync / bar.arrive over both consumers, 256 threads). The page hand-offs
// take id `base + owner` (the consumer that owns page j is j % 2): the running max after page j
// is published (Max), page j's P' and row factors are in place (P), the non-owner's PV of page j
// is done so its P buffer may take page j + 2 (Free). Id 0 is __syncthreads'.
enum class Fp8Barrier : int {
  kAddSums = 1,  // the consumers' parts of l exchanged after the pages
  kMax = 2,      // 2, 3
  kP = 4,        // 4, 5
  kFree = 6,     // 6, 7
  kTransposers = 9,  // the transposer warps among themselves (a page's V^T fix-up)
  // 10, 11: consumer c's warps among themselves after each page's P' (the hand-off of page j - 1
  // comes before the P' writes, so it cannot order them).
  kOwnPage = 10,
  // The V^T-register tile (fp8_vregs_tile.cuh, its own kernel) uses the ids above but kTransposers
  // and kOwnPage, and:
  kRowTotals = 10,   // the rows' output scales written for the accumulator columns (both consumers)
  kOwnRows = 11,     // 11, 12: consumer c's warps among themselves after publishing its page's factors
};

// The shared-memory plan (its layout: offsets and size come from this struct, not from hand-kept
// sums; the kernel addresses it through Fp8TileView). Tiles are K-major in 8 x 16-byte core matrices; the Q latent and the
// pages' latent and rope come by TMA with the 128-byte swizzle (hence 1024-byte alignment).
struct Fp8TileSmem {
  using C = Fp8TileConfig;
  static constexpr int kLatentBytes = C::kPageTokens * kLatentDim;   // one page's latent, 32 KB
  static constexpr int kRopeBytes = C::kPageTokens * kRopeDim * 2;   // one page's rope, 8 KB
  static constexpr int kVtHalfBytes = C::kOutHalf * C::kPageTokens;  // V^T of one output half, SBO 512
  static constexpr int kPBytes = C::kRows * C::kPageTokens;          // one page's P' (e4m3), SBO 512
  using Ring = PageRing<C::kStages>;

  struct Stage {
    alignas(1024) uint8_t latent[kLatentBytes];
    alignas(1024) uint8_t rope[kRopeBytes];
  };
  alignas(1024) uint8_t q_latent[C::kRows * kLatentDim];  // as a page's latent (TMA, swizzled)
  Stage stages[C::kStages];
  alignas(1024) uint8_t vt[C::kVtStages][C::kConsumers][kVtHalfBytes];
  alignas(1024) uint8_t p[2][kPBytes];  // P' of the pair's pages, slot j % 2
  float scales[C::kStages][C::kPageTokens];
  alignas(8) uint8_t ring[Ring::kBytes];  // the stages' full / empty barriers, the Q barrier, the fault flag
  uint64_t vt_full[C::kVtStages];   // kTransposers arrivals: V^T written
  uint64_t vt_empty[C::kVtStages];  // 256 consumer arrivals: PV done reading
  float xmax[2][C::kRows];          // the running max after page j, slot j % 2
  float2 xsig[2][C::kRows];         // page j's (sigma, rho) per row (sigma 0: nothing visible), slot j % 2
  float xl[C::kConsumers][C::kRows];  // each consumer's part of l, after the pages

};
static_assert(sizeof(Fp8TileSmem) <= 227 * 1024, "shared memory per block on sm_90");
static_assert(sizeof(Fp8TileSmem::Stage) % 1024 == 0, "stages keep the 1024-byte alignment of the swizzle");

// A 64-row tile's view of its shared-memory plan L: one pointer per region, derived from the struct's
// offsets, and the addressing of pages and slots that the QK and softmax steps share (both 64-row
// tiles' plans have these regions). Pointers rather than a reference to the plan: addressing the
// struct's members directly gave ptxas 8 bytes of spills in the transposing tile; this form
// compiles to the same SASS as the hand-kept offsets it replaced.
template <typename L, int kStageCount, int kPageSlotCount = 2>
struct PageTileView {
  static constexpr int kStages = kStageCount;
  static constexpr int kPageSlots = kPageSlotCount;  // P' buffers and factor slots, page j in slot j % kPageSlots
  static constexpr int kRows = kTileRows;
  uint8_t* q_latent;
  uint8_t* stage;
  uint8_t* pbuf;
  float* scales;
  typename L::Ring ring;
  float* xmax;   // [2][kRows]
  float2* xsig;  // [2][kRows]
  float* xl;     // [consumers][kRows]

  __device__ explicit PageTileView(uint8_t* base)
      : q_latent(base + offsetof(L, q_latent)),
        stage(base + offsetof(L, stages)),
        pbuf(base + offsetof(L, p)),
        scales(reinterpret_cast<float*>(base + offsetof(L, scales))),
        ring(base + offsetof(L, ring)),
        xmax(reinterpret_cast<float*>(base + offsetof(L, xmax))),
        xsig(reinterpret_cast<float2*>(base + offsetof(L, xsig))),
        xl(reinterpret_cast<float*>(base + offsetof(L, xl))) {}
  __device__ uint8_t* kl(int s) const { return stage + s * int(sizeof(typename L::Stage)); }
  __device__ uint8_t* kr(int s) const {
    return stage + s * int(sizeof(typename L::Stage)) + offsetof(typename L::Stage, rope);
  }
  __device__ float* scale(int s) const { return scales + s * kPageSize; }
  // P' of page j as e4m3 [64 rows x 64 slots] (K-major, in the S fragment's slot order).
  __device__ uint8_t* p_tile(int j) const { return pbuf + (j % kPageSlots) * L::kPBytes; }
  // The running max after page j (slot j % 2: the owner of page j + 2 writes it only after the
  // owner of page j + 1 has read it, the chain of Max hand-offs), the page's factors per row.
  __device__ float& max_after(int j, int r) const { return xmax[(j % 2) * kRows + r]; }
  __device__ float2& factors_of(int j, int r) const { return xsig[(j % kPageSlots) * kRows + r]; }
};

// The transposing tile's view: the shared regions, and the V^T slots with their barriers.
struct Fp8TileView : PageTileView<Fp8TileSmem, Fp8TileConfig::kStages> {
  using C = Fp8TileConfig;
  using L = Fp8TileSmem;
  static constexpr bool kOwnerReleasesStage = true;  // the page's owner (QK, scales) and the transposers read it
  static constexpr int kVtStages = C::kVtStages;
  static constexpr int kTransposerBarrier = int(Fp8Barrier::kTransposers);
  static constexpr int kTransposerInFlight = 4;  // a unit's four ldmatrix before its stores
  uint8_t* vt_base;
  uint64_t* vt_full;   // [kVtStages]
  uint64_t* vt_empty;  // [kVtStages]

  __device__ explicit Fp8TileView(uint8_t* base)
      : PageTileView(base),
        vt_base(base + offsetof(L, vt)),
        vt_full(reinterpret_cast<uint64_t*>(base + offsetof(L, vt_full))),
        vt_empty(reinterpret_cast<uint64_t*>(base + offsetof(L, vt_empty))) {}
  // V^T of page j, output half c (the halves are contiguous).
  __device__ uint8_t* vt_half(int j, int c) const {
    return vt_base + ((j % C::kVtStages) * C::kConsumers + c) * L::kVtHalfBytes;
  }
  // V^T of page j, all 512 dims (the transposers' view).
  __device__ uint8_t* vt_page(int j) const { return vt_half(j, 0); }
  // One thread, before a __syncthreads.
  __device__ void init_vt() const {
    for (int v = 0; v < C::kVtStages; ++v) {
      mbar::init(&vt_full[v], C::kTransposers);
      mbar::init(&vt_empty[v], 128 * C::kConsumers);
    }
  }
};

}  // namespace snapmla::cuda
