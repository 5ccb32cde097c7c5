// decode_fp8 / decode_bf16 / plan_splits / combine against independent formulations written
// plainly here, and the properties decoding must have: causal masking, empty and one-token
// sequences, page-order independence, NaN in unused slots never reaching an output.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <bit>
#include <chrono>
#include <random>
#include <string>

#include "core/split_rule.hpp"
#include "core/validate.hpp"
#include "test_util.hpp"

namespace snapmla {
namespace {

using test::Batch;
using test::make_batch;
using test::make_rng;
using test::options;
using test::OwnedPlan;
using test::ScopedEnv;
using test::sm_list;

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Exact {
  std::vector<double> out;  // [b, s_q, h, 512]
  std::vector<double> lse;  // [b, h, s_q]
  std::vector<double> abs_weighted;  // sum_t p_t |v_t,d| / L, per element (error bounds)
  // sum_t (P'_t / 16 + sigma_b / 1024) |v_t,d| / L: the most e4m3 rounding of P' can move an
  // element (half an ulp: 2^-4 relative for normals, 2^-10 * sigma absolute for subnormals).
  std::vector<double> p_quant_bound;
  // The same under Fp8PScale::kCarried, whose sigma may be as large as max P' / (448 / kCarryFall):
  // sum_t (P'_t / 16 + kCarryFall max P'_b / (448 x 1024)) |v_t,d| / L.
  std::vector<double> p_quant_bound_carried;
  // sum over the tokens whose 448 P' / max P' lies within fp32's reach of an e4m3 rounding
  // boundary of (the gap between the two e4m3 values) * sigma_b |v_t,d| / L: what the emulation
  // (fp32 scores and exponentials) may round the other way than this double formulation.
  std::vector<double> flip_bound;
};

int visible(int len, int s_q, int i) { return std::max(0, len - s_q + i + 1); }

// The SnapMLA algorithm written as one pass per block with no running state: scores in double,
// P' = p * s_t quantized to e4m3 per block with sigma = max P' / 448 (which does not depend on
// the running max, so the block's local max serves), blocks summed at the global max.
// With quantize_p = false: exact softmax over the quantized-domain scores.
Exact independent_fp8(Batch& B, bool quantize_p) {
  Exact E;
  const int rows = B.s_q * B.h;
  E.out.assign(size_t(B.batch) * rows * kLatentDim, 0.0);
  E.lse.assign(size_t(B.batch) * rows, -kInf);
  E.abs_weighted.assign(E.out.size(), 0.0);
  E.p_quant_bound.assign(E.out.size(), 0.0);
  E.p_quant_bound_carried.assign(E.out.size(), 0.0);
  E.flip_bound.assign(E.out.size(), 0.0);
  for (int b = 0; b < B.batch; ++b)
    for (int i = 0; i < B.s_q; ++i)
      for (int hh = 0; hh < B.h; ++hh) {
        const size_t r = (size_t(b) * B.s_q + i) * B.h + hh;
        const int vis = visible(B.seqlens[b], B.s_q, i);
        if (vis == 0) continue;
        std::vector<double> score(vis), mag(vis);
        double M = -kInf;
        for (int t = 0; t < vis; ++t) {
          const int64_t slot = B.slot(b, t);
          double acc = 0, abs_acc = 0;
          for (int d = 0; d < kLatentDim; ++d) {
            const double prod = double(to_float(B.q_nope[r * kLatentDim + d])) * to_float(B.latent[slot * kLatentDim + d]);
            acc += prod;
            abs_acc += std::fabs(prod);
          }
          for (int d = 0; d < kRopeDim; ++d) {
            const double prod = double(to_float(B.q_rope[r * kRopeDim + d])) * to_float(B.rope[slot * kRopeDim + d]);
            acc += prod;
            abs_acc += std::fabs(prod);
          }
          const double factor = B.softmax_scale * B.q_scale[r] * B.scale[slot];
          score[t] = acc * factor;
          mag[t] = abs_acc * std::fabs(factor);
          M = std::max(M, score[t]);
        }
        // fp32's reach on a score: a sum of 576 products in fp32 is within 576 u of the sum of
        // their magnitudes (u = 2^-24), and forming the exponent (s - m, the factors, ex2) adds a
        // few ulps of |s| + |m|; the ratio P' / max P' carries the error of both.
        const double u = std::ldexp(1.0, -24);
        auto reach = [&](int t) { return 576 * u * mag[t] + 8 * u * (std::fabs(score[t]) + std::fabs(M) + 1); };
        double L = 0;
        for (int t = 0; t < vis; ++t) L += std::exp(score[t] - M);
        double* o = E.out.data() + r * kLatentDim;
        double* aw = E.abs_weighted.data() + r * kLatentDim;
        for (int blk = 0; blk < vis; blk += kPageSize) {
          const int end = std::min(vis, blk + kPageSize);
          double w_max = 0;
          int t_max = blk;
          for (int t = blk; t < end; ++t) {
            const double w = std::exp(score[t] - M) * B.scale[B.slot(b, t)];
            if (w > w_max) w_max = w, t_max = t;
          }
          for (int t = blk; t < end; ++t) {
            const int64_t slot = B.slot(b, t);
            const double w = std::exp(score[t] - M) * B.scale[slot];
            const double wq = quantize_p ? to_float(to_e4m3(float(448.0 * w / w_max))) * w_max / 448.0 : w;
            const double x = 448.0 * w / w_max, rel = reach(t) + reach(t_max) + 8 * u;
            const double lo = to_float(to_e4m3(float(x * (1 - rel)))), hi = to_float(to_e4m3(float(x * (1 + rel))));
            double flip = (hi - lo) * w_max / 448.0;
            // A block whose max P' (against the running max, >= w_max) may fall below the floor
            // kMinAmax is quantized on sigma = kMinAmax / 448 there: the emulation's weight is then
            // within half a subnormal step of that scale, this formulation's within w / 16.
            if (w_max < kMinAmax) flip += w / 16 + std::ldexp(double(kMinAmax) / 448, -10);
            for (int d = 0; d < kLatentDim; ++d) {
              const double v = to_float(B.latent[slot * kLatentDim + d]);
              o[d] += wq * v / L;
              aw[d] += std::fabs(w * v) / L;
              E.p_quant_bound[r * kLatentDim + d] += (w / 16 + w_max / 448 / 1024) * std::fabs(v) / L;
              E.p_quant_bound_carried[r * kLatentDim + d] += (w / 16 + kCarryFall * w_max / 448 / 1024) * std::fabs(v) / L;
              E.flip_bound[r * kLatentDim + d] += flip * std::fabs(v) / L;
            }
          }
        }
        E.lse[(size_t(b) * B.h + hh) * B.s_q + i] = M + std::log(L);
      }
  return E;
}

// Exact softmax in double on the BF16 cache's values.
Exact independent_bf16(Batch& B) {
  Exact E;
  const int rows = B.s_q * B.h;
  E.out.assign(size_t(B.batch) * rows * kLatentDim, 0.0);
  E.lse.assign(size_t(B.batch) * rows, -kInf);
  E.abs_weighted.assign(E.out.size(), 0.0);
  for (int b = 0; b < B.batch; ++b)
    for (int i = 0; i < B.s_q; ++i)
      for (int hh = 0; hh < B.h; ++hh) {
        const size_t r = (size_t(b) * B.s_q + i) * B.h + hh;
        const int vis = visible(B.seqlens[b], B.s_q, i);
        if (vis == 0) continue;
        std::vector<double> score(vis);
        double M = -kInf, L = 0;
        for (int t = 0; t < vis; ++t) {
          double acc = 0;
          for (int d = 0; d < kHeadDim; ++d)
            acc += double(to_float(B.q[r * kHeadDim + d])) * to_float(B.bf16_data[B.slot(b, t) * kHeadDim + d]);
          score[t] = acc * B.softmax_scale;
          M = std::max(M, score[t]);
        }
        for (int t = 0; t < vis; ++t) L += std::exp(score[t] - M);
        for (int t = 0; t < vis; ++t) {
          const double p = std::exp(score[t] - M) / L;
          for (int d = 0; d < kLatentDim; ++d) {
            const double v = to_float(B.bf16_data[B.slot(b, t) * kHeadDim + d]);
            E.out[r * kLatentDim + d] += p * v;
            E.abs_weighted[r * kLatentDim + d] += p * std::fabs(v);
          }
        }
        E.lse[(size_t(b) * B.h + hh) * B.s_q + i] = M + std::log(L);
      }
  return E;
}

void expect_lse_close(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      ASSERT_TRUE(std::isinf(got[i]) && got[i] < 0) << "row " << i << " sees nothing: lse -inf";
      continue;
    }
    ASSERT_NEAR(got[i], want[i], tol * std::max(1.0, std::fabs(want[i]))) << "lse row " << i;
  }
}

struct Shape {
  int h, s_q;
  std::vector<int32_t> seqlens;
};

void PrintTo(const Shape& s, std::ostream* os) {
  *os << "h=" << s.h << " s_q=" << s.s_q << " batch=" << s.seqlens.size();
}

class DecodeFp8Shapes : public ::testing::TestWithParam<Shape> {};

// The emulation differs from the independent formulation only by fp32 rounding of scores,
// exponentials and sums, which can flip an e4m3 rounding of P' where P'/sigma lies within
// fp32's reach of a rounding boundary (a handful per million weights). Each element is within
// the flips' bound (Exact::flip_bound) plus fp32 rounding (1e-5 of its weighted magnitude);
// rel-L2 measured 1e-7..5e-7, and 2.4e-4 where one flip hit a weight of a nearly one-hot row.
// That is the per-page rule, kAuto's; under SNAPMLA_FP8_P_SCALE=carried_wide, calls of more than
// 16 rows carry the scales (DecodeFp8Carried below) and are held to that rule's bound against
// exact P.
TEST_P(DecodeFp8Shapes, MatchesIndependentFormulation) {
  auto rng = make_rng();
  SNAPMLA_TRACE_SEED();
  const Shape& s = GetParam();
  Batch B = make_batch(rng, s.seqlens, s.s_q, s.h);
  DecodeOptions per_page = options(B);
  per_page.p_scale = Fp8PScale::kPerPage;
  const ref::DecodeResultF32 r = ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), per_page);
  const Exact E = independent_fp8(B, true);
  const double err = test::rel_l2(r.out, E.out);
  std::printf("[ info ] h=%d s_q=%d: rel-L2 emulation vs independent %.2e\n", s.h, s.s_q, err);
  for (size_t i = 0; i < r.out.size(); ++i)
    ASSERT_LE(std::fabs(r.out[i] - E.out[i]), E.flip_bound[i] + 1e-5 * E.abs_weighted[i] + 1e-30)
        << "element " << i << " (flip bound " << E.flip_bound[i] << ")";
  expect_lse_close(r.lse, E.lse, 2e-6);
  for (size_t i = 0; i < r.out.size(); ++i) ASSERT_TRUE(std::isfinite(r.out[i])) << i;
  // Against exact softmax without P quantization, each element is off by at most what e4m3
  // rounding of P' can do (p_quant_bound), plus fp32 rounding (1e-5 of the weighted magnitude).
  const Exact X = independent_fp8(B, false);
  for (size_t i = 0; i < r.out.size(); ++i)
    ASSERT_LE(std::fabs(r.out[i] - X.out[i]), E.p_quant_bound[i] + 1e-5 * X.abs_weighted[i] + 1e-30)
        << "element " << i;
  ScopedEnv rule("SNAPMLA_FP8_P_SCALE", "");
  EXPECT_EQ(ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), options(B)).out, r.out) << "kAuto: the per-page rule";
  rule.set("carried_wide");
  const ref::DecodeResultF32 a = ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), options(B));
  if (s.h * s.s_q <= 16) {
    EXPECT_EQ(a.out, r.out) << "carried_wide on 16 rows or fewer: the per-page rule";
  } else {
    for (size_t i = 0; i < a.out.size(); ++i)
      ASSERT_LE(std::fabs(a.out[i] - X.out[i]), E.p_quant_bound_carried[i] + 1e-5 * X.abs_weighted[i] + 1e-30)
          << "carried_wide, element " << i;
  }
  expect_lse_close(a.lse, E.lse, 2e-6);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, DecodeFp8Shapes,
    ::testing::Values(Shape{16, 1, {0, 1, 63, 64, 65, 300}}, Shape{32, 2, {1, 2, 129, 64}},
                      Shape{64, 3, {200, 3, 0}}, Shape{128, 4, {257, 64}},
                      Shape{128, 1, {1000}}, Shape{48, 2, {130, 5}},
                      // Any head count: rows that fill no 16- or 64-row tile.
                      Shape{1, 1, {70, 0, 5}}, Shape{3, 4, {130, 2}}, Shape{8, 2, {64, 200}},
                      Shape{9, 1, {129}}, Shape{24, 3, {65, 1}}, Shape{63, 1, {200}},
                      Shape{126, 4, {70}}),
    [](const ::testing::TestParamInfo<Shape>& info) {
      char name[48];
      std::snprintf(name, sizeof name, "h%d_sq%d_%zu", info.param.h, info.param.s_q, info.index);
      return std::string(name);
    });

