// Bad device inputs stay in their row (docs/reference.md, "Bad inputs"): the reference, which
// models the GPU kernels, turns the rows of a sequence with a bad length or page index into NaN
// and leaves every other sequence bit-identical to a run without the bad one; NaN / Inf in q or
// in a token a row sees makes that row NaN and no other.
#include <gtest/gtest.h>

#include "test_util.hpp"

namespace snapmla {
namespace {

using test::Batch;
using test::make_batch;
using test::make_rng;
using test::OwnedPlan;

struct Results {
  ref::DecodeResultF32 fp8, bf16;
};

Results run(Batch& B, const SplitPlan* plan) {
  return {ref::decode_fp8_f32(B.qq(), B.fp8(), B.pages(), test::options(B, plan)),
          ref::decode_bf16_f32(B.query(), B.bf16_cache(), B.pages(), test::options(B, plan))};
}

// Rows of sequence b (out [b, s_q, h, 512], lse [b, h, s_q]: both b-major).
bool row_of_sequence(const Batch& B, size_t index, size_t per_row, int b) {
  return int(index / (per_row * B.s_q * B.h)) == b;
}

// Every row of sequence `bad` is NaN (out and lse); every other value is bit-identical to `good`.
void expect_only_sequence_nan(const Batch& B, const ref::DecodeResultF32& got, const ref::DecodeResultF32& good,
                              int bad) {
  for (size_t i = 0; i < got.out.size(); ++i) {
    if (row_of_sequence(B, i, kLatentDim, bad))
      ASSERT_TRUE(std::isnan(got.out[i])) << "out element " << i;
    else
      ASSERT_EQ(std::memcmp(&got.out[i], &good.out[i], 4), 0) << "out element " << i;
  }
  for (size_t i = 0; i < got.lse.size(); ++i) {
    if (row_of_sequence(B, i, 1, bad))
      ASSERT_TRUE(std::isnan(got.lse[i])) << "lse " << i;
    else
      ASSERT_EQ(std::memcmp(&got.lse[i], &good.lse[i], 4), 0) << "lse " << i;
  }
}

TEST(BadInputs, BadLengthOrPageIndexMakesOnlyThatSequenceNaN) {
  auto rng = make_rng();
  SNAPMLA_TRACE_SEED();
  Batch B = make_batch(rng, {130, 64, 300, 7}, 2, 3);
  OwnedPlan P(B.pages(), 5);  // the plan of the good batch, reused for the bad ones
  for (const SplitPlan* plan : {static_cast<const SplitPlan*>(nullptr), static_cast<const SplitPlan*>(&P.plan)}) {
    const Results good = run(B, plan);
    for (int bad : {0, 3}) {  // the last batch row included
      const int64_t cap = int64_t(B.max_pages) * kPageSize;
      for (int64_t len : {cap + 1, int64_t(1000000), int64_t(INT32_MAX), int64_t(-1), int64_t(-65)}) {
        Batch C = B;
        C.seqlens[bad] = int32_t(len);
        SCOPED_TRACE("sequence " + std::to_string(bad) + " length " + std::to_string(len));
        const Results r = run(C, plan);
        expect_only_sequence_nan(B, r.fp8, good.fp8, bad);
        expect_only_sequence_nan(B, r.bf16, good.bf16, bad);
        EXPECT_THROW(check_page_table(C.pages(), C.num_pages), Error);
      }
      for (int32_t page : {-1, int32_t(B.num_pages), INT32_MAX}) {
        Batch C = B;
        const int used = (B.seqlens[bad] + kPageSize - 1) / kPageSize;
        C.block_table[size_t(bad) * B.max_pages + used - 1] = page;
        SCOPED_TRACE("sequence " + std::to_string(bad) + " page " + std::to_string(page));
        const Results r = run(C, plan);
        expect_only_sequence_nan(B, r.fp8, good.fp8, bad);
        expect_only_sequence_nan(B, r.bf16, good.bf16, bad);
      }
    }
  }
}

TEST(BadInputs, CheckPageTableNamesTheBadEntry) {
  auto rng = make_rng();
  Batch B = make_batch(rng, {130, 64}, 1, 8);
  EXPECT_NO_THROW(check_page_table(B.pages(), B.num_pages));
  Batch C = B;
  C.block_table[size_t(1) * B.max_pages + 0] = int32_t(B.num_pages) + 4;
  EXPECT_MESSAGE(check_page_table(C.pages(), C.num_pages),
                 "snapmla::check_page_table: argument 'block_table': page index " +
                     std::to_string(B.num_pages + 4) + " at [1, 0] is out of range");
  C = B;
  C.seqlens[1] = -2;
  EXPECT_MESSAGE(check_page_table(C.pages(), C.num_pages), "cache_seqlens[1] = -2 is negative");
  C.seqlens[1] = 1000000;
  EXPECT_MESSAGE(check_page_table(C.pages(), C.num_pages), "cache_seqlens[1] = 1000000 is beyond the block table row");
}

// NaN or Inf in one query row: that row's out and lse are NaN, every other row is unchanged.
TEST(BadInputs, NonFiniteQueryMakesOnlyItsRowNaN) {
  auto rng = make_rng();
  SNAPMLA_TRACE_SEED();
  Batch B = make_batch(rng, {100, 70}, 2, 3);
  const Results good = run(B, nullptr);
  const int rows = B.s_q * B.h;
  for (const float bad : {test::kNaN, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()}) {
    for (const int dim : {5, kLatentDim + 3}) {  // the latent part and the rope part
      Batch C = B;
      const int row = rows + 4;  // sequence 1, query 1, head 1
      C.q[size_t(row) * kHeadDim + dim] = to_bf16(bad);
      // decode_fp8's query: the same value in its quantized planes (e4m3 has no Inf: NaN there).
      if (dim < kLatentDim) C.q_nope[size_t(row) * kLatentDim + dim] = e4m3{0x7F};
      else C.q_rope[size_t(row) * kRopeDim + dim - kLatentDim] = to_bf16(bad);
      SCOPED_TRACE("value " + std::to_string(bad) + " at dim " + std::to_string(dim));
      const Results r = run(C, nullptr);
      for (const auto* pair : {&r.fp8, &r.bf16}) {
        const auto& ok = pair == &r.fp8 ? good.fp8 : good.bf16;
        for (int rr = 0; rr < B.batch * rows; ++rr) {
          const int b = rr / rows, i = (rr % rows) / B.h, hh = rr % B.h;
          const float lse = pair->lse[(size_t(b) * B.h + hh) * B.s_q + i];
          const float o = pair->out[size_t(rr) * kLatentDim + 17];
          if (rr == row) {
            EXPECT_TRUE(std::isnan(lse) && std::isnan(o)) << "row " << rr;
          } else {
            EXPECT_EQ(lse, ok.lse[(size_t(b) * B.h + hh) * B.s_q + i]) << "row " << rr;
            EXPECT_EQ(o, ok.out[size_t(rr) * kLatentDim + 17]) << "row " << rr;
          }
        }
      }
    }
  }
}

// NaN / Inf in a cached token: exactly the rows that see it are NaN. With s_q = 2 the last
// token is seen by the second query only (causal), so the first query's rows are unchanged.
TEST(BadInputs, NonFiniteTokenMakesOnlyTheRowsThatSeeItNaN) {
  auto rng = make_rng();
  SNAPMLA_TRACE_SEED();
  Batch B = make_batch(rng, {100, 70}, 2, 3);
  OwnedPlan P(B.pages(), 4);
  const Results good = run(B, &P.plan);
  const int rows = B.s_q * B.h;
  for (const int dim : {9, kLatentDim + 1}) {
    Batch C = B;
    const int64_t slot = C.slot(1, 69);  // sequence 1's last token
    if (dim < kLatentDim) {
      C.latent[size_t(slot) * kLatentDim + dim] = e4m3{0xFF};
      C.bf16_data[size_t(slot) * kHeadDim + dim] = to_bf16(test::kNaN);
    } else {
      C.rope[size_t(slot) * kRopeDim + dim - kLatentDim] = to_bf16(std::numeric_limits<float>::infinity());
      C.bf16_data[size_t(slot) * kHeadDim + dim] = to_bf16(-std::numeric_limits<float>::infinity());
    }
    SCOPED_TRACE("dim " + std::to_string(dim));
    const Results r = run(C, &P.plan);
    for (const auto* res : {&r.fp8, &r.bf16}) {
      const auto& ok = res == &r.fp8 ? good.fp8 : good.bf16;
      for (int rr = 0; rr < B.batch * rows; ++rr) {
        const int b = rr / rows, i = (rr % rows) / B.h, hh = rr % B.h;
        const size_t l = (size_t(b) * B.h + hh) * B.s_q + i;
        const bool sees = b == 1 && i == 1;
        if (sees) {
          EXPECT_TRUE(std::isnan(res->lse[l]) && std::isnan(res->out[size_t(rr) * kLatentDim])) << "row " << rr;
        } else {
          EXPECT_EQ(res->lse[l], ok.lse[l]) << "row " << rr;
          EXPECT_EQ(res->out[size_t(rr) * kLatentDim + 100], ok.out[size_t(rr) * kLatentDim + 100]) << "row " << rr;
        }
      }
    }
  }
}

}  // namespace
}  // namespace snapmla
