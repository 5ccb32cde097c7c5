// SnapMLA from C++: write 300 tokens into an FP8 cache, quantize 16 query heads, plan splits for
// 4 workers and decode one step. Host memory runs the CPU reference; the same calls on device
// memory (Device::cuda()) run the kernels.
#include <snapmla/snapmla.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  using namespace snapmla;
  const int len = 300, heads = 16, pages = (len + kPageSize - 1) / kPageSize;
  const Device cpu = Device::cpu();

  // The cache: three planes of `pages` pages; token t of the sequence goes to page t / 64.
  std::vector<e4m3> latent(size_t(pages) * kPageSize * kLatentDim);
  std::vector<float> scale(size_t(pages) * kPageSize);
  std::vector<bf16> rope(size_t(pages) * kPageSize * kRopeDim);
  PagedFp8Cache cache{latent.data(), scale.data(), rope.data(), pages, cpu};
  std::vector<bf16> kv(size_t(len) * kHeadDim);  // latent 512, then rope 64, per token
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = to_bf16(std::sin(0.37f * float(i)));
  std::vector<int32_t> slots(len);
  for (int t = 0; t < len; ++t) slots[t] = t;  // page t / 64, offset t % 64
  append(cache, KvRows{kv.data(), len, cpu}, SlotMapping{slots.data(), len, cpu});

  // One query token per sequence (batch 1), 16 heads, quantized per head.
  std::vector<bf16> q(size_t(heads) * kHeadDim);
  for (size_t i = 0; i < q.size(); ++i) q[i] = to_bf16(std::cos(0.11f * float(i)));
  std::vector<e4m3> q_nope(size_t(heads) * kLatentDim);
  std::vector<bf16> q_rope(size_t(heads) * kRopeDim);
  std::vector<float> q_scale(heads);
  QuantizedQuery qq{q_nope.data(), q_rope.data(), q_scale.data(), 1, 1, heads, cpu};
  quantize_query(QueryBf16{q.data(), 1, 1, heads, cpu}, qq);

  // The block table and lengths, and a split plan (optional) in fixed-size buffers.
  std::vector<int32_t> block_table(pages), seqlens = {len};
  for (int p = 0; p < pages; ++p) block_table[p] = p;
  PageTable table{block_table.data(), seqlens.data(), 1, pages, cpu};
  const int workers = 4;
  std::vector<int32_t> offsets(2), begins(split_plan_capacity(1, workers)), ranges(begins.size());
  SplitPlan plan{offsets.data(), begins.data(), int(begins.size()), 1, cpu, ranges.data()};
  plan_splits(table, workers, plan);

  std::vector<bf16> out(size_t(heads) * kLatentDim);
  std::vector<float> lse(heads);
  DecodeOptions options;
  options.softmax_scale = 1.0f / std::sqrt(192.0f);
  options.plan = &plan;
  decode_fp8(qq, cache, table, DecodeOutput{out.data(), lse.data(), cpu}, options);

  std::printf("%d splits; head 0: lse %.4f, out[0..3] %.4f %.4f %.4f %.4f\n", offsets[1], lse[0],
              to_float(out[0]), to_float(out[1]), to_float(out[2]), to_float(out[3]));
  return std::isfinite(lse[0]) ? 0 : 1;
}
