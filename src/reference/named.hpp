// The reference operations under the name of the operation the caller called: snapmla::X on
// host memory runs these with op = "X", so an error names what the user called; ref::X runs
// them with op = "ref::X".
#pragma once

#include "snapmla/reference.hpp"

namespace snapmla::ref::named {

void append(const char* op, const PagedFp8Cache& cache, const KvRows& kv, const SlotMapping& slots);
void append(const char* op, const PagedBf16Cache& cache, const KvRows& kv, const SlotMapping& slots);
void quantize_query(const char* op, const QueryBf16& q, const QuantizedQuery& out);
void gather_dequant(const char* op, const PagedFp8Cache& cache, const SlotMapping& slots, const KvRows& out);
void plan_splits(const char* op, const PageTable& pages, int num_workers, const SplitPlan& plan, int query_rows,
                 int split_blocks = 0);
void decode_fp8(const char* op, const QuantizedQuery& q, const PagedFp8Cache& cache, const PageTable& pages,
                const DecodeOutput& out, const DecodeOptions& options);
void decode_bf16(const char* op, const QueryBf16& q, const PagedBf16Cache& cache, const PageTable& pages,
                 const DecodeOutput& out, const DecodeOptions& options);

}  // namespace snapmla::ref::named
