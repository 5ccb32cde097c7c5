// combine: merge the partial results of split sequences (docs/reference.md, "Splits and
// combine"), fp32 or, under SNAPMLA_PARTIALS=bf16, bf16 rows (CombineParams::partial_bf16). Two
// task shapes, the same bits (each element takes the same additions in the same order): the
// splits are summed in groups of kGroup, each group's partial rows loaded at once and summed in
// split order, and the groups' sums are added in group order.
// - Quarter tasks (combine_quarter_kernel): a task is one query row and quarter of the 512 dims (a
//   lane takes 4 dims, one 16-byte load per split), done by W warps of one block (1, 2, 4 or 8);
//   the W warps take the groups in turn, so W changes which warp sums a group but not the order
//   of the additions: a row's bits do not depend on W, which each block picks from its own
//   sequence's split count and the grid, nor so on the batch (the batch-invariant plans). Why
//   W > 1: a sequence split over the whole GPU (b = 1: up to one split per worker) has few rows,
//   and one warp per task walked its groups one load latency at a time (H200, b = 1, h = 16, 8K:
//   128 one-block splits, 16 groups in a row; the decode took 31.3 us with W = 1 and 16.6 us with
//   W = 8).
// - Row tasks (combine_row_kernel): a warp merges a whole row, so the row's lse and each split's
//   weight are formed once instead of once per quarter, and a split's four quarter loads are in
//   flight at once. Where a sequence has many rows per block this halves the combine (H200,
//   b = 46, h = 128, 8K: 21.1 -> 10.3 us; b = 82, h = 128, 32K: 31.6 -> 11.4 us); where it has
//   few, the quarter tasks' four times as many warps win (b = 4, h = 64, 8K: 5.8 vs 6.4 us).
// Sequences with a single split were written directly by the decode kernel and are skipped here;
// one whose range of splits is empty or leaves the plan's capacity gets NaN rows (split_span).
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/common/check.cuh"
#include "kernels/common/numeric.cuh"
#include "kernels/common/ptx.cuh"
#include "combine.hpp"
#include "combine_rows.cuh"

namespace snapmla::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kBlocksPerSm = 4;  // 8-warp blocks resident per SM (at most 64 registers a thread)
constexpr int kMaxWarpsPerTask = kWarpsPerBlock;

// One group's weighted sum, splits g0 .. min(g0 + kGroup, hi) - 1 in order (zero past hi); T: the
// partials' type (load_partial4).
template <typename T>
__device__ __forceinline__ float4 group_sum(const float* lse_of, const T* src, int rows, int64_t split_stride,
                                            int g0, int hi, float total) {
  float w[kGroup];
  float4 v[kGroup];
#pragma unroll
  for (int u = 0; u < kGroup; ++u) {
    const int k = g0 + u;
    w[u] = k < hi ? expf(lse_of[int64_t(k) * rows] - total) : 0.f;
    v[u] = k < hi ? load_partial4<false>(src + k * split_stride) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int u = 0; u < kGroup; ++u) {
    if (w[u] == 0.f) continue;  // an empty split (lse -inf) adds nothing
    add_weighted(s, w[u], v[u]);
  }
  return s;
}

// Warps per task for a sequence of `splits` splits and `tasks` tasks on `blocks` blocks: one per
// group (rounded down to a power of two, at most 8), as long as the tasks still fit the
// sequence's blocks.
__device__ __forceinline__ int warps_per_task(int splits, int tasks, int blocks) {
  const int groups = (splits + kGroup - 1) / kGroup;
  int w = 1;
  while (w < kMaxWarpsPerTask && 2 * w <= groups && int64_t(tasks) * 2 * w <= int64_t(blocks) * kWarpsPerBlock) w *= 2;
  return w;
}

// Row tasks: block (b, y) merges rows y * 8 + w, + gridDim.y * 8, ... of sequence b, warp w a
// row (combine_row, combine_rows.cuh). T: the partials' type (float, or uint16_t for bf16).
template <typename T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, kBlocksPerSm) combine_row_kernel(CombineParams p) {
  // A decode launched as this grid's programmatic dependent (the next step's, SNAPMLA_DECODE_PDL)
  // may start once every block is running; it waits for this grid's writes itself.
  ptx::launch_dependents();
  ptx::grid_dependency_wait();  // the decode's partials (launched as its programmatic dependent)
  const int b = blockIdx.x;
  const SplitSpan span = split_span(p, b);
  if (!span.broken && span.hi - span.lo <= 1) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = blockIdx.y * kWarpsPerBlock + warp; r < p.rows; r += gridDim.y * kWarpsPerBlock) {
    if (span.broken) store_row_nan(p, b, r, lane);
    else combine_row<false, T>(p, b, r, span.lo, span.hi, lane);
  }
}

