// One decode step on the CPU: two sequences written to an FP8 cache, their queries quantized,
// a split plan, decode_fp8. Device memory (Device::cuda()) runs the same calls on the GPU.
#include <snapmla/snapmla.hpp>

#include <cmath>
#include <cstdio>
#include <vector>
using namespace snapmla;

int main() {
  const int b = 2, s_q = 1, h = 8, num_pages = 4, max_pages = 2, workers = 4;
  const Device cpu = Device::cpu();
  std::vector<e4m3> latent(num_pages * kPageSize * kLatentDim);
  std::vector<float> scale(num_pages * kPageSize);
  std::vector<bf16> rope(num_pages * kPageSize * kRopeDim);
  PagedFp8Cache cache{latent.data(), scale.data(), rope.data(), num_pages, cpu};
  // New tokens (latent then rope, bf16 [n, 576]) quantized on write through their slots
  // (slot = page * 64 + offset): sequence 0 gets 100 tokens in pages 2, 0; sequence 1 gets 30 in page 1.
  std::vector<int32_t> block_table = {2, 0, 1, 3}, cache_seqlens = {100, 30}, slots;
  for (int t = 0; t < 100; ++t) slots.push_back(block_table[t / kPageSize] * kPageSize + t % kPageSize);
  for (int t = 0; t < 30; ++t) slots.push_back(1 * kPageSize + t);
  const int n = int(slots.size());
  std::vector<bf16> kv(size_t(n) * kHeadDim);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = to_bf16(std::sin(0.37f * float(i)));
  append(cache, KvRows{kv.data(), n, cpu}, SlotMapping{slots.data(), n, cpu});
  // Queries: per-(token, head) scale, e4m3 nope, pre-scaled bf16 rope.
  std::vector<bf16> q(size_t(b) * s_q * h * kHeadDim);
  for (size_t i = 0; i < q.size(); ++i) q[i] = to_bf16(std::cos(0.11f * float(i)));
  std::vector<e4m3> q_nope(size_t(b) * s_q * h * kLatentDim);
  std::vector<bf16> q_rope(size_t(b) * s_q * h * kRopeDim);
  std::vector<float> q_scale(size_t(b) * s_q * h);
  QuantizedQuery qq{q_nope.data(), q_rope.data(), q_scale.data(), b, s_q, h, cpu};
  quantize_query(QueryBf16{q.data(), b, s_q, h, cpu}, qq);
  // Optional split-KV plan (fixed-size buffers; computed from cache_seqlens).
  PageTable pages{block_table.data(), cache_seqlens.data(), b, max_pages, cpu};
  std::vector<int32_t> offsets(b + 1), begins(split_plan_capacity(b, workers)), order(begins.size());
  SplitPlan plan{offsets.data(), begins.data(), int(begins.size()), b, cpu, order.data()};
  plan_splits(pages, workers, plan);
  DecodeOptions opt;
  opt.softmax_scale = 1.0f / std::sqrt(192.0f);
  opt.plan = &plan;
  std::vector<bf16> out(size_t(b) * s_q * h * kLatentDim);
  std::vector<float> lse(size_t(b) * h * s_q);
  decode_fp8(qq, cache, pages, DecodeOutput{out.data(), lse.data(), cpu}, opt);
  std::printf("lse of sequence 0, head 0: %.4f; out[0] = %.4f\n", lse[0], to_float(out[0]));
  return std::isfinite(lse[0]) ? 0 : 1;
}