// Fp8PScale::kCarried: P' quantized on a sigma carried from page to page while it fits (max P' /
// sigma in [448 / kCarryFall, 448]), so the output is rescaled only on pages that take a new one.
// Against exact softmax without P quantization each element is within what e4m3 rounding of P'
// can do under such a sigma (p_quant_bound_carried: the subnormal step of a sigma up to kCarryFall
// times the per-page one) plus fp32 rounding; the lse does not depend on P' at all. One sequence
// has a sink (a token whose score dominates: later pages' max P' is far below the first page's),
// where carrying the sink's sigma to every page would flush the tail's weights.
TEST(DecodeFp8Carried, WithinE4m3RoundingOfPUnderTheCarriedScale) {
  auto rng = make_rng();
  SNAPMLA_TRACE_SEED();
  Batch B = make_batch(rng, {1000, 0, 1, 64, 65, 700, 2000}, 2, 16);
  // The sink: token 0 of the last sequence with 8x its per-token scale (score and P' x 8).
  B.scale[B.slot(B.batch - 1, 0)] *= 8.0f;
  DecodeOptions per_page = options(B), carried = options(B);
  per_page.p_scale = Fp8PScale::kPerPage;
  carried.p_scale = Fp8PScale::kCarried;
  const ref::DecodeResultF32 c = ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), carried);
  const ref::DecodeResultF32 pp = ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), per_page);
  const Exact E = independent_fp8(B, true);
  const Exact X = independent_fp8(B, false);
  std::vector<double> cd(c.out.begin(), c.out.end()), ppd(pp.out.begin(), pp.out.end());
  std::printf("[ info ] against exact P: rel-L2 carried %.3e, per page %.3e; carried vs per page %.3e\n",
              test::rel_l2(c.out, X.out), test::rel_l2(pp.out, X.out), test::rel_l2(c.out, ppd));
  for (size_t i = 0; i < c.out.size(); ++i) {
    ASSERT_TRUE(std::isfinite(c.out[i])) << i;
    ASSERT_LE(std::fabs(c.out[i] - X.out[i]), E.p_quant_bound_carried[i] + 1e-5 * X.abs_weighted[i] + 1e-30)
        << "element " << i;
  }
  expect_lse_close(c.lse, E.lse, 2e-6);
  // It is another rule: on these pages some P' lands on other e4m3 values than per page.
  ASSERT_GT(test::rel_l2(c.out, ppd), 0.0);
  // Split and combined, each split starts its own carried sigma: within twice the bound.
  OwnedPlan P(B.pages(), 24);
  DecodeOptions carried_split = options(B, &P.plan);
  carried_split.p_scale = Fp8PScale::kCarried;
  const ref::DecodeResultF32 cs = ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), carried_split);
  for (size_t i = 0; i < cs.out.size(); ++i)
    ASSERT_LE(std::fabs(cs.out[i] - c.out[i]), 2 * (E.p_quant_bound_carried[i] + 1e-5 * X.abs_weighted[i]) + 1e-30)
        << "element " << i;
}

// SNAPMLA_FP8_P_SCALE=carried_wide: the P' scales carried where the call runs the transposing
// 64-row tile (more than 16 query rows under fp8_tile kAuto, any rows under kRows64 or under kAuto
// with SNAPMLA_FP8_TILE=rows64_all), per page on the narrow tile's calls and on the V^T-register
// and three-consumer tiles (asked for in the options or by SNAPMLA_FP8_TILE=vregs or trio), on the
// CPU path as on the GPU.
// Unset, kAuto is the per-page rule on every call.
TEST(DecodeFp8Carried, CarriedWideCarriesTheScalesOnTheTransposingTileOnly) {
  auto rng = make_rng();
  ScopedEnv rule("SNAPMLA_FP8_P_SCALE", "");  // the suite may run under any rule
  ScopedEnv tile("SNAPMLA_FP8_TILE", "");
  for (const auto& [h, s_q] : {std::pair{16, 1}, std::pair{8, 2}, std::pair{8, 3}, std::pair{32, 1}, std::pair{128, 1}}) {
    SCOPED_TRACE("h = " + std::to_string(h) + ", s_q = " + std::to_string(s_q));
    Batch B = make_batch(rng, {300, 77}, s_q, h);
    DecodeOptions carried = options(B), per_page = options(B);
    carried.p_scale = Fp8PScale::kCarried;
    per_page.p_scale = Fp8PScale::kPerPage;
    const auto want_carried = ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), carried);
    const auto want_per_page = ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), per_page);
    ASSERT_NE(want_carried.out, want_per_page.out) << "the two rules must differ here";
    EXPECT_EQ(ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), options(B)).out, want_per_page.out) << "unset";
    const bool wide = h * s_q > 16;
    DecodeOptions rows64 = options(B), vregs = options(B), trio = options(B);
    rows64.fp8_tile = Fp8Tile::kRows64;
    vregs.fp8_tile = Fp8Tile::kRows64VRegs;
    trio.fp8_tile = Fp8Tile::kRows64Trio;
    rule.set("carried_wide");
    EXPECT_EQ(ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), options(B)).out,
              wide ? want_carried.out : want_per_page.out);
    EXPECT_EQ(ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), rows64).out, want_carried.out);
    EXPECT_EQ(ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), vregs).out, want_per_page.out);
    EXPECT_EQ(ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), trio).out, want_per_page.out);
    for (const char* other : {"vregs", "trio"}) {
      tile.set(other);
      EXPECT_EQ(ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), options(B)).out, want_per_page.out) << other;
      EXPECT_EQ(ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), rows64).out, want_carried.out) << other;
    }
    // rows64_all: the transposing tile for every call under kAuto, so the rule carries there too.
    tile.set("rows64_all");
    EXPECT_EQ(ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), options(B)).out, want_carried.out);
    tile.set("transposed");  // read where it picks the tile: every call under kAuto
    EXPECT_ARG_ERROR(ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), options(B)), "SNAPMLA_FP8_TILE");
    EXPECT_NO_THROW(ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), rows64));  // not read: the options pick it
    tile.set("");
    rule.set("");
  }
}

// The environment's SNAPMLA_FP8_P_SCALE picks the rule under kAuto, on the CPU path as on the GPU:
// `carried` for every call (the narrow tile's included), `per_page` (the default's rule) for every
// call; a value it does not know is an error naming it; an explicit option wins over it.
TEST(DecodeFp8Carried, EnvironmentPicksTheRuleUnderAuto) {
  auto rng = make_rng();
  ScopedEnv rule("SNAPMLA_FP8_P_SCALE", "");
  for (const int h : {16, 64}) {
    SCOPED_TRACE("h = " + std::to_string(h));
    Batch B = make_batch(rng, {300}, 1, h);
    DecodeOptions carried = options(B), per_page = options(B);
    carried.p_scale = Fp8PScale::kCarried;
    per_page.p_scale = Fp8PScale::kPerPage;
    const auto want_carried = ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), carried);
    const auto want_per_page = ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), per_page);
    ASSERT_NE(want_carried.out, want_per_page.out);
    rule.set("carried");
    EXPECT_EQ(ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), options(B)).out, want_carried.out);
    EXPECT_EQ(ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), per_page).out, want_per_page.out);
    rule.set("per_page");
    EXPECT_EQ(ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), options(B)).out, want_per_page.out);
    EXPECT_EQ(ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), carried).out, want_carried.out);
    for (const char* bad : {"sometimes", "carried_narrow"}) {
      rule.set(bad);
      EXPECT_ARG_ERROR(ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), options(B)), "SNAPMLA_FP8_P_SCALE");
    }
    rule.set("");
  }
  Batch B = make_batch(rng, {300}, 1, 16);
  DecodeOptions bad = options(B);
  bad.p_scale = static_cast<Fp8PScale>(7);
  EXPECT_ARG_ERROR(ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), bad), "options.p_scale");
}

TEST(DecodeBf16, WithinBf16RoundingOfPOfExactSoftmax) {
  auto rng = make_rng();
  SNAPMLA_TRACE_SEED();
  Batch B = make_batch(rng, {0, 1, 64, 65, 700}, 2, 32);
  const ref::DecodeResultF32 r = ref::decode_bf16_f32(B.query(), B.bf16_cache(), B.pages(), options(B));
  const Exact E = independent_bf16(B);
  // P is rounded to bf16 (2^-8 relative per weight) before PV; fp32 sums add ~1e-5.
  for (size_t i = 0; i < r.out.size(); ++i)
    ASSERT_LE(std::fabs(r.out[i] - E.out[i]), E.abs_weighted[i] * (1.0 / 256 + 2e-5) + 1e-30)
        << "element " << i;
  expect_lse_close(r.lse, E.lse, 2e-6);
  // The bf16-output entry point rounds exactly those values.
  std::vector<bf16> out(r.out.size());
  std::vector<float> lse(r.lse.size());
  decode_bf16(B.query(), B.bf16_cache(), B.pages(), {out.data(), lse.data(), Device::cpu()}, options(B));
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i].bits, to_bf16(r.out[i]).bits);
}

