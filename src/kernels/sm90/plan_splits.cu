// plan_splits on the GPU: the reference's balanced division (core/split_rule.hpp), or its deal
// of whole sequences where that is cheaper, in one block, reading cache_seqlens on the device
// and writing the fixed-size plan buffers. No host sync, so it can be captured in a CUDA graph
// together with the decode it plans. One block reduction gives the totals (PlanTotals); then a
// thread per sequence: two block scans give each sequence's place on the cost axis and its first
// split, and its splits and the worker boundaries inside it are its own to write, so every entry
// is written by one thread.
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "core/split_rule.hpp"
#include "kernels/common/check.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/kernels.hpp"

namespace snapmla::cuda {
namespace {

constexpr int kThreads = 1024;

__device__ __forceinline__ int64_t blocks_of(int32_t len) {
  return len > 0 ? (int64_t(len) + kPageSize - 1) / kPageSize : 0;
}

struct MergeTotals {
  __device__ detail::PlanTotals operator()(const detail::PlanTotals& a, const detail::PlanTotals& b) const {
    return detail::merge(a, b);
  }
};

__global__ void __launch_bounds__(kThreads) plan_splits_kernel(const int32_t* __restrict__ seqlens,
                                                               int batch, int num_workers, int query_rows,
                                                               int split_blocks, int capacity,
                                                               detail::PlanLabOptions lab,
                                                               int32_t* __restrict__ offsets,
                                                               int32_t* __restrict__ begins,
                                                               int32_t* __restrict__ worker_splits) {
  // A decode launched as this grid's programmatic dependent (SNAPMLA_DECODE_PDL) may start at once;
  // it waits for the plan itself.
  ptx::launch_dependents();
  using Reduce = cub::BlockReduce<detail::PlanTotals, kThreads>;
  using Scan64 = cub::BlockScan<long long, kThreads>;
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename Scan64::TempStorage scan64;
    typename Scan::TempStorage scan;
  } tmp;
  __shared__ detail::PlanTotals totals_s;
  detail::PlanTotals local;
  for (int i = threadIdx.x; i < batch; i += kThreads) detail::add_sequence(local, blocks_of(seqlens[i]), split_blocks);
  const detail::PlanTotals totals = Reduce(tmp.reduce).Reduce(local, MergeTotals{});
  if (threadIdx.x == 0) totals_s = totals;
  __syncthreads();
  const detail::WorkerShares shares =
      detail::worker_shares(totals_s, batch, num_workers, query_rows, split_blocks, capacity, lab);
  if (threadIdx.x == 0) {
    offsets[0] = 0;
    if (worker_splits != nullptr) worker_splits[0] = 0;
  }
  long long cost_base = 0;  // the cost axis before this tile of sequences
  int split_base = 0;       // the splits before it
  for (int base = 0; base < batch; base += kThreads) {
    const int i = base + threadIdx.x;
    const long long blocks = i < batch ? blocks_of(seqlens[i]) : 0;
    const long long cost = i < batch ? blocks + detail::piece_fixed_cost(i, shares) : 0;
    long long c_excl = 0, c_tile = 0;
    __syncthreads();  // tmp is reused across scans and tiles
    Scan64(tmp.scan64).ExclusiveSum(cost, c_excl, c_tile);
    const detail::SequenceSplits seq = detail::sequence_splits(cost_base + c_excl, blocks, i, shares);
    const int n = i < batch ? int(seq.count()) : 0;
    int excl = 0, tile_total = 0;
    __syncthreads();
    Scan(tmp.scan).ExclusiveSum(n, excl, tile_total);
    if (i < batch) {
      const int first = split_base + excl;
      for (int j = 0; j < n; ++j) begins[first + j] = int32_t(seq.begin_block(j) * kPageSize);
      offsets[i + 1] = first + n;
      if (worker_splits != nullptr)
        for (int w = seq.cuts.lo; w < seq.cuts.hi; ++w) worker_splits[w] = first + int(seq.worker_start(w));
    }
    cost_base += c_tile;
    split_base += tile_total;
  }
  const int splits = split_base;
  // Capacity past the last split is never read; -1 there, so a printed plan shows no garbage.
  for (int k = splits + int(threadIdx.x); k < capacity; k += kThreads) begins[k] = -1;
  if (worker_splits == nullptr) return;
  // Workers past the axis's end, and past the workers the total is worth: no splits (the
  // reference's rule); entries past the last worker's end: -1.
  const int first_idle = max(1, detail::busy_workers(shares));
  const int last = min(capacity - batch, capacity - 1);
  for (int w = first_idle + int(threadIdx.x); w < capacity; w += kThreads) worker_splits[w] = w <= last ? splits : -1;
}

}  // namespace

void plan_splits(const PageTable& pages, int num_workers, const SplitPlan& plan, Stream s, int query_rows,
                 int split_blocks, detail::PlanLabOptions lab) {
  plan_splits_kernel<<<1, kThreads, 0, as_stream(s)>>>(pages.cache_seqlens, pages.batch, num_workers, query_rows,
                                                       split_blocks, plan.capacity, lab, plan.split_offsets,
                                                       plan.split_begin, plan.worker_splits);
  check_launch("plan_splits_kernel");
}

}  // namespace snapmla::cuda
