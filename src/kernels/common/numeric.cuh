// Device-side quantization, written to produce exactly the reference's bytes
// (docs/reference.md): correctly rounded division for the scales, one rounding per product,
// e4m3 conversion with round-to-nearest-even and saturation (cvt.rn.satfinite.e4m3x2.f32).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "snapmla/types.hpp"

namespace snapmla::cuda {

// The bytes of `w` in `mask` that are e4m3 NaN (S.1111.111; e4m3 has no infinity) set to 0.
__device__ __forceinline__ uint32_t zero_e4m3_nan(uint32_t w, uint32_t mask) {
  return w & ~(__vcmpeq4(w & 0x7F7F7F7Fu, 0x7F7F7F7Fu) & mask);
}

struct DevScale {
  float scale, inv_scale;
};

__device__ __forceinline__ DevScale device_token_scale(float amax) {
  const float a = fmaxf(amax, kMinAmax);
  return {__fdiv_rn(a, kE4m3Max), __fdiv_rn(kE4m3Max, a)};
}

// Two floats -> two e4m3 bytes (lo in the low byte).
__device__ __forceinline__ uint16_t e4m3x2(float lo, float hi) {
  return static_cast<uint16_t>(
      __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ uint32_t e4m3x4(float a, float b, float c, float d) {
  return uint32_t(e4m3x2(a, b)) | (uint32_t(e4m3x2(c, d)) << 16);
}

__device__ __forceinline__ float e4m3_to_float(uint8_t v) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(v, __NV_E4M3);
  return __half2float(__half(h));
}

__device__ __forceinline__ float bf16_bits_to_float(uint16_t b) {
  return __uint_as_float(uint32_t(b) << 16);
}

__device__ __forceinline__ uint16_t float_to_bf16_bits(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

// Two floats as one word of bf16 (lo in the low half), one cvt.rn.bf16x2.f32.
__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace snapmla::cuda