TEST(SplitKv, SplitPlusCombineEqualsUnsplitWithinFloatRounding) {
  auto rng = make_rng();
  SNAPMLA_TRACE_SEED();
  Batch B = make_batch(rng, {2000, 0, 64, 1, 777, 130}, 2, 16);
  OwnedPlan P(B.pages(), 24);
  ScopedEnv fp32("SNAPMLA_PARTIALS", "fragments");  // fp32 partials, whatever the environment says
  int max_splits = 0;
  for (int b = 0; b < B.batch; ++b) max_splits = std::max(max_splits, P.offsets[b + 1] - P.offsets[b]);
  ASSERT_GE(max_splits, 4) << "the test needs sequences that really are split";
  // The per-page P' scales (the carried ones restart at each split: DecodeFp8Carried).
  DecodeOptions whole_opt = options(B), split_opt = options(B, &P.plan);
  whole_opt.p_scale = split_opt.p_scale = Fp8PScale::kPerPage;
  const auto whole = ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), whole_opt);
  const auto split = ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), split_opt);
  // P'/sigma is the same whatever the running max, so only fp32 rounding differs (see above).
  std::vector<double> w(whole.out.begin(), whole.out.end());
  const double err = test::rel_l2(split.out, w);
  std::printf("[ info ] split vs unsplit rel-L2 %.2e (max %d splits)\n", err, max_splits);
  // Each is within the rounding flips' bound plus fp32 rounding of the double formulation.
  const Exact E = independent_fp8(B, true);
  for (size_t i = 0; i < split.out.size(); ++i)
    ASSERT_LE(std::fabs(split.out[i] - whole.out[i]), 2 * (E.flip_bound[i] + 1e-5 * E.abs_weighted[i]) + 1e-30)
        << "element " << i;
  std::vector<double> wl(whole.lse.begin(), whole.lse.end());
  expect_lse_close(split.lse, wl, 2e-6);
  const auto whole16 = ref::decode_bf16_f32(B.query(), B.bf16_cache(), B.pages(), options(B));
  const auto split16 = ref::decode_bf16_f32(B.query(), B.bf16_cache(), B.pages(), options(B, &P.plan));
  std::vector<double> w16(whole16.out.begin(), whole16.out.end());
  EXPECT_LT(test::rel_l2(split16.out, w16), 2e-3);  // bf16(P) depends on the running max: 2^-8
}

// SNAPMLA_PARTIALS=bf16 (decode_fp8's default, `auto`; decode_bf16's is fp32): a split sequence's
// partial rows are rounded to bf16 before the combine, as the kernels then store them. A sequence with one split, and every lse, keep the
// fp32 partials' bits; a split sequence's rows move, by at most the rounding of its partials:
// 2^-8 (bf16's unit roundoff) of sum_k w_k |v_k| <= max_k |v_k|, and a partial row is a weighted
// mean of the sequence's V rows under P' (whose e4m3 rounding leaves its weights' sum within
// 2^-3 of 1), so max_k |v_k| <= 1.125 max |V|; plus fp32 rounding of the merge (2^-20 of that).
// A value the option does not know is an error naming it.
TEST(SplitKv, Bf16PartialsMoveSplitRowsByTheirRoundingOnly) {
  auto rng = make_rng();
  SNAPMLA_TRACE_SEED();
  Batch B = make_batch(rng, {2000, 0, 64, 1, 777, 130}, 2, 16);
  OwnedPlan P(B.pages(), 24);
  ScopedEnv store("SNAPMLA_PARTIALS", "fragments");  // fp32, whatever the environment says
  const int rows = B.s_q * B.h;
  for (const bool fp8 : {true, false}) {
    SCOPED_TRACE(fp8 ? "decode_fp8" : "decode_bf16");
    auto decode = [&] {
      return fp8 ? ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), options(B, &P.plan))
                 : ref::decode_bf16_f32(B.query(), B.bf16_cache(), B.pages(), options(B, &P.plan));
    };
    const auto fp32 = decode();
    store.set("staged");  // an fp32 form: the same numbers
    EXPECT_EQ(decode().out, fp32.out);
    store.set("bf16");
    const auto b16 = decode();
    for (const char* unset : {"", "auto"}) {
      store.set(unset);
      EXPECT_EQ(decode().out, fp8 ? b16.out : fp32.out) << "the default: bf16 partials for decode_fp8, fp32 for decode_bf16";
    }
    store.set("fragments");
    EXPECT_EQ(b16.lse, fp32.lse);
    size_t moved = 0;
    for (int b = 0; b < B.batch; ++b) {
      const size_t at = size_t(b) * rows * kLatentDim, end = at + size_t(rows) * kLatentDim;
      if (P.offsets[b + 1] - P.offsets[b] <= 1) {
        for (size_t i = at; i < end; ++i) ASSERT_EQ(b16.out[i], fp32.out[i]) << "sequence " << b << " (one split)";
        continue;
      }
      double v_max = 0;  // max |V| over the sequence's tokens, as the tensor cores see V
      for (int t = 0; t < B.seqlens[b]; ++t) {
        const int64_t slot = B.slot(b, t);
        for (int d = 0; d < kLatentDim; ++d)
          v_max = std::max(v_max, fp8 ? std::fabs(double(to_float(B.latent[slot * kLatentDim + d])) * B.scale[slot])
                                      : std::fabs(double(to_float(B.bf16_data[slot * kHeadDim + d]))));
      }
      const double bound = 1.125 * v_max * (std::ldexp(1.0, -8) + std::ldexp(1.0, -20));
      for (size_t i = at; i < end; ++i) {
        ASSERT_LE(std::fabs(double(b16.out[i]) - double(fp32.out[i])), bound) << "sequence " << b << " element " << i;
        moved += b16.out[i] != fp32.out[i];
      }
    }
    EXPECT_GT(moved, size_t(0)) << "the rounding reaches the split sequences' rows";
  }
  for (const char* bad : {"half", "fp16"}) {
    store.set(bad);
    EXPECT_ARG_ERROR(ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), options(B, &P.plan)), "SNAPMLA_PARTIALS");
  }
}

// split_blocks: each sequence cut at multiples of L blocks whatever else is in the batch, so a
// row decoded alone and in a batch gives the same bits; the default plan does not promise that
// (checked too, so that the comparison can tell the two apart).
TEST(SplitKv, FixedSplitLengthIsBatchInvariant) {
  auto rng = make_rng();
  SNAPMLA_TRACE_SEED();
  Batch B = make_batch(rng, {2000, 777, 0, 130, 64}, 1, 16);
  const int L = 3, rows = B.s_q * B.h;
  const OwnedPlan batch_plan(B.pages(), 24, 0, L, 200);
  for (int i = 0; i < B.batch; ++i) {  // the fixed splits, and the worker ranges cover them
    const int64_t blocks = (B.seqlens[i] + kPageSize - 1) / kPageSize;
    const int n = batch_plan.offsets[i + 1] - batch_plan.offsets[i];
    ASSERT_EQ(n, std::max<int64_t>(1, (blocks + L - 1) / L)) << "sequence " << i;
    for (int j = 0; j < n; ++j) EXPECT_EQ(batch_plan.begins[size_t(batch_plan.offsets[i] + j)], j * L * kPageSize);
  }
  const int workers = 200 - B.batch;
  EXPECT_EQ(batch_plan.worker_splits[0], 0);
  EXPECT_EQ(batch_plan.worker_splits[size_t(workers)], batch_plan.offsets[B.batch]);
  for (int w = 1; w <= workers; ++w) EXPECT_LE(batch_plan.worker_splits[size_t(w - 1)], batch_plan.worker_splits[size_t(w)]);

  auto alone = [&](int i, const DecodeOptions& base, int workers_alone, int split_blocks) {
    PageTable p{B.block_table.data() + size_t(i) * B.max_pages, B.seqlens.data() + i, 1, B.max_pages, Device::cpu()};
    const QuantizedQuery q{B.q_nope.data() + size_t(i) * rows * kLatentDim, B.q_rope.data() + size_t(i) * rows * kRopeDim,
                           B.q_scale.data() + size_t(i) * rows, 1, B.s_q, B.h, Device::cpu()};
    const OwnedPlan plan(p, workers_alone, 0, split_blocks, 64);
    DecodeOptions o = base;
    o.plan = &plan.plan;
    return ref::decode_fp8_f32(q, B.fp8(), p, o);
  };
  const auto in_batch = ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), options(B, &batch_plan.plan));
  const OwnedPlan default_plan(B.pages(), 24);
  const auto in_batch_default = ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), options(B, &default_plan.plan));
  const size_t row_floats = size_t(rows) * kLatentDim;
  const auto slice = [&](const std::vector<float>& v, int i) {
    return std::vector<float>(v.begin() + i * row_floats, v.begin() + (i + 1) * row_floats);
  };
  for (int i : {0, 1, 3}) {
    const auto a = alone(i, options(B), 5, L);
    EXPECT_EQ(0, std::memcmp(a.out.data(), in_batch.out.data() + i * row_floats, row_floats * sizeof(float)))
        << "sequence " << i << ": not the same bits alone and in the batch";
    EXPECT_EQ(0, std::memcmp(a.lse.data(), in_batch.lse.data() + size_t(i) * rows, size_t(rows) * sizeof(float)));
  }
  const auto a0 = alone(0, options(B), 24, 0);
  EXPECT_NE(slice(a0.out, 0), slice(in_batch_default.out, 0)) << "the default plan is batch-dependent here";
  // Without room for the fixed splits, the default plan.
  const OwnedPlan tight(B.pages(), 24, 0, 1, 0), balanced(B.pages(), 24);
  EXPECT_EQ(tight.offsets, balanced.offsets);
  EXPECT_EQ(tight.begins, balanced.begins);
  EXPECT_EQ(tight.worker_splits, balanced.worker_splits);
  EXPECT_ARG_ERROR(OwnedPlan(B.pages(), 24, 0, -1), "split_blocks");
}

TEST(SplitKv, CombineRowIsLogSumExpWeighting) {
  std::vector<float> po(3 * kLatentDim), pl = {1.5f, -std::numeric_limits<float>::infinity(), -0.5f};
  for (int d = 0; d < kLatentDim; ++d) {
    po[d] = float(d);
    po[kLatentDim + d] = 1e30f;  // an empty split's output must not leak
    po[2 * kLatentDim + d] = -float(d);
  }
  std::vector<float> out(kLatentDim);
  float lse = 0;
  ref::combine_row(3, po.data(), pl.data(), out.data(), &lse);
  const double L = std::log(std::exp(1.5) + std::exp(-0.5));
  EXPECT_NEAR(lse, L, 1e-6);
  const double w0 = std::exp(1.5 - L), w2 = std::exp(-0.5 - L);
  for (int d = 0; d < kLatentDim; ++d) ASSERT_NEAR(out[d], w0 * d - w2 * d, 1e-4 * (1 + d));
  std::vector<float> empty = {-INFINITY, -INFINITY};
  ref::combine_row(2, po.data(), empty.data(), out.data(), &lse);
  EXPECT_TRUE(std::isinf(lse) && lse < 0);
  for (float v : out) ASSERT_EQ(v, 0.0f);
}

