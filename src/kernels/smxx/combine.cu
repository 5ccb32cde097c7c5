// combine: merge the fp32 partial results of split sequences (docs/reference.md, "Splits and
// combine"). One warp per query row and quarter of the 512 dims (a lane takes 4 dims, one 16-byte
// load per split): a sequence split over the whole GPU (b = 1: ~66 splits per row tile) has few
// rows, and a warp per whole row left most SMs idle while each warp walked its splits one load
// latency at a time. The splits' lse are reduced across the lanes, and the partial rows are
// loaded kUnroll splits at a time before they are summed. Sequences with a single split were
// written directly by the decode kernel and are skipped here.
#include <cuda_runtime.h>

#include "../common/check.cuh"
#include "../common/numeric.cuh"
#include "combine.hpp"

namespace snapmla::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kQuarters = 4;  // warps per row: 128 dims each
constexpr int kUnroll = 8;    // splits whose partial rows are in flight at once

__global__ void combine_kernel(CombineParams p) {
  const int b = blockIdx.x;
  const int wq = blockIdx.y * kWarpsPerBlock + threadIdx.x / 32;  // (row, quarter)
  const int r = wq / kQuarters, quarter = wq % kQuarters;
  const int lane = threadIdx.x % 32;
  if (r >= p.rows) return;
  const int lo = p.split_offsets[b], hi = p.split_offsets[b + 1];
  if (hi - lo <= 1) return;
  const float* lse_of = p.partial_lse + r;  // split k's at k * rows
  float m = -INFINITY;
  for (int k = lo + lane; k < hi; k += 32) m = fmaxf(m, lse_of[int64_t(k) * p.rows]);
  m = warp_max(m);
  const int i = r / p.num_heads, h = r % p.num_heads;
  float* lse_out = p.lse + (int64_t(b) * p.num_heads + h) * p.seqlen_q + i;
  const int d0 = quarter * (kLatentDim / kQuarters) + 4 * lane;
  uint2* out = reinterpret_cast<uint2*>(p.out + (int64_t(b) * p.rows + r) * kLatentDim + d0);
  if (m == -INFINITY) {
    *out = make_uint2(0u, 0u);
    if (quarter == 0 && lane == 0) *lse_out = -INFINITY;
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

}  // namespace

void combine(const CombineParams& p, cudaStream_t stream) {
  if (p.batch == 0) return;
  const dim3 grid(p.batch, (p.rows * kQuarters + kWarpsPerBlock - 1) / kWarpsPerBlock);
  combine_kernel<<<grid, kWarpsPerBlock * 32, 0, stream>>>(p);
  check_launch("combine_kernel");
}

}  // namespace snapmla::cuda
