#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "snapmla/numeric.hpp"
#include "snapmla/reference.hpp"
#include "snapmla/snapmla.hpp"
#include "study/accuracy.hpp"

namespace snapmla::accuracy {
namespace {

constexpr int kPlanWorkers = 8;  // splits the long sequences: exercises plan + combine

std::vector<bf16> to_bf16_rows(const std::vector<float>& x) {
  std::vector<bf16> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = to_bf16(x[i]);
  return y;
}

// A paged cache layout for one sequence with its pages in shuffled order and spare pages.
struct PagedLayout {
  int64_t num_pages;
  std::vector<int32_t> block_table, slots, seqlens;
};

PagedLayout make_layout(int n, uint64_t seed) {
  PagedLayout L;
  const int pages = std::max(1, (n + kPageSize - 1) / kPageSize);
  L.num_pages = pages + 3;
  std::vector<int32_t> perm(L.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (int64_t i = L.num_pages - 1; i > 0; --i) {  // Fisher-Yates with an LCG
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    std::swap(perm[i], perm[(s >> 33) % (i + 1)]);
  }
  L.block_table.assign(perm.begin(), perm.begin() + pages);
  L.slots.resize(n);
  for (int t = 0; t < n; ++t) L.slots[t] = L.block_table[t / kPageSize] * kPageSize + t % kPageSize;
  L.seqlens = {n};
  return L;
}

struct Output {
  std::vector<float> out;  // [s_q, h, 512], bf16 values
  std::vector<float> lse;  // [h, s_q]
};

template <typename Decode>
Output run_paged(const synthetic::Sequence& seq, Decode&& decode) {
  const auto& c = seq.config;
  const PagedLayout L = make_layout(c.seqlen_k, c.seed);
  PageTable pages{L.block_table.data(), L.seqlens.data(), 1,
                  static_cast<int>(L.block_table.size()), Device::cpu()};
  std::vector<int32_t> offsets(2), begins(split_plan_capacity(1, kPlanWorkers));
  SplitPlan plan{offsets.data(), begins.data(), static_cast<int>(begins.size()), 1, Device::cpu()};
  plan_splits(pages, kPlanWorkers, plan);
  DecodeOptions opt;
  opt.softmax_scale = seq.softmax_scale;
  opt.plan = &plan;
  std::vector<bf16> out(size_t(c.seqlen_q) * c.num_heads * kLatentDim);
  std::vector<float> lse(size_t(c.seqlen_q) * c.num_heads);
  decode(L, pages, opt, DecodeOutput{out.data(), lse.data(), Device::cpu()});
  Output r;
  r.out.resize(out.size());
  for (size_t i = 0; i < out.size(); ++i) r.out[i] = to_float(out[i]);
  r.lse = std::move(lse);
  return r;
}

Output run_snapmla(const synthetic::Sequence& seq) {
  const auto& c = seq.config;
  const std::vector<bf16> kv = to_bf16_rows(seq.kv), q = to_bf16_rows(seq.q);
  return run_paged(seq, [&](const PagedLayout& L, const PageTable& pages,
                            const DecodeOptions& opt, const DecodeOutput& out) {
    const size_t slots = size_t(L.num_pages) * kPageSize;
    std::vector<e4m3> lat(slots * kLatentDim, e4m3{0x7F});  // NaN in every unused slot
    std::vector<float> scale(slots, std::numeric_limits<float>::quiet_NaN());
    std::vector<bf16> rope(slots * kRopeDim, to_bf16(std::numeric_limits<float>::quiet_NaN()));
    PagedFp8Cache cache{lat.data(), scale.data(), rope.data(), L.num_pages, Device::cpu()};
    append(cache, KvRows{const_cast<bf16*>(kv.data()), c.seqlen_k, Device::cpu()},
           SlotMapping{L.slots.data(), c.seqlen_k, Device::cpu()});
    const size_t rows = size_t(c.seqlen_q) * c.num_heads;
    std::vector<e4m3> qn(rows * kLatentDim);
    std::vector<bf16> qr(rows * kRopeDim);
    std::vector<float> qs(rows);
    QuantizedQuery qq{qn.data(), qr.data(), qs.data(), 1, c.seqlen_q, c.num_heads, Device::cpu()};
    quantize_query(QueryBf16{const_cast<bf16*>(q.data()), 1, c.seqlen_q, c.num_heads, Device::cpu()}, qq);
    decode_fp8(qq, cache, pages, out, opt);
  });
}

Output run_bf16(const synthetic::Sequence& seq) {
  const auto& c = seq.config;
  const std::vector<bf16> kv = to_bf16_rows(seq.kv), q = to_bf16_rows(seq.q);
  return run_paged(seq, [&](const PagedLayout& L, const PageTable& pages,
                            const DecodeOptions& opt, const DecodeOutput& out) {
    std::vector<bf16> data(size_t(L.num_pages) * kPageSize * kHeadDim,
                           to_bf16(std::numeric_limits<float>::quiet_NaN()));
    PagedBf16Cache cache{data.data(), L.num_pages, Device::cpu()};
    append(cache, KvRows{const_cast<bf16*>(kv.data()), c.seqlen_k, Device::cpu()},
           SlotMapping{L.slots.data(), c.seqlen_k, Device::cpu()});
    decode_bf16(QueryBf16{const_cast<bf16*>(q.data()), 1, c.seqlen_q, c.num_heads, Device::cpu()},
                cache, pages, out, opt);
  });
}

// Rows (of the cache or of the queries) in an FP8 recipe's operand domain: the 576 values as
// the tensor cores see them (e4m3, or bf16 for pre-scaled rope) and one scale per row.
struct Domain {
  std::vector<float> values;
  std::vector<float> scale;
};

float amax_range(const float* x, int n) {
  float a = 0;
  for (int i = 0; i < n; ++i) a = std::fmax(a, std::fabs(x[i]));
  return a;
}

// rows [n, 576] of bf16-rounded inputs -> domain values; scale_of(row) gives the row's scale.
template <typename ScaleOf>
Domain quantize_rows(const std::vector<float>& rows, int n, bool rope_fp8, ScaleOf&& scale_of) {
  Domain D;
  D.values.resize(size_t(n) * kHeadDim);
  D.scale.resize(n);
  for (int r = 0; r < n; ++r) {
    const float* x = rows.data() + size_t(r) * kHeadDim;
    float* v = D.values.data() + size_t(r) * kHeadDim;
    const TokenScale s = scale_of(r);
    D.scale[r] = s.scale;
    for (int d = 0; d < kLatentDim; ++d) v[d] = to_float(to_e4m3(x[d] * s.inv_scale));
    for (int d = kLatentDim; d < kHeadDim; ++d)
      v[d] = rope_fp8 ? to_float(to_e4m3(x[d] * s.inv_scale)) : to_float(to_bf16(x[d] * s.inv_scale));
  }
  return D;
}

std::vector<float> bf16_rounded(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = to_float(to_bf16(x[i]));
  return y;
}

Output run_variant(Recipe recipe, const synthetic::Sequence& seq) {
  const auto& c = seq.config;
  const int n = c.seqlen_k, rows = c.seqlen_q * c.num_heads;
  const std::vector<float> kv = bf16_rounded(seq.kv), q = bf16_rounded(seq.q);
  const TokenScale unit{1.0f, 1.0f};
  Domain K, Q;
  switch (recipe) {
    case Recipe::kRopeFp8:
      K = quantize_rows(kv, n, true, [&](int r) {
        return token_scale(amax_range(kv.data() + size_t(r) * kHeadDim, kHeadDim));
      });
      Q = quantize_rows(q, rows, true, [&](int r) {
        return token_scale(amax_range(q.data() + size_t(r) * kHeadDim, kHeadDim));
      });
      break;
    case Recipe::kPerTensorStatic:
      K = quantize_rows(kv, n, true, [&](int) { return unit; });
      Q = quantize_rows(q, rows, true, [&](int) { return unit; });
      break;
    case Recipe::kPerTensorDynamic: {
      const TokenScale ks = token_scale(amax_range(kv.data(), int(kv.size())));
      const TokenScale qs = token_scale(amax_range(q.data(), int(q.size())));
      K = quantize_rows(kv, n, true, [&](int) { return ks; });
      Q = quantize_rows(q, rows, true, [&](int) { return qs; });
      break;
    }
    case Recipe::kPerBlock: {
      std::vector<TokenScale> blk((n + kPageSize - 1) / kPageSize);
      for (size_t b = 0; b < blk.size(); ++b) {
        float a = 0;
        for (int t = int(b) * kPageSize; t < std::min(n, int(b + 1) * kPageSize); ++t)
          a = std::fmax(a, amax_range(kv.data() + size_t(t) * kHeadDim, kLatentDim));
        blk[b] = token_scale(a);
      }
      K = quantize_rows(kv, n, false, [&](int r) { return blk[r / kPageSize]; });
      Q = quantize_rows(q, rows, false, [&](int r) {
        return token_scale(amax_range(q.data() + size_t(r) * kHeadDim, kLatentDim));
      });
      break;
    }
    default:
      throw std::logic_error("run_variant: not a variant recipe");
  }
  std::vector<float> q_factor(rows);
  for (int r = 0; r < rows; ++r) q_factor[r] = seq.softmax_scale * Q.scale[r];
  const ref::DecodeResultF32 res = ref::decode_fp8_decoded(
      Q.values.data(), q_factor.data(), c.seqlen_q, c.num_heads, K.values.data(), K.scale.data(),
      n, /*causal=*/true);
  Output o;
  o.out.resize(res.out.size());
  for (size_t i = 0; i < res.out.size(); ++i) o.out[i] = to_float(to_bf16(res.out[i]));
  o.lse = res.lse;
  return o;
}

}  // namespace

std::string name(Recipe r) {
  switch (r) {
    case Recipe::kSnapMla: return "SnapMLA";
    case Recipe::kRopeFp8: return "A:rope-fp8";
    case Recipe::kPerTensorStatic: return "B:tensor-1.0";
    case Recipe::kPerTensorDynamic: return "C:tensor-dyn";
    case Recipe::kPerBlock: return "D:block-64";
    case Recipe::kBf16Cache: return "BF16-cache";
  }
  return "?";
}

std::string description(Recipe r) {
  switch (r) {
    case Recipe::kSnapMla:
      return "per-token latent scale, rope bf16 pre-scaled; query per (token, head)";
    case Recipe::kRopeFp8:
      return "per-token scale over all 576 dims, rope also e4m3; query likewise";
    case Recipe::kPerTensorStatic:
      return "static scale 1.0 for cache and query, all 576 dims e4m3 (FlashMLA FP8 use today)";
    case Recipe::kPerTensorDynamic:
      return "one scale for the whole cache (amax/448), one for all queries, all dims e4m3";
    case Recipe::kPerBlock:
      return "one latent scale per 64-token block, rope bf16 pre-scaled; query as SnapMLA";
    case Recipe::kBf16Cache:
      return "BF16 cache, BF16 decode (P in bf16), the baseline";
  }
  return "?";
}

Truth ground_truth(const synthetic::Sequence& seq) {
  const auto& c = seq.config;
  Truth t;
  t.out.resize(size_t(c.seqlen_q) * c.num_heads * kLatentDim);
  t.lse.resize(size_t(c.seqlen_q) * c.num_heads);
  std::vector<double> entropy(t.lse.size());
  ref::attention_f64(seq.q.data(), c.seqlen_q, c.num_heads, seq.kv.data(), c.seqlen_k,
                     seq.softmax_scale, true, t.out.data(), t.lse.data(), entropy.data());
  double eff = 0;
  for (double h : entropy) eff += std::exp(h);
  t.effective_tokens = eff / std::max<size_t>(entropy.size(), 1);
  return t;
}

Metrics evaluate(Recipe recipe, const synthetic::Sequence& seq, const Truth& truth) {
  Output o;
  switch (recipe) {
    case Recipe::kSnapMla: o = run_snapmla(seq); break;
    case Recipe::kBf16Cache: o = run_bf16(seq); break;
    default: o = run_variant(recipe, seq); break;
  }
  double diff2 = 0, ref2 = 0, out2 = 0, dotp = 0;
  for (size_t i = 0; i < o.out.size(); ++i) {
    const double a = o.out[i], b = truth.out[i];
    diff2 += (a - b) * (a - b);
    ref2 += b * b;
    out2 += a * a;
    dotp += a * b;
  }
  Metrics m;
  m.rel_l2 = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  m.cosine = (ref2 > 0 && out2 > 0) ? dotp / std::sqrt(ref2 * out2) : (ref2 == out2 ? 1.0 : 0.0);
  for (size_t i = 0; i < o.lse.size(); ++i) {
    if (std::isinf(truth.lse[i])) continue;
    const double e = std::fabs(double(o.lse[i]) - truth.lse[i]);
    m.max_lse_err = std::isnan(e) ? std::numeric_limits<double>::infinity()
                                  : std::max(m.max_lse_err, e);
  }
  if (std::isnan(m.rel_l2)) m.rel_l2 = std::numeric_limits<double>::infinity();
  return m;
}

}  // namespace snapmla::accuracy