// The pages of each split of plan P over sequences of `lens` tokens (the last one may be partial),
// and a worker's cost under it: its splits' pages plus a fixed cost F per split.
std::vector<int64_t> split_pages(const OwnedPlan& P, const std::vector<int32_t>& lens) {
  const int b = int(lens.size());
  std::vector<int64_t> pages(size_t(std::max(P.offsets[size_t(b)], 0)), 0);
  for (int i = 0; i < b; ++i)
    for (int k = P.offsets[size_t(i)]; k < P.offsets[size_t(i + 1)]; ++k) {
      const int end = k + 1 < P.offsets[size_t(i + 1)] ? P.begins[size_t(k + 1)] : lens[size_t(i)];
      pages[size_t(k)] = (end - P.begins[size_t(k)] + kPageSize - 1) / kPageSize;
    }
  return pages;
}
int64_t worker_cost(const OwnedPlan& P, const std::vector<int64_t>& pages, int w, int64_t F) {
  int64_t cost = 0;
  for (int k = P.worker_splits[size_t(w)]; k < P.worker_splits[size_t(w + 1)]; ++k) cost += pages[size_t(k)] + F;
  return cost;
}
// Plans a and b the same, entry for entry: offsets, split begins and worker ranges.
void expect_same_plan(const OwnedPlan& a, const OwnedPlan& b, const std::string& what) {
  EXPECT_EQ(a.offsets, b.offsets) << what;
  EXPECT_EQ(a.begins, b.begins) << what;
  EXPECT_EQ(a.worker_splits, b.worker_splits) << what;
}
// The workers of plan P with at least one split.
int busy_workers(const OwnedPlan& P) {
  int n = 0;
  for (size_t w = 0; w + 1 < P.worker_splits.size(); ++w) n += P.worker_splits[w + 1] > P.worker_splits[w];
  return n;
}

// The plan's structure and its balance, from its definition (formats.hpp, SplitPlan; the cost
// model of core/split_rule.hpp), not from the planner's arithmetic:
// - every sequence has at least one split, the first at 0, each of whole pages, increasing and,
//   for a sequence with tokens, not empty; the plan within capacity, -1 past its end;
// - worker ranges from 0, non-decreasing, ending at the number of splits at entry
//   capacity - batch, -1 past it; so every split runs on exactly one worker;
// - a worker's cost (its splits' pages plus kPieceCostBlocks each) is within
//   [share - F, share + 2 F] of the share (total cost / workers used), F = kPieceCostBlocks: a
//   boundary moves back by at most one fixed cost, and a cut worker's first piece adds one.
// lab: the planner's lab options the plan was made under (SNAPMLA_PLAN_FILL=1: every worker gets a
// share where the chunk is the equal share; SNAPMLA_PLAN_SPLIT=equal: the chunk is the equal share;
// SNAPMLA_PLAN_PIECE_COST: F is that instead of kPieceCostBlocks, or with `tile` kPieceCostRows64Blocks
// above kNarrowRows query rows; SNAPMLA_PLAN_WORKERS=blocks: the
// workers used are counted on the blocks alone, not on the cost axis with the fixed costs).
// Returns the largest worker cost.
int64_t expect_balanced_plan(const OwnedPlan& P, const std::vector<int32_t>& seqlens, int workers, int query_rows,
                             detail::PlanLabOptions lab = {}) {
  const int b = int(seqlens.size());
  const int capacity = int(P.begins.size()), slots = capacity - b;
  EXPECT_EQ(capacity, split_plan_capacity(b, workers));
  EXPECT_EQ(P.offsets[0], 0);
  const int splits = P.offsets[b];
  EXPECT_LE(splits, capacity);
  int64_t total_blocks = 0;
  for (int i = 0; i < b; ++i) {
    const int lo = P.offsets[i], hi = P.offsets[i + 1];
    EXPECT_GE(hi - lo, 1) << "sequence " << i;
    if (hi - lo < 1) return 0;
    EXPECT_EQ(P.begins[lo], 0) << "sequence " << i;
    total_blocks += (seqlens[i] + kPageSize - 1) / kPageSize;
    for (int k = lo; k < hi; ++k) {
      const int end = k + 1 < hi ? P.begins[k + 1] : seqlens[i];
      EXPECT_EQ(P.begins[k] % kPageSize, 0) << "split " << k;
      if (seqlens[i] > 0) {
        EXPECT_GT(end, P.begins[k]) << "split " << k;
      }
    }
  }
  const std::vector<int64_t> pages_of = split_pages(P, seqlens);
  for (int k = splits; k < capacity; ++k) EXPECT_EQ(P.begins[size_t(k)], -1) << "unused split_begin " << k;
  EXPECT_EQ(P.worker_splits[0], 0);
  EXPECT_EQ(P.worker_splits[size_t(slots)], splits) << "the last worker's end";
  for (int w = 1; w <= slots; ++w) EXPECT_LE(P.worker_splits[size_t(w - 1)], P.worker_splits[size_t(w)]) << w;
  for (int w = slots + 1; w < capacity; ++w) EXPECT_EQ(P.worker_splits[size_t(w)], -1) << "unused entry " << w;

  const int64_t F = detail::piece_cost_blocks(lab, query_rows);
  const int64_t chunk = detail::split_chunk(total_blocks, workers, lab.equal_shares ? 0 : query_rows);
  const int64_t equal_share = (total_blocks + workers - 1) / workers;
  const int64_t total = total_blocks + F * std::max(b - 1, 0);
  const int64_t counted = lab.workers_on_blocks ? total_blocks : total;
  const int64_t used = std::clamp<int64_t>(
      lab.fill_workers && chunk <= equal_share ? workers : (counted + chunk - 1) / chunk, 1, workers);
  const int64_t share = std::max<int64_t>(1, (total + used - 1) / used);
  // Whole sequences instead (n per worker, in order, no cuts) where even the longest make a
  // worker's time no more than the share plus the cuts' cost (16 blocks at a 64-row tile with
  // every worker cutting, in proportion to the rows and the workers used, at least 4).
  int64_t longest = 0;
  for (int32_t l : seqlens) longest = std::max<int64_t>(longest, (l + kPageSize - 1) / kPageSize);
  const int64_t n = b > 0 ? (b + used - 1) / used : 0;
  const int64_t cut_cost = std::max<int64_t>(4, 16 * std::min(query_rows, 64) * used / (64 * workers));
  if (query_rows > 0 && b > 0 && n * longest + (n - 1) * F <= share + cut_cost) {
    EXPECT_EQ(splits, b) << "whole sequences: one split each";
    for (int w = 0; w <= slots; ++w)
      EXPECT_EQ(P.worker_splits[size_t(w)], std::min<int64_t>(int64_t(w) * n, b)) << "worker " << w << ", " << n << " each";
    return n * longest + (n - 1) * F;
  }
  int64_t worst = 0, sum = 0;
  int working = 0;
  for (int w = 0; w < slots; ++w) {
    const int64_t cost = worker_cost(P, pages_of, w, F);
    if (w >= used) {
      EXPECT_EQ(cost, 0) << "worker " << w << " past the " << used << " the total is worth";
    }
    EXPECT_LE(cost, share + 2 * F) << "worker " << w << ", share " << share;
    if (cost > 0) working = w + 1;
    worst = std::max(worst, cost);
    sum += cost;
  }
  // Every worker before the last working one has its share, less at most one fixed cost.
  for (int w = 0; w + 1 < working; ++w)
    EXPECT_GE(worker_cost(P, pages_of, w, F), share - F) << "worker " << w << ", share " << share;
  // The costs add up to the axis plus the first pieces' fixed costs off it.
  EXPECT_GE(sum, total);
  EXPECT_LE(sum, total + F * working);
  return worst;
}

// The batch that lost most to a wave step before the balanced plan (b = 82, h = 128, 32K on 66
// workers): every worker within one piece's fixed cost of the even deal, at most one cut per
// worker boundary.
TEST(SplitKv, EveryWorkerGetsAnEqualShareAcrossSequences) {
  for (int b : {82, 46, 128, 1, 2, 7, 160}) {
    std::vector<int32_t> seqlens(static_cast<size_t>(b), 32768), table(static_cast<size_t>(b) * 512, 0);
    OwnedPlan P(PageTable{table.data(), seqlens.data(), b, 512, Device::cpu()}, 66, 128);
    const int64_t worst = expect_balanced_plan(P, seqlens, 66, 128);
    const int64_t total = int64_t(b) * 512 + detail::kPieceCostBlocks * (b - 1);
    EXPECT_LE(worst * 66, total + 66 * 3 * detail::kPieceCostBlocks) << "b = " << b << ": near the even deal";
    EXPECT_LE(P.offsets[b], b + 65) << "b = " << b << ": one cut per worker boundary at most";
  }
  // One long sequence among short ones: total 400 + 20 x 10 = 600 blocks, + 20 x 8 fixed = 760
  // on 5 workers, share 152. The long one is cut at blocks 152 and 304. Sequence i >= 1 lies over
  // [400 + 18 (i - 1), 400 + 18 i) on the axis (8 fixed, then its 10 blocks): boundary 3 (456)
  // falls into sequence 4's fixed cost and moves to its start; boundary 4 (608) into sequence 12's
  // blocks, at its block 2. Worker 2 runs the long one's last split and sequences 1-3, worker 3
  // sequences 4-11 and sequence 12's first split.
  std::vector<int32_t> mixed(21, 10 * kPageSize), table(21 * 400, 0);
  mixed[0] = 400 * kPageSize;
  OwnedPlan P(PageTable{table.data(), mixed.data(), 21, 400, Device::cpu()}, 5);
  EXPECT_EQ(expect_balanced_plan(P, mixed, 5, 0), 160) << "workers 0, 1 and 4: 152 blocks, or 144 + 8, plus 8";
  ASSERT_EQ(P.offsets[1], 3);
  EXPECT_EQ(P.begins[1], 152 * kPageSize);
  EXPECT_EQ(P.begins[2], 304 * kPageSize);
  for (int i = 1; i < 21; ++i) EXPECT_EQ(P.offsets[i + 1] - P.offsets[i], i == 12 ? 2 : 1) << "sequence " << i;
  EXPECT_EQ(P.begins[15], 2 * kPageSize);
  EXPECT_EQ((std::vector<int32_t>(P.worker_splits.begin(), P.worker_splits.begin() + 6)),
            (std::vector<int32_t>{0, 1, 2, 6, 15, 24}));
}

// Without worker ranges the plan's splits are the same (the ranges only group them).
TEST(SplitKv, WorkerRangesDoNotChangeTheSplits) {
  auto rng = make_rng();
  SNAPMLA_TRACE_SEED();
  for (int trial = 0; trial < 50; ++trial) {
    const int b = 1 + int(rng() % 200), w = 1 + int(rng() % 300);
    std::vector<int32_t> lens(static_cast<size_t>(b)), tab(static_cast<size_t>(b), 0);
    for (auto& l : lens) l = int32_t(rng() % 40000);
    PageTable pages{tab.data(), lens.data(), b, 700, Device::cpu()};
    OwnedPlan with(pages, w);
    std::vector<int32_t> off(size_t(b) + 1), beg(with.begins.size());
    plan_splits(pages, w, SplitPlan{off.data(), beg.data(), int(beg.size()), b, Device::cpu()});
    ASSERT_EQ(off, with.offsets);
    ASSERT_EQ(beg, with.begins);
  }
}