// Quarter tasks: block (b, y) merges sequence b's tasks y * T + t, + gridDim.y * T, ... (T = 8 / W
// tasks per block pass, warp w on task w / W as its part w % W). Every thread of a block makes
// the same passes and rounds (the block is one sequence's, so W and the split count are the
// block's), which the block barriers between the W warps' group sums need. The grid is at most about one wave of
// blocks (combine below; a wave that assumed 8 resident blocks where registers allow 5 ran two
// waves at b = 8, h = 128, 8K: +3.4 us on a 47 us decode): a block of a sequence with one split
// exits at once, but the GPU still launches it, and one block per 8 tasks (b = 128, h = 128: 8192
// blocks where no sequence is split) cost ~4 us per call. T: as combine_row_kernel's.
template <typename T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, kBlocksPerSm) combine_quarter_kernel(CombineParams p) {
  // A decode launched as this grid's programmatic dependent (the next step's, SNAPMLA_DECODE_PDL)
  // may start once every block is running; it waits for this grid's writes itself.
  ptx::launch_dependents();
  ptx::grid_dependency_wait();  // the decode's partials (launched as its programmatic dependent)
  const int b = blockIdx.x;
  const SplitSpan span = split_span(p, b);
  if (!span.broken && span.hi - span.lo <= 1) return;
  // A broken range is merged as no split with a NaN lse: every active task stores NaN.
  const int lo = span.broken ? 0 : span.lo, hi = span.broken ? 0 : span.hi;
  __shared__ float4 group_sums[kWarpsPerBlock][32];
  const int tasks = p.rows * kQuarters;
  const int W = warps_per_task(hi - lo, tasks, gridDim.y), warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int part = warp % W, per_pass = kWarpsPerBlock / W;
  const int64_t split_stride = int64_t(p.rows) * kLatentDim;
  for (int t0 = blockIdx.y * per_pass; t0 < tasks; t0 += gridDim.y * per_pass) {
    const int task = t0 + warp / W;
    const bool active = task < tasks;
    const int r = active ? task / kQuarters : 0, quarter = task % kQuarters;
    const float* lse_of = p.partial_lse + r;  // split k's at k * rows
    const float total = active && !span.broken ? combined_lse(lse_of, p.rows, lo, hi, lane) : NAN;
    const bool sums = active && total > -INFINITY;  // false for NaN too
    const int d0 = quarter * (kLatentDim / kQuarters) + 4 * lane;
    const T* src = partials_of<T>(p) + int64_t(r) * kLatentDim + d0;  // split k's at k * rows * 512
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int g0 = lo; g0 < hi; g0 += W * kGroup) {  // a round: W groups, one per part
      const int mine = g0 + part * kGroup;
      const float4 s = sums && mine < hi ? group_sum(lse_of, src, p.rows, split_stride, mine, hi, total)
                                         : make_float4(0.f, 0.f, 0.f, 0.f);
      if (W == 1) {
        add(acc, s);
        continue;
      }
      group_sums[warp][lane] = s;
      __syncthreads();
      if (part == 0)
        for (int j = 0; j < W && g0 + j * kGroup < hi; ++j) add(acc, group_sums[warp + j][lane]);
      __syncthreads();
    }
    if (!active || part != 0) continue;
    store_row_quarter(p, b, r, d0, quarter, lane, sums, total, acc);
  }
}

}  // namespace

void combine(const CombineParams& p, cudaStream_t stream, bool programmatic, CombineTasks tasks) {
  if (p.batch == 0) return;
  // The current device's SM count (the dispatch made the output's device current): a grid-size
  // heuristic only, so a failed query falls back to the H200's.
  int sms = current_sm_count();
  if (sms == 0) sms = 132;
  // Blocks per sequence: enough for 8 warps per task (a block per task) where one wave of blocks
  // holds them, else that wave's share; a block whose sequence has fewer groups takes more tasks,
  // and those past its tasks exit at once. The wave is shared among the sequences that can have
  // splits: with the plan's worker ranges at most min(batch, num_workers) of them (a cut per worker
  // boundary; the rest of the grid's blocks exit at once), else the whole batch. Shared among the
  // batch, b = 160 at h = 128 gave each of its ~65 split sequences 4 blocks, so their 512 tasks
  // took 16 passes of one warp each.
  const int per_seq = p.rows * kQuarters * kMaxWarpsPerTask / kWarpsPerBlock;
  const int wave = p.num_workers > 0 ? sms * kBlocksPerSm / std::min(p.batch, p.num_workers)
                                     : (sms * kBlocksPerSm + p.batch - 1) / p.batch;
  const int blocks = std::min(per_seq, std::max(1, wave));
  // Row tasks where a sequence has at least two rows per block, else quarter tasks. Measured on the
  // H200 over the batch sweep, whole decode time with row tasks / with quarter tasks: 0.89-1.02x
  // (median 0.978, 69 cases) at two or more rows per block, 0.97-1.12x (median 1.017, 56 cases)
  // below, where the row tasks leave most of the quarter tasks' warps idle.
  const bool rows = tasks == CombineTasks::kRows || (tasks == CombineTasks::kAuto && p.rows >= 2 * blocks);
  const int row_blocks = (p.rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const dim3 grid(p.batch, rows ? std::min(blocks, row_blocks) : blocks);
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(kWarpsPerBlock * 32);
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = programmatic ? 1 : 0;
  const bool bf16 = p.partial_bf16 != nullptr;
  if (rows)
    check(bf16 ? cudaLaunchKernelEx(&config, combine_row_kernel<uint16_t>, p)
               : cudaLaunchKernelEx(&config, combine_row_kernel<float>, p),
          "combine_row_kernel");
  else
    check(bf16 ? cudaLaunchKernelEx(&config, combine_quarter_kernel<uint16_t>, p)
               : cudaLaunchKernelEx(&config, combine_quarter_kernel<float>, p),
          "combine_quarter_kernel");
}

}  // namespace snapmla::cuda
