// Which splits a CTA works on, and each one's (sequence, token range). The grid is fixed by the
// plan's workers (or the batch), so it does not depend on cache_seqlens: a decode step can be
// captured in a CUDA graph and replayed with new lengths. A CTA is one worker's 64-row tile; it
// runs the worker's splits one after another (a persistent CTA: the balanced plan gives every
// worker the same work, across sequence boundaries), and exits when it has none.
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/common/tma.cuh"
#include "kernels/common/wgmma.cuh"
#include "params.hpp"
#include "snapmla/types.hpp"

namespace snapmla::cuda {

struct Work {
  int seq = 0;
  int split = 0;      // global split index (row of the partial buffers)
  bool single = true; // the sequence has one split: write the final output directly
  int begin = 0, end = 0;  // tokens [begin, end) of this split
  int len = 0;             // tokens in the sequence (clamped to the block-table row)
  // cache_seqlens is negative or beyond the block-table row: the kernels write the sequence's
  // rows as NaN (lse NaN), as for an out-of-range page index.
  bool bad_len = false;
  // Pages (of kPageSize tokens) the split covers; the last one may be partial.
  __device__ int pages() const { return (end - begin + kPageSize - 1) / kPageSize; }
};

// v, the same in every lane of the warp (a warpgroup's or a warp's index), as RoleIndex says:
// as it is, or broadcast from lane 0 so that ptxas knows it is warp-uniform (params.hpp).
template <RoleIndex kRole>
__device__ __forceinline__ int uniform_in_warp(int v) {
  if constexpr (kRole == RoleIndex::kUniform) return __shfl_sync(0xffffffffu, v, 0);
  else return v;
}

// The grid is 1-D, row tile fastest: the row tiles of one worker are neighbours in launch order,
// so they stream the same pages at about the same time and L2 serves the second read.
__device__ __forceinline__ int row_tiles_of(const DecodeParams& p) { return (p.rows + kTileRows - 1) / kTileRows; }
__device__ __forceinline__ int grid_worker(const DecodeParams& p) { return int(blockIdx.x) / row_tiles_of(p); }
__device__ __forceinline__ int grid_row0(const DecodeParams& p) { return int(blockIdx.x) % row_tiles_of(p) * kTileRows; }

// The CTA's worker, claimed where p.worker_claims is set (SNAPMLA_FAST_SMS, a lab option, on calls
// of at most 16 rows: one row tile per worker, so one CTA): the plan weighs its first fast_workers
// workers more, so a CTA on a listed SM takes the next of those, any other the next of the rest,
// and one whose pool is used up the next of the other pool. The grid has one CTA per worker, so
// the claims hand out every worker once, whichever SMs the CTAs land on: the same splits, the same
// bits as blockIdx's worker. Thread 0 claims; the whole CTA calls it (one barrier), with a word of
// shared memory that nothing uses before the CTA's start (start_cta's barrier). -1: no worker.
__device__ __forceinline__ int claimed_worker(const DecodeParams& p, int* scratch) {
  if (p.worker_claims == nullptr) return grid_worker(p);
  if (threadIdx.x == 0) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    const bool fast = sm < 8 * sizeof(p.fast_sm_mask) && (p.fast_sm_mask[sm / 32] >> (sm % 32) & 1u);
    const int fast_pool = p.fast_workers, slow_pool = p.num_workers - p.fast_workers;
    int k = atomicAdd(&p.worker_claims[fast ? 0 : 1], 1), worker = -1;
    if (fast && k < fast_pool) {
      worker = k;
    } else if (!fast && k < slow_pool) {
      worker = fast_pool + k;
    } else {  // the own pool used up: the other's
      k = atomicAdd(&p.worker_claims[fast ? 1 : 0], 1);
      // (Both used up: more CTAs than workers, which the launch never makes; no work.)
      if (fast && k < slow_pool) worker = fast_pool + k;
      if (!fast && k < fast_pool) worker = k;
    }
    *scratch = worker;
  }
  __syncthreads();
  return *scratch;
}

// The splits [first, last) of this CTA's worker: its range of the plan's worker_splits, clamped
// to the plan's splits and those to its capacity (a table not made by plan_splits can make it
// empty, never out of bounds: every split index a CTA runs, and so every partial row it writes and
// every split begin it reads, lies in the plan's capacity), or the one split (sequence, without a
// plan) of the worker's index. Empty: the CTA exits.
struct SplitRange {
  int first = 0, last = 0;
};

