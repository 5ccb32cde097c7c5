// decode_fp8's arithmetic on operands some other recipe quantized: the accuracy study's way in
// to the same attention engine the reference decode runs, without its cache formats.
#include <algorithm>
#include <vector>

#include "core/validate.hpp"
#include "attention_core.hpp"
#include "snapmla/reference.hpp"

namespace snapmla::ref {

DecodeResultF32 decode_fp8_decoded(const float* q, const float* q_factor, int seqlen_q,
                                   int num_heads, const float* keys, const float* key_scale,
                                   int seqlen_k, bool causal, int p_block_tokens, Fp8PScale p_scale) {
  constexpr const char* op = "ref::decode_fp8_decoded";
  if (p_block_tokens != 64 && p_block_tokens != 128 && p_block_tokens != 256)
    detail::fail(op, "p_block_tokens", "expected 64, 128 or 256, got " + std::to_string(p_block_tokens));
  if (seqlen_q < 1) detail::fail(op, "seqlen_q", "expected >= 1, got " + std::to_string(seqlen_q));
  if (num_heads < 1) detail::fail(op, "num_heads", "expected >= 1, got " + std::to_string(num_heads));
  if (seqlen_k < 0) detail::fail(op, "seqlen_k", "expected >= 0, got " + std::to_string(seqlen_k));
  const int rows = seqlen_q * num_heads;
  detail::check_p_scale(op, "p_scale", p_scale);
  DecodeOptions rule;  // the rule's other inputs at their defaults (fp8_tile kAuto)
  rule.p_scale = p_scale;
  const detail::PvMode mode = detail::fp8_pv_mode(detail::resolved_p_scale(op, rule, rows));
  std::vector<detail::QueryRow> qrows(rows);
  for (int r = 0; r < rows; ++r) {
    const int i = r / num_heads;
    qrows[r] = {q + size_t(r) * kHeadDim, q_factor[r],
                causal ? std::max(0, seqlen_k - seqlen_q + i + 1) : seqlen_k};
  }
  const detail::KeySet ks{keys, key_scale, seqlen_k};
  std::vector<float> lse_rows(rows);
  DecodeResultF32 res;
  res.out.resize(size_t(rows) * kLatentDim);
  constexpr int kRowsPerTask = 8;
  detail::parallel_for((rows + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t g) {
    const int r0 = int(g) * kRowsPerTask, count = std::min(kRowsPerTask, rows - r0);
    detail::attend_rows(qrows.data() + r0, count, ks, 0, seqlen_k, mode, p_block_tokens,
                        res.out.data() + size_t(r0) * kLatentDim, lse_rows.data() + r0);
  });
  res.lse.resize(rows);
  for (int r = 0; r < rows; ++r)  // rows are (i, h); lse is [h, s_q]
    res.lse[size_t(r % num_heads) * seqlen_q + r / num_heads] = lse_rows[r];
  return res;
}

}  // namespace snapmla::ref