// expect_balanced_plan on 300 random batches (lengths up to max_len, empty ones, one very long
// among short ones, all of 0-2 tokens; b up to 64, and 1024), with query rows up to max_rows (0:
// none), planned under the environment's planner options (lab: those that are set).
void expect_random_plans_balanced(int max_len, int max_rows, detail::PlanLabOptions lab) {
  auto rng = make_rng();
  SNAPMLA_TRACE_SEED();
  std::uniform_int_distribution<int> len(0, max_len), workers(1, 300), batch(1, 64), rows(0, max_rows);
  for (int trial = 0; trial < 300; ++trial) {
    const int b = trial % 50 == 7 ? 1024 : batch(rng), w = workers(rng), r = rows(rng);
    std::vector<int32_t> seqlens(static_cast<size_t>(b)), table(static_cast<size_t>(b), 0);
    for (auto& l : seqlens) l = len(rng) * (trial % 3 == 0 ? int(rng() % 2) : 1);  // empty ones too
    if (trial % 5 == 4) seqlens[rng() % size_t(b)] = 256 * 1024;  // one very long among short ones
    if (trial % 7 == 6) std::fill(seqlens.begin(), seqlens.end(), int32_t(rng() % 3));  // 0-2 tokens
    PageTable pages{table.data(), seqlens.data(), b, 4096, Device::cpu()};
    OwnedPlan P(pages, w, r);
    expect_balanced_plan(P, seqlens, w, r, lab);
    if (::testing::Test::HasFailure())
      FAIL() << "trial " << trial << ": b = " << b << ", workers = " << w << ", query_rows = " << r;
  }
}

TEST(SplitKv, PlanCoversEverySequenceAndBalancesTheWorkers) { expect_random_plans_balanced(5000, 0, {}); }

// SNAPMLA_PLAN_FILL=1: where the chunk is the equal share, every worker gets a share instead of
// ceil(blocks / chunk) of them. b = 16 x 8K on 132 workers (h = 64), under the former piece cost of 4: 128 used and 124 busy with
// 17 blocks (plus fixed costs) by default, all 132 busy with 16 under the option; the plans stay
// balanced, and a small total (the sqrt rule's chunk) is left as it was. A bad value is an error
// naming the variable.
TEST(SplitKv, FillWorkersOptionGivesEveryWorkerAShare) {
  // Under the former piece cost of 4 and workers counted on the blocks, the regime the option
  // was made for: under the rule's 8, b = 16 x 8K already deals eight workers to a sequence, and
  // counted on the cost axis all 132 are used.
  ScopedEnv cost("SNAPMLA_PLAN_PIECE_COST", "4"), counted("SNAPMLA_PLAN_WORKERS", "blocks");
  std::vector<int32_t> seqlens(16, 8192), table(16 * 128, 0);
  const PageTable pages{table.data(), seqlens.data(), 16, 128, Device::cpu()};
  detail::PlanLabOptions lab;
  lab.piece_cost = 4;
  lab.workers_on_blocks = true;
  const OwnedPlan base(pages, 132, 64);
  const int64_t worst_base = expect_balanced_plan(base, seqlens, 132, 64, lab);
  EXPECT_EQ(busy_workers(base), 124);
  lab.fill_workers = true;
  std::vector<int32_t> one = {8192}, tab1(128, 0);
  const PageTable single{tab1.data(), one.data(), 1, 128, Device::cpu()};
  const OwnedPlan single_base(single, 66, 128);
  {
    ScopedEnv on("SNAPMLA_PLAN_FILL", "1");
    const OwnedPlan filled(pages, 132, 64);
    const int64_t worst = expect_balanced_plan(filled, seqlens, 132, 64, lab);
    EXPECT_EQ(busy_workers(filled), 132);
    EXPECT_LT(worst, worst_base);
    const OwnedPlan single_filled(single, 66, 128);
    expect_same_plan(single_filled, single_base, "b = 1, 8K, h = 128: the sqrt rule's 4-block splits");
    expect_random_plans_balanced(20000, 512, lab);
  }
  ScopedEnv bad("SNAPMLA_PLAN_FILL", "yes");
  EXPECT_ARG_ERROR(OwnedPlan(pages, 132, 64), "SNAPMLA_PLAN_FILL");
}

// The workers a total is worth are counted on the cost axis (blocks plus the further pieces'
// fixed costs); SNAPMLA_PLAN_WORKERS=blocks counts them on the blocks alone (the former rule).
// b = 2 x 8K at h = 16 on 132 workers (chunk 2, axis 256 + 8 = 264): on the blocks 128 workers are
// used, shares of 3, so the axis ends at worker 88, and two of those (boundaries 129 and 132, in
// sequence 1's fixed cost) start at sequence 1 with nothing to do: 86 busy, the busiest with 3
// blocks plus a piece's 8. On the axis all 132 are used with shares of 2: four boundaries
// (128-134) fall into that fixed cost, so 128 busy with at most 2 blocks plus 8. A single sequence
// has no further pieces, so its plan is the same either way; the random plans stay balanced under
// the option; a bad value is an error naming the variable.
TEST(SplitKv, WorkersAreCountedOnTheCostAxis) {
  std::vector<int32_t> seqlens(2, 8192), table(2 * 128, 0);
  const PageTable pages{table.data(), seqlens.data(), 2, 128, Device::cpu()};
  const OwnedPlan axis(pages, 132, 16);
  EXPECT_EQ(expect_balanced_plan(axis, seqlens, 132, 16), 2 + detail::kPieceCostBlocks);
  EXPECT_EQ(busy_workers(axis), 128);
  std::vector<int32_t> one = {32768}, tab1(512, 0);
  const PageTable single{tab1.data(), one.data(), 1, 512, Device::cpu()};
  const OwnedPlan single_axis(single, 66, 128);
  detail::PlanLabOptions lab;
  lab.workers_on_blocks = true;
  {
    ScopedEnv on("SNAPMLA_PLAN_WORKERS", "blocks");
    const OwnedPlan counted(pages, 132, 16);
    EXPECT_EQ(expect_balanced_plan(counted, seqlens, 132, 16, lab), 3 + detail::kPieceCostBlocks);
    EXPECT_EQ(busy_workers(counted), 86);
    const OwnedPlan single_blocks(single, 66, 128);
    expect_same_plan(single_blocks, single_axis, "b = 1: no fixed cost on the axis");
    expect_random_plans_balanced(20000, 512, lab);
  }
  ScopedEnv bad("SNAPMLA_PLAN_WORKERS", "all");
  EXPECT_ARG_ERROR(OwnedPlan(pages, 132, 16), "SNAPMLA_PLAN_WORKERS");
}

// SNAPMLA_PLAN_SPLIT=equal: the split length is the equal share whatever the query rows (the
// rule for the combine folded into the decode's tail, where a further split costs no combine
// time). b = 1, 8K at h = 128 on 66 workers: 64 splits of 2 blocks (the rule's: 32 of 4), the
// plan of query_rows = 0; b = 2 at h = 128 likewise (shares of 4 against the rule's 5); b = 128 x 8K
// at h = 128 keeps the
// whole sequences (2 per worker) that the query rows choose; random plans stay balanced; a bad
// value is an error naming the variable.
TEST(SplitKv, EqualSharesOptionSplitsAtTheEqualShare) {
  struct Case {
    int b, workers, rows;
  };
  for (const Case c : {Case{1, 66, 128}, Case{2, 66, 128}, Case{128, 66, 128}}) {
    SCOPED_TRACE("b=" + std::to_string(c.b));
    std::vector<int32_t> seqlens(size_t(c.b), 8192), table(size_t(c.b) * 128, 0);
    const PageTable pages{table.data(), seqlens.data(), c.b, 128, Device::cpu()};
    const OwnedPlan rule(pages, c.workers, c.rows), no_rows(pages, c.workers, 0);
    ScopedEnv on("SNAPMLA_PLAN_SPLIT", "equal");
    const OwnedPlan equal(pages, c.workers, c.rows);
    expect_balanced_plan(equal, seqlens, c.workers, c.rows, {false, true});
    if (c.b == 128) {
      EXPECT_EQ(equal.offsets, rule.offsets) << "whole sequences, as the query rows choose";
      EXPECT_EQ(equal.offsets[size_t(c.b)], c.b);
      continue;
    }
    EXPECT_EQ(equal.offsets, no_rows.offsets);
    EXPECT_EQ(equal.begins, no_rows.begins);
    EXPECT_GT(equal.offsets[size_t(c.b)], rule.offsets[size_t(c.b)]) << "more, shorter splits than the rule's";
  }
  {
    std::vector<int32_t> one = {8192}, tab1(128, 0);
    const PageTable single{tab1.data(), one.data(), 1, 128, Device::cpu()};
    ScopedEnv on("SNAPMLA_PLAN_SPLIT", "equal");
    EXPECT_EQ(OwnedPlan(single, 66, 128).offsets[1], 64) << "b = 1, 8K on 66 workers: 2-block splits";
    expect_random_plans_balanced(20000, 512, {false, true});
  }
  std::vector<int32_t> one = {100}, tab1(2, 0);
  const PageTable single{tab1.data(), one.data(), 1, 2, Device::cpu()};
  ScopedEnv bad("SNAPMLA_PLAN_SPLIT", "sqrt");
  EXPECT_ARG_ERROR(OwnedPlan(single, 4, 64), "SNAPMLA_PLAN_SPLIT");
}

// SNAPMLA_PLAN_PIECE_COST=N: a further piece costs N blocks on the axis instead of
// kPieceCostBlocks (8). b = 16 x 8K at h = 16 on 132 workers: the plan is balanced under either
// cost, and under the rule's 8 a worker that starts a second piece takes fewer pages than under the
// former 4 (eight workers to a sequence, none with two pieces); random plans stay balanced under 2
// and 12; the default's plan is that of 8; a value not in its list is an error naming the variable.
TEST(SplitKv, PieceCostOptionChargesFurtherPieces) {
  std::vector<int32_t> seqlens(16, 8192), table(16 * 128, 0);
  const PageTable pages{table.data(), seqlens.data(), 16, 128, Device::cpu()};
  // The most pages any worker runs, and the most pages of a worker with two pieces or more.
  auto pages_of_workers = [](const OwnedPlan& P, const std::vector<int32_t>& lens) {
    std::pair<int64_t, int64_t> most{0, 0};
    const std::vector<int64_t> pages_of = split_pages(P, lens);
    for (int w = 0; w < int(P.begins.size()) - int(lens.size()); ++w) {
      const int64_t pages = worker_cost(P, pages_of, w, 0);
      most.first = std::max(most.first, pages);
      if (P.worker_splits[size_t(w + 1)] - P.worker_splits[size_t(w)] >= 2) most.second = std::max(most.second, pages);
    }
    return most;
  };
  static_assert(detail::kPieceCostBlocks == 8, "the rule's cost, which this test compares with the former 4");
  ScopedEnv cost("SNAPMLA_PLAN_PIECE_COST", "");
  const OwnedPlan rule(pages, 132, 16);
  expect_balanced_plan(rule, seqlens, 132, 16);
  cost.set("8");
  EXPECT_EQ(OwnedPlan(pages, 132, 16).begins, rule.begins) << "8 is the rule's cost";
  cost.set("4");
  const OwnedPlan four(pages, 132, 16);
  expect_balanced_plan(four, seqlens, 132, 16, {false, false, 4});
  const auto [most_four, two_four] = pages_of_workers(four, seqlens);
  const auto [most_rule, two_rule] = pages_of_workers(rule, seqlens);
  EXPECT_GT(two_four, 0) << "under 4 some worker runs two pieces";
  EXPECT_LT(two_rule, two_four) << "a worker with two pieces runs fewer pages";
  EXPECT_NE(four.begins, rule.begins);
  for (int w = 0; w < 128; ++w) EXPECT_EQ(rule.worker_splits[size_t(w)], w) << "eight workers to a sequence";
  std::printf("[ info ] b = 16 x 8K, 132 workers: most pages %lld (two pieces: %lld) at cost 4, %lld (%lld) at 8\n",
              (long long)most_four, (long long)two_four, (long long)most_rule, (long long)two_rule);
  for (const int c : {2, 12}) {
    cost.set(std::to_string(c).c_str());
    expect_random_plans_balanced(20000, 512, {false, false, c});
  }
  cost.set("5");
  EXPECT_ARG_ERROR(OwnedPlan(pages, 132, 16), "SNAPMLA_PLAN_PIECE_COST");
}

