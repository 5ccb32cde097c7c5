// Which (sequence, split, token range) a CTA works on. The grid is fixed by the plan's
// capacity (or the batch), so it does not depend on cache_seqlens: a decode step can be
// captured in a CUDA graph and replayed with new lengths. CTAs past the plan's last split exit.
#pragma once

#include "params.hpp"
#include "snapmla/types.hpp"

namespace snapmla::cuda {

struct Work {
  int seq = 0;
  int split = 0;      // global split index (row of the partial buffers)
  bool single = true; // the sequence has one split: write the final output directly
  int begin = 0, end = 0;  // tokens [begin, end) of this split
  int len = 0;             // tokens in the sequence
};

// The grid is 1-D, row tile fastest: the row tiles of one split are neighbours in launch order,
// so they stream the same pages at about the same time and L2 serves the second read.
__device__ __forceinline__ int row_tiles_of(const DecodeParams& p) { return (p.rows + kTileRows - 1) / kTileRows; }
__device__ __forceinline__ int grid_item(const DecodeParams& p) { return int(blockIdx.x) / row_tiles_of(p); }
__device__ __forceinline__ int grid_row0(const DecodeParams& p) { return int(blockIdx.x) % row_tiles_of(p) * kTileRows; }

// Whether grid item `item` has work (CTAs past the plan's last split exit).
__device__ __forceinline__ bool has_work(const DecodeParams& p, int item) {
  return item < (p.split_offsets == nullptr ? p.batch : p.split_offsets[p.batch]);
}

// The work of a grid item for which has_work holds (returned by value, so that it stays in
// registers). With a launch order, grid item k runs split split_order[k] (longest first); an
// entry out of range (a plan not made by plan_splits) is clamped.
__device__ __forceinline__ Work work_of(const DecodeParams& p, int item) {
  Work w;
  if (p.split_offsets == nullptr) {
    w.seq = item;
  } else {
    if (p.split_order != nullptr) item = min(max(p.split_order[item], 0), p.split_offsets[p.batch] - 1);
    int lo = 0, hi = p.batch - 1;  // last seq with split_offsets[seq] <= item
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (p.split_offsets[mid] <= item) lo = mid; else hi = mid - 1;
    }
    w.seq = lo;
  }
  // Lengths beyond the block table are clamped (the host validates them where it can).
  const int cap = p.max_pages * kPageSize;
  w.len = min(max(p.seqlens[w.seq], 0), cap);
  w.split = item;
  if (p.split_offsets == nullptr) {
    w.single = true;
    w.begin = 0;
    w.end = w.len;
  } else {
    const int first = p.split_offsets[w.seq], last = p.split_offsets[w.seq + 1];
    w.single = last - first <= 1;
    w.begin = min(max(p.split_begin[item], 0), w.len);
    w.end = item + 1 < last ? min(max(p.split_begin[item + 1], w.begin), w.len) : w.len;
  }
  return w;
}

// Tokens query row r (r = i * h + head) may see.
__device__ __forceinline__ int visible_end(const DecodeParams& p, const Work& w, int r) {
  const int i = r / p.num_heads;
  const int vis = p.causal ? max(0, w.len - p.seqlen_q + i + 1) : w.len;
  return min(vis, w.end);
}

}  // namespace snapmla::cuda
