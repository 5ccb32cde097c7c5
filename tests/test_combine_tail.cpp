// What the decode kernels' combine tail (SNAPMLA_COMBINE_FUSED; src/kernels/sm90/decode/
// combine_tail.cuh) rests on, checked on the planner's own plans without a GPU: every split of a
// plan is in exactly one worker's range, so that a split sequence's counter (one per row tile)
// ends at its split count, no lower (a hang, or NaN rows after the wait gives up) and no higher;
// every sequence has a split, so that the tail finds a split's sequence by walking the offsets
// from its CTA's first split's; and the S splits' row shares (detail::tail_row_begin) cover a
// tile's rows once each, so that every row of a split sequence is merged exactly once. Over
// random batches with empty, one-token and long sequences, any worker count, the default and the
// batch-invariant plans.
#include <gtest/gtest.h>

#include <snapmla/snapmla.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "core/split_rule.hpp"
#include "test_util.hpp"

namespace snapmla {
namespace {

TEST(CombineTail, EverySplitIsInOneWorkerAndTheSharesCoverEachRowOnce) {
  auto rng = test::make_rng();
  SNAPMLA_TRACE_SEED();
  for (int trial = 0; trial < 300; ++trial) {
    const int batch = 1 + int(rng() % (trial % 3 == 0 ? 300 : 12));
    const int workers = 1 + int(rng() % 264);
    const int query_rows = int(1 + rng() % 4) * int(1 + rng() % 128);
    const int split_blocks = trial % 5 == 0 ? int(1 + rng() % 8) : 0;
    std::vector<int32_t> lens(batch);
    for (auto& len : lens) {
      const int kind = int(rng() % 4);
      len = kind == 0 ? int32_t(rng() % 2) : kind == 1 ? int32_t(rng() % 200) : int32_t(rng() % 40000);
    }
    const int max_pages = (*std::max_element(lens.begin(), lens.end()) + kPageSize - 1) / kPageSize + 1;
    std::vector<int32_t> table(size_t(batch) * max_pages, 0);
    const PageTable pages{table.data(), lens.data(), batch, max_pages, Device::cpu()};
    // Room for the batch-invariant plan's splits where it asks for them.
    int capacity = split_plan_capacity(batch, workers);
    if (split_blocks > 0) {
      int needed = 0;
      for (int len : lens) needed += std::max(1, (len + kPageSize * split_blocks - 1) / (kPageSize * split_blocks));
      capacity = std::max(capacity, needed + workers);
    }
    test::OwnedPlan P(pages, workers, query_rows, split_blocks, capacity);
    SCOPED_TRACE("trial " + std::to_string(trial) + ": b=" + std::to_string(batch) + " workers=" +
                 std::to_string(workers) + " split_blocks=" + std::to_string(split_blocks));
    const int splits = P.offsets[batch];
    ASSERT_GE(splits, batch);
    // Each split in exactly one worker's range (the kernels' splits_of_worker: the ranges
    // clamped to the plan's splits).
    std::vector<int> owners(splits, 0);
    const int plan_workers = P.plan.capacity - batch;
    for (int k = 0; k < plan_workers; ++k) {
      const int first = std::min(std::max(P.worker_splits[k], 0), splits);
      const int last = std::min(std::max(P.worker_splits[k + 1], first), splits);
      for (int item = first; item < last; ++item) ++owners[item];
    }
    for (int item = 0; item < splits; ++item) ASSERT_EQ(owners[item], 1) << "split " << item;
    // Every sequence has a split, so the tail's walk from a CTA's first split's sequence over the
    // offsets (while item >= offsets[seq + 1]: ++seq) ends at each split's own sequence.
    for (int b = 0; b < batch; ++b) ASSERT_GT(P.offsets[b + 1], P.offsets[b]) << "sequence " << b;
    for (int k = 0; k < plan_workers; ++k) {
      const int first = std::min(std::max(P.worker_splits[k], 0), splits);
      const int last = std::min(std::max(P.worker_splits[k + 1], first), splits);
      if (first >= last) continue;
      int seq = int(std::upper_bound(P.offsets.begin(), P.offsets.end(), first) - P.offsets.begin()) - 1;
      for (int item = first; item < last; ++item) {
        while (item >= P.offsets[seq + 1]) ++seq;
        ASSERT_TRUE(P.offsets[seq] <= item && item < P.offsets[seq + 1]) << "worker " << k << " split " << item;
      }
    }
    // Each row of a split sequence's tile in exactly one split's share, for every tile height.
    for (int b = 0; b < batch; ++b) {
      const int s = P.offsets[b + 1] - P.offsets[b];
      if (s <= 1) continue;
      for (const int rows : {1, 3, 12, 16, 63, 64}) {
        std::vector<int> merged(rows, 0);
        for (int k = 0; k < s; ++k)
          for (int r = detail::tail_row_begin(k, s, rows); r < detail::tail_row_begin(k + 1, s, rows); ++r) ++merged[r];
        for (int r = 0; r < rows; ++r) ASSERT_EQ(merged[r], 1) << "sequence " << b << " of " << s << " splits, row " << r;
      }
    }
  }
}

}  // namespace
}  // namespace snapmla
