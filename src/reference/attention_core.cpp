#include "attention_core.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <thread>
#include <vector>

#include "snapmla/numeric.hpp"
#include "snapmla/reference.hpp"

namespace snapmla {
namespace ref {

int num_threads() {
  static const int n = [] {
    if (const char* env = std::getenv("SNAPMLA_NUM_THREADS")) {
      const int v = std::atoi(env);
      if (v > 0) return v;
    }
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }();
  return n;
}

}  // namespace ref

namespace detail {

void parallel_for_impl(int64_t n, void (*call)(void*, int64_t), void* ctx) {
  const int64_t workers = std::min<int64_t>(ref::num_threads(), n);
  if (workers <= 1) {
    for (int64_t i = 0; i < n; ++i) call(ctx, i);
    return;
  }
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t i = next++; i < n; i = next++) call(ctx, i);
  };
  std::vector<std::thread> pool;
  for (int64_t w = 1; w < workers; ++w) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
}

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct RowState {
  float m = kNegInf;  // running max of the scores
  float l = 0.0f;     // running sum of exp(score - m)
  float sigma = 1.0f; // kFp8: the accumulator holds O / sigma
  bool bad = false;   // a score was not finite (NaN / Inf in q or in a visible token)
  float acc[kLatentDim] = {};
};

}  // namespace

double dot_f64(const float* a, const float* b, int n) {
  double acc[8] = {};
  for (int d = 0; d < n; d += 8)
    for (int k = 0; k < 8; ++k) acc[k] += static_cast<double>(a[d + k]) * b[d + k];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

void attend_rows(const QueryRow* rows, int count, const KeySet& keys, int begin, int end,
                 PvMode mode, int block_tokens, float* out, float* lse) {
  std::vector<RowState> state(count);
  double block_acc[kLatentDim];
  float score[kMaxBlockTokens], p[kMaxBlockTokens], pv_weight[kMaxBlockTokens];
  block_tokens = std::clamp(block_tokens, kPageSize, kMaxBlockTokens);  // callers check it

  for (int blk = begin; blk < end; blk += block_tokens) {
    const int blk_end = std::min(end, blk + block_tokens);
    for (int r = 0; r < count; ++r) {
      const QueryRow& q = rows[r];
      const int vis_end = std::min(blk_end, q.visible);
      if (vis_end <= blk) continue;  // nothing visible in this block
      RowState& st = state[r];
      const int nt = vis_end - blk;

      // QK: exact dot (FP8 part and bf16 rope part into one accumulator), rounded to fp32,
      // then the two scales, which lie on the GEMM's M and N axes.
      float blk_max = kNegInf;
      for (int j = 0; j < nt; ++j) {
        const int t = blk + j;
        const float acc = static_cast<float>(dot_f64(q.values, keys.values + int64_t(t) * kHeadDim,
                                                 kHeadDim));
        score[j] = (acc * q.factor) * keys.scale[t];
        st.bad |= !std::isfinite(score[j]);
        blk_max = std::max(blk_max, score[j]);
      }
      const float m_new = std::max(st.m, blk_max);
      const float alpha = std::exp(st.m - m_new);  // exp(-inf) = 0 on the first block
      float row_sum = 0.0f;
      for (int j = 0; j < nt; ++j) {
        p[j] = std::exp(score[j] - m_new);
        row_sum += p[j];
      }
      st.l = st.l * alpha + row_sum;

      float rescale = alpha;
      if (mode == PvMode::kFp8 || mode == PvMode::kFp8Carried) {
        // P' = P * s_t, one e4m3 scale per row and block: sigma = max P' / 448.
        float p_max = 0.0f;
        for (int j = 0; j < nt; ++j) {
          pv_weight[j] = p[j] * keys.scale[blk + j];
          p_max = std::max(p_max, pv_weight[j]);
        }
        TokenScale sig = token_scale(p_max);
        bool kept = false;
        if (mode == PvMode::kFp8Carried) {
          // The previous block's sigma in this block's max (0 on the row's first block) is kept
          // while max P' quantizes to [448 / kCarryFall, 448] under it; else max P' goes to
          // 448 / kCarryHeadroom. Kept, the accumulator is not rescaled at all (factor 1).
          const float carried = st.sigma * alpha;
          kept = sig.scale <= carried && sig.scale * kCarryFall >= carried;
          sig = kept ? TokenScale{carried, 1.0f / carried}
                     : TokenScale{sig.scale * kCarryHeadroom, sig.inv_scale / kCarryHeadroom};
        }
        for (int j = 0; j < nt; ++j) pv_weight[j] = to_float(to_e4m3(pv_weight[j] * sig.inv_scale));
        rescale = kept ? 1.0f : alpha * (st.sigma / sig.scale);
        st.sigma = sig.scale;
      } else {
        for (int j = 0; j < nt; ++j) pv_weight[j] = to_float(to_bf16(p[j]));
      }
      st.m = m_new;

      // PV: exact block product (e4m3 x e4m3, or bf16 x bf16), added to the rescaled fp32
      // accumulator, as a wgmma accumulating into registers after the rescale.
      std::fill(block_acc, block_acc + kLatentDim, 0.0);
      for (int j = 0; j < nt; ++j) {
        const float w = pv_weight[j];
        if (w == 0.0f) continue;
        const float* v = keys.values + int64_t(blk + j) * kHeadDim;
        for (int d = 0; d < kLatentDim; ++d) block_acc[d] += static_cast<double>(w) * v[d];
      }
      for (int d = 0; d < kLatentDim; ++d)
        st.acc[d] = st.acc[d] * rescale + static_cast<float>(block_acc[d]);
    }
  }

  for (int r = 0; r < count; ++r) {
    const RowState& st = state[r];
    float* o = out + int64_t(r) * kLatentDim;
    if (st.bad) {
      std::fill(o, o + kLatentDim, std::numeric_limits<float>::quiet_NaN());
      lse[r] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    if (st.l == 0.0f) {  // no visible token
      std::fill(o, o + kLatentDim, 0.0f);
      lse[r] = kNegInf;
      continue;
    }
    const float out_scale = (mode == PvMode::kBf16 ? 1.0f : st.sigma) / st.l;
    for (int d = 0; d < kLatentDim; ++d) o[d] = st.acc[d] * out_scale;
    lse[r] = st.m + std::log(st.l);
  }
}

}  // namespace detail
}  // namespace snapmla
