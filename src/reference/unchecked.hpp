// The reference's computations on arguments already checked (core/validate.hpp's check_* on
// host memory): snapmla::X runs them on host memory after its checks (api/dispatch.cpp), and
// ref::X after its own, so every argument is checked once per call, in one place.
#pragma once

#include "core/split_rule.hpp"
#include "snapmla/reference.hpp"

namespace snapmla::ref::unchecked {

void append(const PagedFp8Cache& cache, const KvRows& kv, const SlotMapping& slots);
void append(const PagedBf16Cache& cache, const KvRows& kv, const SlotMapping& slots);
void quantize_query(const QueryBf16& q, const QuantizedQuery& out);
void gather_dequant(const PagedFp8Cache& cache, const SlotMapping& slots, const KvRows& out);
void plan_splits(const PageTable& pages, int num_workers, const SplitPlan& plan, int query_rows, int split_blocks,
                 detail::PlanLabOptions lab);
// A sequence whose page indices or length are out of range gets NaN rows (what the GPU does);
// snapmla::decode_* on host memory has rejected such tables before.
void decode_fp8(const QuantizedQuery& q, const PagedFp8Cache& cache, const PageTable& pages,
                const DecodeOutput& out, const DecodeOptions& options);
void decode_bf16(const QueryBf16& q, const PagedBf16Cache& cache, const PageTable& pages,
                 const DecodeOutput& out, const DecodeOptions& options);

}  // namespace snapmla::ref::unchecked
