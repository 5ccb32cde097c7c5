// Reference decode_fp8 / decode_bf16, split planning, combine, and float64 ground truth.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/split_rule.hpp"
#include "core/validate.hpp"
#include "attention_core.hpp"
#include "snapmla/numeric.hpp"
#include "snapmla/reference.hpp"
#include "unchecked.hpp"

namespace snapmla::ref {
namespace {

constexpr int kRowsPerTask = 16;

// Tokens query i of s_q sees in a sequence of `len` tokens.
int visible_tokens(int len, int s_q, int i, bool causal) {
  return causal ? std::max(0, len - s_q + i + 1) : len;
}

struct DecodeShape {
  int batch, s_q, h;
};

// Whether sequence b's table entries are usable: 0 <= len <= max_pages * 64 and every page
// index its length uses in 0..num_pages - 1 (docs/reference.md, "Bad inputs"). A sequence
// whose entries are not gets NaN rows, as on the GPU, and every other sequence is unaffected
// (snapmla::decode_* on host memory rejects such tables in its checks: detail::TableFaults).
bool sequence_ok(const PageTable& pages, int b, int64_t num_pages) {
  const int32_t len = pages.cache_seqlens[b];
  if (len < 0 || int64_t(len) > int64_t(pages.max_pages) * kPageSize) return false;
  const int32_t* table = pages.block_table + int64_t(b) * pages.max_pages;
  for (int j = 0; j < (len + kPageSize - 1) / kPageSize; ++j)
    if (table[j] < 0 || table[j] >= num_pages) return false;
  return true;
}

// Shared driver: keys of each sequence are gathered once (decoded to float), then its query
// rows are attended per split in groups of kRowsPerTask rows, and the splits are combined: their
// partial rows as they are, or rounded to bf16 first (bf16_partials: SNAPMLA_PARTIALS=bf16, as
// the kernels then store them).
template <typename GatherKeys>
DecodeResultF32 run_decode(DecodeShape shape, const std::vector<float>& q_values,
                           const std::vector<float>& q_factor, const PageTable& pages,
                           int64_t num_pages, const DecodeOptions& options, detail::PvMode mode,
                           bool bf16_partials, GatherKeys&& gather_keys) {
  const auto [batch, s_q, h] = shape;
  const int rows = s_q * h;
  DecodeResultF32 res;
  res.out.assign(size_t(batch) * rows * kLatentDim, 0.0f);
  res.lse.assign(size_t(batch) * rows, 0.0f);

  std::vector<float> keys, scales, part_out, part_lse;
  std::vector<int> split_begin;
  for (int b = 0; b < batch; ++b) {
    if (!sequence_ok(pages, b, num_pages)) {
      constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
      std::fill_n(res.out.begin() + int64_t(b) * rows * kLatentDim, int64_t(rows) * kLatentDim, kNaN);
      std::fill_n(res.lse.begin() + int64_t(b) * rows, rows, kNaN);
      continue;
    }
    const int len = pages.cache_seqlens[b];
    keys.resize(size_t(len) * kHeadDim);
    scales.resize(len);
    gather_keys(b, len, keys.data(), scales.data());
    const detail::KeySet ks{keys.data(), scales.data(), len};

    split_begin.clear();
    if (options.plan) {
      for (int k = options.plan->split_offsets[b]; k < options.plan->split_offsets[b + 1]; ++k)
        split_begin.push_back(options.plan->split_begin[k]);
    } else {
      split_begin.push_back(0);
    }
    const int n_splits = static_cast<int>(split_begin.size());
    split_begin.push_back(len);

    std::vector<detail::QueryRow> qrows(rows);
    for (int i = 0; i < s_q; ++i)
      for (int hh = 0; hh < h; ++hh) {
        const int64_t src = (int64_t(b) * s_q + i) * h + hh;
        qrows[i * h + hh] = {q_values.data() + src * kHeadDim, q_factor[src],
                             visible_tokens(len, s_q, i, options.causal)};
      }

    part_out.assign(size_t(n_splits) * rows * kLatentDim, 0.0f);
    part_lse.assign(size_t(n_splits) * rows, 0.0f);
    const int groups = (rows + kRowsPerTask - 1) / kRowsPerTask;
    detail::parallel_for(int64_t(n_splits) * groups, [&](int64_t task) {
      const int k = static_cast<int>(task / groups);
      const int r0 = static_cast<int>(task % groups) * kRowsPerTask;
      const int count = std::min(kRowsPerTask, rows - r0);
      detail::attend_rows(qrows.data() + r0, count, ks, split_begin[k], split_begin[k + 1], mode, kPageSize,
                          part_out.data() + (size_t(k) * rows + r0) * kLatentDim,
                          part_lse.data() + size_t(k) * rows + r0);
    });

    if (bf16_partials && n_splits > 1)
      for (float& x : part_out) x = to_float(to_bf16(x));
    std::vector<float> row_out(size_t(n_splits) * kLatentDim), row_lse(n_splits);
    for (int i = 0; i < s_q; ++i)
      for (int hh = 0; hh < h; ++hh) {
        const int r = i * h + hh;
        float* o = res.out.data() + ((int64_t(b) * s_q + i) * h + hh) * kLatentDim;
        float* l = res.lse.data() + (int64_t(b) * h + hh) * s_q + i;
        if (n_splits == 1) {  // unsplit: the kernel writes its own normalized result
          std::copy_n(part_out.data() + size_t(r) * kLatentDim, kLatentDim, o);
          *l = part_lse[r];
          continue;
        }
        for (int k = 0; k < n_splits; ++k) {
          std::copy_n(part_out.data() + (size_t(k) * rows + r) * kLatentDim, kLatentDim,
                      row_out.data() + size_t(k) * kLatentDim);
          row_lse[k] = part_lse[size_t(k) * rows + r];
        }
        combine_row(n_splits, row_out.data(), row_lse.data(), o, l);
      }
  }
  return res;
}

void write_bf16(const DecodeResultF32& r, const DecodeOutput& out) {
  for (size_t i = 0; i < r.out.size(); ++i) out.out[i] = to_bf16(r.out[i]);
  std::copy(r.lse.begin(), r.lse.end(), out.lse);
}

// A row that sees no token has lse -inf in the engine; the caller may ask for +inf.
void set_empty_lse(DecodeResultF32& r, float empty_lse) {
  if (empty_lse == -std::numeric_limits<float>::infinity()) return;
  for (float& l : r.lse)
    if (l == -std::numeric_limits<float>::infinity()) l = empty_lse;
}

}  // namespace

void combine_row(int num_splits, const float* partial_out, const float* partial_lse, float* out,
                 float* lse) {
  float m = -std::numeric_limits<float>::infinity();
  for (int k = 0; k < num_splits; ++k) {
    if (std::isnan(partial_lse[k])) {  // a faulted split: the row is NaN
      std::fill(out, out + kLatentDim, partial_lse[k]);
      *lse = partial_lse[k];
      return;
    }
    m = std::max(m, partial_lse[k]);
  }
  if (m == -std::numeric_limits<float>::infinity()) {
    std::fill(out, out + kLatentDim, 0.0f);
    *lse = m;
    return;
  }
  float sum = 0.0f;
  for (int k = 0; k < num_splits; ++k) sum += std::exp(partial_lse[k] - m);
  const float total = m + std::log(sum);
  std::fill(out, out + kLatentDim, 0.0f);
  for (int k = 0; k < num_splits; ++k) {
    const float w = std::exp(partial_lse[k] - total);
    if (w == 0.0f) continue;
    for (int d = 0; d < kLatentDim; ++d) out[d] += w * partial_out[size_t(k) * kLatentDim + d];
  }
  *lse = total;
}

namespace unchecked {

void plan_splits(const PageTable& pages, int num_workers, const SplitPlan& plan, int query_rows, int split_blocks,
                 detail::PlanLabOptions lab) {
  detail::PlanTotals totals;
  for (int i = 0; i < pages.batch; ++i)
    detail::add_sequence(totals, (pages.cache_seqlens[i] + kPageSize - 1) / kPageSize, split_blocks);
  // The division of the work (core/split_rule.hpp): the sequences' costs (blocks plus a fixed
  // cost each) end to end, worker k the part from k x share on; a worker boundary inside a
  // sequence's blocks starts a new split there, so there are at most batch + workers - 1 <=
  // capacity splits. Or whole sequences per worker, where cutting gains nothing; or the
  // batch-invariant fixed splits.
  const detail::WorkerShares shares =
      detail::worker_shares(totals, pages.batch, num_workers, query_rows, split_blocks, plan.capacity, lab);
  const int slots = plan.capacity - pages.batch;  // the plan's workers (>= num_workers)
  int32_t k = 0;
  int64_t c0 = 0;
  plan.split_offsets[0] = 0;
  if (plan.worker_splits != nullptr) plan.worker_splits[0] = 0;
  for (int i = 0; i < pages.batch; ++i) {
    const int64_t blocks = (pages.cache_seqlens[i] + kPageSize - 1) / kPageSize;
    const detail::SequenceSplits seq = detail::sequence_splits(c0, blocks, i, shares);
    const int32_t first = k;
    for (int64_t j = 0, n = seq.count(); j < n; ++j)
      plan.split_begin[k++] = static_cast<int32_t>(seq.begin_block(j) * kPageSize);
    if (plan.worker_splits != nullptr)
      for (int w = seq.cuts.lo; w < seq.cuts.hi; ++w)
        plan.worker_splits[w] = first + static_cast<int32_t>(seq.worker_start(w));
    plan.split_offsets[i + 1] = k;
    c0 += blocks + detail::piece_fixed_cost(i, shares);
  }
  // Capacity past the last split is never read; -1 there, so a printed plan shows no garbage.
  std::fill(plan.split_begin + k, plan.split_begin + plan.capacity, -1);
  if (plan.worker_splits == nullptr) return;
  // Workers past the axis's end (and past the workers the total is worth) have no splits; the
  // entries past the last worker's end are never read.
  const int first_idle = detail::busy_workers(shares);
  const int last = std::min(slots, plan.capacity - 1);  // a batch of 0 has no room for the end entry
  for (int w = std::max(first_idle, 1); w <= last; ++w) plan.worker_splits[w] = k;
  std::fill(plan.worker_splits + last + 1, plan.worker_splits + plan.capacity, -1);
}

}  // namespace unchecked

namespace {

DecodeResultF32 fp8_f32(const QuantizedQuery& q, const PagedFp8Cache& cache, const PageTable& pages,
                        const DecodeOptions& options) {
  const int64_t rows = int64_t(q.batch) * q.seqlen_q * q.num_heads;
  std::vector<float> qv(rows * kHeadDim), qf(rows);
  for (int64_t r = 0; r < rows; ++r) {
    for (int d = 0; d < kLatentDim; ++d) qv[r * kHeadDim + d] = to_float(q.nope[r * kLatentDim + d]);
    for (int d = 0; d < kRopeDim; ++d)
      qv[r * kHeadDim + kLatentDim + d] = to_float(q.rope[r * kRopeDim + d]);
    qf[r] = options.softmax_scale * q.scale[r];
  }
  const detail::PvMode mode =
      detail::fp8_pv_mode(detail::resolved_p_scale("decode_fp8", options, q.seqlen_q * q.num_heads));
  DecodeResultF32 r = run_decode({q.batch, q.seqlen_q, q.num_heads}, qv, qf, pages, cache.num_pages, options,
                    mode, detail::bf16_partials("decode_fp8", detail::DecodePath::kFp8), [&](int b, int len, float* kv, float* scale) {
                      const int32_t* table = pages.block_table + int64_t(b) * pages.max_pages;
                      for (int t = 0; t < len; ++t) {
                        const int64_t slot = int64_t(table[t / kPageSize]) * kPageSize + t % kPageSize;
                        float* row = kv + int64_t(t) * kHeadDim;
                        for (int d = 0; d < kLatentDim; ++d)
                          row[d] = to_float(cache.latent[slot * kLatentDim + d]);
                        for (int d = 0; d < kRopeDim; ++d)
                          row[kLatentDim + d] = to_float(cache.rope[slot * kRopeDim + d]);
                        scale[t] = cache.scale[slot];
                      }
                    });
  set_empty_lse(r, options.empty_lse);
  return r;
}

DecodeResultF32 bf16_f32(const QueryBf16& q, const PagedBf16Cache& cache, const PageTable& pages,
                         const DecodeOptions& options) {
  const int64_t rows = int64_t(q.batch) * q.seqlen_q * q.num_heads;
  std::vector<float> qv(rows * kHeadDim), qf(rows, options.softmax_scale);
  for (int64_t i = 0; i < rows * kHeadDim; ++i) qv[i] = to_float(q.data[i]);
  DecodeResultF32 r = run_decode({q.batch, q.seqlen_q, q.num_heads}, qv, qf, pages, cache.num_pages, options,
                    detail::PvMode::kBf16, detail::bf16_partials("decode_bf16", detail::DecodePath::kBf16),
                    [&](int b, int len, float* kv, float* scale) {
                      const int32_t* table = pages.block_table + int64_t(b) * pages.max_pages;
                      for (int t = 0; t < len; ++t) {
                        const int64_t slot = int64_t(table[t / kPageSize]) * kPageSize + t % kPageSize;
                        for (int d = 0; d < kHeadDim; ++d)
                          kv[int64_t(t) * kHeadDim + d] = to_float(cache.data[slot * kHeadDim + d]);
                        scale[t] = 1.0f;
                      }
                    });
  set_empty_lse(r, options.empty_lse);
  return r;
}

}  // namespace

namespace unchecked {

void decode_fp8(const QuantizedQuery& q, const PagedFp8Cache& cache, const PageTable& pages,
                const DecodeOutput& out, const DecodeOptions& options) {
  write_bf16(fp8_f32(q, cache, pages, options), out);
}

void decode_bf16(const QueryBf16& q, const PagedBf16Cache& cache, const PageTable& pages,
                 const DecodeOutput& out, const DecodeOptions& options) {
  write_bf16(bf16_f32(q, cache, pages, options), out);
}

}  // namespace unchecked

// The reference's own entry points: host memory only, then the checks every call runs (a bad
// table gives NaN rows, as on the GPU).
void plan_splits(const PageTable& pages, int num_workers, const SplitPlan& plan, int query_rows, int split_blocks) {
  detail::check_host("ref::plan_splits", "pages", pages.device);
  detail::check_plan_splits("ref::plan_splits", pages, num_workers, query_rows, plan, split_blocks);
  unchecked::plan_splits(pages, num_workers, plan, query_rows, split_blocks,
                         detail::plan_lab_options("ref::plan_splits"));
}

DecodeResultF32 decode_fp8_f32(const QuantizedQuery& q, const PagedFp8Cache& cache,
                               const PageTable& pages, const DecodeOptions& options) {
  detail::check_host("ref::decode_fp8", "q", q.device);
  detail::check_decode("ref::decode_fp8", q, cache, pages, nullptr, options, detail::TableFaults::kNanRows);
  return fp8_f32(q, cache, pages, options);
}

DecodeResultF32 decode_bf16_f32(const QueryBf16& q, const PagedBf16Cache& cache,
                                const PageTable& pages, const DecodeOptions& options) {
  detail::check_host("ref::decode_bf16", "q", q.device);
  detail::check_decode("ref::decode_bf16", q, cache, pages, nullptr, options, detail::TableFaults::kNanRows);
  return bf16_f32(q, cache, pages, options);
}

void decode_fp8(const QuantizedQuery& q, const PagedFp8Cache& cache, const PageTable& pages,
                const DecodeOutput& out, const DecodeOptions& options) {
  detail::check_host("ref::decode_fp8", "q", q.device);
  detail::check_decode("ref::decode_fp8", q, cache, pages, &out, options, detail::TableFaults::kNanRows);
  unchecked::decode_fp8(q, cache, pages, out, options);
}

void decode_bf16(const QueryBf16& q, const PagedBf16Cache& cache, const PageTable& pages,
                 const DecodeOutput& out, const DecodeOptions& options) {
  detail::check_host("ref::decode_bf16", "q", q.device);
  detail::check_decode("ref::decode_bf16", q, cache, pages, &out, options, detail::TableFaults::kNanRows);
  unchecked::decode_bf16(q, cache, pages, out, options);
}

void attention_f64(const float* q, int seqlen_q, int num_heads, const float* kv, int seqlen_k,
                   double softmax_scale, bool causal, double* out, double* lse, double* entropy) {
  const int rows = seqlen_q * num_heads;
  detail::parallel_for(rows, [&](int64_t r) {
    const int i = static_cast<int>(r) / num_heads, hh = static_cast<int>(r) % num_heads;
    const float* qr = q + r * kHeadDim;
    const int vis = visible_tokens(seqlen_k, seqlen_q, i, causal);
    double* o = out + r * kLatentDim;
    std::fill(o, o + kLatentDim, 0.0);
    const int64_t li = int64_t(hh) * seqlen_q + i;
    if (vis == 0) {
      lse[li] = -std::numeric_limits<double>::infinity();
      if (entropy) entropy[li] = 0.0;
      return;
    }
    std::vector<double> s(vis);
    double m = -std::numeric_limits<double>::infinity();
    for (int t = 0; t < vis; ++t) {
      s[t] = detail::dot_f64(qr, kv + int64_t(t) * kHeadDim, kHeadDim) * softmax_scale;
      m = std::max(m, s[t]);
    }
    double sum = 0.0, ps = 0.0;
    for (int t = 0; t < vis; ++t) {
      const double p = std::exp(s[t] - m);
      sum += p;
      ps += p * s[t];
      const float* v = kv + int64_t(t) * kHeadDim;
      for (int d = 0; d < kLatentDim; ++d) o[d] += p * double(v[d]);
    }
    for (int d = 0; d < kLatentDim; ++d) o[d] /= sum;
    lse[li] = m + std::log(sum);
    if (entropy) entropy[li] = lse[li] - ps / sum;  // H = lse - E_p[s]
  });
}

}  // namespace snapmla::ref
