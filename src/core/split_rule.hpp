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

// Calls of at most this many query rows per sequence run the narrow tile under kAuto (decode_fp8;
// decode_bf16 by its batch rule), more the 64-row tile.
inline constexpr int kNarrowRows = 16;

// The share of one worker in 64-token blocks. Equal shares of the total (num_workers of them),
// but, given the decode's query rows per sequence (seqlen_q x num_heads; 0: equal shares only),
// no shorter than a split is worth: each split costs its fp32 partials (rows x 2 KB, written by
// the decode and read back by the combine) and a CTA's start, so for a small total the time
//   chunk x t_page + (total / chunk) x rows x c_row
// is least at chunk^2 = total x rows x c_row / t_page, with c_row / t_page = 1 / 1024, rounded
// down, and never below two blocks: a one-block split's page pipeline never overlaps a page's
// load with another's math. What the H200 measured at b = 1, 8K (a split per worker): h = 128
// 20.6 us with 4-block splits (the rule's), 22.3 with 2; h = 64 18.0 us with 2 (the rule's),
// 19.4 with 3; h = 16 14.5 us with 2 (the rule's), 16.6 with 1, 15.6 with 4; h = 8 13.7 us
// with 2, 15.0 with 1. A total large enough that equal shares are longer is left alone.
SNAPMLA_HOST_DEVICE inline int64_t split_chunk(int64_t total_blocks, int num_workers, int query_rows) {
  int64_t chunk = (total_blocks + num_workers - 1) / num_workers;
  if (chunk < 1) chunk = 1;
  if (query_rows > 0) {
    // The largest c >= 2 with c^2 <= total x rows / 1024, from the equal share up (no iteration
    // once the equal share is longer).
    const int64_t x = total_blocks * query_rows;
    if (chunk < 2) chunk = 2;
    while ((chunk + 1) * (chunk + 1) * 1024 <= x) ++chunk;
  }
  return chunk;
}

// The fixed cost of one piece of work (a split, or a whole sequence) in page-equivalents: the
// pipeline's drain and refill between pieces (the Q tile, the first pages' latency) and the
// epilogue's stores. 8: the profiling build's stamps put the narrow tile's at about that where
// every CTA streams at once, and the H200's same-run sweep had 8 faster than the former 4 (decode_fp8
// 0.994x the median time, with bf16 partials 0.984x; docs/kernels.md). (PlanLabOptions::piece_cost
// replaces it for a lab run: SNAPMLA_PLAN_PIECE_COST.)
inline constexpr int64_t kPieceCostBlocks = 8;

// The 64-row tile's own fixed cost per piece, which the profiling build's stamps put near 4 (its
// CTAs end within 1-3 us of each other where the narrow tile's with a second piece end ~10 us
// late). Under PlanLabOptions::piece_cost_by_tile (SNAPMLA_PLAN_PIECE_COST=tile) a call of more
// than kNarrowRows query rows, which decode_fp8 runs on the 64-row tile, is planned with it, the
// others with kPieceCostBlocks. On the H200's sweep at 3178c1c with bf16 partials, 8 against 4 took
// 1.005x the median time at h = 128 and 1.012x at h = 64, 0.994x at h = 16 and 0.992x at h = 8.
inline constexpr int64_t kPieceCostRows64Blocks = 4;

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
  int fixed = 0;         // > 0: batch-invariant, splits of `fixed` blocks (fixed_splits below)
  int64_t piece = kPieceCostBlocks;  // a further piece's fixed cost (piece_fixed_cost)
  // > 0 (PlanLabOptions::fast_workers): the first `fast` workers weigh weight16 / 16 workers each
  // on the axis (their CTAs run on the SMs that stream faster), the rest one; wsum: the weight of
  // the `workers` in 16ths (worker_boundary).
  int fast = 0;
  int weight16 = 16;
  int64_t wsum = 0;
};

// What the planner sums over the sequences before it divides the work (one pass; on the GPU one
// block reduction of this struct).
struct PlanTotals {
  int64_t blocks = 0;        // all sequences' 64-token blocks
  int64_t longest = 0;       // the longest sequence's
  int64_t fixed_splits = 0;  // the splits of a batch-invariant plan (split_blocks > 0)
};

