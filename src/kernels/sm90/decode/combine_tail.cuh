// The decode kernels' own combine (SNAPMLA_COMBINE_FUSED, a lab option; slower than the combine
// kernel on the H200 at fc4dfc1, docs/kernels.md): instead of a combine
// kernel after the decode, each CTA merges a share of its split sequences' rows once their
// partials are all written. Why: at small batches the combine and the gap before it were a third
// of a call (H200, b = 1, h = 128, 8K: decode 15.1 us, combine 4.8, between the kernels 2.1), and
// every split a shorter split length adds costs combine time.
//
// The protocol, per (sequence, 64-row tile), over a counter in the workspace that is zero at the
// launch (launch.hpp clears it):
//   1. after the CTA's last split, all its partials stored (the consumers' barrier), one thread
//      releases them (fence) and adds 1 per split it wrote to its sequence's counter;
//   2. then, split by split, it waits until the counter holds the sequence's split count S, and
//      the consumers merge the split's share of the tile's rows (k of S: rows k R / S up to
//      (k + 1) R / S, detail::tail_row_begin), reading the partials from L2 (another CTA wrote
//      them; this SM's L1 may hold an earlier call's), with the combine kernels' arithmetic
//      (combine_rows.cuh): the same bits.
// Signalling every split before waiting on any keeps CTAs from waiting on each other in a cycle
// (a CTA waiting after its first split could wait on one that waits for its second). The waits
// need every CTA of the grid resident at once: the launch folds the combine in only where the grid
// has at most one CTA per SM (the decode CTAs fill an SM's shared memory).
#pragma once

#include "core/split_rule.hpp"
#include "kernels/common/ptx.cuh"
#include "kernels/smxx/combine_rows.cuh"
#include "params.hpp"
#include "scheduler.cuh"