// SNAPMLA_PLAN_PIECE_COST=tile: the cost by the tile the query rows select, the 64-row tile's
// (kPieceCostRows64Blocks, 4) above kNarrowRows rows, else the rule's 8. b = 16 x 8K on 132 workers
// at h = 64 gets cost 4's plan, at h = 16 the rule's; b = 46 x 32K at h = 128 on 66 workers cost
// 4's too, and it differs from the rule's there; random plans stay balanced under it.
TEST(SplitKv, PieceCostByTileChargesTheTilesCost) {
  static_assert(detail::kPieceCostRows64Blocks == 4 && detail::kPieceCostBlocks == 8,
                "the costs this test compares with the explicit settings");
  struct Case {
    int b, len, workers, rows;
  };
  for (const Case c : {Case{16, 8192, 132, 64}, Case{16, 8192, 132, 16}, Case{46, 32768, 66, 128}}) {
    SCOPED_TRACE("b=" + std::to_string(c.b) + " rows=" + std::to_string(c.rows));
    const int max_pages = (c.len + kPageSize - 1) / kPageSize;
    std::vector<int32_t> seqlens(size_t(c.b), c.len), table(size_t(c.b) * size_t(max_pages), 0);
    const PageTable pages{table.data(), seqlens.data(), c.b, max_pages, Device::cpu()};
    ScopedEnv cost("SNAPMLA_PLAN_PIECE_COST", "4");
    const OwnedPlan four(pages, c.workers, c.rows);
    cost.set("");
    const OwnedPlan rule(pages, c.workers, c.rows);
    cost.set("tile");
    const OwnedPlan tile(pages, c.workers, c.rows);
    detail::PlanLabOptions lab;
    lab.piece_cost_by_tile = true;
    expect_balanced_plan(tile, seqlens, c.workers, c.rows, lab);
    expect_same_plan(tile, c.rows > detail::kNarrowRows ? four : rule, "the tile's cost");
    if (c.rows == 128) {
      EXPECT_NE(four.begins, rule.begins) << "a case where the two costs make different plans";
    }
  }
  ScopedEnv cost("SNAPMLA_PLAN_PIECE_COST", "tile");
  detail::PlanLabOptions lab;
  lab.piece_cost_by_tile = true;
  expect_random_plans_balanced(20000, 512, lab);
}

// SNAPMLA_FAST_SMS (with SNAPMLA_FAST_SM_WEIGHT): on calls of at most 16 query rows the plan's first
// workers, as many as SMs listed, take weight / 1 of the others' share each. On random batches:
// every worker's cost (its pages plus one fixed cost F per split) is its weighted part of the axis
// (the total times its weight over all the used workers' weights) within the balanced plan's
// margins, [part - F - 1, part + 2 F + 1]; the splits cover every sequence once; more rows, or no
// SM listed, give the plan without the option byte for byte. A bad list is an error naming it.
TEST(SplitKv, FastSmsWeighTheFirstWorkers) {
  auto rng = make_rng();
  SNAPMLA_TRACE_SEED();
  ScopedEnv sms("SNAPMLA_FAST_SMS", ""), weight("SNAPMLA_FAST_SM_WEIGHT", "");
  const char* weights[] = {"1.125", "1.25", "1.375", "1.5"};
  const int weight16s[] = {18, 20, 22, 24};
  const int64_t F = detail::kPieceCostBlocks;
  for (int trial = 0; trial < 200; ++trial) {
    const int b = trial % 40 == 3 ? 600 : 1 + int(rng() % 160), workers = 1 + int(rng() % 200);
    const int rows = 1 + int(rng() % 16);
    std::vector<int32_t> lens(static_cast<size_t>(b)), table(static_cast<size_t>(b), 0);
    for (auto& l : lens) l = int32_t(rng() % 40000) * int(rng() % 6 != 0);
    const PageTable pages{table.data(), lens.data(), b, 4096, Device::cpu()};
    sms.set("");
    const OwnedPlan plain(pages, workers, rows), plain64(pages, workers, 64);
    const int listed = 1 + int(rng() % std::min(workers + 10, 60)), wi = int(rng() % 4);
    sms.set(sm_list(listed, int(trial % 2), 2).c_str());
    weight.set(weights[wi]);
    const OwnedPlan P(pages, workers, rows);
    EXPECT_EQ(OwnedPlan(pages, workers, 64).begins, plain64.begins) << "64 rows: no weights";
    // The expected parts, as worker_shares makes the axis.
    int64_t blocks = 0;
    for (int32_t l : lens) blocks += (l + kPageSize - 1) / kPageSize;
    const int64_t chunk = detail::split_chunk(blocks, workers, rows);
    const int64_t total = blocks + F * (b - 1);
    const int64_t used = std::clamp<int64_t>((total + chunk - 1) / chunk, 1, workers);
    const int64_t fast = std::min<int64_t>(listed, used), w16 = weight16s[wi];
    const double wsum = double(16 * used + (w16 - 16) * fast);
    const std::vector<int64_t> pages_of = split_pages(P, lens);
    for (int i = 0; i < b; ++i) {
      int64_t covered = 0;
      for (int k = P.offsets[size_t(i)]; k < P.offsets[size_t(i + 1)]; ++k) covered += pages_of[size_t(k)];
      EXPECT_EQ(covered, (lens[size_t(i)] + kPageSize - 1) / kPageSize) << "sequence " << i;
    }
    const int slots = int(P.begins.size()) - b;
    int64_t fast_cost = 0, slow_cost = 0;
    for (int w = 0; w < slots; ++w) {
      const int64_t cost = worker_cost(P, pages_of, w, F);
      if (w >= used) {
        EXPECT_EQ(cost, 0) << "worker " << w;
        continue;
      }
      const double part = double(total) * double(w < fast ? w16 : 16) / wsum;
      if (w + 1 < used && cost > 0) {
        EXPECT_GE(double(cost), part - double(F) - 1) << "worker " << w;
      }
      EXPECT_LE(double(cost), part + 2.0 * double(F) + 1) << "worker " << w;
      (w < fast ? fast_cost : slow_cost) += cost;
    }
    if (::testing::Test::HasFailure())
      FAIL() << "trial " << trial << ": b = " << b << ", workers = " << workers << ", rows = " << rows << ", "
             << listed << " SMs at " << weights[wi];
    if (trial == 0) {
      sms.set("");
      EXPECT_EQ(OwnedPlan(pages, workers, rows).begins, plain.begins) << "no SM listed: the plain plan";
    }
  }
  // b = 128 x 32K on 132 workers, 24 SMs listed: the first 24 workers run 1.25x the others' pages.
  std::vector<int32_t> lens(128, 32768), table(128 * 512, 0);
  const PageTable pages{table.data(), lens.data(), 128, 512, Device::cpu()};
  sms.set(sm_list(24).c_str());
  weight.set("");
  const OwnedPlan P(pages, 132, 16);
  const std::vector<int64_t> pages_of = split_pages(P, lens);
  auto worker_pages = [&](int w) { return worker_cost(P, pages_of, w, 0); };
  const double ratio = double(worker_pages(5)) / double(worker_pages(100));
  EXPECT_NEAR(ratio, 1.25, 0.02) << "worker 5: " << worker_pages(5) << " pages, worker 100: " << worker_pages(100);
  for (const char* bad : {"3+3", "x", "256", "1++2", "-1"}) {
    sms.set(bad);
    EXPECT_ARG_ERROR(OwnedPlan(pages, 132, 16), "SNAPMLA_FAST_SMS");
  }
  sms.set("1");
  weight.set("2");
  EXPECT_ARG_ERROR(OwnedPlan(pages, 132, 16), "SNAPMLA_FAST_SM_WEIGHT");
}

// The lab options' parser (every SNAPMLA_* switch read per call goes through it): unset or empty
// picks the first value, a listed value its index, and anything else is an error naming the
// variable and listing what it takes; env_flag is the choice between 0 and 1, env_enum a choice
// among an enum's values.
TEST(LabOptions, EnvChoiceTakesTheListedValuesOnly) {
  constexpr const char* kName = "SNAPMLA_TEST_LAB_CHOICE";
  ScopedEnv v(kName, "");
  const auto choice = [&] { return detail::env_choice("op", kName, {"auto", "rows", "quarters"}); };
  EXPECT_EQ(choice(), 0) << "empty";
  ::unsetenv(kName);
  EXPECT_EQ(choice(), 0) << "unset";
  v.set("quarters");
  EXPECT_EQ(choice(), 2);
  v.set("rows");
  EXPECT_EQ(choice(), 1);
  v.set("auto");
  EXPECT_EQ(choice(), 0);
  v.set("Rows");
  EXPECT_ARG_ERROR(choice(), kName);
  EXPECT_MESSAGE(choice(), "expected unset, 'auto', 'rows' or 'quarters' in the environment, got 'Rows'");
  v.set("1");
  EXPECT_TRUE(detail::env_flag("op", kName));
  v.set("0");
  EXPECT_FALSE(detail::env_flag("op", kName));
  v.set("");
  EXPECT_FALSE(detail::env_flag("op", kName));
  v.set("yes");
  EXPECT_ARG_ERROR(detail::env_flag("op", kName), kName);
  EXPECT_MESSAGE(detail::env_flag("op", kName), "expected unset, '0' or '1' in the environment, got 'yes'");
  // env_enum: the value at the name's place, the first where unset, the same error otherwise.
  enum class Kind { kA, kB, kC };
  const auto kind = [&] { return detail::env_enum("op", kName, {"a", "b", "c"}, {Kind::kA, Kind::kB, Kind::kC}); };
  v.set("c");
  EXPECT_EQ(kind(), Kind::kC);
  v.set("b");
  EXPECT_EQ(kind(), Kind::kB);
  ::unsetenv(kName);
  EXPECT_EQ(kind(), Kind::kA);
  v.set("d");
  EXPECT_MESSAGE(kind(), "expected unset, 'a', 'b' or 'c' in the environment, got 'd'");
}

