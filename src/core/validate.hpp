// The one place that checks SnapMLA's views (the bottom layer: api/, reference/ and kernels/
// include it; it includes only the public headers). Each public call runs every check once:
// the reference's entry points on the CPU, api/dispatch.cpp before a kernel on the GPU.
// Shape/pointer/device checks run for every call; content checks (page indices, seqlens,
// slots) read the int32 tables and so run only where those tables are host memory. Each
// failure throws snapmla::Error naming the argument.
#pragma once

#include <string>

#include "snapmla/formats.hpp"

namespace snapmla::detail {

[[noreturn]] void fail(const char* op, const std::string& argument, const std::string& what);

void check_devices_match(const char* op, Device expected, const char* argument, Device got);

void validate(const char* op, const PagedFp8Cache& cache, const char* name = "cache");
void validate(const char* op, const PagedBf16Cache& cache, const char* name = "cache");
void validate(const char* op, const KvRows& rows, const char* name);
void validate(const char* op, const SlotMapping& slots, const char* name = "slot_mapping");
void validate(const char* op, const QueryBf16& q, const char* name = "q");
void validate(const char* op, const QuantizedQuery& q, const char* name);
void validate(const char* op, const PageTable& pages, const char* name = "pages");
// `needed`: whether there are rows to write (an empty batch may pass null pointers, as frameworks
// give for empty arrays).
void validate(const char* op, const DecodeOutput& out, const char* name = "out", bool needed = true);
void validate(const char* op, const SplitPlan& plan, const char* name = "plan");
void validate(const char* op, const DecodeOptions& options, int batch);
// seqlen_q in 1..4 and num_heads in 1..128 (so seqlen_q * num_heads <= 512 query rows).
void check_query_shape(const char* op, const char* seqlen_q_arg, int seqlen_q, const char* num_heads_arg,
                       int num_heads);

// Relations between arguments: one kv/out row per slot; a decode call's devices, page table,
// output and options against its query's batch and device; the split workspace (GPU only:
// the reference keeps its partials in host memory) against the plan and the query's shape.
void check_rows_match(const char* op, const KvRows& kv, const SlotMapping& slots,
                      const char* rows_name);
void check_decode_common(const char* op, int q_batch, Device q_dev, const PageTable& pages,
                         const DecodeOutput& out, const DecodeOptions& options, Device cache_dev);
void check_workspace(const char* op, const DecodeOptions& options, int seqlen_q, int num_heads);
// plan_splits' arguments: the views, num_workers >= 1, and a plan sized for them.
void check_plan_splits_args(const char* op, const PageTable& pages, int num_workers, int query_rows,
                            const SplitPlan& plan, int split_blocks = 0);

// Content checks (host-resident tables only).
void check_slots_in_range(const char* op, const SlotMapping& slots, int64_t num_pages);
void check_page_table_contents(const char* op, const PageTable& pages, int64_t num_pages);
void check_plan_contents(const char* op, const SplitPlan& plan, const PageTable& pages);

}  // namespace snapmla::detail