// The extra cost of cutting the sequences, in blocks of one worker's time, for the choice
// between the balanced division (a cut at each of `used` worker boundaries) and whole
// sequences: the cuts' fp32 partials (rows x 2 KB per split, written, then read by the combine)
// and the combine's share of the step. The partials of all cuts share the device's memory
// bandwidth, so the cost grows with the number of cuts: 16 blocks with every one of
// `num_workers` workers cutting, as measured on the H200 (h = 128, uniform 8K: b = 128 and 256
// ran 3-6% faster with whole sequences, 2 and 4 per worker, than with a cut per worker), and in
// proportion for fewer (b = 1, h = 128, 1K: 16 one-block splits took 15.4 us, the whole
// sequence 32.6 us). The partials scale with the query rows up to a 64-row tile, so fewer rows
// cost less; at least 4 blocks (a split's own fixed cost).
SNAPMLA_HOST_DEVICE inline int64_t cut_cost_blocks(int query_rows, int64_t used, int num_workers) {
  constexpr int64_t kFullTile = 16;
  const int64_t r = query_rows < 64 ? query_rows : 64;
  const int64_t w = num_workers > 0 ? num_workers : 1;
  const int64_t c = kFullTile * r * (used < w ? used : w) / (64 * w);
  return c < 4 ? 4 : c;
}

// Sequence seq's fixed cost on the axis (WorkerShares::piece; none for sequence 0, worker 0's
// first piece).
SNAPMLA_HOST_DEVICE inline int64_t piece_fixed_cost(int seq, const WorkerShares& s) { return seq == 0 ? 0 : s.piece; }

// Batch-invariant plans (plan_splits' split_blocks = L > 0): a sequence of B blocks has
// max(1, ceil(B / L)) splits, cut at multiples of L, whatever else is in the batch, so each row's
// result is the same bits in any batch. The workers still divide the cost axis evenly; a worker
// starts at the first of those splits at or after its boundary (SequenceSplits::worker_start).
SNAPMLA_HOST_DEVICE inline int64_t fixed_splits(int64_t blocks, int split_blocks) {
  const int64_t n = (blocks + split_blocks - 1) / split_blocks;
  return n < 1 ? 1 : n;
}

SNAPMLA_HOST_DEVICE inline void add_sequence(PlanTotals& t, int64_t blocks, int split_blocks) {
  t.blocks += blocks;
  t.longest = blocks > t.longest ? blocks : t.longest;
  if (split_blocks > 0) t.fixed_splits += fixed_splits(blocks, split_blocks);
}

SNAPMLA_HOST_DEVICE inline PlanTotals merge(const PlanTotals& a, const PlanTotals& b) {
  return {a.blocks + b.blocks, a.longest > b.longest ? a.longest : b.longest, a.fixed_splits + b.fixed_splits};
}

// The planner's lab options (core/validate.hpp, plan_lab_options: the environment's
// SNAPMLA_PLAN_FILL and SNAPMLA_PLAN_SPLIT), the same for both planners. fill_workers: see
// worker_shares. equal_shares: the split length is the equal share whatever the query rows (the
// rule's fixed cost per split left out; the choice of whole sequences keeps them): for the combine
// folded into the decode's tail, under which a further split no longer costs combine time.
// piece_cost > 0: a further piece's fixed cost in blocks instead of kPieceCostBlocks
// (SNAPMLA_PLAN_PIECE_COST); piece_cost_by_tile: kPieceCostRows64Blocks for calls of more than
// kNarrowRows query rows (SNAPMLA_PLAN_PIECE_COST=tile; piece_cost_blocks).
// fast_workers > 0 (SNAPMLA_FAST_SMS, the count of the SMs it lists) with fast_weight16: the plans of
// calls of at most 16 query rows (the narrow tiles, which stream the cache) give their first
// fast_workers workers fast_weight16 / 16 of a share each (worker_boundary); the decode kernels then
// run those workers on the listed SMs (scheduler.cuh, claimed_worker). On an H100 the profiling
// build's dump had 24 of its 132 SMs (12 TPCs, the same in every launch) stream pages about 1.25x
// as fast as the others at h = 16, and the launches ended with them idle (lab/sm_balance.py); the
// weights did not shorten them there (the DRAM's total rate bounds the launch; docs/kernels.md).
// workers_on_blocks (SNAPMLA_PLAN_WORKERS=blocks, the rule until 2026-12-05): the workers a total
// is worth counted on its blocks alone, ceil(blocks / chunk), instead of on the cost axis (the
// rule, worker_shares).
struct PlanLabOptions {
  bool fill_workers = false;
  bool equal_shares = false;
  int piece_cost = 0;
  int fast_workers = 0;
  int fast_weight16 = 16;
  bool workers_on_blocks = false;
  bool piece_cost_by_tile = false;
};

