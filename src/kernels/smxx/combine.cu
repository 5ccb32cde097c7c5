// combine: merge the fp32 partial results of split sequences (docs/reference.md, "Splits and
// combine"). One warp per query row; sequences with a single split were written directly by
// the decode kernel and are skipped here.
#include <cuda_runtime.h>

#include "../common/check.cuh"
#include "../common/numeric.cuh"
#include "combine.hpp"

namespace snapmla::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void combine_kernel(CombineParams p) {
  const int b = blockIdx.x;
  const int r = blockIdx.y * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= p.rows) return;
  const int lo = p.split_offsets[b], hi = p.split_offsets[b + 1];
  if (hi - lo <= 1) return;
  float m = -INFINITY;
  for (int k = lo; k < hi; ++k) m = fmaxf(m, p.partial_lse[int64_t(k) * p.rows + r]);
  const int i = r / p.num_heads, h = r % p.num_heads;
  float* lse_out = p.lse + (int64_t(b) * p.num_heads + h) * p.seqlen_q + i;
  uint16_t* out = p.out + (int64_t(b) * p.rows + r) * kLatentDim;
  if (m == -INFINITY) {
    for (int d = lane; d < kLatentDim; d += 32) out[d] = 0;
    if (lane == 0) *lse_out = -INFINITY;
    return;
  }
  float sum = 0.f;
  for (int k = lo; k < hi; ++k) sum += expf(p.partial_lse[int64_t(k) * p.rows + r] - m);
  const float total = m + logf(sum);
  float acc[16] = {};
  for (int k = lo; k < hi; ++k) {
    const float w = expf(p.partial_lse[int64_t(k) * p.rows + r] - total);
    if (w == 0.f) continue;
    const float4* src =
        reinterpret_cast<const float4*>(p.partial_out + (int64_t(k) * p.rows + r) * kLatentDim) + lane * 4;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float4 v = src[j];
      acc[4 * j] += w * v.x;
      acc[4 * j + 1] += w * v.y;
      acc[4 * j + 2] += w * v.z;
      acc[4 * j + 3] += w * v.w;
    }
  }
  uint32_t o[8];
#pragma unroll
  for (int j = 0; j < 8; ++j)
    o[j] = uint32_t(float_to_bf16_bits(acc[2 * j])) | (uint32_t(float_to_bf16_bits(acc[2 * j + 1])) << 16);
  uint4* dst = reinterpret_cast<uint4*>(out + lane * 16);
  dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
  dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
  if (lane == 0) *lse_out = total;
}

}  // namespace

void combine(const CombineParams& p, cudaStream_t stream) {
  if (p.batch == 0) return;
  const dim3 grid(p.batch, (p.rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  combine_kernel<<<grid, kWarpsPerBlock * 32, 0, stream>>>(p);
  check_launch("combine_kernel");
}

}  // namespace snapmla::cuda
