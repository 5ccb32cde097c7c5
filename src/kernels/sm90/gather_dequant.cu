// gather_dequant: tokens by slot from the FP8 cache back to bf16 rows [n, 576]; one warp per
// row. Slot -1 (padding) gives a zero row; a slot out of range gives a NaN row, so a bad index
// is visible rather than silently wrong.
#include <cuda_runtime.h>

#include "kernels/common/check.cuh"
#include "kernels/common/numeric.cuh"
#include "kernels/kernels.hpp"

namespace snapmla::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

constexpr int kRowsPerWarp = 8;  // rows per warp, loads in flight together

__device__ __forceinline__ void store_row(uint16_t* row, int lane, int64_t slot, int64_t num_slots,
                                          uint4 q, uint32_t r, float s) {
  uint4* dst = reinterpret_cast<uint4*>(row + lane * 16);
  uint32_t* rdst = reinterpret_cast<uint32_t*>(row + kLatentDim) + lane;
  if (slot < 0 || slot >= num_slots) {
    const uint32_t fill = slot == -1 ? 0u : 0x7FC07FC0u;  // zeros, or bf16 NaNs
    dst[0] = dst[1] = make_uint4(fill, fill, fill, fill);
    *rdst = fill;
    return;
  }
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
  uint32_t o[8];
#pragma unroll
  for (int k = 0; k < 4; ++k)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float a = __fmul_rn(e4m3_to_float(uint8_t(w[k] >> (16 * j))), s);
      const float b = __fmul_rn(e4m3_to_float(uint8_t(w[k] >> (16 * j + 8))), s);
      o[2 * k + j] = uint32_t(float_to_bf16_bits(a)) | (uint32_t(float_to_bf16_bits(b)) << 16);
    }
  dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
  dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
  *rdst = uint32_t(float_to_bf16_bits(__fmul_rn(bf16_bits_to_float(uint16_t(r)), s))) |
          (uint32_t(float_to_bf16_bits(__fmul_rn(bf16_bits_to_float(uint16_t(r >> 16)), s))) << 16);
}

__global__ void gather_dequant_kernel(const uint8_t* __restrict__ latent,
                                      const float* __restrict__ scale,
                                      const uint16_t* __restrict__ rope,
                                      const int32_t* __restrict__ slots, int64_t n,
                                      int64_t num_slots, uint16_t* __restrict__ out) {
  const int lane = threadIdx.x % 32;
  const int64_t first = (int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32) * kRowsPerWarp;
  int64_t slot[kRowsPerWarp];
  uint4 q[kRowsPerWarp];
  uint32_t r[kRowsPerWarp];
  float s[kRowsPerWarp];
#pragma unroll
  for (int k = 0; k < kRowsPerWarp; ++k) {
    slot[k] = first + k < n ? slots[first + k] : -1;
    if (slot[k] >= 0 && slot[k] < num_slots) {
      q[k] = reinterpret_cast<const uint4*>(latent + slot[k] * kLatentDim)[lane];
      r[k] = reinterpret_cast<const uint32_t*>(rope + slot[k] * kRopeDim)[lane];
      s[k] = scale[slot[k]];
    }
  }
#pragma unroll
  for (int k = 0; k < kRowsPerWarp; ++k)
    if (first + k < n) store_row(out + (first + k) * kHeadDim, lane, slot[k], num_slots, q[k], r[k], s[k]);
}

}  // namespace

void gather_dequant(const PagedFp8Cache& cache, const SlotMapping& slots, const KvRows& out,
                    Stream s) {
  if (slots.num_tokens == 0) return;
  constexpr int kPerBlock = kWarpsPerBlock * kRowsPerWarp;
  gather_dequant_kernel<<<unsigned((slots.num_tokens + kPerBlock - 1) / kPerBlock),
                          kWarpsPerBlock * 32, 0, as_stream(s)>>>(
      reinterpret_cast<const uint8_t*>(cache.latent), cache.scale,
      reinterpret_cast<const uint16_t*>(cache.rope), slots.slots, slots.num_tokens,
      cache.num_pages * kPageSize, reinterpret_cast<uint16_t*>(out.data));
  check_launch("gather_dequant_kernel");
}

}  // namespace snapmla::cuda
