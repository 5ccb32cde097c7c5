// Parameters of the decode kernels (decode_fp8.cu, decode_bf16.cu) and of their launch.
#pragma once

#include <cstdint>

namespace snapmla::cuda {

// Query rows per CTA: one wgmma M tile.
inline constexpr int kTileRows = 64;

// The warpgroups of a decode CTA: one producer and `Consumers` consumers, with the registers
// setmaxnreg gives each role. setmaxnreg moves registers within the CTA's launch allocation
// (65536 / threads per thread, in multiples of 8: 168 at 384 threads), not the SM's file: a larger
// sum leaves the consumers waiting in setmaxnreg.inc forever.
template <int Consumers, int ProducerRegs, int ConsumerRegs>
struct WarpgroupRoles {
  static constexpr int kConsumers = Consumers;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kProducerRegs = ProducerRegs;  // setmaxnreg of the producer warpgroup
  static constexpr int kConsumerRegs = ConsumerRegs;  // setmaxnreg of each consumer warpgroup
  static_assert(kProducerRegs + kConsumers * kConsumerRegs <= 65536 / kThreads / 8 * 8 * (1 + kConsumers),
                "the CTA's registers at launch");
  static_assert(kProducerRegs % 8 == 0 && kConsumerRegs % 8 == 0, "setmaxnreg takes multiples of 8");
};

// The 64-row tiles' score step on fully visible pages (softmax.cuh): the reference's rounding
// order, or the row's factor folded into the exponent (page_scores_folded; a lab option,
// SNAPMLA_SCORE_STEP, until the H200 has timed it).
enum class ScoreStep { kReference, kFolded };

// Where decode_bf16's consumer takes the P of its own page for that page's PV: from the page's
// P tile in shared memory, as the other consumer does, or from its own registers (the wgmma's A
// operand: no wait for the owner's other warps' stores, and no shared-memory reads of P). Both
// give the same bits. A lab option (SNAPMLA_BF16_OWN_PV) until the H200 has timed it.
enum class OwnPagePv { kShared, kRegisters };

// The order of decode_bf16's QKs for the next pair of pages. kOnRelease: each consumer issues its
// own as soon as page B of the pair is released (consumer 1 right after its PV of B, consumer 0
// once both have released B), so consumer 1's QK of page B' usually goes first and the two
// products share the tensor cores: page A''s scores come last, and consumer 0's softmax of A',
// which starts the pair's chain, waits for both products. kPageAFirst: consumer 1 issues its QK
// only once consumer 0 has issued its own, so A''s scores come one product's time earlier and
// consumer 0's softmax runs under B''s product (FlashMLA orders its QKs so). The same arithmetic,
// so the same bits. A lab option (SNAPMLA_BF16_QK_ORDER): level with the default on the H200
// (same-run sweep at fc4dfc1, median 1.000x, 0.93-1.05x), so not the default.
enum class Bf16QkOrder { kOnRelease, kPageAFirst };

// When decode_bf16's consumer 0 hands page A's running max m_a to consumer 1. kWithP: with page
// A's P, once its exponentials are taken and stored, so consumer 1 takes page B's exponentials
// (at m_b = max(m_a, max S_B)) only after consumer 0's: the pair's two softmaxes run one after
// the other. kEarly: on a barrier of its own as soon as m_a is known, before consumer 0's
// exponentials, so the two consumers take their pages' exponentials at the same time; consumer 1
// then waits for page A's P (for its PV of A) only after storing page B's. The same values in
// the same order (m_b is what consumer 1's state would give after page A), so the same bits. A
// lab option (SNAPMLA_BF16_MAX_HANDOFF) until the H200 has timed it.
enum class Bf16MaxHandOff { kWithP, kEarly };

// decode_bf16's tile for calls of at most 16 query rows (h * s_q <= 16): the 64-row tile, which
// pads them to 64, or the narrow tile (decode_bf16_narrow.cu: S^T / O^T with the rows as the wgmma
// N, one consumer warpgroup). kAuto (the default) runs the narrow tile on batches of at most
// kBf16NarrowMaxBatch, where its shorter per-page chain shortens the calls' fixed costs (the H200's
// same-run sweep: 1.03-1.24x faster at h <= 16, b <= 32), and the 64-row tile on larger ones, where
// the launch streams the cache at the DRAM's rate and the narrow tile's two page stages keep less
// in flight (there it took up to 1.12x the 64-row tile's time at b >= 100, 32K).
// SNAPMLA_BF16_TILE=narrow / rows64 force either. Larger calls run the 64-row tile either way.
enum class Bf16Tile { kAuto, kRows64, kNarrow16 };
inline constexpr int kBf16NarrowMaxBatch = 32;

// The order of the three-consumer tile's iteration over its page j (decode_fp8_trio.cu): kPvFirst
// issues the PV of page j - 2 before the softmax of page j, so that it runs under the softmax;
// kSoftmaxFirst takes the softmax first, as the transposing tile does, so that the running max
// reaches page j + 1's owner sooner. The same arithmetic in the same order per consumer, so the
// same bits. A lab option (SNAPMLA_FP8_TRIO_ORDER) until the H200 has timed both.
enum class TrioOrder { kPvFirst, kSoftmaxFirst };

// Where a decode kernel's consumer thread takes its consumer index (which pages it owns, its
// output half, its named barriers' ids) and its warp's index from: threadIdx as it is (kThread),
// or those values broadcast from lane 0 of the warp (kUniform), which ptxas then knows to be
// warp-uniform. With kThread everything derived from them (the page stage's address, each
// wgmma's descriptors, the barrier ids) lives in per-thread registers, is moved into uniform
// registers once per wgmma (R2UR) and is re-derived from %tid where registers are short; with
// kUniform it lives in the uniform datapath (decode_fp8's 64-row loop: 56 R2UR -> 1, 1764 ->
// 1616 SASS instructions). The same operations on the same values, so the same bits. kUniform is
// the default (the H200's same-run sweep at fc4dfc1: decode_fp8's time 0.987x the kThread
// kernels' median, decode_bf16's 0.973x); SNAPMLA_ROLE_INDEX=thread keeps kThread for A/B.
enum class RoleIndex { kThread, kUniform };

// How the 64-row tiles' CTAs store a split's partials (epilogue.cuh). kBf16Rows (decode_fp8's
// default, SNAPMLA_PARTIALS unset or `bf16`, since the H200's same-run sweep at 3178c1c: 0.991x
// the fp32 partials' median time, 0.95-0.97x at h = 64-128; decode_bf16 keeps fp32 unless asked): the normalized rows rounded to bf16
// (RNE) and stored as whole rows, as a sequence with one split stores its output, at half the
// bytes, and the combine reads them so (DecodeParams::partial_bf16). Not the fp32 partials' bits:
// the rounding (at most 2^-8 relative) is the price, a twentieth to a fortieth of the FP8 error on
// the CPU reference (lab/bf16_partials_error.py), which rounds alike. fp32 (SNAPMLA_PARTIALS=
// fragments; decode_bf16's default): kFragments, from the accumulator fragment (write_partials: 8 rows
// x 32 bytes per store instruction); kStaged (`staged`), through shared memory as whole rows
// (write_partials_staged: 512 contiguous bytes per instruction, a quarter of the write requests),
// the same values at the same addresses, level with kFragments on the H200 (kernel timeline at
// fc4dfc1, within 1%). The default 64-row kernels (and the carried
// scales' one) have kBf16Rows twins; the narrow and V^T-register tiles choose at run time from
// partial_bf16; kernels without either keep fp32 (SplitKernels::kHasBf16Rows, launch.hpp).
enum class PartialStore { kFragments, kStaged, kBf16Rows };

struct DecodeParams {
  // Queries: FP8 (nope, rope, scale) or BF16 ([rows, 576]).
  const uint8_t* q_nope = nullptr;
  const uint16_t* q_rope = nullptr;
  const float* q_scale = nullptr;
  const uint16_t* q_bf16 = nullptr;
  // Cache: the FP8 scales (the cache planes, FP8 and BF16, are read through TMA tensor maps).
  const float* k_scale = nullptr;
  int64_t num_pages = 0;
  const int32_t* block_table = nullptr;
  const int32_t* seqlens = nullptr;
  int max_pages = 0;
  int batch = 0, seqlen_q = 1, num_heads = 0, rows = 0;  // rows = seqlen_q * num_heads
  float softmax_scale = 0.f;
  bool causal = true;
  float empty_lse = 0.f;  // the final lse of a row that sees no token (-inf or +inf)
  // Split plan (null: one split per sequence) and the partials of split sequences.
  const int32_t* split_offsets = nullptr;
  const int32_t* split_begin = nullptr;
  // The plan's worker ranges (null: one worker per split): worker k runs splits
  // worker_splits[k] .. worker_splits[k + 1] - 1 (scheduler.cuh).
  const int32_t* worker_splits = nullptr;
  int num_workers = 0;  // the grid's workers: the plan's capacity - batch, or its capacity without ranges
  int plan_capacity = 0;  // the plan's capacity (split_begin's entries)
  // The roles look their splits up in fewer rounds of dependent loads (SNAPMLA_PLAN_LOOKUP=
  // window_l1, the default, or window; launch.hpp; scheduler.cuh, work_of_window); false: work_of's
  // search. The same values either way.
  bool lookup_window = false;
  // Each CTA's first warp asks for the plan's tables' first lines (and a small block table) into L1
  // beside its worker range's load, so that the lookups after it hit L1 (SNAPMLA_PLAN_LOOKUP=
  // window_l1, the default, or search_l1; scheduler.cuh, prefetch_plan). Hints only.
  bool prefetch_plan = false;
  float* partial_out = nullptr;  // [capacity, rows, 512]
  float* partial_lse = nullptr;  // [capacity, rows]
  // Non-null (PartialStore::kBf16Rows, decode_fp8's default): the split partials are bf16 rows
  // here ([capacity, rows, 512], the first half of partial_out's bytes) instead of fp32 in
  // partial_out; their lse stays in partial_lse.
  uint16_t* partial_bf16 = nullptr;
  // Non-null: the decode kernel merges its split sequences' partials itself, in its tail, instead
  // of the combine kernel (combine_tail.cuh; SNAPMLA_COMBINE_FUSED, a lab option): one counter per
  // split and 64-row tile ([capacity, row tiles], zero at the launch), after partial_lse in the
  // workspace.
  int* combine_counters = nullptr;
  // Where a CTA lets a programmatic combine start (griddepcontrol.launch_dependents, a no-op for the
  // ordinary launch): false, at its start; true, once its last split's pages are done, before its
  // stores (SNAPMLA_COMBINE_PDL=late, launch.hpp).
  bool dependents_late = false;
  // The decode was launched as a programmatic dependent of the kernel before it on the stream
  // (SNAPMLA_DECODE_PDL, on unless 0, launch.hpp): its CTAs may start before that kernel's
  // writes (the query, the cache, the plan) are visible, so each waits for them before its first
  // read (grid_start).
  bool wait_previous_grid = false;
  // The narrow tiles' producer loads the Q tile before requesting its split's first pages
  // (SNAPMLA_NARROW_Q=first, a lab option, launch.hpp); false: the first pages, then Q. Where every
  // CTA starts at once, the Q loads otherwise queue behind all the CTAs' first pages.
  bool q_before_pages = false;
  // The narrow decode_fp8 tile's loader prefetches its CTA's next split into L2 (its first pages
  // and its Q rows) once the current split's last page is requested (SNAPMLA_PREFETCH_NEXT=1, a
  // lab option, launch.hpp): the profiling build's stamps put a second piece's start at about
  // twice the planner's 4 pages where every CTA streams at once. The same bits either way.
  bool prefetch_next = false;
  // Non-null (SNAPMLA_FAST_SMS, a lab option, calls of at most 16 rows): each CTA claims its worker
  // instead of taking blockIdx's (scheduler.cuh, claimed_worker): one on an SM of fast_sm_mask
  // from the plan's first fast_workers (which the planner weighted more), any other from the
  // rest, either pool's overflow from the other. Two counters, zero at the launch.
  int* worker_claims = nullptr;
  uint32_t fast_sm_mask[8] = {};  // detail::FastSms::mask: bit i % 32 of word i / 32 is SM i
  int fast_workers = 0;
  // decode_bf16's consumers skip a rescale of their output where every factor of the warp is
  // exactly 1, the running maxima of its rows unchanged by the page (SNAPMLA_BF16_RESCALE=changed,
  // the default; launch.hpp; softmax.cuh, warp_factors_unit): the same bits, fewer multiplies on
  // the pages that leave the maxima where they were.
  bool skip_unit_rescale = false;
  // Outputs.
  uint16_t* out = nullptr;  // bf16 [batch, s_q, h, 512] = [batch, rows, 512]
  float* lse = nullptr;     // [batch, h, s_q]
};

}  // namespace snapmla::cuda
