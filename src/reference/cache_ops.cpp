// Reference append / quantize_query / gather_dequant: the exact bytes the kernels must write.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/validate.hpp"
#include "attention_core.hpp"
#include "snapmla/numeric.hpp"
#include "snapmla/reference.hpp"
#include "unchecked.hpp"

namespace snapmla::ref {
namespace {

float amax_of(const bf16* x, int n) {
  float a = 0.0f;
  for (int i = 0; i < n; ++i) a = std::fmax(a, std::fabs(to_float(x[i])));
  return a;
}

// The one quantization rule for cache rows and query rows: e4m3 latent/nope, pre-scaled bf16
// rope, fp32 scale (numeric.hpp, token_scale).
float quantize_row(const bf16* row, e4m3* latent_out, bf16* rope_out) {
  const TokenScale s = token_scale(amax_of(row, kLatentDim));
  for (int d = 0; d < kLatentDim; ++d) latent_out[d] = to_e4m3(to_float(row[d]) * s.inv_scale);
  for (int d = 0; d < kRopeDim; ++d)
    rope_out[d] = to_bf16(to_float(row[kLatentDim + d]) * s.inv_scale);
  return s.scale;
}

}  // namespace

namespace unchecked {

void append(const PagedFp8Cache& cache, const KvRows& kv, const SlotMapping& slots) {
  for (int64_t i = 0; i < kv.num_tokens; ++i) {
    const int64_t slot = slots.slots[i];
    if (slot < 0) continue;
    cache.scale[slot] = quantize_row(kv.data + i * kHeadDim, cache.latent + slot * kLatentDim,
                                     cache.rope + slot * kRopeDim);
  }
}

void append(const PagedBf16Cache& cache, const KvRows& kv, const SlotMapping& slots) {
  for (int64_t i = 0; i < kv.num_tokens; ++i) {
    const int64_t slot = slots.slots[i];
    if (slot < 0) continue;
    std::memcpy(cache.data + slot * kHeadDim, kv.data + i * kHeadDim, kHeadDim * sizeof(bf16));
  }
}

void quantize_query(const QueryBf16& q, const QuantizedQuery& out) {
  const int64_t rows = int64_t(q.batch) * q.seqlen_q * q.num_heads;
  for (int64_t r = 0; r < rows; ++r)
    out.scale[r] = quantize_row(q.data + r * kHeadDim, out.nope + r * kLatentDim,
                                out.rope + r * kRopeDim);
}

void gather_dequant(const PagedFp8Cache& cache, const SlotMapping& slots, const KvRows& out) {
  for (int64_t i = 0; i < slots.num_tokens; ++i) {
    bf16* row = out.data + i * kHeadDim;
    const int64_t slot = slots.slots[i];
    if (slot < 0) {
      std::fill(row, row + kHeadDim, bf16{0});
      continue;
    }
    const float s = cache.scale[slot];
    for (int d = 0; d < kLatentDim; ++d)
      row[d] = to_bf16(to_float(cache.latent[slot * kLatentDim + d]) * s);
    for (int d = 0; d < kRopeDim; ++d)
      row[kLatentDim + d] = to_bf16(to_float(cache.rope[slot * kRopeDim + d]) * s);
  }
}

}  // namespace unchecked

// The reference's own entry points: host memory only, then the checks every call runs.
void append(const PagedFp8Cache& cache, const KvRows& kv, const SlotMapping& slots) {
  detail::check_host("ref::append", "cache", cache.device);
  detail::check_append("ref::append", cache, kv, slots);
  unchecked::append(cache, kv, slots);
}
void append(const PagedBf16Cache& cache, const KvRows& kv, const SlotMapping& slots) {
  detail::check_host("ref::append", "cache", cache.device);
  detail::check_append("ref::append", cache, kv, slots);
  unchecked::append(cache, kv, slots);
}
void quantize_query(const QueryBf16& q, const QuantizedQuery& out) {
  detail::check_host("ref::quantize_query", "q", q.device);
  detail::check_quantize_query("ref::quantize_query", q, out);
  unchecked::quantize_query(q, out);
}
void gather_dequant(const PagedFp8Cache& cache, const SlotMapping& slots, const KvRows& out) {
  detail::check_host("ref::gather_dequant", "cache", cache.device);
  detail::check_gather_dequant("ref::gather_dequant", cache, slots, out);
  unchecked::gather_dequant(cache, slots, out);
}

}  // namespace snapmla::ref
