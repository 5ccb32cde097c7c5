// Host-side conversions between float and the two storage types, bit-exact with CUDA's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) and __float2bfloat16_rn: round to nearest
// even; e4m3 saturates at +-448 (infinities too) and maps NaN to NaN; bf16 keeps inf and NaN.
#pragma once

#include <bit>
#include <cstdint>

#include "snapmla/types.hpp"

namespace snapmla {

e4m3 to_e4m3(float x);
float to_float(e4m3 x);
bf16 to_bf16(float x);
// bf16 is float's upper half: inline, so that loops over cache rows can vectorize it.
inline float to_float(bf16 x) { return std::bit_cast<float>(static_cast<uint32_t>(x.bits) << 16); }

// amax -> per-token / per-(token, head) scale and its reciprocal, exactly as every SnapMLA
// kernel computes them (one IEEE division each), so CPU and GPU quantize identically:
//   scale = max(amax, kMinAmax) / 448,  inv_scale = 448 / max(amax, kMinAmax),
//   stored = e4m3(x * inv_scale)  (latent, q nope),  bf16(x * inv_scale)  (rope parts).
struct TokenScale {
  float scale;
  float inv_scale;
};
TokenScale token_scale(float amax);

}  // namespace snapmla
