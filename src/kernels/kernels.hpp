// Host-side entry points of the CUDA kernels (one .cu per kernel under sm90/ and smxx/).
// Called by src/api/dispatch.cpp after the views are validated; plain C++ types only, so the
// dispatcher compiles without CUDA headers.
#pragma once

#include "core/split_rule.hpp"
#include "snapmla/formats.hpp"

namespace snapmla::cuda {

// Throws snapmla::Error (argument `argument`.device) unless `d` is a CUDA device of compute
// capability 9.0 (sm_90a kernels). Returns its multiprocessor count. Makes it current.
int require_sm90(const char* op, const char* argument, Device d);
bool device_available();
// Synchronous device-to-host copy after the work queued on `s`.
void copy_to_host(void* dst, const void* src, size_t bytes, Stream s);

void append(const PagedFp8Cache& cache, const KvRows& kv, const SlotMapping& slots, Stream s);
void append(const PagedBf16Cache& cache, const KvRows& kv, const SlotMapping& slots, Stream s);
void quantize_query(const QueryBf16& q, const QuantizedQuery& out, Stream s);
void gather_dequant(const PagedFp8Cache& cache, const SlotMapping& slots, const KvRows& out,
                    Stream s);
void plan_splits(const PageTable& pages, int num_workers, const SplitPlan& plan, Stream s, int query_rows,
                 int split_blocks, detail::PlanLabOptions lab);
void decode_fp8(const QuantizedQuery& q, const PagedFp8Cache& cache, const PageTable& pages,
                const DecodeOutput& out, const DecodeOptions& options);
void decode_bf16(const QueryBf16& q, const PagedBf16Cache& cache, const PageTable& pages,
                 const DecodeOutput& out, const DecodeOptions& options);

}  // namespace snapmla::cuda
