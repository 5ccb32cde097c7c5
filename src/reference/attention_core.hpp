// The arithmetic of one decode kernel, on the CPU: online softmax over 64-token blocks for a
// group of query rows that share one sequence's keys. Operands arrive decoded to float in the
// kernel's own domain (e4m3 codes as their values, bf16 as its values) with per-token scales,
// so the same engine runs SnapMLA, the ablation variants and the BF16 baseline.
#pragma once

#include <cstdint>

#include "snapmla/formats.hpp"
#include "snapmla/types.hpp"

namespace snapmla::detail {

enum class PvMode {
  kFp8,         // P' = P * s_t, quantized to e4m3 per row and block, sigma-domain output
  kFp8Carried,  // kFp8 with the previous block's sigma kept while P' fits it (Fp8PScale::kCarried)
  kBf16,        // P rounded to bf16 (the FlashMLA BF16 kernel), V unscaled
};

// decode_fp8's PV mode under a resolved P' scale rule (core/validate.hpp's resolved_p_scale).
inline PvMode fp8_pv_mode(Fp8PScale resolved) {
  return resolved == Fp8PScale::kCarried ? PvMode::kFp8Carried : PvMode::kFp8;
}

// One sequence's keys: values [n, 576] (the first 512 are also V), scale [n] (s_t, applied to
// the score and, in kFp8 mode, folded into P).
struct KeySet {
  const float* values = nullptr;
  const float* scale = nullptr;
  int n = 0;
};

struct QueryRow {
  const float* values = nullptr;  // [576]
  float factor = 1.0f;            // softmax_scale * s_q
  int visible = 0;                // the row sees tokens t < visible
};

// The largest online-softmax block attend_rows takes (tokens).
inline constexpr int kMaxBlockTokens = 256;

// Attends `count` rows over tokens [begin, end) (begin a multiple of 64) in online-softmax steps
// of `block_tokens` tokens from `begin` (64, 128 or 256; in kFp8 mode also the P' quantization
// block): per row the normalized fp32 output [512] and lse (-inf, and out = 0, when the row sees
// no token; NaN, and out = NaN, when a score of a token it sees is not finite).
void attend_rows(const QueryRow* rows, int count, const KeySet& keys, int begin, int end,
                 PvMode mode, int block_tokens, float* out /* [count, 512] */, float* lse /* [count] */);

// sum_d a[d] * b[d] in double with 8 interleaved partial sums (vectorizable). For e4m3 x e4m3
// products every partial sum is exact (products are multiples of 2^-18 below 2^18, sums of 512
// stay below 2^27 < 2^35), so the order does not matter and the result is the exact dot.
// n must be a multiple of 8.
double dot_f64(const float* a, const float* b, int n);

void parallel_for_impl(int64_t n, void (*call)(void*, int64_t), void* ctx);

// Runs fn(i) for i in [0, n) on the reference's threads.
template <typename Fn>
void parallel_for(int64_t n, Fn&& fn) {
  parallel_for_impl(
      n, [](void* c, int64_t i) { (*static_cast<Fn*>(c))(i); }, &fn);
}

}  // namespace snapmla::detail