__device__ __forceinline__ SplitRange splits_of_worker(const DecodeParams& p, int worker) {
  SplitRange r;
  const int items = p.split_offsets == nullptr ? p.batch : min(max(p.split_offsets[p.batch], 0), p.plan_capacity);
  if (p.worker_splits == nullptr) {
    r.first = worker;
    r.last = worker < items ? worker + 1 : worker;
  } else {
    r.first = min(max(p.worker_splits[worker], 0), items);
    r.last = min(max(p.worker_splits[worker + 1], r.first), items);
  }
  return r;
}

// SNAPMLA_PLAN_LOOKUP=window_l1 (the default) or search_l1 (DecodeParams::prefetch_plan): the CTA's
// first warp asks for the first 32 lines (1024 entries) of each of the plan's tables - the split
// offsets, the lengths, the split begins - into L1, one line per lane and table, and for the
// whole block table where it has at most kPrefetchTableEntries entries (small batches, the rows no
// wider than the sequences need), before its worker range's loads. Their latency overlaps those
// loads', so the lookups after them (the search's rounds, or the window's one) and the first page
// index hit L1 where each would otherwise wait on L2 or memory. Hints only.
inline constexpr int kPrefetchTableEntries = 2048;  // 64 lines of 128 bytes: two per lane

__device__ __forceinline__ void prefetch_plan(const DecodeParams& p) {
  if (!p.prefetch_plan || p.split_offsets == nullptr || threadIdx.x >= 32) return;
  const int first = int(threadIdx.x) * 32;  // the lane's line: entries [first, first + 32)
  if (first <= p.batch) ptx::prefetch_l1(p.split_offsets + first);
  if (first < p.batch) ptx::prefetch_l1(p.seqlens + first);
  if (first < p.plan_capacity) ptx::prefetch_l1(p.split_begin + first);
  const int64_t table = int64_t(p.batch) * p.max_pages;
  if (table <= kPrefetchTableEntries)
    for (int64_t e = first; e < table; e += 32 * 32) ptx::prefetch_l1(p.block_table + e);
}

// The CTA's splits (every decode kernel's first step): its worker's (claimed_worker, with its
// scratch word), or none where it has no worker; the plan's tables prefetched first where asked.
__device__ __forceinline__ SplitRange cta_splits(const DecodeParams& p, int* scratch) {
  prefetch_plan(p);
  const int worker = claimed_worker(p, scratch);
  return worker >= 0 ? splits_of_worker(p, worker) : SplitRange{};
}

// The decode kernels' two places to let a programmatic combine start (DecodeParams::dependents_late):
// at the CTA's start, or after its last split's pages, before its stores (FlashMLA's place: the
// combine's launch then overlaps the stores, and its blocks do not wait through the whole decode).
// dependents_at_start also waits for the previous kernel's writes where the decode was launched as
// its programmatic dependent (DecodeParams::wait_previous_grid): every decode kernel calls it first.
__device__ __forceinline__ void dependents_at_start(const DecodeParams& p) {
  if (!p.dependents_late) ptx::launch_dependents();
  if (p.wait_previous_grid) ptx::grid_dependency_wait();
}
__device__ __forceinline__ void dependents_after_pages(const DecodeParams& p, const SplitRange& range, int item) {
  if (p.dependents_late && item + 1 == range.last) ptx::launch_dependents();
}

// The named barrier between two splits of a CTA (above every kernel's own ids).
inline constexpr int kSplitBoundaryBarrier = 15;

struct NoInit {
  __device__ void operator()() const {}
};

