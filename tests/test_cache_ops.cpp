// append / quantize_query / gather_dequant: the bytes each writes (checked against the
// definition, written out plainly here) and round-trip error bounds that follow from e4m3's
// and bf16's precision.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "test_util.hpp"

namespace snapmla {
namespace {

using test::make_rng;

// e4m3 keeps 3 mantissa bits: round to nearest is within 2^-4 relative in the normal range
// (|v| >= 2^-6) and within half a subnormal step (2^-10) absolute below it. bf16 keeps 8
// significant bits: 2^-8 relative.
constexpr double kE4m3Rel = 1.0 / 16, kE4m3SubAbs = 1.0 / 1024, kBf16Rel = 1.0 / 256;

struct CacheFixture {
  int64_t num_pages;
  std::vector<e4m3> latent;
  std::vector<float> scale;
  std::vector<bf16> rope;
  explicit CacheFixture(int64_t pages)
      : num_pages(pages),
        latent(size_t(pages) * kPageSize * kLatentDim, e4m3{0x7F}),
        scale(size_t(pages) * kPageSize, test::kNaN),
        rope(size_t(pages) * kPageSize * kRopeDim, to_bf16(test::kNaN)) {}
  PagedFp8Cache view() { return {latent.data(), scale.data(), rope.data(), num_pages, Device::cpu()}; }
};

TEST(Append, WritesTheDefinedBytesAndLeavesOtherSlotsAlone) {
  auto rng = make_rng();
  SNAPMLA_TRACE_SEED();
  CacheFixture c(7);
  const int n = 200;
  std::vector<bf16> kv = test::random_kv(rng, n);
  for (int d = 0; d < kLatentDim; ++d) kv[5 * kHeadDim + d] = bf16{0};  // an all-zero latent
  std::vector<int32_t> all(c.num_pages * kPageSize);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<int32_t> slots(all.begin(), all.begin() + n);
  slots[17] = -1;  // padding: skipped
  append(c.view(), {kv.data(), n, Device::cpu()}, {slots.data(), n, Device::cpu()});

  std::vector<bool> written(all.size(), false);
  for (int i = 0; i < n; ++i) {
    if (slots[i] < 0) continue;
    written[slots[i]] = true;
    const bf16* x = kv.data() + size_t(i) * kHeadDim;
    float amax = 0;
    for (int d = 0; d < kLatentDim; ++d) amax = std::max(amax, std::fabs(to_float(x[d])));
    const float a = std::max(amax, kMinAmax);
    ASSERT_EQ(c.scale[slots[i]], a / 448.0f) << "token " << i;
    const float inv = 448.0f / a;
    bool saw_max_code = false;
    for (int d = 0; d < kLatentDim; ++d) {
      const e4m3 got = c.latent[size_t(slots[i]) * kLatentDim + d];
      ASSERT_EQ(got.bits, to_e4m3(to_float(x[d]) * inv).bits) << "token " << i << " dim " << d;
      saw_max_code |= (got.bits & 0x7F) == 0x7E;
    }
    if (amax > 0) {
      EXPECT_TRUE(saw_max_code) << "the largest latent must map to +-448";
    }
    for (int d = 0; d < kRopeDim; ++d)
      ASSERT_EQ(c.rope[size_t(slots[i]) * kRopeDim + d].bits,
                to_bf16(to_float(x[kLatentDim + d]) * inv).bits);
  }
  for (size_t s = 0; s < written.size(); ++s) {
    if (written[s]) continue;
    ASSERT_TRUE(std::isnan(c.scale[s])) << "slot " << s << " was not ours to write";
    ASSERT_EQ(c.latent[s * kLatentDim].bits, 0x7F);
  }
  // The all-zero latent row: a finite positive scale, zero codes, finite pre-scaled rope.
  const int32_t z = slots[5];
  EXPECT_GT(c.scale[z], 0.0f);
  for (int d = 0; d < kRopeDim; ++d) EXPECT_TRUE(std::isfinite(to_float(c.rope[size_t(z) * kRopeDim + d])));
}

TEST(Append, RoundTripErrorIsWithinE4m3AndBf16Precision) {
  auto rng = make_rng();
  SNAPMLA_TRACE_SEED();
  CacheFixture c(4);
  const int n = 4 * kPageSize;
  std::vector<bf16> kv = test::random_kv(rng, n);
  std::vector<int32_t> slots(n);
  std::iota(slots.begin(), slots.end(), 0);
  append(c.view(), {kv.data(), n, Device::cpu()}, {slots.data(), n, Device::cpu()});
  std::vector<bf16> back(size_t(n) * kHeadDim);
  gather_dequant(c.view(), {slots.data(), n, Device::cpu()}, {back.data(), n, Device::cpu()});
  double worst_rel_normal = 0;
  for (int t = 0; t < n; ++t) {
    const double s = c.scale[t];
    for (int d = 0; d < kHeadDim; ++d) {
      const double x = to_float(kv[size_t(t) * kHeadDim + d]);
      const double y = to_float(back[size_t(t) * kHeadDim + d]);
      const double err = std::fabs(y - x);
      if (d < kLatentDim) {
        // e4m3 rounding of x/s, then bf16 rounding of the dequantized value.
        const double bound = (kE4m3Rel * std::fabs(x) + kE4m3SubAbs * s) * (1 + kBf16Rel) +
                             kBf16Rel * std::fabs(x) + 1e-30;
        ASSERT_LE(err, bound) << "token " << t << " dim " << d << " x=" << x << " s=" << s;
        if (std::fabs(x) / s >= 1.0 / 64) worst_rel_normal = std::max(worst_rel_normal, err / std::fabs(x));
      } else {
        ASSERT_LE(err, (2 * kBf16Rel + kBf16Rel * kBf16Rel) * std::fabs(x) * 1.0000001)
            << "rope: two bf16 roundings, token " << t << " dim " << d;
      }
    }
  }
  EXPECT_GT(worst_rel_normal, 0.02) << "suspiciously exact: is the latent really e4m3?";
}

TEST(Append, Bf16CacheIsAPagedCopy) {
  auto rng = make_rng();
  SNAPMLA_TRACE_SEED();
  const int64_t pages = 3;
  std::vector<bf16> data(pages * kPageSize * kHeadDim, to_bf16(test::kNaN));
  const int n = 70;
  std::vector<bf16> kv = test::random_kv(rng, n);
  std::vector<int32_t> slots(n);
  for (int i = 0; i < n; ++i) slots[i] = int32_t((i * 37 + 5) % (pages * kPageSize));
  append(PagedBf16Cache{data.data(), pages, Device::cpu()}, {kv.data(), n, Device::cpu()},
         {slots.data(), n, Device::cpu()});
  for (int i = 0; i < n; ++i)
    for (int d = 0; d < kHeadDim; ++d)
      ASSERT_EQ(data[size_t(slots[i]) * kHeadDim + d].bits, kv[size_t(i) * kHeadDim + d].bits);
}

TEST(QuantizeQuery, PerTokenHeadScaleAndPreScaledRope) {
  auto rng = make_rng();
  SNAPMLA_TRACE_SEED();
  const int b = 3, s_q = 2, h = 32, rows = b * s_q * h;
  std::vector<bf16> q = test::random_q(rng, rows);
  std::vector<e4m3> nope(size_t(rows) * kLatentDim);
  std::vector<bf16> rope(size_t(rows) * kRopeDim);
  std::vector<float> scale(rows);
  quantize_query({q.data(), b, s_q, h, Device::cpu()},
                 {nope.data(), rope.data(), scale.data(), b, s_q, h, Device::cpu()});
  for (int r = 0; r < rows; ++r) {
    const bf16* x = q.data() + size_t(r) * kHeadDim;
    float amax = 0;
    for (int d = 0; d < kLatentDim; ++d) amax = std::max(amax, std::fabs(to_float(x[d])));
    ASSERT_EQ(scale[r], std::max(amax, kMinAmax) / 448.0f);
    const float inv = 448.0f / std::max(amax, kMinAmax);
    for (int d = 0; d < kLatentDim; ++d) {
      ASSERT_EQ(nope[size_t(r) * kLatentDim + d].bits, to_e4m3(to_float(x[d]) * inv).bits);
      const double v = to_float(nope[size_t(r) * kLatentDim + d]) * double(scale[r]);
      ASSERT_LE(std::fabs(v - to_float(x[d])), kE4m3Rel * std::fabs(to_float(x[d])) + kE4m3SubAbs * scale[r]);
    }
    for (int d = 0; d < kRopeDim; ++d)
      ASSERT_EQ(rope[size_t(r) * kRopeDim + d].bits, to_bf16(to_float(x[kLatentDim + d]) * inv).bits);
  }
}

TEST(GatherDequant, DefinedBytesAndZeroRowsForPadding) {
  auto rng = make_rng();
  SNAPMLA_TRACE_SEED();
  CacheFixture c(2);
  const int n = 2 * kPageSize;
  std::vector<bf16> kv = test::random_kv(rng, n);
  std::vector<int32_t> slots(n);
  std::iota(slots.begin(), slots.end(), 0);
  append(c.view(), {kv.data(), n, Device::cpu()}, {slots.data(), n, Device::cpu()});
  std::vector<int32_t> idx = {5, 127, -1, 0, 64, 5};
  std::vector<bf16> out(idx.size() * kHeadDim, to_bf16(test::kNaN));
  gather_dequant(c.view(), {idx.data(), int64_t(idx.size()), Device::cpu()},
                 {out.data(), int64_t(idx.size()), Device::cpu()});
  for (size_t i = 0; i < idx.size(); ++i) {
    for (int d = 0; d < kHeadDim; ++d) {
      const uint16_t got = out[i * kHeadDim + d].bits;
      if (idx[i] < 0) {
        ASSERT_EQ(got, 0) << "padding row";
        continue;
      }
      const float s = c.scale[idx[i]];
      const float v = d < kLatentDim ? to_float(c.latent[size_t(idx[i]) * kLatentDim + d])
                                     : to_float(c.rope[size_t(idx[i]) * kRopeDim + d - kLatentDim]);
      ASSERT_EQ(got, to_bf16(v * s).bits) << "row " << i << " dim " << d;
    }
  }
}

}  // namespace
}  // namespace snapmla
