// plan_splits on the GPU: the reference's algorithm (docs/reference.md) in one block, reading
// cache_seqlens on the device and writing the fixed-size plan buffers. No host sync, so it
// can be captured in a CUDA graph together with the decode it plans.
#include <cuda_runtime.h>

#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "../../core/split_rule.hpp"
#include "../common/check.cuh"
#include "../kernels.hpp"

namespace snapmla::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kSortItems = kMaxOrderedSplits / kThreads;  // splits per thread in the order sort

__device__ __forceinline__ int64_t blocks_of(int32_t len) {
  return len > 0 ? (int64_t(len) + kPageSize - 1) / kPageSize : 0;
}

__global__ void __launch_bounds__(kThreads) plan_splits_kernel(const int32_t* __restrict__ seqlens,
                                                               int batch, int num_workers, int query_rows,
                                                               int capacity,
                                                               int32_t* __restrict__ offsets,
                                                               int32_t* __restrict__ begins,
                                                               int32_t* __restrict__ order) {
  using Reduce = cub::BlockReduce<long long, kThreads>;
  using Scan = cub::BlockScan<int, kThreads>;
  using Sort = cub::BlockRadixSort<int, kThreads, kSortItems, int>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename Scan::TempStorage scan;
    typename Sort::TempStorage sort;
  } tmp;
  __shared__ long long total_s;
  long long local = 0;
  for (int i = threadIdx.x; i < batch; i += kThreads) local += blocks_of(seqlens[i]);
  const long long total = Reduce(tmp.reduce).Sum(local);
  if (threadIdx.x == 0) total_s = total;
  __syncthreads();
  const long long chunk = detail::split_chunk(total_s, num_workers, query_rows);  // the reference's rule
  if (threadIdx.x == 0) offsets[0] = 0;
  int running = 0;
  for (int base = 0; base < batch; base += kThreads) {
    const int i = base + threadIdx.x;
    const long long blocks = i < batch ? blocks_of(seqlens[i]) : 0;
    const int n = i < batch ? int(max(1LL, (4 * blocks + 3 * chunk - 1) / (4 * chunk))) : 0;
    int excl = 0, tile_total = 0;
    __syncthreads();  // tmp.scan is reused across tiles
    Scan(tmp.scan).ExclusiveSum(n, excl, tile_total);
    if (i < batch) {
      const int first = running + excl;
      for (int j = 0; j < n; ++j) begins[first + j] = int32_t(j * blocks / n * kPageSize);
      offsets[i + 1] = first + n;
    }
    running += tile_total;
  }
  // Capacity past the last split is never read; -1 there, so a printed plan shows no garbage.
  for (int k = running + int(threadIdx.x); k < capacity; k += kThreads) {
    begins[k] = -1;
    if (order != nullptr) order[k] = -1;
  }
  if (order == nullptr) return;
  // Launch order (the reference's rule): pages descending, ties in index order. Radix sort is
  // stable and the splits enter it in index order (blocked: thread t holds kSortItems t ..).
  const int splits = running;
  if (splits > kMaxOrderedSplits) {
    for (int k = threadIdx.x; k < splits; k += kThreads) order[k] = k;
    return;
  }
  __syncthreads();  // offsets and begins written by other threads
  int keys[kSortItems], vals[kSortItems];
#pragma unroll
  for (int u = 0; u < kSortItems; ++u) {
    const int k = threadIdx.x * kSortItems + u;
    vals[u] = k;
    keys[u] = -1;  // padding sorts last
    if (k < splits) {
      int lo = 0, hi = batch - 1;  // the split's sequence: last i with offsets[i] <= k
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (offsets[mid] <= k) lo = mid; else hi = mid - 1;
      }
      const int len = max(seqlens[lo], 0);
      const int end = k + 1 < offsets[lo + 1] ? begins[k + 1] : len;
      keys[u] = (end - begins[k] + kPageSize - 1) / kPageSize;
    }
  }
  __syncthreads();  // tmp.scan is reused
  Sort(tmp.sort).SortDescending(keys, vals);
#pragma unroll
  for (int u = 0; u < kSortItems; ++u) {
    const int k = threadIdx.x * kSortItems + u;
    if (k < splits) order[k] = vals[u];
  }
}

}  // namespace

void plan_splits(const PageTable& pages, int num_workers, const SplitPlan& plan, Stream s, int query_rows) {
  plan_splits_kernel<<<1, kThreads, 0, as_stream(s)>>>(pages.cache_seqlens, pages.batch, num_workers, query_rows,
                                                       plan.capacity, plan.split_offsets,
                                                       plan.split_begin, plan.split_order);
  check_launch("plan_splits_kernel");
}

}  // namespace snapmla::cuda
