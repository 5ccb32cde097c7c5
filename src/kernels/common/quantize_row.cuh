// One 576-wide bf16 row -> e4m3 latent/nope (512), pre-scaled bf16 rope (64), fp32 scale, by
// one warp: the rule shared by append (cache rows) and quantize_query (query rows).
// Lane l owns latent dims [16 l, 16 l + 16) and rope dims [2 l, 2 l + 2).
#pragma once

#include "numeric.cuh"

namespace snapmla::cuda {

__device__ __forceinline__ void quantize_row_warp(const uint16_t* __restrict__ row, int lane,
                                                  uint8_t* __restrict__ latent_out,
                                                  uint16_t* __restrict__ rope_out,
                                                  float* __restrict__ scale_out) {
  const uint4* src = reinterpret_cast<const uint4*>(row + lane * 16);
  const uint4 v0 = src[0], v1 = src[1];
  const uint32_t w[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
  float x[16];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    x[2 * i] = bf16_bits_to_float(uint16_t(w[i] & 0xFFFF));
    x[2 * i + 1] = bf16_bits_to_float(uint16_t(w[i] >> 16));
  }
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(x[i]));
  amax = warp_max(amax);
  const DevScale s = device_token_scale(amax);
  uint32_t q[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    q[i] = e4m3x4(__fmul_rn(x[4 * i], s.inv_scale), __fmul_rn(x[4 * i + 1], s.inv_scale),
                  __fmul_rn(x[4 * i + 2], s.inv_scale), __fmul_rn(x[4 * i + 3], s.inv_scale));
  reinterpret_cast<uint4*>(latent_out)[lane] = make_uint4(q[0], q[1], q[2], q[3]);
  const uint32_t r = reinterpret_cast<const uint32_t*>(row + kLatentDim)[lane];
  const float r0 = bf16_bits_to_float(uint16_t(r & 0xFFFF));
  const float r1 = bf16_bits_to_float(uint16_t(r >> 16));
  reinterpret_cast<uint32_t*>(rope_out)[lane] =
      uint32_t(float_to_bf16_bits(__fmul_rn(r0, s.inv_scale))) |
      (uint32_t(float_to_bf16_bits(__fmul_rn(r1, s.inv_scale))) << 16);
  if (lane == 0) *scale_out = s.scale;
}

}  // namespace snapmla::cuda
