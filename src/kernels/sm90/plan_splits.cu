// plan_splits on the GPU: the reference's algorithm (docs/reference.md) in one block, reading
// cache_seqlens on the device and writing the fixed-size plan buffers. No host sync, so it
// can be captured in a CUDA graph together with the decode it plans.
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "../common/check.cuh"
#include "../kernels.hpp"

namespace snapmla::cuda {
namespace {

constexpr int kThreads = 1024;

__device__ __forceinline__ int64_t blocks_of(int32_t len) {
  return len > 0 ? (int64_t(len) + kPageSize - 1) / kPageSize : 0;
}

__global__ void __launch_bounds__(kThreads) plan_splits_kernel(const int32_t* __restrict__ seqlens,
                                                               int batch, int num_workers,
                                                               int32_t* __restrict__ offsets,
                                                               int32_t* __restrict__ begins) {
  using Reduce = cub::BlockReduce<long long, kThreads>;
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename Scan::TempStorage scan;
  } tmp;
  __shared__ long long total_s;
  long long local = 0;
  for (int i = threadIdx.x; i < batch; i += kThreads) local += blocks_of(seqlens[i]);
  const long long total = Reduce(tmp.reduce).Sum(local);
  if (threadIdx.x == 0) total_s = total;
  __syncthreads();
  const long long chunk = max(1LL, (total_s + num_workers - 1) / num_workers);
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
}

}  // namespace

void plan_splits(const PageTable& pages, int num_workers, const SplitPlan& plan, Stream s) {
  plan_splits_kernel<<<1, kThreads, 0, as_stream(s)>>>(pages.cache_seqlens, pages.batch,
                                                       num_workers, plan.split_offsets,
                                                       plan.split_begin);
  check_launch("plan_splits_kernel");
}

}  // namespace snapmla::cuda
