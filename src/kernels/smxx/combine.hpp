// The split-KV combine kernel's parameters (shared by decode_fp8 and decode_bf16).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace snapmla::cuda {

struct CombineParams {
  const int32_t* split_offsets;  // [batch + 1]
  const float* partial_out;      // [capacity, rows, 512]
  const float* partial_lse;      // [capacity, rows]
  // Non-null: the partials are bf16 rows here instead ([capacity, rows, 512]; SNAPMLA_PARTIALS=bf16).
  const uint16_t* partial_bf16;
  uint16_t* out;                 // bf16 [batch, s_q, h, 512]
  float* lse;                    // [batch, h, s_q]
  int batch, rows, seqlen_q, num_heads;
  float empty_lse;  // the lse of a row that sees no token (-inf or +inf)
  // The plan's workers where it has worker ranges, else 0. A balanced plan cuts a sequence only at
  // a worker boundary, so at most num_workers - 1 sequences have splits to merge; the grid's wave
  // is shared among those, not among the whole batch (combine.cu).
  int num_workers;
  // The plan's capacity (the partials' rows): a sequence whose splits [split_offsets[b],
  // split_offsets[b + 1]) are empty or leave [0, capacity) gets NaN rows (combine_rows.cuh,
  // split_span), whatever wrote its device tables.
  int capacity;
};

// programmatic: launch as a programmatic dependent of the kernel before it on the stream (its
// blocks wait for that kernel's results at their start), so the launch overlaps its tail.
// The combine's task shape (combine.cu; the same bits either way). kAuto: row tasks where a
// sequence's rows are at least twice its blocks, else quarter tasks.
enum class CombineTasks { kAuto, kRows, kQuarters };
void combine(const CombineParams& p, cudaStream_t stream, bool programmatic, CombineTasks tasks);

}  // namespace snapmla::cuda