namespace snapmla::cuda {

// The named barrier of the consumers' tail (above every kernel's own ids, below the split
// boundary's).
inline constexpr int kCombineTailBarrier = 14;
static_assert(kCombineTailBarrier != kSplitBoundaryBarrier, "distinct named barriers");

// How long a CTA waits for a sequence's splits before it gives up on them (1 s; a balanced plan's
// CTAs end within a split of each other, microseconds to a few milliseconds).
inline constexpr uint64_t kCombineWaitNs = 1000000000ull;
inline constexpr int kCombineClosed = 1 << 30;  // a counter given up on: at least this

__device__ __forceinline__ int* combine_counter(const DecodeParams& p, int first_split, int row0) {
  return p.combine_counters + int64_t(first_split) * row_tiles_of(p) + row0 / kTileRows;
}

// The shared memory combine_tail needs (free once a CTA's splits are done: the kernels pass a
// page stage or their Q tile): one group's sums per warp, 2 KB each.
template <int kThreads>
inline constexpr int kCombineTailScratchBytes = kThreads / 32 * kQuarters * 32 * int(sizeof(float4));

// Run by the CTA's consumer threads (kThreads of them, `tid` in [0, kThreads)) after its splits,
// where p.combine_counters is set (a CTA without splits has left at the kernel's start).
// tile_rows: the kernel's rows per CTA (64, or 16 for the narrow tile); scratch:
// kCombineTailScratchBytes of shared memory. The CTA's splits and row tile are looked up again
// rather than held across the kernel's main loop (in the 64-row tile they spilled there). A
// share's rows are merged W warps to a row (W a power of two up to the row's groups of kGroup
// splits), so that a row waits for one load latency per W groups rather than per group: the W
// warps sum a group each, and the row's first warp adds their sums in group order, as the combine
// kernels' quarter tasks do (the same bits).
template <int kThreads>
__device__ __forceinline__ void combine_tail(const DecodeParams& p, int tile_rows, int tid, float4* scratch) {
  constexpr int kWarps = kThreads / 32;
  const SplitRange range = splits_of_worker(p, grid_worker(p));
  const int row0 = grid_row0(p);
  const int warp = tid / 32, lane = tid % 32;
  ptx::named_barrier(kCombineTailBarrier, kThreads);  // every partial of the CTA is stored
  // The CTA's splits are consecutive, so their sequences are too: the first one's is looked up
  // (a whole warp's lookup: every warp makes it), the others found by walking the offsets (each
  // sequence has a split at least), rather than a lookup per split and pass.
  const int seq0 = work_of(p, range.first).seq;
  // (fp32 partials only: launch_decode does not fuse the combine where they are bf16.)
  const CombineParams cp{p.split_offsets, p.partial_out, p.partial_lse, nullptr,     p.out, p.lse,
                         p.batch,         p.rows,        p.seqlen_q,    p.num_heads, p.empty_lse, 0,
                         p.plan_capacity};
  if (tid == 0) {
    __threadfence();
    for (int item = range.first, seq = seq0; item < range.last; ++item) {
      while (seq + 1 < p.batch && item >= p.split_offsets[seq + 1]) ++seq;
      const SplitSpan span = split_span(cp, seq);
      if (!span.broken && span.hi - span.lo > 1) atomicAdd(combine_counter(p, span.lo, row0), 1);
    }
  }
  const int rows = min(tile_rows, p.rows - row0);
  for (int item = range.first, seq = seq0; item < range.last; ++item) {
    while (seq + 1 < p.batch && item >= p.split_offsets[seq + 1]) ++seq;
    const SplitSpan span = split_span(cp, seq);
    // (A broken range: no counter, no merge; the sequence's rows are left as the splits wrote them.
    // This lab tail keeps its reads and writes inside the plan only; the combine kernel writes NaN.)
    const int lo = span.lo, hi = span.hi, splits = hi - lo;
    if (span.broken || splits <= 1) continue;
    int* counter = combine_counter(p, lo, row0);
    // A count that does not complete (split ranges not made by plan_splits: a split no CTA has, or
    // two that have it) makes the sequence's rows NaN instead of a hang: a CTA that gives up
    // closes the counter (raises it to kCombineClosed, above any split count, where late signals
    // cannot bring it back to the count), so that every thread of every CTA of the sequence,
    // whenever it reads it, sees it incomplete.
    if (tid == 0) {
      const uint64_t t0 = ptx::global_timer_ns();
      while (ptx::ld_acquire_gpu(counter) < splits && ptx::global_timer_ns() - t0 < kCombineWaitNs) __nanosleep(64);
      if (ptx::ld_acquire_gpu(counter) < splits) atomicMax(counter, kCombineClosed);
    }
    ptx::named_barrier(kCombineTailBarrier, kThreads);  // the sequence's partials are all in, or given up on
    const bool complete = ptx::ld_acquire_gpu(counter) == splits;
    const int k = item - lo;
    const int r_begin = row0 + detail::tail_row_begin(k, splits, rows);
    const int r_end = row0 + detail::tail_row_begin(k + 1, splits, rows);
    int W = 1;  // warps per row: the same in every thread (a CTA-uniform loop of barriers below)
    while (2 * W <= kWarps && 2 * W <= (splits + kGroup - 1) / kGroup) W *= 2;
    const int part = warp % W;
    for (int r_first = r_begin; r_first < r_end; r_first += kWarps / W) {
      const int r = r_first + warp / W;
      const bool active = r < r_end;
      const float* lse_of = p.partial_lse + (active ? r : 0);  // split k's at k * rows
      const float total = active && complete ? combined_lse<true>(lse_of, p.rows, lo, hi, lane) : NAN;
      const bool sums = total > -INFINITY;  // false for NaN too
      const float* src = p.partial_out + int64_t(active ? r : 0) * kLatentDim + 4 * lane;
      float4 acc[kQuarters];
#pragma unroll
      for (int q = 0; q < kQuarters; ++q) acc[q] = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int g0 = lo; g0 < hi; g0 += W * kGroup) {  // a round: W groups, one per part
        const int mine = g0 + part * kGroup;
        float4 s[kQuarters];
        if (sums && mine < hi) row_group_sum<true>(s, lse_of, src, p.rows, mine, hi, total);
        else
#pragma unroll
          for (int q = 0; q < kQuarters; ++q) s[q] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (W == 1) {
#pragma unroll
          for (int q = 0; q < kQuarters; ++q) add(acc[q], s[q]);
          continue;
        }
#pragma unroll
        for (int q = 0; q < kQuarters; ++q) scratch[(warp * kQuarters + q) * 32 + lane] = s[q];
        ptx::named_barrier(kCombineTailBarrier, kThreads);
        if (part == 0)
          for (int j = 0; j < W && g0 + j * kGroup < hi; ++j)
#pragma unroll
            for (int q = 0; q < kQuarters; ++q) add(acc[q], scratch[((warp + j) * kQuarters + q) * 32 + lane]);
        ptx::named_barrier(kCombineTailBarrier, kThreads);
      }
      if (active && part == 0)
#pragma unroll
        for (int q = 0; q < kQuarters; ++q)
          store_row_quarter(cp, seq, r, q * (kLatentDim / kQuarters) + 4 * lane, q, lane, sums, total, acc[q]);
    }
  }
}

}  // namespace snapmla::cuda
