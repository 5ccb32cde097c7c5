#include "snapmla/numeric.hpp"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>

namespace snapmla {
namespace {

// e4m3 (OCP "fn" variant): bias 7, no infinities, 0x7F/0xFF are NaN, max finite 448 = 0x7E.
float decode_e4m3_bits(uint8_t b) {
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  const int exp = (b >> 3) & 0xF;
  const int man = b & 0x7;
  if (exp == 0xF && man == 0x7) return std::nanf("");
  if (exp == 0) return sign * std::ldexp(static_cast<float>(man), -9);  // subnormal: m * 2^-9
  return sign * std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
}

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = decode_e4m3_bits(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

}  // namespace

e4m3 to_e4m3(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  if (std::isnan(x)) return {static_cast<uint8_t>(sign | 0x7F)};
  const float a = std::fabs(x);
  // Values at or above 464 (448 + half an ulp of 448's binade, where round-to-nearest-even
  // would go to 480) saturate; so do infinities.
  if (a >= 464.0f) return {static_cast<uint8_t>(sign | 0x7E)};
  if (a < std::ldexp(1.0f, -6)) {
    // Subnormal range (and zero): code = round_half_even(a * 2^9), exact scaling by 2^9.
    // A result of 8 is the smallest normal (exponent field 1, mantissa 0), which is code 8.
    const float m = std::nearbyint(a * 512.0f);
    return {static_cast<uint8_t>(sign | static_cast<uint8_t>(m))};
  }
  int e = 0;
  const float frac = std::frexp(a, &e);  // a = frac * 2^e, frac in [0.5, 1)
  // a = (1 + f) * 2^(e-1), f in [0, 1): 3 mantissa bits = round_half_even(f * 8).
  float q = std::nearbyint((frac * 2.0f - 1.0f) * 8.0f);
  int exp_field = e - 1 + 7;
  if (q == 8.0f) {
    q = 0.0f;
    ++exp_field;
  }
  uint32_t code = (static_cast<uint32_t>(exp_field) << 3) | static_cast<uint32_t>(q);
  if (code > 0x7E) code = 0x7E;  // 448 < a < 464 rounds to 448 already; keep the guard
  return {static_cast<uint8_t>(sign | code)};
}

float to_float(e4m3 x) { return e4m3_table()[x.bits]; }

bf16 to_bf16(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if (std::isnan(x)) return {static_cast<uint16_t>((u >> 16) | 0x0040)};  // quiet NaN
  const uint32_t rounding = 0x7FFF + ((u >> 16) & 1);
  u += rounding;
  return {static_cast<uint16_t>(u >> 16)};
}

TokenScale token_scale(float amax) {
  const float a = std::fmax(amax, kMinAmax);  // fmax also turns a NaN amax into kMinAmax
  return {a / kE4m3Max, kE4m3Max / a};
}

}  // namespace snapmla