// query_rows: a small total is not cut into splits shorter than the cost model's chunk (the one
// H200 measurement behind it: b = 1, h = 128, 8K ran faster as 32 splits of 4 blocks than as 64
// of 2), so fewer workers get work; a large total uses every worker.
TEST(SplitKv, QueryRowsKeepSmallTotalsFromShortSplits) {
  std::vector<int32_t> one = {8192}, tab1 = {0};
  PageTable single{tab1.data(), one.data(), 1, 128, Device::cpu()};
  OwnedPlan equal(single, 66), costed(single, 66, 128);
  EXPECT_EQ(equal.offsets[1], 64) << "equal shares: 2 blocks per split";
  ASSERT_EQ(costed.offsets[1], 32) << "h = 128: 4 blocks per split";
  for (int k = 0; k < 32; ++k) EXPECT_EQ(costed.begins[size_t(k)], k * 4 * kPageSize);
  for (int w = 0; w <= 32; ++w) EXPECT_EQ(costed.worker_splits[size_t(w)], w) << "one split per worker";
  for (int w = 33; w <= 66; ++w) EXPECT_EQ(costed.worker_splits[size_t(w)], 32) << "idle worker " << w;
  OwnedPlan narrow(single, 132, 16);
  EXPECT_EQ(narrow.offsets[1], 64) << "16 rows: sqrt(128 x 16 / 1024) is below 2 blocks, the shortest split";

  std::vector<int32_t> many(128, 8192), tab(128, 0);
  PageTable big{tab.data(), many.data(), 128, 128, Device::cpu()};
  OwnedPlan big_equal(big, 66), big_costed(big, 66, 128);
  // 128 equal sequences on 66 workers: cut at every worker boundary without query_rows, two
  // whole ones per worker (64 busy, no combine) with them.
  EXPECT_GT(big_equal.offsets[128], 128);
  EXPECT_EQ(big_costed.offsets[128], 128);
  for (int w = 0; w <= 66; ++w) EXPECT_EQ(big_costed.worker_splits[size_t(w)], std::min(2 * w, 128)) << w;
  // One sequence twice as long as the rest: whole ones would give a worker 1.5x the share, so
  // the balanced division stays, and it is the one without query_rows (a large total).
  many[5] = 16384;
  OwnedPlan mixed_equal(big, 66), mixed_costed(big, 66, 128);
  EXPECT_EQ(mixed_equal.offsets, mixed_costed.offsets) << "a large total keeps equal shares";
  EXPECT_EQ(mixed_equal.begins, mixed_costed.begins);
  EXPECT_EQ(mixed_equal.worker_splits, mixed_costed.worker_splits);

  // Few cuts cost little: a short sequence alone is cut, not dealt whole (one 16-block sequence
  // as one split took 2.1x the time of 16 one-block splits on the H200), into splits of two
  // blocks, the shortest the rule makes.
  std::vector<int32_t> short_one = {1024}, tab0 = {0};
  PageTable short_single{tab0.data(), short_one.data(), 1, 16, Device::cpu()};
  OwnedPlan short_costed(short_single, 66, 128);
  EXPECT_EQ(short_costed.offsets[1], 8) << "b = 1, 1K, h = 128: 8 splits of two blocks";
  std::vector<int32_t> four(4, 1024), tab4(4, 0);
  PageTable short_four{tab4.data(), four.data(), 4, 16, Device::cpu()};
  OwnedPlan four_costed(short_four, 66, 128);
  EXPECT_GT(four_costed.offsets[4], 4) << "b = 4, 1K, h = 128: the sequences are cut";

  auto rng = make_rng();
  SNAPMLA_TRACE_SEED();
  std::uniform_int_distribution<int> len(0, 20000), workers(1, 300), batch(1, 16), rows(1, 512);
  for (int trial = 0; trial < 300; ++trial) {
    const int b = batch(rng), w = workers(rng), r = rows(rng);
    std::vector<int32_t> seqlens(static_cast<size_t>(b)), table(static_cast<size_t>(b), 0);
    for (auto& l : seqlens) l = len(rng);
    if (trial % 3 == 0)  // equal lengths, where whole sequences per worker can win
      for (auto& l : seqlens) l = seqlens[0];
    int64_t total = 0;
    for (int32_t l : seqlens) total += (l + 63) / 64;
    const int64_t chunk = detail::split_chunk(total, w, r);
    const int64_t equal_share = std::max<int64_t>(1, (total + w - 1) / w);
    ASSERT_GE(chunk, equal_share);
    if (chunk > equal_share) {  // then floor(sqrt(total x rows / 1024)), at least 2
      const int64_t x = total * r;
      ASSERT_GE(chunk, 2);
      if (chunk > 2) {
        ASSERT_LE(chunk * chunk * 1024, x);
      }
      ASSERT_GT((chunk + 1) * (chunk + 1) * 1024, x);
    }
    PageTable pages{table.data(), seqlens.data(), b, 400, Device::cpu()};
    OwnedPlan P(pages, w, r);
    expect_balanced_plan(P, seqlens, w, r);
    if (::testing::Test::HasFailure()) FAIL() << "trial " << trial;
  }
}

TEST(Causal, EachQuerySeesExactlyItsPrefix) {
  auto rng = make_rng();
  SNAPMLA_TRACE_SEED();
  const int s_q = 4, h = 16;
  Batch B = make_batch(rng, {130, 3, 64}, s_q, h);
  // Under each P' scale rule, named (carried_wide would pick by the call's rows, 64 here and 16 alone).
  for (const Fp8PScale rule : {Fp8PScale::kPerPage, Fp8PScale::kCarried}) {
    SCOPED_TRACE(rule == Fp8PScale::kCarried ? "carried" : "per page");
    DecodeOptions opt = options(B);
    opt.p_scale = rule;
    const auto all = ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), opt);
    const auto all16 = ref::decode_bf16_f32(B.query(), B.bf16_cache(), B.pages(), opt);
    for (int b = 0; b < B.batch; ++b)
      for (int i = 0; i < s_q; ++i) {
        // The same query alone (s_q = 1) over the sequence cut to the tokens it may see.
        const size_t r0 = (size_t(b) * s_q + i) * h;
        int32_t len = visible(B.seqlens[b], s_q, i);
        PageTable one{B.block_table.data() + size_t(b) * B.max_pages, &len, 1, B.max_pages, Device::cpu()};
        QuantizedQuery qq{B.q_nope.data() + r0 * kLatentDim, B.q_rope.data() + r0 * kRopeDim,
                          B.q_scale.data() + r0, 1, 1, h, Device::cpu()};
        const auto alone = ref::decode_fp8_f32(qq, B.fp8(), one, opt);
        QueryBf16 q16{B.q.data() + r0 * kHeadDim, 1, 1, h, Device::cpu()};
        const auto alone16 = ref::decode_bf16_f32(q16, B.bf16_cache(), one, opt);
        for (int hh = 0; hh < h; ++hh) {
          const size_t lse_i = (size_t(b) * h + hh) * s_q + i;
          ASSERT_EQ(std::bit_cast<uint32_t>(all.lse[lse_i]), std::bit_cast<uint32_t>(alone.lse[hh]));
          ASSERT_EQ(std::bit_cast<uint32_t>(all16.lse[lse_i]), std::bit_cast<uint32_t>(alone16.lse[hh]));
          for (int d = 0; d < kLatentDim; ++d) {
            ASSERT_EQ(all.out[(r0 + hh) * kLatentDim + d], alone.out[size_t(hh) * kLatentDim + d]);
            ASSERT_EQ(all16.out[(r0 + hh) * kLatentDim + d], alone16.out[size_t(hh) * kLatentDim + d]);
          }
        }
      }
    EXPECT_TRUE(std::isinf(all.lse[(size_t(1) * h) * s_q + 0])) << "causal: query 0 of 4 sees none of 3 tokens";
  }
  // Without the causal mask every query sees the whole sequence.
  const auto full = ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), options(B, nullptr, false));
  for (int i = 0; i < s_q; ++i)
    EXPECT_TRUE(std::isfinite(full.lse[(size_t(1) * h) * s_q + i])) << "3-token sequence, query " << i;
}

// FlashMLA's convention on request: a row that sees no token gets lse +inf (out still 0), with
// or without splits; every other row is unchanged.
TEST(EdgeCases, EmptyLseCanBePlusInf) {
  auto rng = make_rng();
  SNAPMLA_TRACE_SEED();
  Batch B = make_batch(rng, {0, 130, 3}, 4, 5);
  OwnedPlan P(B.pages(), 6);
  for (const SplitPlan* plan : {static_cast<const SplitPlan*>(nullptr), static_cast<const SplitPlan*>(&P.plan)}) {
    DecodeOptions opt = options(B, plan);
    const auto minus = ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), opt);
    opt.empty_lse = std::numeric_limits<float>::infinity();
    const auto plus = ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), opt);
    const auto plus16 = ref::decode_bf16_f32(B.query(), B.bf16_cache(), B.pages(), opt);
    int empty = 0;
    for (size_t i = 0; i < minus.lse.size(); ++i) {
      if (minus.lse[i] == -std::numeric_limits<float>::infinity()) {
        ++empty;
        EXPECT_EQ(plus.lse[i], std::numeric_limits<float>::infinity()) << i;
        EXPECT_EQ(plus16.lse[i], std::numeric_limits<float>::infinity()) << i;
      } else {
        EXPECT_EQ(plus.lse[i], minus.lse[i]) << i;
        EXPECT_TRUE(std::isfinite(plus16.lse[i])) << i;
      }
    }
    // Sequence 0 (5 heads x 4 queries) and query 0 of sequence 2 (4 queries, 3 tokens).
    EXPECT_EQ(empty, 20 + 5);
    EXPECT_EQ(plus.out, minus.out);
  }
  DecodeOptions bad = options(B);
  bad.empty_lse = 0.0f;
  std::vector<bf16> out(size_t(3) * 4 * 5 * kLatentDim);
  std::vector<float> lse(60);
  EXPECT_ARG_ERROR(decode_fp8(B.qq(), B.fp8(), B.pages(), {out.data(), lse.data(), Device::cpu()}, bad),
                   "options.empty_lse");
}

TEST(EdgeCases, EmptySequenceIsZeroWithMinusInfLseAndOneTokenIsThatToken) {
  auto rng = make_rng();
  SNAPMLA_TRACE_SEED();
  Batch B = make_batch(rng, {0, 1}, 1, 16);
  std::vector<bf16> out(size_t(2) * 16 * kLatentDim, to_bf16(test::kNaN));
  std::vector<float> lse(32, test::kNaN);
  decode_fp8(B.qq(), B.fp8(), B.pages(), {out.data(), lse.data(), Device::cpu()}, options(B));
  for (int hh = 0; hh < 16; ++hh) {
    EXPECT_TRUE(std::isinf(lse[hh]) && lse[hh] < 0);
    for (int d = 0; d < kLatentDim; ++d) ASSERT_EQ(out[size_t(hh) * kLatentDim + d].bits, 0);
  }
  // One token: softmax weight 1, so the output is the dequantized latent (P' = s_t maps to
  // exactly 448 = e4m3 max, sigma = s_t / 448), rounded to bf16.
  const int64_t slot = B.slot(1, 0);
  for (int hh = 0; hh < 16; ++hh)
    for (int d = 0; d < kLatentDim; ++d) {
      const float want = to_float(B.latent[slot * kLatentDim + d]) * B.scale[slot];
      ASSERT_NEAR(to_float(out[(16 + hh) * size_t(kLatentDim) + d]), want, std::fabs(want) / 256 + 1e-30)
          << "head " << hh << " dim " << d;
    }
}

