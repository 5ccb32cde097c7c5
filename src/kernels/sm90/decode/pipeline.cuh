// Pieces of the decode kernels' page pipelines: the no-swizzle K-major tile layout of the wgmma
// operands the kernels write themselves (Q, P) and the Q tile's load, the page lookup and its
// check, the pages' loads, and the ring of shared-memory stages (a producer fills them, completion
// signalled on `full` mbarriers; readers release a stage on its `empty` mbarrier).
#pragma once

#include <cuda.h>

#include "kernels/common/mbarrier.cuh"
#include "kernels/common/tma.cuh"
#include "kernels/common/wgmma.cuh"
#include "params.hpp"
#include "scheduler.cuh"
#include "tensor_map.hpp"

namespace snapmla::cuda {

// Byte k of row r in a K-major no-swizzle tile with `row_bytes`-long rows: 8 x 16 B core
// matrices stored as contiguous 128 B blocks, LBO = 128 (along K), SBO = 8 rows (along M/N).
__device__ __forceinline__ int km_offset(int r, int k, int row_bytes) {
  return (r / 8) * (row_bytes * 8) + (k / 16) * 128 + (r % 8) * 16 + (k % 16);
}

__device__ __forceinline__ int32_t page_of(const DecodeParams& p, const Work& w, int blk) {
  return p.block_table[int64_t(w.seq) * p.max_pages + blk / kPageSize];
}
__device__ __forceinline__ bool page_ok(const DecodeParams& p, int32_t page) {
  return page >= 0 && page < p.num_pages;
}

// A Q tile of kRows rows (kRowBytes each), K-major no swizzle, by `threads` threads from
// thread t with cp.async (completion: mbar::arrive_on_cp_async); rows past the query rows are zero.
// src: the batch's first query row, rows `stride` bytes apart.
template <int kRowBytes, int kRows = kTileRows>
__device__ __forceinline__ void load_q_latent(uint8_t* dst, const uint8_t* src, int64_t stride, const DecodeParams& p,
                                              const Work& w, int row0, int t, int threads) {
  constexpr int kChunks = kRowBytes / 16;
  for (int c = t; c < kRows * kChunks; c += threads) {
    const int r = c / kChunks, part = c % kChunks;
    const bool ok = row0 + r < p.rows;
    const int64_t row = int64_t(w.seq) * p.rows + (ok ? row0 + r : 0);
    ptx::cp_async_16(dst + km_offset(r, part * 16, kRowBytes), src + row * stride + part * 16, ok);
  }
}

// A consumer thread's two query rows in the tile (r0 and r0 + 8): each one's row index in the
// batch (row 0 of the sequence for padding rows past the query rows), its visible end (0 for
// padding rows), and its Q rope as the rope product's A operand (m16n8k16 layout per warp, one
// fragment per 16-wide K step; zero for padding rows). rope: the first row's 64 bf16, rows
// `stride` elements apart.
__device__ __forceinline__ void load_q_rows(const DecodeParams& p, const Work& w, int row0, int r0, int q,
                                            const uint16_t* rope, int64_t stride, int64_t (&row)[2],
                                            int (&vis)[2], uint32_t (&qa)[4][4]) {
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const int r = row0 + r0 + 8 * ri;
    const bool ok = r < p.rows;
    row[ri] = int64_t(w.seq) * p.rows + (ok ? r : 0);
    vis[ri] = ok ? visible_end(p, w, r) : 0;
    const uint32_t* qr = reinterpret_cast<const uint32_t*>(rope + row[ri] * stride);
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      qa[ks][ri] = ok ? qr[8 * ks + q] : 0u;
      qa[ks][2 + ri] = ok ? qr[8 * ks + 4 + q] : 0u;
    }
  }
}

// One page of the FP8 cache into shared memory, by one thread: four TMA boxes of latent (64
// tokens x 128 bytes each, 128-byte swizzle) into kl, one of rope into kr, and the 64 scales
// as a bulk copy, all completing on `bar` with their byte count. An out-of-range page index
// loads nothing (the stage keeps stale data) and sets *bad before the arrival: the consumers,
// which acquire every page through its barrier, read the flag at the end and turn their rows
// into NaN. Tokens past the split end are loaded as they are in the cache (the kernels mask
// them).
__device__ __forceinline__ void load_fp8_page(const DecodeParams& p, const CUtensorMap* tm_latent,
                                              const CUtensorMap* tm_rope, int32_t page, uint8_t* kl, uint8_t* kr,
                                              float* scales, uint64_t* bar, volatile uint32_t* bad) {
  constexpr int kLatentBytes = kPageSize * kLatentDim, kRopeBytes = kPageSize * kRopeDim * 2;
  constexpr int kScaleBytes = kPageSize * 4;
  if (!page_ok(p, page)) {  // nothing to copy: complete the phase with the arrival alone
    *bad = 1u;
    mbar::arrive_expect_tx(bar, 0);
    return;
  }
  const int y = page * kPageSize;
  mbar::arrive_expect_tx(bar, kLatentBytes + kRopeBytes + kScaleBytes);
#pragma unroll
  for (int b = 0; b < kLatentDim / kTmaBoxBytes; ++b)
    tma::load_2d(kl + b * (kPageSize * kTmaBoxBytes), tm_latent, b * kTmaBoxBytes, y, bar);
  tma::load_2d(kr, tm_rope, 0, y, bar);
  tma::bulk_load(scales, p.k_scale + int64_t(page) * kPageSize, kScaleBytes, bar);
}

