// The one place that checks SnapMLA's arguments (the bottom layer: api/, reference/ and
// kernels/ include it; it includes only the public headers and the planner's rules). Every public
// call runs one check_<operation> below, once, before any work: snapmla::X (api/dispatch.cpp) before it
// dispatches to the reference or a kernel, ref::X (the reference's own entry points) before it
// computes. Shape/pointer/device checks run for every call; content checks (page indices,
// seqlens, slots, plans) read the int32 tables and so run only where those tables are host
// memory. Each failure throws snapmla::Error naming the argument.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/split_rule.hpp"
#include "snapmla/formats.hpp"

namespace snapmla::detail {

[[noreturn]] void fail(const char* op, const std::string& argument, const std::string& what);

// `argument`.device: expected `expected` like the other arguments of the call.
void check_devices_match(const char* op, Device expected, const char* argument, Device got);
// Host memory, which the reference's own entry points (ref::X) require.
void check_host(const char* op, const char* argument, Device d);
// seqlen_q in 1..kMaxQueriesPerSeq and num_heads in kMinHeads..kMaxHeads.
void check_query_shape(const char* op, const char* seqlen_q_arg, int seqlen_q, const char* num_heads_arg,
                       int num_heads);

// Every check of one call of each operation: the other arguments on the device of the first
// (the cache, or the query), each view, their relations, the split workspace where the call
// runs on a GPU (the reference keeps its partials in host memory), and on host memory the
// tables' contents.
void check_append(const char* op, const PagedFp8Cache& cache, const KvRows& kv, const SlotMapping& slots);
void check_append(const char* op, const PagedBf16Cache& cache, const KvRows& kv, const SlotMapping& slots);
void check_quantize_query(const char* op, const QueryBf16& q, const QuantizedQuery& out);
void check_gather_dequant(const char* op, const PagedFp8Cache& cache, const SlotMapping& slots, const KvRows& out);
// num_workers >= 1, query_rows 0 or up to kMaxHeads * kMaxQueriesPerSeq, split_blocks >= 0,
// and a plan sized for them.
void check_plan_splits(const char* op, const PageTable& pages, int num_workers, int query_rows,
                       const SplitPlan& plan, int split_blocks);
// What a bad page index or sequence length on host memory is: an error (snapmla::decode_*), or,
// as on the GPU, which cannot read the tables before the launch, the sequence's rows made NaN
// (the reference's own decode, ref::decode_*). A bad plan is an error either way.
enum class TableFaults { kThrow, kNanRows };
// `out` null: no output buffers (the reference's fp32 results).
void check_decode(const char* op, const QuantizedQuery& q, const PagedFp8Cache& cache, const PageTable& pages,
                  const DecodeOutput* out, const DecodeOptions& options, TableFaults faults);
void check_decode(const char* op, const QueryBf16& q, const PagedBf16Cache& cache, const PageTable& pages,
                  const DecodeOutput* out, const DecodeOptions& options, TableFaults faults);

// options.p_scale (or `argument`): kAuto, kPerPage or kCarried, else an error naming it.
void check_p_scale(const char* op, const char* argument, Fp8PScale p_scale);

// The tile decode_fp8 runs a call of `rows` query rows per sequence on, under the P' scale rule
// p_scale (resolved): `tile` (DecodeOptions::fp8_tile) where it forces one. Under kAuto, the
// narrow tile where the rows fit it, else kRows64, unless the environment's SNAPMLA_FP8_TILE
// (read per call, for trying a tile in an engine without changing its code) says `vregs`
// (kRows64VRegs on the wider calls), `trio` (kRows64Trio on the wider calls) or `rows64_all`
// (kRows64 on every call: a lab option, to time the two tiles on the same small-row calls); a bad
// value is an error naming it. kCarried runs on the transposing 64-row tile only (whatever the
// rows); with a forced narrow, V^T-register or three-consumer tile it is an error naming
// options.p_scale, as the narrow tile forced on more rows than it holds names options.fp8_tile.
Fp8Tile fp8_tile_of_call(const char* op, int rows, Fp8Tile tile, Fp8PScale p_scale);

// decode_fp8's P' scale rule for a call of `rows` query rows per sequence (seqlen_q x num_heads),
// the same on both paths: options.p_scale, where kAuto is kPerPage unless the environment's
// SNAPMLA_FP8_P_SCALE says `carried` (every call, on the transposing 64-row tile) or
// `carried_wide` (kCarried for the calls that fp8_tile_of_call puts on that tile anyway, kPerPage
// for the narrow and V^T-register tiles' calls). A bad value is an error naming it.
Fp8PScale resolved_p_scale(const char* op, const DecodeOptions& options, int rows);

// A lab option read from the environment per call: the index of its value in `values`, 0 where
// it is unset or empty (values[0] is the default); any other value is an error naming the
// variable and listing the values.
int env_choice(const char* op, const char* name, std::initializer_list<const char*> values);
int env_choice(const char* op, const char* name, const char* const* values, size_t count);

// A lab option that names one of an enum's values: values[i] where the variable holds names[i]
// (env_choice's rules; names and values are lists of the same length).
template <typename E, size_t N>
E env_enum(const char* op, const char* name, const char* const (&names)[N], const E (&values)[N]) {
  return values[env_choice(op, name, names, N)];
}

// An on/off lab option (env_choice over 0 and 1): unset, empty or 0 is off, 1 is on.
bool env_flag(const char* op, const char* name);

// Which decode a setting is read for, where their defaults differ.
enum class DecodePath { kFp8, kBf16 };

// SNAPMLA_PARTIALS (read per call): how the decode stores a split's partial rows for the combine.
// `bf16` rounds each split's normalized rows to bf16 (RNE) at half the bytes of fp32, which
// changes the result by at most the rounding (docs/accuracy.md), so the reference rounds its split
// partials alike (bf16_partials) and the kernels store so (kernels/sm90/decode/launch.hpp);
// `fragments` and `staged` store fp32 (two store forms of the GPU kernels, the same bits). `auto`
// (unset): bf16 for decode_fp8, where the rounding is a twentieth to a fortieth of the FP8 error,
// fp32 for decode_bf16, where it would add 1-17% to the BF16 path's own error (the CPU study).
// partials_setting resolves `auto` for the path: the one rule the reference (bf16_partials) and
// the kernels' launch (PartialStore) both read.
enum class PartialsSetting { kBf16, kFp32Fragments, kFp32Staged };
PartialsSetting partials_setting(const char* op, DecodePath path);
inline bool bf16_partials(const char* op, DecodePath path) {
  return partials_setting(op, path) == PartialsSetting::kBf16;
}

// The planner's lab options (PlanLabOptions, core/split_rule.hpp) from the environment:
// SNAPMLA_PLAN_FILL (env_flag) for fill_workers, SNAPMLA_PLAN_SPLIT (`rule`, the default, or
// `equal`) for equal_shares, SNAPMLA_PLAN_PIECE_COST (8, the default, or 2, 4, 6, 12, 16 blocks)
// for piece_cost, or `tile` for piece_cost_by_tile; SNAPMLA_PLAN_WORKERS (`axis`, the default, or
// `blocks`) for workers_on_blocks; SNAPMLA_FAST_SMS (fast_sms) and SNAPMLA_FAST_SM_WEIGHT for
// fast_workers and fast_weight16.
PlanLabOptions plan_lab_options(const char* op);

// SNAPMLA_FAST_SMS (a lab option, read per call): SM ids (0 .. kMaxFastSmId, '+' between them,
// none twice) whose CTAs stream the cache faster than the others' (lab/sm_balance.py finds them
// on a GPU), or unset / empty: as a bit mask (bit i % 32 of word i / 32: SM i) and their count.
// The planner weighs as many workers more (PlanLabOptions) at SNAPMLA_FAST_SM_WEIGHT (1.125, 1.25
// (unset), 1.375 or 1.5) and the decode kernels run them on those SMs
// (kernels/sm90/decode/scheduler.cuh, claimed_worker).
inline constexpr int kMaxFastSmId = 255;
struct FastSms {
  uint32_t mask[(kMaxFastSmId + 1) / 32] = {};
  int count = 0;
};
FastSms fast_sms(const char* op);

// The debug checks' tables (check_page_table, check_slot_mapping): the view, then its contents
// where they are host memory (the caller copies device tables to the host first).
void validate(const char* op, const PageTable& pages, const char* name = "pages");
void validate(const char* op, const SlotMapping& slots, const char* name = "slot_mapping");
void check_slots_in_range(const char* op, const SlotMapping& slots, int64_t num_pages);
void check_page_table_contents(const char* op, const PageTable& pages, int64_t num_pages);

}  // namespace snapmla::detail