// A further piece's fixed cost in blocks for a call of query_rows rows per sequence, under lab.
SNAPMLA_HOST_DEVICE inline int64_t piece_cost_blocks(const PlanLabOptions& lab, int query_rows) {
  if (lab.piece_cost > 0) return lab.piece_cost;
  return lab.piece_cost_by_tile && query_rows > kNarrowRows ? kPieceCostRows64Blocks : kPieceCostBlocks;
}

// How many of num_workers a total of `t.blocks` over `batch` sequences is worth (split_chunk:
// all of them, or fewer for a small total given query_rows), and the share of each. The workers
// are ceil(total / chunk), the total being the cost axis (the blocks plus the further pieces'
// fixed costs), since a worker's time is its share of the axis. Counted on the blocks alone
// (lab.workers_on_blocks, the former rule), the fixed costs fall on the same workers and round
// their share up a block: b = 2, 8K, h = 16 on 132 workers had 264 blocks of cost on 128 workers,
// shares of 3 with 86 busy, where 132 take 2 each (128 busy); on the H200 (b416bc1, same run) the
// axis count took b = 2, 8K to 0.85-0.95x the former time and left the other changed shares level
// (docs/design.md). Where the chunk is the equal share, its rounding up to whole blocks can still
// leave workers without work; lab.fill_workers (a lab option, SNAPMLA_PLAN_FILL=1) gives every
// worker a share in that case. Given query_rows, whole sequences (n = ceil(batch / workers) each)
// are chosen instead when even the longest ones make a worker's time no longer than the balanced
// share plus the cuts' cost: on uniform lengths whose count fills the workers (b = 128 on 66
// workers: two each), where the balanced division would cut a sequence per worker for nothing. split_blocks > 0 asks for a
// batch-invariant plan, made where the plan's capacity holds its splits (else the default plan:
// the GPU planner cannot report the overflow, and both planners make the same plan); the
// workers' shares are then the equal ones.
SNAPMLA_HOST_DEVICE inline WorkerShares worker_shares(const PlanTotals& t, int batch, int num_workers, int query_rows,
                                                      int split_blocks, int capacity, PlanLabOptions lab) {
  WorkerShares s;
  s.piece = piece_cost_blocks(lab, query_rows);
  if (split_blocks > 0 && t.fixed_splits <= capacity) {
    s.fixed = split_blocks;
    query_rows = 0;
  }
  const int64_t chunk = split_chunk(t.blocks, num_workers, lab.equal_shares ? 0 : query_rows);
  s.total = t.blocks + (batch > 1 ? int64_t(batch - 1) * s.piece : 0);
  int64_t used = ((lab.workers_on_blocks ? t.blocks : s.total) + chunk - 1) / chunk;
  const int64_t equal_share = (t.blocks + num_workers - 1) / num_workers;
  if (lab.fill_workers && chunk <= equal_share) used = num_workers;
  if (used < 1) used = 1;
  if (used > num_workers) used = num_workers;
  s.workers = int(used);
  s.share = (s.total + used - 1) / used;
  if (s.share < 1) s.share = 1;
  if (lab.fast_workers > 0 && lab.fast_weight16 > 16 && query_rows > 0 && query_rows <= kNarrowRows && s.fixed == 0 &&
      s.total > 0) {
    s.fast = lab.fast_workers < s.workers ? lab.fast_workers : s.workers;
    s.weight16 = lab.fast_weight16;
    s.wsum = 16 * used + int64_t(s.weight16 - 16) * s.fast;
    return s;  // balanced, never whole sequences (their workers would weigh the same)
  }
  if (query_rows > 0 && batch > 0) {
    const int64_t n = (batch + used - 1) / used;
    if (n * t.longest + (n - 1) * s.piece <= s.share + cut_cost_blocks(query_rows, used, num_workers)) {
      s.whole = int(n);
      s.workers = int((batch + n - 1) / n);
    }
  }
  return s;
}

// Worker k's start on the axis: k x share, or where some workers weigh more (s.fast > 0) the
// total times the weight of workers [0, k) over all of theirs, rounded up.
SNAPMLA_HOST_DEVICE inline int64_t worker_boundary(int64_t k, const WorkerShares& s) {
  if (s.fast == 0) return k * s.share;
  const int64_t w = 16 * k + int64_t(s.weight16 - 16) * (k < s.fast ? k : s.fast);
  return (s.total * w + s.wsum - 1) / s.wsum;
}

