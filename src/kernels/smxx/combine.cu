// combine: merge the fp32 partial results of split sequences (docs/reference.md, "Splits and
// combine"). One warp per query row and quarter of the 512 dims (a lane takes 4 dims, one 16-byte
// load per split): a sequence split over the whole GPU (b = 1: ~66 splits per row tile) has few
// rows, and a warp per whole row left most SMs idle while each warp walked its splits one load
// latency at a time. The splits' lse are reduced across the lanes, and the partial rows are
// loaded kUnroll splits at a time before they are summed. Sequences with a single split were
// written directly by the decode kernel and are skipped here.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/common/check.cuh"
#include "kernels/common/numeric.cuh"
#include "combine.hpp"

namespace snapmla::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kQuarters = 4;  // warps per row: 128 dims each
constexpr int kUnroll = 8;    // splits whose partial rows are in flight at once
constexpr int kBlocksPerSm = 8;  // 8-warp blocks that fill an SM (64 warps)

// Row r, dims [128 quarter, + 128) of sequence b, whose splits are lo .. hi - 1 (at least two), by
// one warp.
__device__ __forceinline__ void combine_row_quarter(const CombineParams& p, int b, int lo, int hi, int r, int quarter,
                                                    int lane) {
  const float* lse_of = p.partial_lse + r;  // split k's at k * rows
  float m = -INFINITY;
  bool faulted = false;  // a split wrote NaN (bad page, bad length, non-finite score): so does the row
  for (int k = lo + lane; k < hi; k += 32) {
    const float v = lse_of[int64_t(k) * p.rows];
    faulted |= isnan(v);
    m = fmaxf(m, v);
  }
  m = warp_max(m);
  const int i = r / p.num_heads, h = r % p.num_heads;
  float* lse_out = p.lse + (int64_t(b) * p.num_heads + h) * p.seqlen_q + i;
  const int d0 = quarter * (kLatentDim / kQuarters) + 4 * lane;
  uint2* out = reinterpret_cast<uint2*>(p.out + (int64_t(b) * p.rows + r) * kLatentDim + d0);
  if (__any_sync(0xffffffffu, faulted)) {
    *out = make_uint2(bf16x2_bits(NAN, NAN), bf16x2_bits(NAN, NAN));
    if (quarter == 0 && lane == 0) *lse_out = NAN;
    return;
  }
  if (m == -INFINITY) {
    *out = make_uint2(0u, 0u);
    if (quarter == 0 && lane == 0) *lse_out = p.empty_lse;
    return;
  }
  float sum = 0.f;
  for (int k = lo + lane; k < hi; k += 32) sum += expf(lse_of[int64_t(k) * p.rows] - m);
  const float total = m + logf(warp_sum(sum));
  const float* src = p.partial_out + int64_t(r) * kLatentDim + d0;  // split k's at k * rows * 512
  const int64_t split_stride = int64_t(p.rows) * kLatentDim;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int k0 = lo; k0 < hi; k0 += kUnroll) {
    float w[kUnroll];
    float4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int k = k0 + u;
      w[u] = k < hi ? expf(lse_of[int64_t(k) * p.rows] - total) : 0.f;
      v[u] = k < hi ? *reinterpret_cast<const float4*>(src + k * split_stride) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (w[u] == 0.f) continue;  // an empty split (lse -inf) adds nothing
      acc.x += w[u] * v[u].x;
      acc.y += w[u] * v[u].y;
      acc.z += w[u] * v[u].z;
      acc.w += w[u] * v[u].w;
    }
  }
  *out = make_uint2(bf16x2_bits(acc.x, acc.y), bf16x2_bits(acc.z, acc.w));
  if (quarter == 0 && lane == 0) *lse_out = total;
}

// Block (b, y) merges sequence b's (row, quarter) tasks y * 8 + warp, + gridDim.y * 8, ... The grid is
// at most about one wave of blocks (combine below): a block of a sequence with one split exits at
// once, but the GPU still launches it, and one block per 8 tasks (b = 128, h = 128: 8192 blocks
// where no sequence is split) cost ~4 us per call; split sequences keep a warp per task where the
// batch is small and share warps where a wave holds fewer warps than tasks.
__global__ void combine_kernel(CombineParams p) {
  const int b = blockIdx.x;
  const int lo = p.split_offsets[b], hi = p.split_offsets[b + 1];
  if (hi - lo <= 1) return;
  const int lane = threadIdx.x % 32;
  for (int wq = blockIdx.y * kWarpsPerBlock + threadIdx.x / 32; wq < p.rows * kQuarters;
       wq += gridDim.y * kWarpsPerBlock)
    combine_row_quarter(p, b, lo, hi, wq / kQuarters, wq % kQuarters, lane);
}

}  // namespace

void combine(const CombineParams& p, cudaStream_t stream) {
  if (p.batch == 0) return;
  // The current device's SM count (the dispatch made the output's device current): a grid-size
  // heuristic only, so a failed query falls back to the H200's.
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    cudaGetLastError();
    sms = 132;
  }
  const int per_seq = (p.rows * kQuarters + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int wave = (sms * kBlocksPerSm + p.batch - 1) / p.batch;
  const dim3 grid(p.batch, std::min(per_seq, std::max(1, wave)));
  combine_kernel<<<grid, kWarpsPerBlock * 32, 0, stream>>>(p);
  check_launch("combine_kernel");
}

}  // namespace snapmla::cuda