// Between two splits of a persistent CTA, by all its threads (each role at the top of its next
// split): every thread is done with the last split - its mbarrier phases, its named-barrier
// hand-offs (each kernel's are balanced within a split), its shared memory, its wgmmas - then
// thread 0 re-initializes the mbarriers (`init`, as at the kernel's start) and all go on, so each
// split starts from the state a fresh CTA has. The proxy fence orders this split's generic
// accesses of the stages (the staged output, P) before the next split's TMA writes to them.
// The cost is the pipeline's drain and refill, which the plan counts as a piece's fixed cost.
// A role without thread 0 passes NoInit{}, so that it holds no barrier addresses across its
// splits for a call it never makes.
template <int kThreads, typename Init>
__device__ __forceinline__ void split_boundary(const Init& init) {
  wg::fence_proxy_async();
  ptx::barrier_sync_unaligned<kSplitBoundaryBarrier, kThreads>();
  if (threadIdx.x == 0) {
    init();
    wg::fence_proxy_async();  // the new barriers before the next split's TMA completes on them
  }
  ptx::barrier_sync_unaligned<kSplitBoundaryBarrier, kThreads>();
}

// The CTA's start, after its worker's splits were found non-empty (every decode kernel): thread 0
// checks that the dynamic shared memory is 1024-byte aligned (the swizzled tiles need it),
// prefetches the kernel's tensor-map descriptors and initializes the barriers (`init`, as
// split_boundary does again before each further split); then the whole CTA goes on together.
template <typename Init, typename... Maps>
__device__ __forceinline__ void start_cta(const uint8_t* smem, const Init& init, const Maps*... maps) {
  if (threadIdx.x == 0) {
    if (ptx::smem_addr(smem) % 1024 != 0) __trap();
    (tma::prefetch_map(maps), ...);
    init();
  }
  __syncthreads();
}

// One round of the search for the last sequence seq in [lo, lo + n) with offsets[seq] <= item
// (offsets non-decreasing), by the whole calling warp: it loads 32 offsets at a stride and keeps
// the last one <= item (lane 0's, offsets[lo], where none is), which leaves ceil(n / 32)
// candidates.
__device__ __forceinline__ void narrow_candidates(const int32_t* offsets, int item, int& lo, int& n) {
  const int lane = int(threadIdx.x % 32);
  const int stride = (n + 31) / 32;
  const bool le = lane * stride < n && offsets[lo + lane * stride] <= item;
  const unsigned m = __ballot_sync(0xffffffffu, le);
  const int last = m == 0 ? 0 : 31 - __clz(int(m));
  lo += last * stride;
  n = min(stride, n - last * stride);
}

// The last sequence seq in [0, batch) with offsets[seq] <= item (offsets non-decreasing,
// offsets[0] = 0), found by the whole calling warp in rounds of narrow_candidates, so up to 1024
// sequences take two rounds of loads, not the ~10 dependent ones of a binary search - they stand
// between a CTA's start and its first page. Every caller is a whole warp (the decode kernels look
// their work up per warpgroup).
__device__ __forceinline__ int seq_of_split(const int32_t* offsets, int batch, int item) {
  int lo = 0, n = batch;  // the answer is in [lo, lo + n)
  while (n > 1) narrow_candidates(offsets, item, lo, n);
  return lo;
}

// A Work's length from cache_seqlens' entry: lengths outside the block table are clamped, so that
// nothing outside it is read, and mark the work as faulted (the host validates them where the
// tables are host memory).
__device__ __forceinline__ void set_length(const DecodeParams& p, Work& w, int32_t len) {
  const int64_t cap = int64_t(p.max_pages) * kPageSize;
  w.bad_len = len < 0 || len > cap;
  w.len = int(min(max(int64_t(len), int64_t(0)), cap));
}

