// Shared test fixtures: fresh random inputs every run (seed printed; SNAPMLA_TEST_SEED fixes
// it), paged caches with shuffled pages, spare pages and NaN in every slot no token owns.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "snapmla/reference.hpp"
#include "snapmla/snapmla.hpp"

namespace snapmla::test {

inline uint64_t test_seed() {
  static const uint64_t seed = []() -> uint64_t {
    if (const char* s = std::getenv("SNAPMLA_TEST_SEED")) return std::strtoull(s, nullptr, 10);
    return (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  }();
  return seed;
}

// A fresh generator per test, derived from the run's seed and the test's name.
inline std::mt19937_64 make_rng() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "";
  uint64_t h = test_seed();
  for (char c : name) h = h * 1099511628211ull ^ uint8_t(c);
  return std::mt19937_64(h);
}

#define SNAPMLA_TRACE_SEED() \
  SCOPED_TRACE("rerun with SNAPMLA_TEST_SEED=" + std::to_string(::snapmla::test::test_seed()))

inline float kNaN = std::numeric_limits<float>::quiet_NaN();

// bf16 rows with N(0, 1) latents (per-token norm varying over 2 decades) and rope values
// spanning about +-1e3, as MLA caches have.
inline std::vector<bf16> random_kv(std::mt19937_64& rng, int64_t n) {
  std::normal_distribution<float> N(0.f, 1.f);
  std::uniform_real_distribution<float> U(-1.f, 1.f);
  std::vector<bf16> kv(size_t(n) * kHeadDim);
  for (int64_t t = 0; t < n; ++t) {
    const float norm = std::pow(10.f, U(rng));
    for (int d = 0; d < kLatentDim; ++d) kv[t * kHeadDim + d] = to_bf16(norm * N(rng));
    for (int d = 0; d < kRopeDim; ++d) kv[t * kHeadDim + kLatentDim + d] = to_bf16(300.f * N(rng));
  }
  return kv;
}

inline std::vector<bf16> random_q(std::mt19937_64& rng, int64_t rows) {
  std::normal_distribution<float> N(0.f, 1.f);
  std::vector<bf16> q(size_t(rows) * kHeadDim);
  for (int64_t r = 0; r < rows; ++r) {
    for (int d = 0; d < kLatentDim; ++d) q[r * kHeadDim + d] = to_bf16(N(rng));
    for (int d = 0; d < kRopeDim; ++d) q[r * kHeadDim + kLatentDim + d] = to_bf16(0.01f * N(rng));
  }
  return q;
}

// A batch of sequences in one paged cache (FP8 and BF16 planes over the same pages). Pages are
// shuffled, there are spare pages, block-table entries past each sequence's pages hold
// out-of-range garbage, and every slot no token owns holds NaN.
struct Batch {
  int batch = 0, s_q = 1, h = 16, max_pages = 0;
  int64_t num_pages = 0;
  std::vector<int32_t> seqlens, block_table;
  std::vector<std::vector<bf16>> kv;  // per sequence [len, 576]
  std::vector<bf16> q;                // [b, s_q, h, 576]
  std::vector<e4m3> latent;
  std::vector<float> scale;
  std::vector<bf16> rope, bf16_data;
  std::vector<e4m3> q_nope;
  std::vector<bf16> q_rope;
  std::vector<float> q_scale;
  float softmax_scale = 0.0f;

