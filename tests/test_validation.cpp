// Every bad input gets snapmla::Error naming the argument and what was expected.
#include <gtest/gtest.h>

#include "test_util.hpp"

namespace snapmla {
namespace {

using test::Batch;
using test::make_batch;
using test::make_rng;

struct Bad : ::testing::Test {
  std::mt19937_64 rng = make_rng();
  Batch B = make_batch(rng, {100, 5}, 2, 16);
  std::vector<bf16> out = std::vector<bf16>(size_t(2) * 2 * 16 * kLatentDim);
  std::vector<float> lse = std::vector<float>(64);
  DecodeOutput o() { return {out.data(), lse.data(), Device::cpu()}; }
  void decode8(const QuantizedQuery& q, const PagedFp8Cache& c, const PageTable& p,
               const DecodeOptions& opt) {
    decode_fp8(q, c, p, o(), opt);
  }
};

TEST_F(Bad, HeadCountNotSupported) {
  for (int h : {0, -1, 129, 144, 256}) {
    QuantizedQuery q = B.qq();
    q.num_heads = h;
    EXPECT_ARG_ERROR(decode8(q, B.fp8(), B.pages(), test::options(B)), "q.num_heads");
    QueryBf16 q16 = B.query();
    q16.num_heads = h;
    EXPECT_ARG_ERROR(decode_bf16(q16, B.bf16_cache(), B.pages(), o(), test::options(B)), "q.num_heads");
  }
}

TEST_F(Bad, QueriesPerSequenceOutOfRange) {
  for (int s_q : {0, 5, -1}) {
    QuantizedQuery q = B.qq();
    q.seqlen_q = s_q;
    EXPECT_ARG_ERROR(decode8(q, B.fp8(), B.pages(), test::options(B)), "q.seqlen_q");
  }
}

TEST_F(Bad, SeqlenBeyondTheBlockTable) {
  B.seqlens[1] = B.max_pages * kPageSize + 1;
  EXPECT_ARG_ERROR(decode8(B.qq(), B.fp8(), B.pages(), test::options(B)), "cache_seqlens");
  EXPECT_MESSAGE(decode8(B.qq(), B.fp8(), B.pages(), test::options(B)),
                 "snapmla::decode_fp8: argument 'cache_seqlens': cache_seqlens[1] = " +
                     std::to_string(B.max_pages * kPageSize + 1) + " is beyond the block table row");
  B.seqlens[1] = -3;
  EXPECT_ARG_ERROR(decode8(B.qq(), B.fp8(), B.pages(), test::options(B)), "cache_seqlens");
  EXPECT_MESSAGE(decode8(B.qq(), B.fp8(), B.pages(), test::options(B)), "cache_seqlens[1] = -3 is negative");
}

// The public entry points on host memory name the operation the caller called, not the
// reference behind it.
TEST_F(Bad, ErrorsNameTheOperationCalled) {
  QuantizedQuery q = B.qq();
  q.num_heads = 0;
  EXPECT_MESSAGE(decode8(q, B.fp8(), B.pages(), test::options(B)), "snapmla::decode_fp8: argument 'q.num_heads'");
  QueryBf16 q16 = B.query();
  q16.seqlen_q = 9;
  EXPECT_MESSAGE(decode_bf16(q16, B.bf16_cache(), B.pages(), o(), test::options(B)),
                 "snapmla::decode_bf16: argument 'q.seqlen_q'");
  EXPECT_MESSAGE(quantize_query(q16, B.qq()), "snapmla::quantize_query: ");
  const int32_t bad_slot = -7;
  EXPECT_MESSAGE(append(B.fp8(), KvRows{B.kv[0].data(), 1, Device::cpu()}, SlotMapping{&bad_slot, 1, Device::cpu()}),
                 "snapmla::append: argument 'slot_mapping'");
  EXPECT_MESSAGE(ref::decode_fp8(q, B.fp8(), B.pages(), o(), test::options(B)), "snapmla::ref::decode_fp8: ");
}

TEST(BadArguments, RecommendedNumWorkersChecksTheQueryShape) {
  for (int h : {1, 3, 24, 126, 128}) EXPECT_GE(recommended_num_workers(Device::cpu(), 1, h), 1) << h;
  for (int h : {0, 129}) EXPECT_ARG_ERROR(recommended_num_workers(Device::cpu(), 1, h), "num_heads");
  for (int s_q : {0, 5}) EXPECT_ARG_ERROR(recommended_num_workers(Device::cpu(), s_q, 16), "seqlen_q");
}

TEST_F(Bad, PageIndexOutOfRange) {
  for (int32_t bad : {-1, int32_t(B.num_pages), 1 << 30}) {
    Batch C = B;
    C.block_table[1] = bad;  // sequence 0 has 100 tokens: page 1 is used
    EXPECT_ARG_ERROR(decode8(C.qq(), C.fp8(), C.pages(), test::options(C)), "block_table");
    EXPECT_ARG_ERROR(decode_bf16(C.query(), C.bf16_cache(), C.pages(), o(), test::options(C)), "block_table");
  }
}

TEST_F(Bad, SlotOutOfRange) {
  std::vector<bf16> kv(2 * kHeadDim);
  for (int32_t bad : {-2, int32_t(B.num_pages * kPageSize), 1 << 30}) {
    std::vector<int32_t> slots = {0, bad};
    EXPECT_ARG_ERROR(append(B.fp8(), {kv.data(), 2, Device::cpu()}, {slots.data(), 2, Device::cpu()}), "slot_mapping");
    EXPECT_ARG_ERROR(append(B.bf16_cache(), {kv.data(), 2, Device::cpu()}, {slots.data(), 2, Device::cpu()}), "slot_mapping");
    EXPECT_ARG_ERROR(gather_dequant(B.fp8(), {slots.data(), 2, Device::cpu()}, {kv.data(), 2, Device::cpu()}), "slot_mapping");
  }
  std::vector<int32_t> slots = {0, 1, 2};
  // One check site for the host and the GPU path: the rows are named, against the slots.
  EXPECT_ARG_ERROR(append(B.fp8(), {kv.data(), 2, Device::cpu()}, {slots.data(), 3, Device::cpu()}), "kv.num_tokens");
  EXPECT_ARG_ERROR(ref::append(B.fp8(), {kv.data(), 2, Device::cpu()}, {slots.data(), 3, Device::cpu()}),
                   "kv.num_tokens");
  EXPECT_ARG_ERROR(gather_dequant(B.fp8(), {slots.data(), 3, Device::cpu()}, {kv.data(), 2, Device::cpu()}), "out.num_tokens");
}

TEST_F(Bad, NullAndMisalignedPointers) {
  PagedFp8Cache c = B.fp8();
  c.scale = nullptr;
  EXPECT_ARG_ERROR(decode8(B.qq(), c, B.pages(), test::options(B)), "cache.scale");
  c = B.fp8();
  c.latent = c.latent + 1;
  EXPECT_ARG_ERROR(decode8(B.qq(), c, B.pages(), test::options(B)), "cache.latent");
  QuantizedQuery q = B.qq();
  q.rope = nullptr;
  EXPECT_ARG_ERROR(decode8(q, B.fp8(), B.pages(), test::options(B)), "q.rope");
  PageTable p = B.pages();
  p.block_table = nullptr;
  EXPECT_ARG_ERROR(decode8(B.qq(), B.fp8(), p, test::options(B)), "pages.block_table");
  EXPECT_ARG_ERROR(decode_fp8(B.qq(), B.fp8(), B.pages(), {nullptr, lse.data(), Device::cpu()}, test::options(B)), "out.out");
  QueryBf16 q16 = B.query();
  q16.data = nullptr;
  EXPECT_ARG_ERROR(quantize_query(q16, B.qq()), "q.data");
}

// An empty batch has nothing to write: null outputs (what frameworks give for empty arrays) are
// accepted there, and only there.
TEST_F(Bad, EmptyBatchTakesNullOutputs) {
  QuantizedQuery q = B.qq();
  q.batch = 0;
  QueryBf16 q16 = B.query();
  q16.batch = 0;
  PageTable p = B.pages();
  p.batch = 0;
  DecodeOptions opt;
  opt.softmax_scale = 0.1f;
  const DecodeOutput none{nullptr, nullptr, Device::cpu()};
  EXPECT_NO_THROW(decode_fp8(q, B.fp8(), p, none, opt));
  EXPECT_NO_THROW(decode_bf16(q16, B.bf16_cache(), p, none, opt));
  EXPECT_ARG_ERROR(decode_fp8(B.qq(), B.fp8(), B.pages(), none, test::options(B)), "out.out");
}

TEST_F(Bad, ShapesThatDoNotAgree) {
  PageTable p = B.pages();
  p.batch = 1;
  EXPECT_ARG_ERROR(decode8(B.qq(), B.fp8(), p, test::options(B)), "pages.batch");
  QuantizedQuery q = B.qq();
  q.num_heads = 32;
  EXPECT_ARG_ERROR(quantize_query(B.query(), q), "out");
  PagedFp8Cache c = B.fp8();
  c.num_pages = -1;
  EXPECT_ARG_ERROR(decode8(B.qq(), c, B.pages(), test::options(B)), "cache.num_pages");
}

TEST_F(Bad, SoftmaxScale) {
  for (float s : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    DecodeOptions opt = test::options(B);
    opt.softmax_scale = s;
    EXPECT_ARG_ERROR(decode8(B.qq(), B.fp8(), B.pages(), opt), "options.softmax_scale");
  }
}

TEST_F(Bad, PlansThatDoNotFit) {
  test::OwnedPlan P(B.pages(), 4);
  SplitPlan plan = P.plan;
  plan.batch = 3;
  DecodeOptions opt = test::options(B, &plan);
  EXPECT_ARG_ERROR(decode8(B.qq(), B.fp8(), B.pages(), opt), "options.plan.batch");
  // A plan made for other seqlens (a split beginning past the sequence end).
  std::vector<int32_t> longer = B.seqlens;
  longer[1] = 1000;
  std::vector<int32_t> table(size_t(2) * 20, 0);
  test::OwnedPlan Q(PageTable{table.data(), longer.data(), 2, 20, Device::cpu()}, 8);
  opt = test::options(B, &Q.plan);
  EXPECT_ARG_ERROR(decode8(B.qq(), B.fp8(), B.pages(), opt), "options.plan.split_begin");
  // Capacity too small for the number of workers.
  std::vector<int32_t> off(3), beg(3);
  EXPECT_ARG_ERROR(plan_splits(B.pages(), 4, SplitPlan{off.data(), beg.data(), 3, 2, Device::cpu()}), "plan.capacity");
  EXPECT_ARG_ERROR(plan_splits(B.pages(), 0, P.plan), "num_workers");
  EXPECT_ARG_ERROR(plan_splits(B.pages(), 4, P.plan, nullptr, -1), "query_rows");
  EXPECT_ARG_ERROR(plan_splits(B.pages(), 4, P.plan, nullptr, 513), "query_rows");
  // Worker ranges not made by plan_splits: not from 0, decreasing, not ending at the last split.
  test::OwnedPlan R(B.pages(), 4);
  const int workers = R.plan.capacity - R.plan.batch, splits = R.offsets[2];
  ASSERT_GE(splits, 2);
  opt = test::options(B, &R.plan);
  const std::vector<int32_t> good = R.worker_splits;
  R.worker_splits[0] = 1;
  EXPECT_ARG_ERROR(decode8(B.qq(), B.fp8(), B.pages(), opt), "options.plan.worker_splits");
  R.worker_splits = good;
  R.worker_splits[1] = splits;
  R.worker_splits[2] = 0;
  EXPECT_ARG_ERROR(decode8(B.qq(), B.fp8(), B.pages(), opt), "options.plan.worker_splits");
  R.worker_splits = good;
  R.worker_splits[size_t(workers)] = splits - 1;  // the last split run by no worker
  EXPECT_ARG_ERROR(decode8(B.qq(), B.fp8(), B.pages(), opt), "options.plan.worker_splits");
  R.worker_splits = good;
  R.plan.worker_splits = R.worker_splits.data();
  SplitPlan misaligned = R.plan;
  misaligned.worker_splits = reinterpret_cast<int32_t*>(reinterpret_cast<char*>(R.worker_splits.data()) + 2);
  opt = test::options(B, &misaligned);
  EXPECT_ARG_ERROR(decode8(B.qq(), B.fp8(), B.pages(), opt), "options.plan.worker_splits");
  // Worker ranges need room for at least one worker past the batch.
  SplitPlan no_workers = R.plan;
  no_workers.capacity = no_workers.batch;
  opt = test::options(B, &no_workers);
  EXPECT_ARG_ERROR(decode8(B.qq(), B.fp8(), B.pages(), opt), "options.plan.capacity");
}

TEST_F(Bad, DevicesThatDoNotMatchOrAreNotBuilt) {
  PagedFp8Cache c = B.fp8();
  c.device = Device::cuda(0);
  EXPECT_ARG_ERROR(decode8(B.qq(), c, B.pages(), test::options(B)), "cache.device");
  if (!built_with_cuda()) {
    QuantizedQuery q = B.qq();
    q.device = c.device;
    PageTable p = B.pages();
    p.device = c.device;
    EXPECT_ARG_ERROR(decode_fp8(q, c, p, {out.data(), lse.data(), c.device}, test::options(B)), "q.device");
  }
  // The reference itself accepts host memory only.
  EXPECT_ARG_ERROR(ref::append(c, {nullptr, 0, Device::cpu()}, {nullptr, 0, Device::cpu()}), "cache.device");
  EXPECT_MESSAGE(ref::decode_fp8(B.qq(), c, B.pages(), o(), test::options(B)),
                 "snapmla::ref::decode_fp8: argument 'cache.device': expected cpu like the other arguments");
  // Host memory with one view elsewhere: the devices are checked on every path, before the
  // reference runs (the output, the plan, the slots of append).
  EXPECT_ARG_ERROR(decode_fp8(B.qq(), B.fp8(), B.pages(), {out.data(), lse.data(), Device::cuda(0)},
                              test::options(B)),
                   "out.device");
  test::OwnedPlan P(B.pages(), 3);
  SplitPlan elsewhere = P.plan;
  elsewhere.device = Device::cuda(0);
  EXPECT_ARG_ERROR(decode8(B.qq(), B.fp8(), B.pages(), test::options(B, &elsewhere)), "options.plan.device");
  EXPECT_ARG_ERROR(plan_splits(B.pages(), 3, elsewhere), "plan.device");
  std::vector<bf16> kv(kHeadDim);
  const int32_t slot = 0;
  EXPECT_ARG_ERROR(append(B.fp8(), {kv.data(), 1, Device::cpu()}, {&slot, 1, Device::cuda(0)}), "slot_mapping.device");
}

TEST_F(Bad, DebugTableChecksReportTheFirstBadEntry) {
  EXPECT_NO_THROW(check_page_table(B.pages(), B.num_pages));
  Batch C = B;
  C.block_table[0] = -4;
  EXPECT_ARG_ERROR(check_page_table(C.pages(), C.num_pages), "block_table");
  C = B;
  C.seqlens[0] = C.max_pages * kPageSize + 64;
  EXPECT_ARG_ERROR(check_page_table(C.pages(), C.num_pages), "cache_seqlens");
  std::vector<int32_t> slots = {0, -1, int32_t(B.num_pages * kPageSize)};
  EXPECT_NO_THROW(check_slot_mapping({slots.data(), 2, Device::cpu()}, B.num_pages));
  EXPECT_ARG_ERROR(check_slot_mapping({slots.data(), 3, Device::cpu()}, B.num_pages), "slot_mapping");
  EXPECT_GE(recommended_num_workers(Device::cpu(), 1, 16), 1);
}

TEST(ErrorText, NamesOperationArgumentAndExpectation) {
  try {
    split_plan_capacity(4, 0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.op(), "split_plan_capacity");
    EXPECT_EQ(e.argument(), "num_workers");
    EXPECT_STREQ(e.what(), "snapmla::split_plan_capacity: argument 'num_workers': expected >= 1");
  }
}

}  // namespace
}  // namespace snapmla