TEST(Paging, PageOrderDoesNotChangeTheResult) {
  auto rng = make_rng();
  SNAPMLA_TRACE_SEED();
  Batch B = make_batch(rng, {300, 65, 128}, 2, 32);
  const auto before = ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), options(B));
  const auto before16 = ref::decode_bf16_f32(B.query(), B.bf16_cache(), B.pages(), options(B));
  // Move every page p to perm[p] in a second copy of the caches and rewrite the block table.
  std::vector<int32_t> perm(B.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  Batch C = B;
  for (int64_t p = 0; p < B.num_pages; ++p) {
    const int64_t q = perm[p];
    std::copy_n(B.latent.begin() + p * kPageSize * kLatentDim, kPageSize * kLatentDim, C.latent.begin() + q * kPageSize * kLatentDim);
    std::copy_n(B.scale.begin() + p * kPageSize, kPageSize, C.scale.begin() + q * kPageSize);
    std::copy_n(B.rope.begin() + p * kPageSize * kRopeDim, kPageSize * kRopeDim, C.rope.begin() + q * kPageSize * kRopeDim);
    std::copy_n(B.bf16_data.begin() + p * kPageSize * kHeadDim, kPageSize * kHeadDim, C.bf16_data.begin() + q * kPageSize * kHeadDim);
  }
  for (int b = 0; b < B.batch; ++b)
    for (int j = 0; j < (B.seqlens[b] + 63) / 64; ++j) {
      int32_t& e = C.block_table[size_t(b) * B.max_pages + j];
      e = perm[e];
    }
  const auto after = ref::decode_fp8_f32(C.qq(), C.fp8(), C.pages(), options(C));
  const auto after16 = ref::decode_bf16_f32(C.query(), C.bf16_cache(), C.pages(), options(C));
  EXPECT_EQ(before.out, after.out);
  EXPECT_EQ(before16.out, after16.out);
  for (size_t i = 0; i < before.lse.size(); ++i) ASSERT_EQ(before.lse[i], after.lse[i]);
}

TEST(Paging, NaNInUnusedSlotsNeverReachesAnOutput) {
  auto rng = make_rng();
  SNAPMLA_TRACE_SEED();
  // Lengths that end mid-page: the rest of each last page is NaN, as are spare pages; table
  // entries past each sequence's pages are out of range and must not be read.
  Batch B = make_batch(rng, {1, 63, 65, 127, 190}, 3, 16);
  OwnedPlan P(B.pages(), 7);
  for (const SplitPlan* plan : {static_cast<const SplitPlan*>(nullptr), static_cast<const SplitPlan*>(&P.plan)}) {
    const auto r = ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), options(B, plan));
    const auto r16 = ref::decode_bf16_f32(B.query(), B.bf16_cache(), B.pages(), options(B, plan));
    for (size_t i = 0; i < r.out.size(); ++i) {
      ASSERT_TRUE(std::isfinite(r.out[i])) << i;
      ASSERT_TRUE(std::isfinite(r16.out[i])) << i;
    }
    for (size_t i = 0; i < r.lse.size(); ++i) ASSERT_FALSE(std::isnan(r.lse[i]));
  }
}

// One sequence of B (batch 1) as decode_fp8_decoded's operands: the FP8 cache's and the
// quantized query's own values and scales, decoded to float.
struct DecodedSequence {
  std::vector<float> q, q_factor, keys, key_scale;
};
DecodedSequence decoded_operands(const Batch& B, int s_q, int h, int len) {
  const int rows = s_q * h;
  DecodedSequence d;
  d.q.resize(size_t(rows) * kHeadDim);
  d.q_factor.resize(rows);
  d.keys.resize(size_t(len) * kHeadDim);
  d.key_scale.resize(len);
  for (int r = 0; r < rows; ++r) {
    for (int k = 0; k < kLatentDim; ++k) d.q[size_t(r) * kHeadDim + k] = to_float(B.q_nope[size_t(r) * kLatentDim + k]);
    for (int k = 0; k < kRopeDim; ++k)
      d.q[size_t(r) * kHeadDim + kLatentDim + k] = to_float(B.q_rope[size_t(r) * kRopeDim + k]);
    d.q_factor[r] = B.softmax_scale * B.q_scale[r];
  }
  for (int t = 0; t < len; ++t) {
    const int64_t slot = B.slot(0, t);
    for (int k = 0; k < kLatentDim; ++k) d.keys[size_t(t) * kHeadDim + k] = to_float(B.latent[slot * kLatentDim + k]);
    for (int k = 0; k < kRopeDim; ++k)
      d.keys[size_t(t) * kHeadDim + kLatentDim + k] = to_float(B.rope[slot * kRopeDim + k]);
    d.key_scale[t] = B.scale[slot];
  }
  return d;
}

TEST(DecodedOperands, SnapMlaOperandsGiveDecodeFp8Exactly) {
  // The study's entry point runs the same arithmetic as decode_fp8: fed the FP8 cache's and the
  // quantized query's own values and scales (one sequence, pages shuffled), it must reproduce
  // decode_fp8_f32 bit for bit, out and lse.
  auto rng = make_rng();
  SNAPMLA_TRACE_SEED();
  for (const auto& [s_q, rule] : {std::pair{1, Fp8PScale::kAuto}, std::pair{3, Fp8PScale::kAuto},
                                  std::pair{3, Fp8PScale::kPerPage}, std::pair{1, Fp8PScale::kCarried}}) {
    const int len = 200, h = 32;
    Batch B = make_batch(rng, {len}, s_q, h);
    DecodeOptions opt = options(B);
    opt.p_scale = rule;
    const auto want = ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), opt);
    const DecodedSequence d = decoded_operands(B, s_q, h, len);
    const auto got = ref::decode_fp8_decoded(d.q.data(), d.q_factor.data(), s_q, h, d.keys.data(),
                                             d.key_scale.data(), len, /*causal=*/true, kPageSize, rule);
    ASSERT_EQ(got.out.size(), want.out.size());
    ASSERT_EQ(got.lse.size(), want.lse.size());
    for (size_t i = 0; i < want.out.size(); ++i) ASSERT_EQ(got.out[i], want.out[i]) << "s_q " << s_q << " out " << i;
    for (size_t i = 0; i < want.lse.size(); ++i) ASSERT_EQ(got.lse[i], want.lse[i]) << "s_q " << s_q << " lse " << i;
  }
}

TEST(DecodedOperands, PBlockOfOneTwoOrFourPages) {
  // The P' block (one sigma per row per block, the online-softmax step) may be 64, 128 or 256
  // tokens: within one block all three are the same computation (bit for bit), over many blocks
  // they round differently but keep the same error against float64 attention (measured within
  // 1% on MLA-like data; allowed here: 15%, far below the 4x a shared-sigma recipe costs), and
  // any other block size is an error naming the argument.
  auto rng = make_rng();
  SNAPMLA_TRACE_SEED();
  const int s_q = 1, h = 16;
  for (const int len : {64, 1000}) {
    Batch B = make_batch(rng, {len}, s_q, h);
    const DecodedSequence d = decoded_operands(B, s_q, h, len);
    std::vector<float> qf(size_t(s_q) * h * kHeadDim), kvf(size_t(len) * kHeadDim);
    for (size_t i = 0; i < qf.size(); ++i) qf[i] = to_float(B.q[i]);
    for (size_t i = 0; i < kvf.size(); ++i) kvf[i] = to_float(B.kv[0][i]);
    std::vector<double> truth(size_t(s_q) * h * kLatentDim), truth_lse(size_t(s_q) * h);
    ref::attention_f64(qf.data(), s_q, h, kvf.data(), len, B.softmax_scale, true, truth.data(), truth_lse.data());
    std::vector<ref::DecodeResultF32> res;
    for (const int blk : {64, 128, 256})
      res.push_back(ref::decode_fp8_decoded(d.q.data(), d.q_factor.data(), s_q, h, d.keys.data(), d.key_scale.data(),
                                            len, true, blk));
    const double e64 = test::rel_l2(res[0].out, truth);
    EXPECT_GT(e64, 1e-3) << "FP8 error should be visible";
    for (int k = 1; k < 3; ++k) {
      if (len <= 64) {
        EXPECT_EQ(res[k].out, res[0].out) << "one block: block " << (64 << k);
        EXPECT_EQ(res[k].lse, res[0].lse);
      } else {
        EXPECT_NE(res[k].out, res[0].out) << "block " << (64 << k) << " should round differently";
        EXPECT_NEAR(test::rel_l2(res[k].out, truth), e64, 0.15 * e64) << "block " << (64 << k);
      }
    }
  }
  std::vector<float> one(kHeadDim, 0.f), f(1, 1.f);
  EXPECT_ARG_ERROR(ref::decode_fp8_decoded(one.data(), f.data(), 1, 1, one.data(), f.data(), 1, true, 96),
                   "p_block_tokens");
  EXPECT_ARG_ERROR(ref::decode_fp8_decoded(one.data(), f.data(), 1, 1, one.data(), f.data(), 1, true, 64,
                                           static_cast<Fp8PScale>(7)),
                   "p_scale");
}

TEST(GroundTruth, Float64AttentionMatchesTheFormula) {
  // Two tokens, one head: softmax of two scores, by hand.
  std::vector<float> q(kHeadDim, 0.f), kv(2 * kHeadDim, 0.f);
  q[0] = 1.f;
  q[kLatentDim] = 2.f;
  kv[0] = 3.f;                 // token 0 score = 3
  kv[kHeadDim + 0] = 1.f;      // token 1 score = 1 + 2 * 0.5 = 2
  kv[kHeadDim + kLatentDim] = 0.5f;
  kv[1] = 10.f;
  kv[kHeadDim + 1] = -10.f;
  std::vector<double> out(kLatentDim), lse(1);
  ref::attention_f64(q.data(), 1, 1, kv.data(), 2, 1.0, true, out.data(), lse.data());
  const double p0 = std::exp(3.0) / (std::exp(3.0) + std::exp(2.0));
  EXPECT_NEAR(lse[0], std::log(std::exp(3.0) + std::exp(2.0)), 1e-12);
  EXPECT_NEAR(out[0], p0 * 3 + (1 - p0) * 1, 1e-12);
  EXPECT_NEAR(out[1], p0 * 10 - (1 - p0) * 10, 1e-12);
}

TEST(LongContext, ThirtyTwoThousandTokensRunInSeconds) {
  auto rng = make_rng();
  SNAPMLA_TRACE_SEED();
  Batch B = make_batch(rng, {32768}, 1, 128);
  OwnedPlan P(B.pages(), 16);
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), options(B, &P.plan));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ info ] decode_fp8 reference, 1 x 32768 tokens x 128 heads: %.2f s on %d threads\n",
              secs, ref::num_threads());
  for (float v : r.out) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace snapmla