// load_fp8_page's copies as L2 prefetches (a hint; an out-of-range index: nothing), for a page a
// later split of the CTA will load (DecodeParams::prefetch_next).
__device__ __forceinline__ void prefetch_fp8_page(const DecodeParams& p, const CUtensorMap* tm_latent,
                                                  const CUtensorMap* tm_rope, int32_t page) {
  if (!page_ok(p, page)) return;
  const int y = page * kPageSize;
#pragma unroll
  for (int b = 0; b < kLatentDim / kTmaBoxBytes; ++b) tma::prefetch_2d(tm_latent, b * kTmaBoxBytes, y);
  tma::prefetch_2d(tm_rope, 0, y);
  tma::bulk_prefetch(p.k_scale + int64_t(page) * kPageSize, kPageSize * 4);
}

// One page of the BF16 cache into a stage by one thread (decode_bf16's narrow tile): kHeadDim x 2 /
// 128 = 9 TMA boxes of 64 tokens x 64 dims (128-byte swizzle), box b holding dims 64 b .. 64 b + 63
// (box 8: the rope) at b x kBf16BoxBytes, all completing on `bar` with their byte count. An
// out-of-range page index loads nothing and sets *bad before the arrival, as load_fp8_page.
inline constexpr int kBf16BoxBytes = kPageSize * kTmaBoxBytes;           // 8 KB
inline constexpr int kBf16Boxes = kHeadDim * 2 / kTmaBoxBytes;           // 9
inline constexpr int kBf16PageBytes = kBf16Boxes * kBf16BoxBytes;        // 72 KB

__device__ __forceinline__ void load_bf16_page(const DecodeParams& p, const CUtensorMap* tm_kv, int32_t page,
                                               uint8_t* stage, uint64_t* bar, volatile uint32_t* bad) {
  if (!page_ok(p, page)) {
    *bad = 1u;
    mbar::arrive_expect_tx(bar, 0);
    return;
  }
  const int y = page * kPageSize;
  mbar::arrive_expect_tx(bar, kBf16PageBytes);
#pragma unroll
  for (int b = 0; b < kBf16Boxes; ++b) tma::load_2d(stage + b * kBf16BoxBytes, tm_kv, b * (kTmaBoxBytes / 2), y, bar);
}

// A 64-row tile's Q latent by one thread: kLatentBytes / 128 TMA boxes of 64 rows x 128 bytes with
// the 128-byte swizzle (the pages' layout, so the QK reads both operands the same way) from row
// `row` of the query plane (elements of kElemBytes: e4m3 for decode_fp8, bf16 for decode_bf16),
// completing on `bar` with their bytes. Rows past the plane's end arrive as zeros; rows past the
// sequence's query rows hold the next sequence's queries, which no token is visible to (their
// scores are masked).
template <int kLatentBytes, int kElemBytes>
__device__ __forceinline__ void load_q_tile(const CUtensorMap* tm_q, uint8_t* dst, int row, uint64_t* bar) {
  mbar::arrive_expect_tx(bar, kTileRows * kLatentBytes);
#pragma unroll
  for (int b = 0; b < kLatentBytes / kTmaBoxBytes; ++b)
    tma::load_2d(dst + b * (kTileRows * kTmaBoxBytes), tm_q, b * (kTmaBoxBytes / kElemBytes), row, bar);
}

// Whether any page index of the split is out of range (its stage was never filled: the rows
// become NaN). Checked once, after the pages, a warp's lanes splitting them; warp-uniform.
// (decode_bf16; the decode_fp8 kernels' loader records it as it loads: PageRing::faulted.)
__device__ __forceinline__ bool split_has_bad_page(const DecodeParams& p, const Work& w, int nblk, int lane) {
  bool bad = false;
  for (int i = lane; i < nblk; i += 32) bad |= !page_ok(p, page_of(p, w, w.begin + i * kPageSize));
  return __any_sync(0xffffffffu, bad);
}

