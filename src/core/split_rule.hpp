// The planner's rules, shared by the reference planner (C++) and the GPU planner (CUDA) so that
// both make the same plan by construction: how many workers a total is worth, and where the
// balanced division of the work among them cuts the sequences.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SNAPMLA_HOST_DEVICE __host__ __device__
#else
#define SNAPMLA_HOST_DEVICE
#endif

namespace snapmla::detail {

// The share of one worker in 64-token blocks. Equal shares of the total (num_workers of them),
// but, given the decode's query rows per sequence (seqlen_q x num_heads; 0: equal shares only),
// no shorter than a split is worth: each split costs its fp32 partials (rows x 2 KB, written by
// the decode and read back by the combine) and a CTA's start, so for a small total the time
//   chunk x t_page + (total / chunk) x rows x c_row
// is least at chunk^2 = total x rows x c_row / t_page. The ratio c_row / t_page = 1 / 1024 is
// what one H200 measurement gives (b = 1, h = 128, 8K: 24.1 us with 2-block splits, 20.6 us with
// 4, so the 4 blocks this rule picks there); the result is rounded to the nearest integer, and
// a total large enough that equal shares are longer is left alone.
SNAPMLA_HOST_DEVICE inline int64_t split_chunk(int64_t total_blocks, int num_workers, int query_rows) {
  int64_t chunk = (total_blocks + num_workers - 1) / num_workers;
  if (chunk < 1) chunk = 1;
  if (query_rows > 0) {
    // The largest c with (c - 1/2)^2 <= total x rows / 1024, i.e. (2c - 1)^2 x 256 <= x, from
    // the equal share up (no iteration once the equal share is longer).
    const int64_t x = total_blocks * query_rows;
    while ((2 * chunk + 1) * (2 * chunk + 1) * 256 <= x) ++chunk;
  }
  return chunk;
}

// The fixed cost of one piece of work (a split, or a whole sequence) in page-equivalents: the
// pipeline's drain and refill between pieces (the Q tile, the first pages' latency) and the
// epilogue's stores.
inline constexpr int64_t kPieceCostBlocks = 4;

// The balanced division (docs/design.md, "Splits"). The sequences' costs are laid end to end on
// one axis and worker k gets the axis from k x share to (k + 1) x share, so every worker has the
// same work across sequence boundaries. Every worker pays one fixed cost for its first piece,
// which the axis leaves out; a sequence that starts inside a worker's part is a further piece,
// so sequence i > 0 costs kPieceCostBlocks before its blocks (sequence 0 is worker 0's first
// piece): it lies over [c_i, c_i + fixed_i + blocks_i). A boundary that falls into a sequence's
// blocks cuts it (a new split, the next worker's first piece, starts there); one that falls into
// its fixed cost moves to the sequence's start (that worker then does up to one fixed cost less).
struct WorkerShares {
  int workers = 1;       // workers with work: the plan's first `workers` worker ranges
  int64_t share = 1;     // cost per worker, >= 1
  int64_t total = 0;     // the whole axis
  int whole = 0;         // > 0: no cuts, `whole` whole sequences per worker (in order) instead
};

// The extra cost of cutting a sequence, in blocks of one worker's time, for the choice between
// the balanced division and whole sequences: the cut's fp32 partials (rows x 2 KB per split,
// written, then read by the combine) and the combine's share of the step. Measured on the H200
// (h = 128, uniform 8K: b = 128 and 256 ran 3-6% faster with whole sequences, 2 and 4 per
// worker, than with a cut per worker); the partials scale with the query rows up to a 64-row
// tile, so fewer rows cost less.
SNAPMLA_HOST_DEVICE inline int64_t cut_cost_blocks(int query_rows) {
  constexpr int64_t kFullTile = 16;
  const int64_t r = query_rows < 64 ? query_rows : 64;
  const int64_t c = kFullTile * r / 64;
  return c < 4 ? 4 : c;
}

SNAPMLA_HOST_DEVICE inline int64_t piece_fixed_cost(int seq) { return seq == 0 ? 0 : kPieceCostBlocks; }

// How many of num_workers a total of `total_blocks` over `batch` sequences is worth (split_chunk:
// all of them, or fewer for a small total given query_rows), and the share of each. Given
// query_rows, whole sequences (n = ceil(batch / workers) each) are chosen instead when even the
// longest ones (`max_blocks`) make a worker's time no longer than the balanced share plus one
// cut: on uniform lengths whose count fills the workers (b = 128 on 66 workers: two each), where
// the balanced division would cut a sequence per worker for nothing.
SNAPMLA_HOST_DEVICE inline WorkerShares worker_shares(int64_t total_blocks, int64_t max_blocks, int batch,
                                                      int num_workers, int query_rows) {
  WorkerShares s;
  const int64_t chunk = split_chunk(total_blocks, num_workers, query_rows);
  int64_t used = (total_blocks + chunk - 1) / chunk;
  if (used < 1) used = 1;
  if (used > num_workers) used = num_workers;
  s.workers = int(used);
  s.total = total_blocks + (batch > 1 ? int64_t(batch - 1) * kPieceCostBlocks : 0);
  s.share = (s.total + used - 1) / used;
  if (s.share < 1) s.share = 1;
  if (query_rows > 0 && batch > 0) {
    const int64_t n = (batch + used - 1) / used;
    if (n * max_blocks + (n - 1) * kPieceCostBlocks <= s.share + cut_cost_blocks(query_rows)) {
      s.whole = int(n);
      s.workers = int((batch + n - 1) / n);
    }
  }
  return s;
}

// The workers that get splits: the first `workers`, less those past the axis's end.
SNAPMLA_HOST_DEVICE inline int busy_workers(const WorkerShares& s) {
  if (s.whole > 0) return s.workers;
  const int64_t reach = (s.total + s.share - 1) / s.share;
  return reach < s.workers ? int(reach) : s.workers;
}

// The worker boundaries k x share (1 <= k < workers) inside sequence `seq`'s cost interval
// (whole sequences: the workers that start at sequence `seq`)
// [c0, c0 + fixed + blocks): workers [lo, cut) start at the sequence's first split, workers
// [cut, hi) each at a cut inside it, at block cut_block(...) (in 1 .. blocks - 1). The sequence
// has 1 + (hi - cut) splits.
struct SequenceCuts {
  int lo = 0, cut = 0, hi = 0;
};

SNAPMLA_HOST_DEVICE inline SequenceCuts sequence_cuts(int64_t c0, int64_t blocks, int seq, const WorkerShares& s) {
  if (s.whole > 0) {  // worker k starts at sequence k x whole
    int lo = (seq + s.whole - 1) / s.whole, hi = (seq + s.whole) / s.whole;
    if (lo < 1) lo = 1;
    if (hi > s.workers) hi = s.workers;
    if (lo > hi) lo = hi;
    return {lo, hi, hi};
  }
  const int64_t fixed = piece_fixed_cost(seq), end = c0 + fixed + blocks;
  int64_t lo = (c0 + s.share - 1) / s.share, hi = (end + s.share - 1) / s.share;
  int64_t cut = (c0 + fixed) / s.share + 1;  // the first k with k x share > c0 + fixed
  if (lo < 1) lo = 1;
  if (hi > s.workers) hi = s.workers;
  if (lo > hi) lo = hi;
  if (cut < lo) cut = lo;
  if (cut > hi) cut = hi;
  return {int(lo), int(cut), int(hi)};
}

// Batch-invariant plans (plan_splits' split_blocks = L > 0): a sequence of B blocks has
// max(1, ceil(B / L)) splits, cut at multiples of L, whatever else is in the batch, so each row's
// result is the same bits in any batch. The workers still divide the cost axis evenly; a worker
// starts at the first of those splits at or after its boundary (fixed_start_split).
SNAPMLA_HOST_DEVICE inline int64_t fixed_splits(int64_t blocks, int split_blocks) {
  const int64_t n = (blocks + split_blocks - 1) / split_blocks;
  return n < 1 ? 1 : n;
}

// The split (0 .. fixed_splits) of sequence `seq` worker k (sequence_cuts' lo <= k < hi) starts at:
// the first one beginning at or after its boundary; fixed_splits means the next sequence's first.
SNAPMLA_HOST_DEVICE inline int64_t fixed_start_split(int64_t c0, int64_t blocks, int seq, int k, const WorkerShares& s,
                                                     int split_blocks) {
  int64_t into = int64_t(k) * s.share - c0 - piece_fixed_cost(seq);
  if (into < 0) into = 0;
  const int64_t j = (into + split_blocks - 1) / split_blocks, n = fixed_splits(blocks, split_blocks);
  return j < n ? j : n;
}

// The first block of the cut of worker k (sequence_cuts' cut <= k < hi).
SNAPMLA_HOST_DEVICE inline int64_t cut_block(int64_t c0, int seq, int k, const WorkerShares& s) {
  return int64_t(k) * s.share - c0 - piece_fixed_cost(seq);
}

}  // namespace snapmla::detail
