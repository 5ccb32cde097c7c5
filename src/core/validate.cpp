#include "validate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

namespace snapmla {
namespace detail {
namespace {

// An argument as errors name it: "name.field" (or "name" alone). The checks below run on every
// call, so the string is built only for an error, never on the way through.
struct ArgName {
  const char* name;
  const char* field = nullptr;
  std::string str() const { return field ? std::string(name) + "." + field : std::string(name); }
};

template <typename T>
void check_pointer(const char* op, const ArgName& arg, const T* p, bool needed, size_t alignment) {
  if (!needed) return;
  if (p == nullptr) fail(op, arg.str(), "null pointer, expected memory");
  if (reinterpret_cast<uintptr_t>(p) % alignment != 0) {
    // snprintf, not an ostringstream: with PyTorch loaded in the same process the stream's
    // locale machinery crashed the H200 machine's Python (a segfault in this message).
    char at[32];
    std::snprintf(at, sizeof at, "%p", static_cast<const void*>(p));
    fail(op, arg.str(), "expected a " + std::to_string(alignment) + "-byte aligned pointer, got " + at +
                            " (the kernels read it with vector and bulk copies)");
  }
}

void check_heads(const char* op, const ArgName& arg, int h) {
  if (h < kMinHeads || h > kMaxHeads)
    fail(op, arg.str(),
         "expected " + std::to_string(kMinHeads) + ".." + std::to_string(kMaxHeads) + ", got " +
             std::to_string(h));
}

void check_seqlen_q(const char* op, const ArgName& arg, int s_q) {
  if (s_q < 1 || s_q > kMaxQueriesPerSeq)
    fail(op, arg.str(),
         "expected 1.." + std::to_string(kMaxQueriesPerSeq) + ", got " + std::to_string(s_q));
}

std::string join(const char* name, const char* field) { return ArgName{name, field}.str(); }

}  // namespace

void check_query_shape(const char* op, const char* seqlen_q_arg, int s_q, const char* num_heads_arg,
                       int h) {
  check_seqlen_q(op, {seqlen_q_arg}, s_q);
  check_heads(op, {num_heads_arg}, h);
}

void fail(const char* op, const std::string& argument, const std::string& what) {
  throw Error(op, argument, what);
}

void check_devices_match(const char* op, Device expected, const char* argument, Device got) {
  if (!(expected == got))
    fail(op, std::string(argument) + ".device",
         "expected " + to_string(expected) + " like the other arguments, got " + to_string(got));
}

void check_host(const char* op, const char* argument, Device d) {
  if (!d.is_cpu())
    fail(op, std::string(argument) + ".device",
         "expected host memory (the reference runs on the CPU), got " + to_string(d));
}

// The views' own checks (static: those of the views that the header does not name).
static void validate(const char* op, const PagedFp8Cache& c, const char* name = "cache") {
  if (c.num_pages < 0 || c.num_pages > std::numeric_limits<int32_t>::max() / kPageSize)
    fail(op, join(name, "num_pages"),
         "expected 0.." + std::to_string(std::numeric_limits<int32_t>::max() / kPageSize) +
             " (slots are int32), got " + std::to_string(c.num_pages));
  const bool needed = c.num_pages > 0;
  check_pointer(op, {name, "latent"}, c.latent, needed, 16);
  check_pointer(op, {name, "scale"}, c.scale, needed, 16);
  check_pointer(op, {name, "rope"}, c.rope, needed, 16);
}

static void validate(const char* op, const PagedBf16Cache& c, const char* name = "cache") {
  if (c.num_pages < 0 || c.num_pages > std::numeric_limits<int32_t>::max() / kPageSize)
    fail(op, join(name, "num_pages"),
         "expected 0.." + std::to_string(std::numeric_limits<int32_t>::max() / kPageSize) +
             " (slots are int32), got " + std::to_string(c.num_pages));
  check_pointer(op, {name, "data"}, c.data, c.num_pages > 0, 16);
}

static void validate(const char* op, const KvRows& r, const char* name) {
  if (r.num_tokens < 0)
    fail(op, join(name, "num_tokens"), "expected >= 0, got " + std::to_string(r.num_tokens));
  check_pointer(op, {name, "data"}, r.data, r.num_tokens > 0, 16);
}

void validate(const char* op, const SlotMapping& s, const char* name) {
  if (s.num_tokens < 0)
    fail(op, join(name, "num_tokens"), "expected >= 0, got " + std::to_string(s.num_tokens));
  check_pointer(op, {name, "slots"}, s.slots, s.num_tokens > 0, 4);
}

static void validate(const char* op, const QueryBf16& q, const char* name = "q") {
  if (q.batch < 0) fail(op, join(name, "batch"), "expected >= 0, got " + std::to_string(q.batch));
  check_seqlen_q(op, {name, "seqlen_q"}, q.seqlen_q);
  check_heads(op, {name, "num_heads"}, q.num_heads);
  check_pointer(op, {name, "data"}, q.data, q.batch > 0, 16);
}

static void validate(const char* op, const QuantizedQuery& q, const char* name) {
  if (q.batch < 0) fail(op, join(name, "batch"), "expected >= 0, got " + std::to_string(q.batch));
  check_seqlen_q(op, {name, "seqlen_q"}, q.seqlen_q);
  check_heads(op, {name, "num_heads"}, q.num_heads);
  const bool needed = q.batch > 0;
  check_pointer(op, {name, "nope"}, q.nope, needed, 16);
  check_pointer(op, {name, "rope"}, q.rope, needed, 16);
  check_pointer(op, {name, "scale"}, q.scale, needed, 16);
}

void validate(const char* op, const PageTable& p, const char* name) {
  if (p.batch < 0) fail(op, join(name, "batch"), "expected >= 0, got " + std::to_string(p.batch));
  if (p.max_pages < 0)
    fail(op, join(name, "max_pages"), "expected >= 0, got " + std::to_string(p.max_pages));
  check_pointer(op, {name, "cache_seqlens"}, p.cache_seqlens, p.batch > 0, 4);
  check_pointer(op, {name, "block_table"}, p.block_table, p.batch > 0 && p.max_pages > 0, 4);
}

static void validate(const char* op, const DecodeOutput& o, const char* name, bool needed) {
  check_pointer(op, {name, "out"}, o.out, needed, 16);
  check_pointer(op, {name, "lse"}, o.lse, needed, 16);
}

static void validate(const char* op, const SplitPlan& p, const char* name = "plan") {
  if (p.batch < 0) fail(op, join(name, "batch"), "expected >= 0, got " + std::to_string(p.batch));
  if (p.capacity < p.batch || p.capacity < 1)
    fail(op, join(name, "capacity"),
         "expected >= max(batch, 1) = " + std::to_string(std::max(p.batch, 1)) + ", got " +
             std::to_string(p.capacity) + " (size it with split_plan_capacity)");
  check_pointer(op, {name, "split_offsets"}, p.split_offsets, true, 4);
  check_pointer(op, {name, "split_begin"}, p.split_begin, true, 4);
  if (p.worker_splits != nullptr) {
    check_pointer(op, {name, "worker_splits"}, p.worker_splits, true, 4);
    if (p.capacity <= p.batch)
      fail(op, join(name, "capacity"),
           "expected > batch (" + std::to_string(p.batch) + ") with worker_splits: the plan's workers are its "
           "capacity - batch slots (size it with split_plan_capacity), got " + std::to_string(p.capacity));
  }
}

static void validate(const char* op, const DecodeOptions& o, int batch) {
  if (!(o.softmax_scale > 0.0f) || !std::isfinite(o.softmax_scale))
    fail(op, "options.softmax_scale",
         "expected a finite value > 0, got " + std::to_string(o.softmax_scale));
  if (!std::isinf(o.empty_lse))
    fail(op, "options.empty_lse", "expected -inf or +inf, got " + std::to_string(o.empty_lse));
  check_p_scale(op, "options.p_scale", o.p_scale);
  if (o.plan != nullptr) {
    validate(op, *o.plan, "options.plan");
    if (o.plan->batch != batch)
      fail(op, "options.plan.batch",
           "expected the batch of q (" + std::to_string(batch) + "), got " +
               std::to_string(o.plan->batch));
  }
}

namespace {

void check_rows_match(const char* op, const KvRows& kv, const SlotMapping& slots,
                      const char* rows_name) {
  if (slots.num_tokens != kv.num_tokens)
    fail(op, std::string(rows_name) + ".num_tokens",
         "expected one row per slot (" + std::to_string(slots.num_tokens) + "), got " +
             std::to_string(kv.num_tokens));
}

void check_workspace(const char* op, const DecodeOptions& options, int seqlen_q, int num_heads) {
  if (options.plan == nullptr) return;
  const size_t need = decode_workspace_bytes(options.plan->capacity, seqlen_q, num_heads);
  if (options.workspace == nullptr || options.workspace_bytes < need)
    fail(op, "options.workspace",
         "expected device memory of at least decode_workspace_bytes(capacity, s_q, h) = " +
             std::to_string(need) + " bytes for the split partials, got " +
             std::to_string(options.workspace_bytes));
  if (reinterpret_cast<uintptr_t>(options.workspace) % 16 != 0)
    fail(op, "options.workspace", "expected a 16-byte aligned pointer");
}

}  // namespace

void check_slots_in_range(const char* op, const SlotMapping& s, int64_t num_pages) {
  const int64_t num_slots = num_pages * kPageSize;
  for (int64_t i = 0; i < s.num_tokens; ++i) {
    const int32_t slot = s.slots[i];
    if (slot < -1 || slot >= num_slots)
      fail(op, "slot_mapping",
           "slot " + std::to_string(slot) + " at index " + std::to_string(i) +
               " is out of range: expected -1 (skip) or 0.." + std::to_string(num_slots - 1) +
               " (num_pages * 64 - 1)");
  }
}

void check_page_table_contents(const char* op, const PageTable& p, int64_t num_pages) {
  const int64_t capacity = static_cast<int64_t>(p.max_pages) * kPageSize;
  for (int i = 0; i < p.batch; ++i) {
    const int32_t len = p.cache_seqlens[i];
    if (len < 0 || len > capacity)
      fail(op, "cache_seqlens",
           "cache_seqlens[" + std::to_string(i) + "] = " + std::to_string(len) +
               (len < 0 ? " is negative" : " is beyond the block table row") + ": expected 0.." +
               std::to_string(capacity) + " (max_pages * 64)");
    const int used = (len + kPageSize - 1) / kPageSize;
    for (int j = 0; j < used; ++j) {
      const int32_t page = p.block_table[static_cast<int64_t>(i) * p.max_pages + j];
      if (page < 0 || page >= num_pages)
        fail(op, "block_table",
             "page index " + std::to_string(page) + " at [" + std::to_string(i) + ", " +
                 std::to_string(j) + "] is out of range: expected 0.." +
                 std::to_string(num_pages - 1) + " (cache.num_pages - 1)");
    }
  }
}

namespace {

void check_plan_contents(const char* op, const SplitPlan& plan, const PageTable& pages) {
  if (plan.split_offsets[0] != 0)
    fail(op, "options.plan.split_offsets", "expected split_offsets[0] == 0");
  for (int i = 0; i < plan.batch; ++i) {
    const int32_t lo = plan.split_offsets[i], hi = plan.split_offsets[i + 1];
    if (hi <= lo || hi > plan.capacity)
      fail(op, "options.plan.split_offsets",
           "sequence " + std::to_string(i) + " has splits [" + std::to_string(lo) + ", " +
               std::to_string(hi) + "): expected at least one and at most capacity " +
               std::to_string(plan.capacity));
    const int32_t len = pages.cache_seqlens[i];
    // A length outside the block table makes the sequence's rows NaN whatever its splits say.
    if (len < 0 || int64_t(len) > int64_t(pages.max_pages) * kPageSize) continue;
    for (int32_t k = lo; k < hi; ++k) {
      const int32_t b = plan.split_begin[k];
      const bool ok = b % kPageSize == 0 && (k == lo ? b == 0 : b > plan.split_begin[k - 1]) &&
                      (b < len || (k == lo && len == 0));
      if (!ok)
        fail(op, "options.plan.split_begin",
             "split " + std::to_string(k) + " of sequence " + std::to_string(i) + " begins at " +
                 std::to_string(b) +
                 ": expected the first at 0, then increasing multiples of 64 below the "
                 "sequence length " + std::to_string(len) + " (was the plan made for other "
                 "cache_seqlens?)");
    }
  }
  if (plan.worker_splits != nullptr) {
    // Worker k runs splits [worker_splits[k], worker_splits[k + 1]): from 0, non-decreasing, the
    // last worker's end the number of splits, so that every split runs exactly once.
    const int32_t total = plan.split_offsets[plan.batch];
    const int workers = plan.capacity - plan.batch;
    for (int k = 0; k <= workers; ++k) {
      const int32_t v = plan.worker_splits[k];
      const int32_t lo = k == 0 ? 0 : plan.worker_splits[k - 1], hi = k == 0 ? 0 : total;
      if (v < lo || v > hi || (k == workers && v != total))
        fail(op, "options.plan.worker_splits",
             "entry " + std::to_string(k) + " is " + std::to_string(v) +
                 ": expected 0 at entry 0, then non-decreasing up to the number of splits " + std::to_string(total) +
                 " at entry capacity - batch = " + std::to_string(workers) + " (was the plan made by plan_splits?)");
    }
  }
}

template <typename Cache>
void check_append_args(const char* op, const Cache& cache, const KvRows& kv, const SlotMapping& slots) {
  check_devices_match(op, cache.device, "kv", kv.device);
  check_devices_match(op, cache.device, "slot_mapping", slots.device);
  validate(op, cache);
  validate(op, kv, "kv");
  validate(op, slots);
  check_rows_match(op, kv, slots, "kv");
  if (cache.device.is_cpu()) check_slots_in_range(op, slots, cache.num_pages);
}

template <typename Query, typename Cache>
void check_decode_args(const char* op, const Query& q, const Cache& cache, const PageTable& pages,
                       const DecodeOutput* out, const DecodeOptions& options, TableFaults faults) {
  check_devices_match(op, q.device, "cache", cache.device);
  check_devices_match(op, q.device, "pages", pages.device);
  if (out) check_devices_match(op, q.device, "out", out->device);
  if (options.plan) check_devices_match(op, q.device, "options.plan", options.plan->device);
  validate(op, q, "q");
  validate(op, cache);
  validate(op, pages);
  if (out) validate(op, *out, "out", q.batch > 0);
  validate(op, options, q.batch);
  if (pages.batch != q.batch)
    fail(op, "pages.batch",
         "expected the batch of q (" + std::to_string(q.batch) + "), got " + std::to_string(pages.batch));
  if (!q.device.is_cpu()) return check_workspace(op, options, q.seqlen_q, q.num_heads);
  if (faults == TableFaults::kThrow) check_page_table_contents(op, pages, cache.num_pages);
  if (options.plan) check_plan_contents(op, *options.plan, pages);
}

}  // namespace

void check_append(const char* op, const PagedFp8Cache& cache, const KvRows& kv, const SlotMapping& slots) {
  check_append_args(op, cache, kv, slots);
}

void check_append(const char* op, const PagedBf16Cache& cache, const KvRows& kv, const SlotMapping& slots) {
  check_append_args(op, cache, kv, slots);
}

void check_quantize_query(const char* op, const QueryBf16& q, const QuantizedQuery& out) {
  check_devices_match(op, q.device, "out", out.device);
  validate(op, q);
  validate(op, out, "out");
  if (out.batch != q.batch || out.seqlen_q != q.seqlen_q || out.num_heads != q.num_heads)
    fail(op, "out",
         "expected the shape of q [" + std::to_string(q.batch) + ", " + std::to_string(q.seqlen_q) + ", " +
             std::to_string(q.num_heads) + "]");
}

void check_gather_dequant(const char* op, const PagedFp8Cache& cache, const SlotMapping& slots, const KvRows& out) {
  check_devices_match(op, cache.device, "slot_mapping", slots.device);
  check_devices_match(op, cache.device, "out", out.device);
  validate(op, cache);
  validate(op, slots);
  validate(op, out, "out");
  check_rows_match(op, out, slots, "out");
  if (cache.device.is_cpu()) check_slots_in_range(op, slots, cache.num_pages);
}

void check_plan_splits(const char* op, const PageTable& pages, int num_workers, int query_rows,
                       const SplitPlan& plan, int split_blocks) {
  check_devices_match(op, pages.device, "plan", plan.device);
  if (split_blocks < 0)
    fail(op, "split_blocks",
         "expected 0 (the balanced plan) or a split length in 64-token blocks (a batch-invariant plan), got " +
             std::to_string(split_blocks));
  validate(op, pages);
  validate(op, plan);
  if (num_workers < 1) fail(op, "num_workers", "expected >= 1, got " + std::to_string(num_workers));
  if (query_rows < 0 || query_rows > kMaxHeads * kMaxQueriesPerSeq)
    fail(op, "query_rows",
         "expected 0 (equal shares) or the decode's seqlen_q x num_heads (1.." +
             std::to_string(kMaxHeads * kMaxQueriesPerSeq) + "), got " + std::to_string(query_rows));
  if (plan.batch != pages.batch)
    fail(op, "plan.batch", "expected pages.batch (" + std::to_string(pages.batch) + "), got " +
                               std::to_string(plan.batch));
  if (plan.capacity < split_plan_capacity(pages.batch, num_workers))
    fail(op, "plan.capacity",
         "expected >= split_plan_capacity(batch, num_workers) = " +
             std::to_string(split_plan_capacity(pages.batch, num_workers)) + ", got " +
             std::to_string(plan.capacity));
  if (!pages.device.is_cpu()) return;
  for (int i = 0; i < pages.batch; ++i)
    if (pages.cache_seqlens[i] < 0)
      fail(op, "cache_seqlens", "cache_seqlens[" + std::to_string(i) + "] = " +
                                    std::to_string(pages.cache_seqlens[i]) + ", expected >= 0");
}

void check_decode(const char* op, const QuantizedQuery& q, const PagedFp8Cache& cache, const PageTable& pages,
                  const DecodeOutput* out, const DecodeOptions& options, TableFaults faults) {
  check_decode_args(op, q, cache, pages, out, options, faults);
}

void check_decode(const char* op, const QueryBf16& q, const PagedBf16Cache& cache, const PageTable& pages,
                  const DecodeOutput* out, const DecodeOptions& options, TableFaults faults) {
  check_decode_args(op, q, cache, pages, out, options, faults);
}

void check_p_scale(const char* op, const char* argument, Fp8PScale p_scale) {
  if (p_scale != Fp8PScale::kAuto && p_scale != Fp8PScale::kPerPage && p_scale != Fp8PScale::kCarried)
    fail(op, argument, "expected kAuto, kPerPage or kCarried, got " + std::to_string(int(p_scale)));
}

// fp8_tile_of_call's kAuto (validate.hpp).
static Fp8Tile auto_fp8_tile(const char* op, int rows) {
  const int choice = env_choice(op, "SNAPMLA_FP8_TILE", {"auto", "rows64", "vregs", "rows64_all", "trio"});
  if (rows <= kNarrowRows) return choice == 3 ? Fp8Tile::kRows64 : Fp8Tile::kNarrow16;
  return choice == 2 ? Fp8Tile::kRows64VRegs : choice == 4 ? Fp8Tile::kRows64Trio : Fp8Tile::kRows64;
}

Fp8Tile fp8_tile_of_call(const char* op, int rows, Fp8Tile tile, Fp8PScale p_scale) {
  if (p_scale == Fp8PScale::kCarried) {
    if (tile == Fp8Tile::kAuto || tile == Fp8Tile::kRows64) return Fp8Tile::kRows64;
    fail(op, "options.p_scale",
         "expected kAuto or kPerPage with options.fp8_tile kNarrow16, kRows64VRegs or kRows64Trio (kCarried runs "
         "on the transposing 64-row tile only), got kCarried");
  }
  switch (tile) {
    case Fp8Tile::kAuto: return auto_fp8_tile(op, rows);
    case Fp8Tile::kRows64:
    case Fp8Tile::kRows64VRegs:
    case Fp8Tile::kRows64Trio: return tile;
    case Fp8Tile::kNarrow16:
      if (rows > kNarrowRows)
        fail(op, "options.fp8_tile",
             "expected kAuto, kRows64, kRows64VRegs or kRows64Trio for a call with more than 16 query rows (num_heads * "
             "seqlen_q), got kNarrow16 with " + std::to_string(rows) + " rows");
      return tile;
  }
  fail(op, "options.fp8_tile", "expected kAuto, kRows64, kRows64VRegs, kRows64Trio or kNarrow16");
}

Fp8PScale resolved_p_scale(const char* op, const DecodeOptions& options, int rows) {
  if (options.p_scale != Fp8PScale::kAuto) return options.p_scale;
  switch (env_choice(op, "SNAPMLA_FP8_P_SCALE", {"auto", "per_page", "carried", "carried_wide"})) {
    case 0:
    case 1: return Fp8PScale::kPerPage;
    case 2: return Fp8PScale::kCarried;
    default: break;  // carried_wide: carried where the call runs the transposing 64-row tile
  }
  return fp8_tile_of_call(op, rows, options.fp8_tile, Fp8PScale::kPerPage) == Fp8Tile::kRows64 ? Fp8PScale::kCarried
                                                                                               : Fp8PScale::kPerPage;
}

int env_choice(const char* op, const char* name, const char* const* values, size_t count) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return 0;
  for (size_t i = 0; i < count; ++i)
    if (std::strcmp(v, values[i]) == 0) return int(i);
  std::string expected = "expected unset";
  for (size_t i = 0; i < count; ++i) expected += (i + 1 == count ? " or '" : ", '") + std::string(values[i]) + "'";
  fail(op, name, expected + " in the environment, got '" + v + "'");
}

int env_choice(const char* op, const char* name, std::initializer_list<const char*> values) {
  return env_choice(op, name, values.begin(), values.size());
}

bool env_flag(const char* op, const char* name) { return env_choice(op, name, {"0", "1"}) == 1; }

PartialsSetting partials_setting(const char* op, DecodePath path) {
  const PartialsSetting auto_setting = path == DecodePath::kFp8 ? PartialsSetting::kBf16 : PartialsSetting::kFp32Fragments;
  return env_enum(op, "SNAPMLA_PARTIALS", {"auto", "bf16", "fragments", "staged"},
                  {auto_setting, PartialsSetting::kBf16, PartialsSetting::kFp32Fragments, PartialsSetting::kFp32Staged});
}

PlanLabOptions plan_lab_options(const char* op) {
  PlanLabOptions lab;
  lab.fill_workers = env_flag(op, "SNAPMLA_PLAN_FILL");
  lab.equal_shares = env_choice(op, "SNAPMLA_PLAN_SPLIT", {"rule", "equal"}) == 1;
  // A further piece's fixed cost in blocks: the rule's (8, unset) or one of a few others, to scan
  // (4: the former rule), or `tile` (0 here): by the tile the query rows select (piece_cost_blocks).
  lab.piece_cost =
      env_enum(op, "SNAPMLA_PLAN_PIECE_COST", {"8", "2", "4", "6", "12", "16", "tile"}, {8, 2, 4, 6, 12, 16, 0});
  lab.piece_cost_by_tile = lab.piece_cost == 0;
  lab.workers_on_blocks = env_choice(op, "SNAPMLA_PLAN_WORKERS", {"axis", "blocks"}) == 1;
  lab.fast_workers = fast_sms(op).count;
  lab.fast_weight16 = env_enum(op, "SNAPMLA_FAST_SM_WEIGHT", {"1.25", "1.125", "1.375", "1.5"}, {20, 18, 22, 24});
  return lab;
}

FastSms fast_sms(const char* op) {
  FastSms sms;
  const char* v = std::getenv("SNAPMLA_FAST_SMS");
  if (v == nullptr || *v == 0) return sms;
  const std::string text(v);
  for (size_t at = 0; at <= text.size();) {
    const size_t end = std::min(text.find('+', at), text.size());
    const std::string item = text.substr(at, end - at);
    char* stop = nullptr;
    const long id = item.empty() ? -1 : std::strtol(item.c_str(), &stop, 10);
    const bool ok = !item.empty() && *stop == 0 && id >= 0 && id <= kMaxFastSmId;
    if (!ok || (sms.mask[id / 32] >> (id % 32) & 1u))
      fail(op, "SNAPMLA_FAST_SMS",
           "expected SM ids 0.." + std::to_string(kMaxFastSmId) + " separated by '+', none twice, in the environment, got '" +
               text + "'");
    sms.mask[id / 32] |= 1u << (id % 32);
    ++sms.count;
    at = end + 1;
  }
  return sms;
}

}  // namespace detail
}  // namespace snapmla