// The first worker k >= 0 whose start (worker_boundary) is at or past c.
SNAPMLA_HOST_DEVICE inline int64_t first_worker_from(int64_t c, const WorkerShares& s) {
  if (c <= 0) return 0;
  if (s.fast == 0) return (c + s.share - 1) / s.share;
  // ceil(total w / wsum) >= c, for the weight w of workers [0, k), holds from w = floor((c - 1)
  // wsum / total) + 1 on; w grows by weight16 per fast worker, then by 16.
  const int64_t x = (c - 1) * s.wsum / s.total + 1, fast_weight = int64_t(s.weight16) * s.fast;
  if (x <= fast_weight) return (x + s.weight16 - 1) / s.weight16;
  return s.fast + (x - fast_weight + 15) / 16;
}

// The workers that get splits: the first `workers`, less those past the axis's end.
SNAPMLA_HOST_DEVICE inline int busy_workers(const WorkerShares& s) {
  if (s.whole > 0) return s.workers;
  const int64_t reach = first_worker_from(s.total, s);
  return reach < s.workers ? int(reach) : s.workers;
}

// The worker boundaries k x share (1 <= k < workers) inside sequence `seq`'s cost interval
// (whole sequences: the workers that start at sequence `seq`)
// [c0, c0 + fixed + blocks): workers [lo, cut) start at the sequence's first split, workers
// [cut, hi) each at a cut inside it, at their boundary's block (in 1 .. blocks - 1). The sequence
// has 1 + (hi - cut) splits (SequenceSplits).
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
  const int64_t fixed = piece_fixed_cost(seq, s), end = c0 + fixed + blocks;
  int64_t lo = first_worker_from(c0, s), hi = first_worker_from(end, s);
  int64_t cut = first_worker_from(c0 + fixed + 1, s);  // the first k starting past c0 + fixed
  if (lo < 1) lo = 1;
  if (hi > s.workers) hi = s.workers;
  if (lo > hi) lo = hi;
  if (cut < lo) cut = lo;
  if (cut > hi) cut = hi;
  return {int(lo), int(cut), int(hi)};
}

// Where the plan puts sequence `seq` (blocks over [c0, c0 + fixed + blocks) of the axis), for
// both planners: how many splits it has, the first block of its split j, and the split (0 ..
// count) that worker k of sequence_cuts' [lo, hi) starts at (count: the next sequence's first).
// Balanced: split 0 and a cut per boundary in [cut, hi); whole sequences: split 0 only;
// batch-invariant: cuts at multiples of s.fixed, each worker at the first at or after its boundary.
struct SequenceSplits {
  int64_t c0, blocks;
  int seq;
  SequenceCuts cuts;
  const WorkerShares& s;

  SNAPMLA_HOST_DEVICE int64_t count() const {
    return s.fixed > 0 ? fixed_splits(blocks, s.fixed) : 1 + (cuts.hi - cuts.cut);
  }
  SNAPMLA_HOST_DEVICE int64_t begin_block(int64_t j) const {
    if (s.fixed > 0) return j * s.fixed;
    return j == 0 ? 0 : boundary_block(cuts.cut + int(j) - 1);
  }
  SNAPMLA_HOST_DEVICE int64_t worker_start(int k) const {
    if (s.fixed == 0) return k < cuts.cut ? 0 : 1 + (k - cuts.cut);
    const int64_t into = boundary_block(k), n = count();
    const int64_t j = into > 0 ? (into + s.fixed - 1) / s.fixed : 0;
    return j < n ? j : n;
  }
  // Worker k's boundary as a block of this sequence (negative: in its fixed cost or before).
  SNAPMLA_HOST_DEVICE int64_t boundary_block(int k) const {
    return worker_boundary(k, s) - c0 - piece_fixed_cost(seq, s);
  }
};

SNAPMLA_HOST_DEVICE inline SequenceSplits sequence_splits(int64_t c0, int64_t blocks, int seq, const WorkerShares& s) {
  return {c0, blocks, seq, sequence_cuts(c0, blocks, seq, s), s};
}

// The decode kernels' combine tail (a lab option, SNAPMLA_COMBINE_FUSED): split k of a sequence's
// S splits merges the rows [tail_row_begin(k, S, R), tail_row_begin(k + 1, S, R)) of its R-row
// tile, so that the S shares cover the tile's rows once each (a split gets none where S > R).
SNAPMLA_HOST_DEVICE inline int tail_row_begin(int k, int splits, int rows) {
  return int(int64_t(k) * rows / splits);
}

}  // namespace snapmla::detail
