// decode_fp8's transposer (the 64-row tile's producer warps 1-3): each landed page's latent
// (K-major, as TMA wrote it) -> V^T, the K-major B operand of the FP8 PV. FP8 wgmma reads both
// shared-memory operands K-major only, and the PV's K is the token, so V must be transposed in
// the kernel (the QK needs the same bytes with the dim as K).
#pragma once

#include <cstdint>

#include "kernels/common/mbarrier.cuh"
#include "kernels/common/ptx.cuh"
#include "fp8_tile.cuh"
#include "params.hpp"
#include "scheduler.cuh"

namespace snapmla::cuda {

static_assert(Fp8TileSmem::kVtHalfBytes == 256 * 64 && Fp8TileConfig::kPageTokens == 64,
              "the unit offsets below assume 256-dim halves of 64 token slots, 512 bytes per 8 dims");

// The latent of one page (64 tokens x 512 dims, K-major) -> V^T for PV: two halves of 256 dims
// x 64 token slots, K-major, slot 16 h + 4 q + j of 32-token chunk k holding token
// 32 k + 16 h + {2q, 2q+1, 2q+8, 2q+9}[j]: the order of a thread's S fragment, so each row's
// P' bytes of four slots are one 4-byte word. One unit of work is 16 tokens (group gi) x 128
// dims (TMA box b) for one warp: per 32 dims one transposing ldmatrix (b16 units: two tokens x
// two dims per register), byte permutes split the dim pairs into 4-token words, and one
// stmatrix writes the 32 dims' 16-byte rows (each matrix row one dim's 16 slots). Lane 4 c + q
// holds dims 2 c, 2 c + 1 (and 16 more); lanes c >= 4 swap which of the two goes to the even
// matrix, so that each matrix's eight rows fall in eight different 16-byte bank groups (a V^T
// row's bank group is its dim % 8). Transposer warp tw takes units tw, tw + 3, ...; its lanes'
// offsets are the same for every page, so they are computed once.
constexpr int kTransposerWarps = Fp8TileConfig::kTransposerWarps;
constexpr int kLatentBox = kTmaBoxBytes;  // TMA box: 64 tokens x 128 bytes of latent
constexpr int kUnitsPerWarp = (16 + kTransposerWarps - 1) / kTransposerWarps;
// A transposer lane's addressing. Only the lane's parts are held; a unit's parts (of the warp
// index, warp-uniform) and the per-step chunks are derived where they are used: the table is
// live across the producer's whole split loop in its 56 registers.
struct TransposeLanes {
  uint32_t src;     // the lane's ldmatrix row in the latent tile, less its unit's offset
  uint32_t dst;     // the lane's stmatrix row in the page's V^T, less its unit's offset
  uint32_t chunk0;  // the lane's 16-byte chunk (swizzled) of the first 32-dim step
  int q2;           // 2 x (lane % 4): the lane's first token within its unit's 16
  uint32_t sel_a;   // byte permute: the even matrix's dim first, then the odd one's (sel_b the reverse)
  __device__ TransposeLanes(int lane) {
    const int m = lane / 8, c = lane / 4, q = lane % 4, r = lane % 8;
    // The dim (within 32) of matrix m's row r: 16 (m / 2) + 2 r, + 1 for the odd matrices,
    // swapped for rows 4-7.
    const int dk = 16 * (m / 2) + 2 * r + ((m % 2) ^ (r / 4));
    // The latent tile as TMA wrote it: box b = bytes [128 b, 128 b + 128) of each token's row,
    // 128 bytes per token, 16-byte chunk x of row t at chunk x ^ (t % 8).
    src = uint32_t(((m % 2) * 8 + lane % 8) * kLatentBox);
    dst = uint32_t((dk / 8) * 512 + (dk % 8) * 16);
    q2 = 2 * q;
    chunk0 = uint32_t(((m / 2) ^ (lane % 8)) * 16);
    sel_a = c < 4 ? 0x6420u : 0x7531u;
  }
  // Unit u = tw + kTransposerWarps k of a page: token group gi = (u / 4) % 4 (16 tokens), box b = u % 4.
  __device__ static int group_of(int u) { return (u / 4) % 4; }
  __device__ uint32_t src_of(int u) const { return src + uint32_t(u % 4 * (kPageSize * kLatentBox) + 16 * group_of(u) * kLatentBox); }
  __device__ uint32_t dst_of(int u) const { return dst + uint32_t(group_of(u) * 128 + u % 4 * 4 * 2048); }
  // The first of the lane's four tokens in unit u.
  __device__ int t0_of(int u) const { return 16 * group_of(u) + q2; }
  // Step i's chunk is ((2 i + m / 2) ^ (lane % 8)) x 16; 2 i and m / 2 < 2 have no bit in common,
  // so that is chunk0 ^ 32 i.
  __device__ uint32_t chunk(int i) const { return chunk0 ^ uint32_t(32 * i); }
  __device__ uint32_t sel_b() const { return sel_a ^ 0x1111u; }  // 0x6420 <-> 0x7531
};

// One unit; keep masks the bytes of tokens at or past the split end (P is 0 there, but V may
// be NaN). kInFlight of the four ldmatrix are issued before their stores (they would otherwise
// wait on each other through the stores' memory order): all four (16 registers) where the
// producer has them, two in a 32-register producer.
template <int kInFlight = 4>
__device__ __forceinline__ void transpose_unit(const uint8_t* src, uint8_t* dst, const TransposeLanes& tl,
                                               uint32_t keep) {
  static_assert(4 % kInFlight == 0, "whole groups of ldmatrix");
#pragma unroll
  for (int i0 = 0; i0 < 4; i0 += kInFlight) {
    uint32_t r[kInFlight][4];
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) ptx::ldsm_x4_trans(src + tl.chunk(i0 + i), r[i]);
#pragma unroll
    for (int i = 0; i < kInFlight; ++i)
      ptx::stsm_x4(dst + (i0 + i) * 2048, ptx::prmt(r[i][0], r[i][1], tl.sel_a) & keep,
                   ptx::prmt(r[i][0], r[i][1], tl.sel_b()) & keep, ptx::prmt(r[i][2], r[i][3], tl.sel_a) & keep,
                   ptx::prmt(r[i][2], r[i][3], tl.sel_b()) & keep);
  }
}