// The decode_fp8 kernels' and decode_bf16's narrow tile's ring: mbarriers of kStages page stages
// filled by TMA, plus one for the Q tile, and the split's fault flag (an out-of-range page index
// met by the loader).
template <int kStages>
struct PageRing {
  uint64_t* full;   // [kStages]: the loader's arrival with the page's bytes
  uint64_t* empty;  // [kStages]: one arrival per thread that reads the stage
  uint64_t* qbar;   // the Q tile: one arrival per cp.async loading thread, or one with the TMA bytes
  uint32_t* bad;    // set by load_fp8_page before the page's arrival
  static constexpr int kBytes = (2 * kStages + 2) * 8;

  __device__ explicit PageRing(void* at) {
    full = static_cast<uint64_t*>(at);
    empty = full + kStages;
    qbar = empty + kStages;
    bad = reinterpret_cast<uint32_t*>(qbar + 1);
  }
  // One thread, before a __syncthreads.
  __device__ void init(uint32_t readers, uint32_t q_loaders) const {
    for (int s = 0; s < kStages; ++s) {
      mbar::init(&full[s], 1);
      mbar::init(&empty[s], readers);
    }
    mbar::init(qbar, q_loaders);
    *bad = 0u;
  }
  // Whether the split met an out-of-range page index (warp-uniform). Call after a barrier that
  // follows every page's acquisition by some thread of the barrier.
  __device__ bool faulted() const { return *static_cast<volatile uint32_t*>(bad) != 0u; }
  // Producer: wait until page j's stage is free.
  __device__ void acquire(int j) const {
    if (j >= kStages) mbar::wait(&empty[j % kStages], ((j / kStages) & 1) ^ 1);
  }
  // Consumers: wait until page j is in its stage.
  __device__ void wait(int j) const { mbar::wait(&full[j % kStages], (j / kStages) & 1); }
  // The pages a loader that loads its Q tile by cp.async (the narrow tiles) requests before it: the
  // first kStages by default, so that their latency and Q's overlap; none under
  // DecodeParams::q_before_pages (SNAPMLA_NARROW_Q=first, a lab option): with every CTA starting at
  // once, Q would otherwise land behind all the CTAs' first pages.
  __device__ static int pages_before_q(const DecodeParams& p, int nblk) {
    return p.q_before_pages ? 0 : min(kStages, nblk);
  }
  // Consumers of a Q tile loaded by load_q_latent (cp.async and st.shared: the generic proxy):
  // wait for it, then order those writes, now seen by this thread, before its wgmmas, which read
  // the tile through the async proxy. (A Q tile that came by TMA needs only the wait.)
  __device__ void wait_q_copied() const {
    mbar::wait(qbar, 0);
    wg::fence_proxy_async();
  }
  // Readers: done reading page j's stage.
  __device__ void release(int j) const { mbar::arrive(&empty[j % kStages]); }

  // The loader thread: pages [from, to) of the split, each as soon as its stage is free (the
  // first kStages need no wait), the indices read two pages ahead, so that the first requests
  // wait for one global load, not one each. load(page, stage, full barrier) copies one page (an
  // out-of-range index: nothing, the fault flag set, the phase completed by the arrival alone).
  template <typename LoadPage>
  __device__ void stream_pages(const DecodeParams& p, const Work& w, int from, int to, LoadPage&& load) const {
    if (from >= to) return;
    int32_t page = page_of(p, w, w.begin + from * kPageSize);
    int32_t next = from + 1 < to ? page_of(p, w, w.begin + (from + 1) * kPageSize) : 0;
    for (int j = from; j < to; ++j) {
      const int32_t after = j + 2 < to ? page_of(p, w, w.begin + (j + 2) * kPageSize) : 0;
      acquire(j);
      const int s = j % kStages;
      load(page, s, &full[s]);
      page = next;
      next = after;
    }
  }

  // The loader thread, for the CTA's next split (DecodeParams::prefetch_next): its first kStages
  // pages (the ones its stream requests before any stage is released) as L2 prefetches, so that
  // those requests meet L2 after the split boundary instead of the flooded memory system.
  __device__ void prefetch_first_pages(const DecodeParams& p, const Work& w, const CUtensorMap* tm_latent,
                                       const CUtensorMap* tm_rope) const {
    const int n = min(w.pages(), kStages);
    for (int j = 0; j < n; ++j) prefetch_fp8_page(p, tm_latent, tm_rope, page_of(p, w, w.begin + j * kPageSize));
  }

  // stream_pages of FP8 cache pages (load_fp8_page). Stages: anything with kl(s), kr(s), scale(s)
  // (the kernels' shared-memory layouts).
  template <typename Stages>
  __device__ void stream(const DecodeParams& p, const Work& w, const CUtensorMap* tm_latent, const CUtensorMap* tm_rope,
                         Stages& st, int from, int to) const {
    stream_pages(p, w, from, to, [&](int32_t page, int s, uint64_t* bar) {
      load_fp8_page(p, tm_latent, tm_rope, page, st.kl(s), st.kr(s), st.scale(s), bar, bad);
    });
  }
};

}  // namespace snapmla::cuda