  PagedFp8Cache fp8() { return {latent.data(), scale.data(), rope.data(), num_pages, Device::cpu()}; }
  PagedBf16Cache bf16_cache() { return {bf16_data.data(), num_pages, Device::cpu()}; }
  PageTable pages() {
    return {block_table.data(), seqlens.data(), batch, max_pages, Device::cpu()};
  }
  QueryBf16 query() { return {q.data(), batch, s_q, h, Device::cpu()}; }
  QuantizedQuery qq() {
    return {q_nope.data(), q_rope.data(), q_scale.data(), batch, s_q, h, Device::cpu()};
  }
  int64_t slot(int b, int t) const {
    return int64_t(block_table[size_t(b) * max_pages + t / kPageSize]) * kPageSize + t % kPageSize;
  }
};

// kv_style kWide: random_kv / random_q (norms over 2 decades, rope ~1e3); kGaussian: every
// value N(0, 1) and softmax_scale 1/sqrt(576), the data FlashMLA's own tests use.
enum class Data { kWide, kGaussian };

inline std::vector<bf16> gaussian_rows(std::mt19937_64& rng, int64_t rows) {
  std::normal_distribution<float> N(0.f, 1.f);
  std::vector<bf16> v(size_t(rows) * kHeadDim);
  for (auto& x : v) x = to_bf16(N(rng));
  return v;
}

inline Batch make_batch(std::mt19937_64& rng, const std::vector<int32_t>& seqlens, int s_q, int h,
                        bool shuffle_pages = true, Data data = Data::kWide) {
  Batch B;
  B.batch = int(seqlens.size());
  B.s_q = s_q;
  B.h = h;
  B.seqlens = seqlens;
  B.softmax_scale = data == Data::kGaussian ? 1.0f / std::sqrt(576.0f) : 1.0f / std::sqrt(192.0f);
  int total_pages = 0;
  for (int32_t len : seqlens) {
    const int p = (len + kPageSize - 1) / kPageSize;
    B.max_pages = std::max(B.max_pages, p + 1);  // one extra table column of garbage
    total_pages += p;
  }
  B.num_pages = total_pages + 5;
  std::vector<int32_t> perm(B.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  if (shuffle_pages) std::shuffle(perm.begin(), perm.end(), rng);
  B.block_table.assign(size_t(B.batch) * B.max_pages, 0);
  int next = 0;
  for (int b = 0; b < B.batch; ++b) {
    const int p = (seqlens[b] + kPageSize - 1) / kPageSize;
    for (int j = 0; j < B.max_pages; ++j)
      B.block_table[size_t(b) * B.max_pages + j] =
          j < p ? perm[next++] : (j % 2 ? -7 : int32_t(B.num_pages + 1000));  // never read
  }
  const size_t slots = size_t(B.num_pages) * kPageSize;
  B.latent.assign(slots * kLatentDim, e4m3{0x7F});
  B.scale.assign(slots, kNaN);
  B.rope.assign(slots * kRopeDim, to_bf16(kNaN));
  B.bf16_data.assign(slots * kHeadDim, to_bf16(kNaN));
  for (int b = 0; b < B.batch; ++b) {
    B.kv.push_back(data == Data::kGaussian ? gaussian_rows(rng, seqlens[b]) : random_kv(rng, seqlens[b]));
    std::vector<int32_t> sl(seqlens[b]);
    for (int t = 0; t < seqlens[b]; ++t) sl[t] = int32_t(B.slot(b, t));
    const KvRows rows{B.kv[b].data(), seqlens[b], Device::cpu()};
    const SlotMapping map{sl.data(), seqlens[b], Device::cpu()};
    append(B.fp8(), rows, map);
    append(B.bf16_cache(), rows, map);
  }
  const size_t rows = size_t(B.batch) * s_q * h;
  B.q = data == Data::kGaussian ? gaussian_rows(rng, int64_t(rows)) : random_q(rng, rows);
  B.q_nope.assign(rows * kLatentDim, e4m3{0});
  B.q_rope.assign(rows * kRopeDim, bf16{0});
  B.q_scale.assign(rows, 0.f);
  quantize_query(B.query(), B.qq());
  return B;
}

inline DecodeOptions options(const Batch& B, const SplitPlan* plan = nullptr, bool causal = true) {
  DecodeOptions o;
  o.softmax_scale = B.softmax_scale;
  o.plan = plan;
  o.causal = causal;
  return o;
}

// A plan with its own storage.
struct OwnedPlan {
  std::vector<int32_t> offsets, begins, worker_splits;
  SplitPlan plan;
  // capacity 0: split_plan_capacity(batch, workers).
  OwnedPlan(PageTable pages, int workers, int query_rows = 0, int split_blocks = 0, int capacity = 0)
      : offsets(pages.batch + 1),
        begins(capacity > 0 ? capacity : split_plan_capacity(pages.batch, workers), 0x5A5A5A5A),  // garbage the plan must not leave
        worker_splits(begins.size(), 0x5A5A5A5A) {
    plan = {offsets.data(), begins.data(), int(begins.size()), pages.batch, Device::cpu(), worker_splits.data()};
    plan_splits(pages, workers, plan, nullptr, query_rows, split_blocks);
  }
};


inline double rel_l2(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Expects an Error naming `arg` (as a prefix of the argument path).
#define EXPECT_ARG_ERROR(stmt, arg)                                                    \
  do {                                                                                 \
    try {                                                                              \
      stmt;                                                                            \
      ADD_FAILURE() << "expected snapmla::Error naming '" << (arg) << "'";             \
    } catch (const ::snapmla::Error& e) {                                              \
      EXPECT_EQ(e.argument().rfind((arg), 0), 0u)                                      \
          << "error names '" << e.argument() << "', expected '" << (arg) << "': " << e.what(); \
      EXPECT_NE(std::string(e.what()).find("expected"), std::string::npos) << e.what(); \
    }                                                                                  \
  } while (0)

// stmt throws snapmla::Error whose message contains `text`.
#define EXPECT_MESSAGE(stmt, text)                                                     \
  do {                                                                                 \
    try {                                                                              \
      stmt;                                                                            \
      ADD_FAILURE() << "expected snapmla::Error containing '" << (text) << "'";        \
    } catch (const ::snapmla::Error& e) {                                              \
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();      \
    }                                                                                  \
  } while (0)

// An environment variable set for a scope (the lab options are read from the environment per
// call) and put back as it was, unset included, when the scope ends. A null value leaves the
// environment's own setting as it is.
// An SNAPMLA_FAST_SMS list: `count` SM ids first, first + stride, ..., joined by '+'.
inline std::string sm_list(int count, int first = 0, int stride = 1) {
  std::string list;
  for (int i = 0; i < count; ++i) {
    if (i > 0) list += '+';
    list += std::to_string(first + stride * i);
  }
  return list;
}

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* was = std::getenv(name);
    had_ = was != nullptr;
    if (had_) saved_ = was;
    if (value != nullptr) set(value);
  }
  void set(const char* value) { ::setenv(name_, value, 1); }
  ~ScopedEnv() {
    if (had_) ::setenv(name_, saved_.c_str(), 1);
    else ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string saved_;
};

}  // namespace snapmla::test