// The lookup in fewer rounds of dependent loads (DecodeParams::lookup_window, SNAPMLA_PLAN_LOOKUP=
// window_l1, the default, or window), from the same table entries, so the same Work. The search
// narrows the candidates as seq_of_split does while more than 32 remain (one round up to 1024
// sequences); its last round, one candidate per lane, loads each candidate's first split, the next
// sequence's and its length, and the split's begins (they depend on `item` alone) go out with
// them; the chosen lane's entries are shuffled to the warp. At batch <= 32 the whole lookup is one
// round of loads, where work_of's search is two (the offsets, then the sequence's entries). The
// next split's begin is loaded inside the plan's capacity only, and used as work_of uses it, below
// the sequence's last split inside the capacity (a table not made by plan_splits reads nothing out
// of bounds). (Its last three lines are work_of's; work_of keeps them inline with its own
// conditional load: written through one shared helper, the three-consumer tile spilled 32 bytes
// where it spills 20.)
__device__ __forceinline__ Work work_of_window(const DecodeParams& p, int item) {
  const int lane = int(threadIdx.x % 32);
  const int32_t* offsets = p.split_offsets;
  int lo = 0, n = p.batch;  // the answer is in [lo, lo + n)
  while (n > 32) narrow_candidates(offsets, item, lo, n);
  // Lanes past the candidates load sequence lo's entries (in bounds) and are not chosen.
  const bool candidate = lane < n;
  const int s = candidate ? lo + lane : lo;
  const int32_t first = offsets[s], next = offsets[s + 1], len = p.seqlens[s];
  const int32_t begin = p.split_begin[item];
  const int32_t next_begin = item + 1 < p.plan_capacity ? p.split_begin[item + 1] : 0;
  const unsigned m = __ballot_sync(0xffffffffu, candidate && first <= item);
  const int pick = m == 0 ? 0 : 31 - __clz(int(m));  // as seq_of_split's last round: lane 0 if none
  Work w;
  w.seq = lo + pick;
  set_length(p, w, __shfl_sync(0xffffffffu, len, pick));
  w.split = item;
  const int32_t seq_first = __shfl_sync(0xffffffffu, first, pick);
  const int32_t seq_last = min(__shfl_sync(0xffffffffu, next, pick), p.plan_capacity);  // as work_of's
  w.single = seq_last - seq_first <= 1;
  w.begin = min(max(begin, 0), w.len);
  w.end = item + 1 < seq_last ? min(max(next_begin, w.begin), w.len) : w.len;
  return w;
}

// The work of split `item` (in the CTA's SplitRange; returned by value, so that it stays in
// registers), looked up by a whole warp (seq_of_split).
__device__ __forceinline__ Work work_of(const DecodeParams& p, int item) {
  Work w;
  if (p.split_offsets == nullptr) {
    w.seq = item;
  } else {
    w.seq = seq_of_split(p.split_offsets, p.batch, item);
  }
  set_length(p, w, p.seqlens[w.seq]);
  w.split = item;
  if (p.split_offsets == nullptr) {
    w.single = true;
    w.begin = 0;
    w.end = w.len;
  } else {
    // The sequence's last split inside the plan's capacity, so that split_begin[item + 1] is read
    // there only (a range beyond it makes the combine write the sequence's rows as NaN).
    const int first = p.split_offsets[w.seq], last = min(p.split_offsets[w.seq + 1], p.plan_capacity);
    w.single = last - first <= 1;
    w.begin = min(max(p.split_begin[item], 0), w.len);
    w.end = item + 1 < last ? min(max(p.split_begin[item + 1], w.begin), w.len) : w.len;
  }
  return w;
}

// A role's lookup: work_of_window by default (DecodeParams::lookup_window), else work_of. Every
// role looks its splits up itself (the loader before its requests, the consumers before their Q
// rows). Where the window's registers spill, a role calls work_of instead: the three-consumer
// tile's producer (32 registers) and decode_bf16's own-page PV's (24), and the consumers of
// decode_fp8's transposing and three-consumer tiles, whose loops hold the most (10-50 bytes with
// it); also the transposer warps, which only wait for the pages.
__device__ __forceinline__ Work lookup_work(const DecodeParams& p, int item) {
  if (p.lookup_window && p.split_offsets != nullptr) return work_of_window(p, item);
  return work_of(p, item);
}

// Tokens query row r (r = i * h + head) may see.
// The first token some query row of the sequence does not see (causal, s_q > 1: tokens in
// [band_start, len) are visible to the later queries only), or len. The PV reads such a token's V
// for every row, so a non-finite value there must be zeroed after the scores have used it (its P
// is 0 for the rows that do not see it, and 0 x NaN is NaN).
__device__ __forceinline__ int band_start(const DecodeParams& p, const Work& w) {
  return p.causal ? max(0, w.len - p.seqlen_q + 1) : w.len;
}

__device__ __forceinline__ int visible_end(const DecodeParams& p, const Work& w, int r) {
  const int i = r / p.num_heads;
  const int vis = p.causal ? max(0, w.len - p.seqlen_q + i + 1) : w.len;
  return min(vis, w.end);
}

}  // namespace snapmla::cuda
