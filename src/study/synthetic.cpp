#include "study/synthetic.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "snapmla/types.hpp"

namespace snapmla::synthetic {
namespace {

// splitmix64 + Box-Muller: the same numbers on every platform and standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return (next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  int below(int n) { return static_cast<int>(uniform() * n); }
  double normal() {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  uint64_t state_;
};

constexpr int kPairs = kRopeDim / 2;
constexpr double kRopeBase = 10000.0;

Sequence make_gaussian(const Config& c, Rng& rng) {
  Sequence s;
  s.config = c;
  s.kv.resize(size_t(c.seqlen_k) * kHeadDim);
  s.q.resize(size_t(c.seqlen_q) * c.num_heads * kHeadDim);
  for (float& x : s.kv) x = static_cast<float>(rng.normal());
  for (float& x : s.q) x = static_cast<float>(rng.normal());
  s.softmax_scale = static_cast<float>(1.0 / std::sqrt(double(kHeadDim)));
  return s;
}

Sequence make_mla_like(const Config& c, Rng& rng) {
  Sequence s;
  s.config = c;
  const int n = c.seqlen_k;
  // DeepSeek-V3: qk head dim 128 + 64 = 192.
  s.softmax_scale = static_cast<float>(1.0 / std::sqrt(192.0));
  s.kv.resize(size_t(n) * kHeadDim);
  s.q.resize(size_t(c.seqlen_q) * c.num_heads * kHeadDim);

  // Latent: per-channel gains (log-normal), 6 outlier channels x15, per-token norm (log-normal)
  // and a sink token at position 0 with 4x the norm.
  std::vector<double> gain(kLatentDim);
  for (double& g : gain) g = std::exp(0.5 * rng.normal());
  for (int k = 0; k < 6; ++k) gain[rng.below(kLatentDim)] *= 15.0;
  // Rope: per-pair magnitudes 1..20, four low-frequency outlier pairs at 300..1000.
  std::vector<double> amp(kPairs), phase(kPairs), theta(kPairs);
  for (int j = 0; j < kPairs; ++j) {
    amp[j] = std::pow(10.0, rng.uniform(0.0, 1.3));
    phase[j] = rng.uniform(0.0, 2.0 * std::numbers::pi);
    theta[j] = std::pow(kRopeBase, -double(j) / kPairs);
  }
  for (int k = 0; k < 4; ++k) amp[kPairs / 2 + rng.below(kPairs / 2)] = std::pow(10.0, rng.uniform(2.5, 3.0));

  // Squared gain-whitened norms: q components along c_t / gain^2 lift token t's logit without
  // lifting every token that shares the outlier channels.
  std::vector<double> wnorm2(n);
  for (int t = 0; t < n; ++t) {
    float* row = s.kv.data() + size_t(t) * kHeadDim;
    const double tok = (t == 0 ? 4.0 : 1.0) * std::exp(0.25 * rng.normal());
    double sq = 0.0;
    for (int d = 0; d < kLatentDim; ++d) {
      row[d] = static_cast<float>(gain[d] * tok * rng.normal());
      sq += double(row[d]) * row[d] / (gain[d] * gain[d]);
    }
    wnorm2[t] = sq;
    for (int j = 0; j < kPairs; ++j) {
      const double a = amp[j] * (1.0 + 0.2 * rng.normal());
      const double ang = theta[j] * t + phase[j] + 0.1 * rng.normal();
      row[kLatentDim + 2 * j] = static_cast<float>(a * std::cos(ang));
      row[kLatentDim + 2 * j + 1] = static_cast<float>(a * std::sin(ang));
    }
  }

  // Queries. Nope part: gain-whitened noise scaled so that its scaled logits have std ~1.2
  // (4.8 for the sink), plus, for content-peaked heads, components along a few target tokens
  // (and the sink) that lift their logits by ln(n) + U(1, 4). Rope part: pairs matched to the
  // key pairs (b_j ~ strength / a_j, so each pair adds up to `strength` = 0.6, or 2.0 in
  // positional heads, to the scaled logit) with a random phase offset per head and pair: a
  // position-dependent logit with a std of about 2.4 (8 in positional heads), carried mostly by
  // the large low-frequency key pairs in the positional heads' most attended tokens.
  const double ln_n = std::log(double(std::max(n, 2)));
  for (int i = 0; i < c.seqlen_q; ++i) {
    const int pos = n - c.seqlen_q + i;
    for (int h = 0; h < c.num_heads; ++h) {
      float* row = s.q.data() + (size_t(i) * c.num_heads + h) * kHeadDim;
      std::vector<double> qn(kLatentDim);
      double var = 0.0;  // variance of qn . c_t over tokens of unit norm factor
      for (int d = 0; d < kLatentDim; ++d) {
        qn[d] = rng.normal() / gain[d];
        var += qn[d] * qn[d] * gain[d] * gain[d];
      }
      const double noise_std_raw = 1.2 / s.softmax_scale;
      const double k = noise_std_raw / std::sqrt(var);
      for (double& x : qn) x *= k;
      // Head kinds: a quarter diffuse (noise only), a quarter positional (strong rope pairs,
      // no content targets), half content-peaked (targets + sink, weaker rope pairs).
      const double kind = rng.uniform();
      const bool peaked = kind >= 0.5;
      const double rope_strength = (kind >= 0.25 && kind < 0.5) ? 2.0 : 0.6;
      if (peaked && n > 0) {
        const int targets = std::min(n, 1 + rng.below(4));
        for (int tt = 0; tt <= targets; ++tt) {
          const int t = (tt == targets) ? 0 : rng.below(n);  // last one: the sink
          const double lift = (ln_n + rng.uniform(1.0, 4.0)) / s.softmax_scale;
          const float* ct = s.kv.data() + size_t(t) * kHeadDim;
          for (int d = 0; d < kLatentDim; ++d)
            qn[d] += lift * ct[d] / (gain[d] * gain[d]) / wnorm2[t];
        }
      }
      for (int d = 0; d < kLatentDim; ++d) row[d] = static_cast<float>(qn[d]);
      for (int j = 0; j < kPairs; ++j) {
        const double head_phase = rng.uniform(-std::numbers::pi, std::numbers::pi);
        const double b = rope_strength / amp[j] * std::exp(0.3 * rng.normal()) / s.softmax_scale;
        const double ang = theta[j] * pos + phase[j] + head_phase;
        row[kLatentDim + 2 * j] = static_cast<float>(b * std::cos(ang));
        row[kLatentDim + 2 * j + 1] = static_cast<float>(b * std::sin(ang));
      }
    }
  }
  return s;
}

}  // namespace

std::string to_string(DataKind k) { return k == DataKind::kMlaLike ? "mla" : "gaussian"; }

Sequence make_sequence(const Config& config) {
  Rng rng(config.seed * 1000003ull + uint64_t(config.seqlen_k) * 131ull +
          uint64_t(config.num_heads) * 7ull + uint64_t(config.seqlen_q));
  return config.kind == DataKind::kGaussian ? make_gaussian(config, rng)
                                            : make_mla_like(config, rng);
}

}  // namespace snapmla::synthetic
