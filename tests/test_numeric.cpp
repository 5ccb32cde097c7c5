// e4m3 and bf16 conversions: bit-exact with CUDA's own host-side conversions (cuda_fp8.h,
// cuda_bf16.h) -- all 256 codes, every boundary, and millions of random floats.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>

#include "snapmla/numeric.hpp"
#include "test_util.hpp"

#if SNAPMLA_TEST_HAVE_CUDA_HEADERS
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#endif

namespace snapmla {
namespace {

TEST(E4m3, DecodesEveryCodeByTheFormatDefinition) {
  for (int c = 0; c < 256; ++c) {
    const float v = to_float(e4m3{uint8_t(c)});
    const int e = (c >> 3) & 15, m = c & 7;
    const float sign = (c & 0x80) ? -1.f : 1.f;
    if (e == 15 && m == 7) {
      EXPECT_TRUE(std::isnan(v)) << c;
    } else if (e == 0) {
      EXPECT_EQ(v, sign * m / 512.f) << c;
    } else {
      EXPECT_EQ(v, sign * (8 + m) / 8.f * std::ldexp(1.f, e - 7)) << c;
    }
  }
  EXPECT_EQ(to_float(e4m3{0x7E}), 448.f);
  EXPECT_EQ(to_float(e4m3{0x01}), std::ldexp(1.f, -9));
}

TEST(E4m3, EncodeRoundTripsEveryFiniteCode) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(to_e4m3(to_float(e4m3{uint8_t(c)})).bits, c) << c;
  }
}

TEST(E4m3, RoundsToNearestEvenSaturatesAndKeepsNaN) {
  EXPECT_EQ(to_e4m3(1.0f + 1.0f / 16).bits, to_e4m3(1.0f).bits);  // tie -> even mantissa 0
  EXPECT_EQ(to_e4m3(1.0f + 3.0f / 16).bits, to_e4m3(1.25f).bits);  // tie -> even mantissa 2
  EXPECT_EQ(to_e4m3(1e9f).bits, 0x7E);
  EXPECT_EQ(to_e4m3(-1e9f).bits, 0xFE);
  EXPECT_EQ(to_e4m3(INFINITY).bits, 0x7E);
  EXPECT_EQ(to_e4m3(-INFINITY).bits, 0xFE);
  EXPECT_EQ(to_e4m3(464.f).bits, 0x7E);
  EXPECT_TRUE(std::isnan(to_float(to_e4m3(NAN))));
  EXPECT_EQ(to_e4m3(-0.0f).bits, 0x80);
  EXPECT_EQ(to_e4m3(std::ldexp(1.f, -10)).bits, 0x00);        // half the smallest subnormal: tie -> 0
  EXPECT_EQ(to_e4m3(std::ldexp(1.5f, -10)).bits, 0x01);
}

TEST(TokenScale, ClampsTinyAmaxAndRoundTrips) {
  const TokenScale z = token_scale(0.f);
  EXPECT_GT(z.scale, 0.f);
  EXPECT_TRUE(std::isfinite(z.inv_scale));
  const TokenScale s = token_scale(10.f);
  EXPECT_EQ(s.scale, 10.f / 448.f);
  EXPECT_EQ(s.inv_scale, 448.f / 10.f);
}

#if SNAPMLA_TEST_HAVE_CUDA_HEADERS

uint8_t cuda_e4m3(float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); }

float cuda_e4m3_to_float(uint8_t c) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(c, __NV_E4M3);
  return __half2float(__half(h));
}

uint16_t cuda_bf16(float x) {
  const __nv_bfloat16 b = __float2bfloat16_rn(x);
  return std::bit_cast<uint16_t>(b);
}

void expect_same_e4m3(float x) {
  const uint8_t ours = to_e4m3(x).bits, theirs = cuda_e4m3(x);
  if (std::isnan(x)) {
    EXPECT_TRUE(std::isnan(to_float(e4m3{ours})) && std::isnan(cuda_e4m3_to_float(theirs)));
  } else {
    ASSERT_EQ(ours, theirs) << "x = " << x << " (bits 0x" << std::hex
                            << std::bit_cast<uint32_t>(x) << ")";
  }
}

TEST(E4m3VsCuda, AllCodesDecodeIdentically) {
  for (int c = 0; c < 256; ++c) {
    const float a = to_float(e4m3{uint8_t(c)}), b = cuda_e4m3_to_float(uint8_t(c));
    if (std::isnan(a) || std::isnan(b)) {
      EXPECT_TRUE(std::isnan(a) && std::isnan(b)) << c;
    } else {
      EXPECT_EQ(a, b) << c;
    }
  }
}

TEST(E4m3VsCuda, EveryBoundaryEncodesIdentically) {
  // Each code, the midpoints between neighbouring codes, and one float ulp either side.
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = to_float(e4m3{uint8_t(c)}), hi = to_float(e4m3{uint8_t(c + 1)});
    const float mid = (lo + hi) / 2;
    for (float x : {lo, hi, mid, std::nextafter(mid, 0.f), std::nextafter(mid, 1e9f),
                    std::nextafter(lo, 1e9f), std::nextafter(hi, 0.f)}) {
      expect_same_e4m3(x);
      expect_same_e4m3(-x);
    }
  }
  for (float x : {448.f, 456.f, 463.99f, 464.f, 464.01f, 480.f, 1e6f, 3e38f, INFINITY, -INFINITY,
                  NAN, 0.f, -0.f, 1e-30f, std::numeric_limits<float>::denorm_min()})
    expect_same_e4m3(x);
}

TEST(E4m3VsCuda, MillionsOfRandomFloatsEncodeIdentically) {
  auto rng = test::make_rng();
  SNAPMLA_TRACE_SEED();
  std::uniform_int_distribution<uint32_t> bits;
  std::uniform_real_distribution<float> range(-600.f, 600.f);
  std::uniform_real_distribution<float> expo(-14.f, 10.f);
  for (int i = 0; i < 2'000'000; ++i) expect_same_e4m3(std::bit_cast<float>(bits(rng)));
  for (int i = 0; i < 2'000'000; ++i) expect_same_e4m3(range(rng));
  for (int i = 0; i < 2'000'000; ++i)
    expect_same_e4m3((i % 2 ? -1.f : 1.f) * std::exp2(expo(rng)));
}

TEST(Bf16VsCuda, RandomAndSpecialFloatsConvertIdentically) {
  auto rng = test::make_rng();
  SNAPMLA_TRACE_SEED();
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2'000'000; ++i) {
    const float x = std::bit_cast<float>(bits(rng));
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(to_float(to_bf16(x))));
      continue;
    }
    ASSERT_EQ(to_bf16(x).bits, cuda_bf16(x)) << x;
  }
  for (float x : {0.f, -0.f, INFINITY, -INFINITY, 3.3895314e38f, 1.0f + 1.0f / 256})
    EXPECT_EQ(to_bf16(x).bits, cuda_bf16(x)) << x;
}

#else
TEST(E4m3VsCuda, Skipped) {
  GTEST_SKIP() << "cuda_fp8.h not found: the CUDA conformance checks of e4m3/bf16 did not run";
}
#endif

}  // namespace
}  // namespace snapmla