// After a page's transposition (all transposer warps), V^T bytes of tokens [from, to) that are
// e4m3 NaN set to 0: tokens some query rows do not see (at most 3 per split) meet those rows'
// P' = 0 in the PV, and 0 x NaN is NaN; the rows that see them already have a NaN score (the QK
// reads the stage, not V^T). Token t sits at slot 32 k + 16 h + 4 q + j of V^T (the order of
// transpose_unit, see TransposeLanes).
template <int kBarrier>
__device__ __forceinline__ void zero_nan_tokens(uint8_t* vt, int from, int to) {
  using C = Fp8TileConfig;
  ptx::named_barrier(kBarrier, C::kTransposers);  // every unit is written
  const int tid = int(threadIdx.x) - C::kLoaderThreads;
  for (int t = from; t < to; ++t) {
    const int u = t % 32, v = u % 16;
    const int slot = 32 * (t / 32) + 16 * (u / 16) + 4 * ((v % 8) / 2) + 2 * (v / 8) + v % 2;
    for (int d = tid; d < kLatentDim; d += C::kTransposers) {
      // The two 256-dim halves are contiguous; each is K-major over 64 slots (SBO 512, LBO 128).
      const int half = d / 256, dd = d % 256;
      uint8_t* b = vt + half * Fp8TileSmem::kVtHalfBytes + (dd / 8) * 512 + (slot / 16) * 128 + (dd % 8) * 16 + slot % 16;
      if ((*b & 0x7F) == 0x7F) *b = 0;
    }
  }
}

// Page i of the split by transposer warp tw: once the page has landed and PV of the page that
// last used its V^T slot is done, its latent -> the slot's V^T (tokens at or past ntok zeroed,
// NaN bytes of tokens at or past `band`, which some query rows do not see, zeroed after), then
// the slot is marked full and the stage released (the transposers are readers of it). View: the
// tile's shared-memory view (its stages, V^T slots and their barriers, the transposers' barrier id:
// Fp8TileView, Fp8TrioView); both tiles' producers have the loading warp and three transposer warps.
// View::kTransposerInFlight: transpose_unit's ldmatrix issued before their stores.
template <typename View>
__device__ __forceinline__ void transpose_page(const View& sm, int i, int tw, const TransposeLanes& tl, int ntok,
                                               int band) {
  using C = Fp8TileConfig;
  constexpr int kVtStages = View::kVtStages;
  sm.ring.wait(i);
  if (i >= kVtStages) mbar::wait(&sm.vt_empty[i % kVtStages], ((i / kVtStages) - 1) & 1);
  const uint8_t* kl = sm.kl(i % View::kStages);
  uint8_t* vt = sm.vt_page(i);  // 512 dims x 64 slots, K-major: unit offsets span all of them
  constexpr int kInFlight = View::kTransposerInFlight;
  if (ntok == C::kPageTokens && band >= C::kPageTokens) {  // a whole page seen by every row: no masks
#pragma unroll
    for (int k = 0; k < kUnitsPerWarp; ++k)
      if (tw + kTransposerWarps * k < 16)
        transpose_unit<kInFlight>(kl + tl.src_of(tw + kTransposerWarps * k), vt + tl.dst_of(tw + kTransposerWarps * k),
                                  tl, 0xFFFFFFFFu);
  } else {
#pragma unroll
    for (int k = 0; k < kUnitsPerWarp; ++k) {
      const int u = tw + kTransposerWarps * k, t0 = tl.t0_of(u);
      const uint32_t keep = (t0 < ntok ? 0xFFu : 0u) | (t0 + 1 < ntok ? 0xFF00u : 0u) |
                            (t0 + 8 < ntok ? 0xFF0000u : 0u) | (t0 + 9 < ntok ? 0xFF000000u : 0u);
      if (u < 16) transpose_unit<kInFlight>(kl + tl.src_of(u), vt + tl.dst_of(u), tl, keep);
    }
    if (band < ntok) zero_nan_tokens<View::kTransposerBarrier>(vt, max(band, 0), ntok);
  }
  wg::fence_proxy_async();  // V^T written with st.shared, read by wgmma (async proxy)
  mbar::arrive(&sm.vt_full[i % kVtStages]);
  sm.ring.release(i);          // done reading the stage's latent
}

// The transposer warps' part of a worker's splits (warp tw of them; the transposing 64-row tiles'
// producer warps 1-3): every page of each split in turn, with the CTA's split boundaries.
template <int kCtaThreads, typename View>
__device__ __forceinline__ void transpose_splits(const DecodeParams& p, const SplitRange& range, const View& sm,
                                                 int tw, const TransposeLanes& tl) {
  for (int item = range.first; item < range.last; ++item) {
    if (item > range.first) split_boundary<kCtaThreads>(NoInit{});
    const Work w = work_of(p, item);
    const int band = band_start(p, w);
    for (int i = 0, nblk = w.pages(); i < nblk; ++i) {
      const int blk = w.begin + i * kPageSize;
      transpose_page(sm, i, tw, tl, min(kPageSize, w.end - blk), band - blk);
    }
  }
}

}  // namespace snapmla::cuda
