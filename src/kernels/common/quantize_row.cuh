// One 576-wide bf16 row -> e4m3 latent/nope (512), pre-scaled bf16 rope (64), fp32 scale, by
// one warp: the rule shared by append (cache rows) and quantize_query (query rows).
// Lane l owns latent dims [16 l, 16 l + 16) and rope dims [2 l, 2 l + 2). Loading and
// quantizing are separate steps so a warp can have several rows' loads in flight.
#pragma once

#include "numeric.cuh"

namespace snapmla::cuda {

struct RowFragment {
  uint4 lo, hi;   // 16 latent values
  uint32_t rope;  // 2 rope values
};

__device__ __forceinline__ RowFragment load_row(const uint16_t* __restrict__ row, int lane) {
  const uint4* src = reinterpret_cast<const uint4*>(row + lane * 16);
  return {src[0], src[1], reinterpret_cast<const uint32_t*>(row + kLatentDim)[lane]};
}

__device__ __forceinline__ void quantize_store(const RowFragment& f, int lane,
                                               uint8_t* __restrict__ latent_out,
                                               uint16_t* __restrict__ rope_out,
                                               float* __restrict__ scale_out) {
  const uint32_t w[8] = {f.lo.x, f.lo.y, f.lo.z, f.lo.w, f.hi.x, f.hi.y, f.hi.z, f.hi.w};
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
  const float r0 = bf16_bits_to_float(uint16_t(f.rope & 0xFFFF));
  const float r1 = bf16_bits_to_float(uint16_t(f.rope >> 16));
  reinterpret_cast<uint32_t*>(rope_out)[lane] =
      uint32_t(float_to_bf16_bits(__fmul_rn(r0, s.inv_scale))) |
      (uint32_t(float_to_bf16_bits(__fmul_rn(r1, s.inv_scale))) << 16);
  if (lane == 0) *scale_out = s.scale;
}

}  // namespace snapmla::cuda
