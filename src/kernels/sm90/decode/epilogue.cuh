// Writes a warp's output tile: normalized rows as bf16 into `out` (a sequence with one split)
// or as fp32 partials for the combine kernel, and the lse. A row that saw no token gets 0 and
// -inf; a CTA that met an out-of-range page index writes NaN, so the fault is visible.
#pragma once

#include "../../common/numeric.cuh"
#include "params.hpp"
#include "scheduler.cuh"
#include "softmax.cuh"

namespace snapmla::cuda {

// Row r's lse: into lse ([b, h, s_q], r = i * h + head) for a sequence with one split, else
// into the split's partial lse for the combine.
__device__ __forceinline__ void store_lse(const DecodeParams& p, const Work& w, int r, float lse) {
  if (w.single) {
    const int i = r / p.num_heads, h = r % p.num_heads;
    p.lse[(int64_t(w.seq) * p.num_heads + h) * p.seqlen_q + i] = lse;
  } else {
    p.partial_lse[int64_t(w.split) * p.rows + r] = lse;
  }
}

// o: NT n-tiles of 8 dims starting at dim0; rows row0 + g and row0 + g + 8.
template <bool kFp8, int NT>
__device__ __forceinline__ void write_rows(const DecodeParams& p, const Work& w,
                                           const SoftmaxState& st, float (&o)[NT][4], int row0,
                                           int dim0, int lane, bool write_lse, bool fault) {
  const int g = lane / 4, q = lane % 4;
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const int r = row0 + g + 8 * ri;
    if (r >= p.rows) continue;
    const bool empty = st.l[ri] == 0.f;
    const float scale = fault ? NAN : (empty ? 0.f : __fdiv_rn(kFp8 ? st.sigma[ri] : 1.f, st.l[ri]));
    const float lse = fault ? NAN : (empty ? -INFINITY : st.m[ri] + logf(st.l[ri]));
    if (w.single) {
      uint16_t* dst = p.out + (int64_t(w.seq) * p.rows + r) * kLatentDim + dim0 + 2 * q;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const float a = empty && !fault ? 0.f : o[n][2 * ri] * scale;
        const float b = empty && !fault ? 0.f : o[n][2 * ri + 1] * scale;
        *reinterpret_cast<uint32_t*>(dst + 8 * n) =
            uint32_t(float_to_bf16_bits(a)) | (uint32_t(float_to_bf16_bits(b)) << 16);
      }
      if (write_lse && q == 0) store_lse(p, w, r, lse);
    } else {
      float* dst = p.partial_out + (int64_t(w.split) * p.rows + r) * kLatentDim + dim0 + 2 * q;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const float a = empty && !fault ? 0.f : o[n][2 * ri] * scale;
        const float b = empty && !fault ? 0.f : o[n][2 * ri + 1] * scale;
        *reinterpret_cast<float2*>(dst + 8 * n) = make_float2(a, b);
      }
      if (write_lse && q == 0) store_lse(p, w, r, lse);
    }
  }
}

}  // namespace snapmla::cuda
