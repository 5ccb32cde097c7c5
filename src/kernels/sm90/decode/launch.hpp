// Host-side set-up shared by decode_fp8 and decode_bf16: the common parameters, the grid, and
// the launch of a decode kernel plus combine. The arguments arrive checked (api/dispatch.cpp,
// core/validate.hpp, workspace included); only the grid's size limit is checked here, since it
// depends on the kernels' tile.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <string>
#include <type_traits>

#include "core/validate.hpp"
#include "kernels/common/check.cuh"
#include "kernels/smxx/combine.hpp"
#include "params.hpp"
#include "snapmla/formats.hpp"

namespace snapmla::cuda {

inline DecodeParams make_params(int batch, int s_q, int h, const PageTable& pages,
                                const DecodeOutput& out, const DecodeOptions& options) {
  DecodeParams p;
  p.block_table = pages.block_table;
  p.seqlens = pages.cache_seqlens;
  p.max_pages = pages.max_pages;
  p.batch = batch;
  p.seqlen_q = s_q;
  p.num_heads = h;
  p.rows = s_q * h;
  p.softmax_scale = options.softmax_scale;
  p.causal = options.causal;
  p.empty_lse = options.empty_lse;
  p.out = reinterpret_cast<uint16_t*>(out.out);
  p.lse = out.lse;
  if (options.plan) {
    p.split_offsets = options.plan->split_offsets;
    p.split_begin = options.plan->split_begin;
    p.worker_splits = options.plan->worker_splits;
    p.num_workers = p.worker_splits != nullptr ? options.plan->capacity - batch : options.plan->capacity;
    p.plan_capacity = options.plan->capacity;
    p.partial_out = static_cast<float*>(options.workspace);
    p.partial_lse = p.partial_out + size_t(options.plan->capacity) * p.rows * kLatentDim;
  }
  return p;
}

// Where the decode's own combine keeps its counters (decode_workspace_bytes counts them), and how
// many: one per split of the plan's capacity and 64-row tile.
inline int* combine_counters_of(const DecodeParams& p, const DecodeOptions& options) {
  return reinterpret_cast<int*>(p.partial_lse + size_t(options.plan->capacity) * p.rows);
}
inline size_t combine_counter_count(const DecodeParams& p, const DecodeOptions& options) {
  return size_t(options.plan->capacity) * size_t((p.rows + kTileRows - 1) / kTileRows);
}

// The decode grid: one CTA per (worker, 64-row tile), row tile fastest (grid_worker /
// grid_row0 on the device). Workers: the plan's (its worker ranges, or one per split of its
// capacity), or one per sequence without a plan.
inline dim3 decode_grid(const char* op, const DecodeParams& p, const DecodeOptions& options) {
  const int64_t items = options.plan ? p.num_workers : p.batch;
  const int64_t ctas = items * ((p.rows + kTileRows - 1) / kTileRows);
  if (ctas > 0x7FFFFFFF)
    detail::fail(op, options.plan ? "options.plan.capacity" : "q.batch",
                 "expected (work items) x (64-row tiles) <= 2^31 - 1 CTAs, got " + std::to_string(ctas));
  return dim3(static_cast<unsigned>(ctas));
}

// wave_over_workers: the combine's wave shared among the sequences a plan with worker ranges can
// split (combine.cu), else among the whole batch.
inline CombineParams combine_params(const DecodeParams& p, bool wave_over_workers) {
  const int workers = wave_over_workers && p.worker_splits != nullptr ? p.num_workers : 0;
  return {p.split_offsets, p.partial_out, p.partial_lse, p.partial_bf16, p.out,       p.lse,
          p.batch,         p.rows,        p.seqlen_q,    p.num_heads,    p.empty_lse, workers,
          p.plan_capacity};
}

// cudaFuncSetAttribute(MaxDynamicSharedMemorySize, smem) for Kernel on the current device, once
// per device rather than on every launch (a driver call with its own locking). The decode
// kernels need more than the default 48 KB, which CUDA wants opted into per kernel in each
// device's context, where it then stays. The bits of `done` are the ordinals (below 64) on
// which it is set; threads that race on the first launch both set it, which is harmless (the
// same value), so no lock is needed. The value is a compile-time constant per kernel, so a set
// bit always means the right size. (A cudaDeviceReset would discard the setting with the
// context; nothing in this library or in PyTorch resets a device.)
template <auto Kernel>
void allow_dynamic_smem(int smem) {
  static std::atomic<uint64_t> done{0};
  int device = -1;
  check(cudaGetDevice(&device), "cudaGetDevice");
  const uint64_t bit = device >= 0 && device < 64 ? uint64_t(1) << device : 0;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit) != 0) return;
  check(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
        "cudaFuncSetAttribute (decode kernel)");
  done.fetch_or(bit, std::memory_order_release);
}

// SNAPMLA_COMBINE_PDL in the environment (a lab option, read per call like SNAPMLA_FP8_TILE, so a
// CUDA graph keeps what was set at its capture): `1` launches the combine as a programmatic
// dependent of the decode kernel, whose CTAs let it start at their own start; `late` the same, the
// CTAs letting it start once their last split's pages are done, before their stores
// (DecodeParams::dependents_late). Unset or 0: the ordinary launch.
enum class CombineLaunch { kOrdinary, kProgrammatic, kProgrammaticLate };
inline CombineLaunch combine_launch(const char* op) {
  return detail::env_enum(op, "SNAPMLA_COMBINE_PDL", {"0", "1", "late"},
                          {CombineLaunch::kOrdinary, CombineLaunch::kProgrammatic, CombineLaunch::kProgrammaticLate});
}

// SNAPMLA_COMBINE_WAVE in the environment (a lab option, read per call like SNAPMLA_COMBINE_PDL):
// unset or `workers` shares the combine's wave among the sequences the plan can split (combine.cu),
// `batch` among all sequences, as before (kept for same-run A/B). The combine's bits are the same
// either way: only its blocks per sequence and warps per task move.
inline bool combine_wave_over_workers(const char* op) {
  return detail::env_choice(op, "SNAPMLA_COMBINE_WAVE", {"workers", "batch"}) == 0;
}

// SNAPMLA_COMBINE_TASKS in the environment (a lab option, read per call like the others): unset or
// `auto` lets the combine pick its task shape (combine.cu), `rows` / `quarters` force one (the same
// bits; for same-run A/B and the bits test).
inline CombineTasks combine_tasks(const char* op) {
  return detail::env_enum(op, "SNAPMLA_COMBINE_TASKS", {"auto", "rows", "quarters"},
                          {CombineTasks::kAuto, CombineTasks::kRows, CombineTasks::kQuarters});
}

// SNAPMLA_SCORE_STEP in the environment (a lab option, read per call like the others): unset or
// `reference` runs the 64-row tiles' score step in the reference's rounding order, `folded` their
// base-2 step (softmax.cuh, page_scores_folded): decode_bf16's, and decode_fp8's transposing and
// three-consumer tiles under the per-page P' rule. For same-run A/B until the H200 has timed it.
inline ScoreStep score_step(const char* op) {
  return detail::env_enum(op, "SNAPMLA_SCORE_STEP", {"reference", "folded"},
                          {ScoreStep::kReference, ScoreStep::kFolded});
}

// SNAPMLA_BF16_OWN_PV in the environment (a lab option, read per call): `shared` (unset) or
// `registers`, decode_bf16's OwnPagePv (params.hpp).
inline OwnPagePv own_page_pv(const char* op) {
  return detail::env_enum(op, "SNAPMLA_BF16_OWN_PV", {"shared", "registers"},
                          {OwnPagePv::kShared, OwnPagePv::kRegisters});
}

// SNAPMLA_BF16_QK_ORDER in the environment (a lab option, read per call): `release` (unset) or
// `a_first`, decode_bf16's Bf16QkOrder (params.hpp).
inline Bf16QkOrder bf16_qk_order(const char* op) {
  return detail::env_enum(op, "SNAPMLA_BF16_QK_ORDER", {"release", "a_first"},
                          {Bf16QkOrder::kOnRelease, Bf16QkOrder::kPageAFirst});
}

// SNAPMLA_BF16_MAX_HANDOFF in the environment (a lab option, read per call): `with_p` (unset) or
// `early`, decode_bf16's Bf16MaxHandOff (params.hpp).
inline Bf16MaxHandOff bf16_max_handoff(const char* op) {
  return detail::env_enum(op, "SNAPMLA_BF16_MAX_HANDOFF", {"with_p", "early"},
                          {Bf16MaxHandOff::kWithP, Bf16MaxHandOff::kEarly});
}

// SNAPMLA_BF16_RESCALE in the environment (read per call): `changed` (unset, the default) or
// `always`, decode_bf16's DecodeParams::skip_unit_rescale: a warp rescales its output only where
// one of its rows' running max moved. On a long sequence a row's max moves on ever fewer pages (on
// iid scores a new maximum comes with probability about 1/j on page j), so most pages skip the
// 128 multiplies per consumer thread of each rescale (both tiles). The same bits; `always` keeps
// the former default for same-run A/B.
inline bool bf16_rescale_changed(const char* op) {
  return detail::env_enum(op, "SNAPMLA_BF16_RESCALE", {"changed", "always"}, {true, false});
}

// SNAPMLA_BF16_TILE in the environment (read per call): `auto` (unset), `narrow` or `rows64`,
// decode_bf16's Bf16Tile for calls of at most 16 query rows (params.hpp); `rows64` keeps the
// former default for same-run A/B.
inline Bf16Tile bf16_tile(const char* op) {
  return detail::env_enum(op, "SNAPMLA_BF16_TILE", {"auto", "narrow", "rows64"},
                          {Bf16Tile::kAuto, Bf16Tile::kNarrow16, Bf16Tile::kRows64});
}
// Whether decode_bf16 runs its narrow tile on a call of `rows` query rows over `batch` sequences.
inline bool bf16_narrow_tile(Bf16Tile tile, int rows, int batch) {
  if (rows > detail::kNarrowRows) return false;
  return tile == Bf16Tile::kNarrow16 || (tile == Bf16Tile::kAuto && batch <= kBf16NarrowMaxBatch);
}

// SNAPMLA_FP8_TRIO_ORDER in the environment (a lab option, read per call): `pv_first` (unset) or
// `softmax_first`, the three-consumer tile's TrioOrder (params.hpp).
inline TrioOrder trio_order(const char* op) {
  return detail::env_enum(op, "SNAPMLA_FP8_TRIO_ORDER", {"pv_first", "softmax_first"},
                          {TrioOrder::kPvFirst, TrioOrder::kSoftmaxFirst});
}
// SNAPMLA_ROLE_INDEX in the environment (read per call): `uniform` (unset: the default since the
// H200's same-run sweep, docs/kernels.md) or `thread` (the former default, kept for same-run A/B),
// the decode kernels' RoleIndex (params.hpp).
inline RoleIndex role_index(const char* op) {
  return detail::env_enum(op, "SNAPMLA_ROLE_INDEX", {"uniform", "thread"}, {RoleIndex::kUniform, RoleIndex::kThread});
}

// SNAPMLA_COMBINE_FUSED in the environment (a lab option, read per call like the others): `1` runs
// the decode kernel's instantiation with the combine tail (combine_tail.cuh), which merges its
// split sequences itself, where there is one (the default kernels' settings), a plan is given and
// the grid has at most one CTA per SM (the tail's waits need the whole grid resident: a
// cooperative launch, SplitKernels); unset or 0, or elsewhere: the kernel without it, then the
// combine kernel. Slower on the H200 (kernel timeline at fc4dfc1: the fused kernel 7-23 us longer
// than decode + combine at b = 1-8), so not the default.
inline bool combine_fused(const char* op) { return detail::env_flag(op, "SNAPMLA_COMBINE_FUSED"); }

// SNAPMLA_PARTIALS in the environment (read per call like the others) as the decode `path`'s
// PartialStore (detail::partials_setting, the reference's rule too): bf16 rows (every tile, through
// DecodeParams::partial_bf16); fp32 from the fragments; fp32 staged, for the kernels that have a
// staged instantiation (the default 64-row kernels: decode_fp8's transposing tile and decode_bf16),
// elsewhere the fragments'.
inline PartialStore partial_store(const char* op, detail::DecodePath path) {
  switch (detail::partials_setting(op, path)) {
    case detail::PartialsSetting::kBf16: return PartialStore::kBf16Rows;
    case detail::PartialsSetting::kFp32Staged: return PartialStore::kStaged;
    default: return PartialStore::kFragments;
  }
}

// SNAPMLA_DECODE_PDL in the environment (read per call like the others): `1` (unset) launches
// the decode kernel as a programmatic dependent of the kernel before it on the stream: after
// quantize_query, the planner or the previous step's combine or decode (each lets its dependents
// start at its own start) its CTAs are scheduled as that kernel drains and wait in their first
// instructions for its writes (DecodeParams::wait_previous_grid), so the launch's latency overlaps
// the kernel before instead of following it; after any other kernel (append, say) it starts when
// that kernel ends, as an ordinary launch does. `0`: the ordinary launch (the former default, kept
// for same-run A/B). The same bits either way.
inline bool decode_pdl(const char* op) { return detail::env_enum(op, "SNAPMLA_DECODE_PDL", {"1", "0"}, {true, false}); }

// SNAPMLA_NARROW_Q in the environment (a lab option, read per call like the others): `after_pages`
// (unset) has the narrow tiles' producers request their split's first pages, then load the Q tile;
// `first` loads Q first (DecodeParams::q_before_pages). The profiling build's stamps at b = 4-16,
// h = 16 put Q's landing 3.7-6.6 us after its issue, behind every CTA's first pages, and the first
// score after it. The same bits either way.
inline bool narrow_q_first(const char* op) {
  return detail::env_enum(op, "SNAPMLA_NARROW_Q", {"after_pages", "first"}, {false, true});
}

// SNAPMLA_PREFETCH_NEXT in the environment (a lab option, read per call like the others): `1` has
// the narrow decode_fp8 tile prefetch its CTA's next split into L2 (DecodeParams::prefetch_next);
// unset or 0, not. The same bits either way.
inline bool prefetch_next(const char* op) { return detail::env_flag(op, "SNAPMLA_PREFETCH_NEXT"); }

// SNAPMLA_PLAN_LOOKUP in the environment (read per call like the others): how the decode
// kernels' roles find their splits. `window_l1` (unset, the default): each CTA's first warp
// prefetches the plan's tables' first lines (and a small block table) into L1 beside its worker
// range's load (DecodeParams::prefetch_plan), and the lookups load a split's sequence entries with
// the search's last round (DecodeParams::lookup_window): at batch <= 32 one round of dependent
// loads where the search takes two, between a CTA's worker range and its first request (the
// profiling build's stamps put a CTA's worker range and first split in hand 1.2-2.1 us after its
// start), and those loads hit L1. `search`: work_of's search, then the sequence's entries, without
// the prefetch (the former default); `window` / `search_l1`: one of the two changes alone. The
// same bits in every case.
struct PlanLookup {
  bool window = true;
  bool prefetch = true;
};
inline PlanLookup plan_lookup(const char* op) {
  return detail::env_enum(op, "SNAPMLA_PLAN_LOOKUP", {"window_l1", "search", "window", "search_l1"},
                          {PlanLookup{true, true}, PlanLookup{false, false}, PlanLookup{true, false},
                           PlanLookup{false, true}});
}

// Whether a SplitKernels slot holds a kernel (not nullptr).
template <auto Kernel>
inline constexpr bool kInstantiated = !std::is_same_v<decltype(Kernel), std::nullptr_t>;

// A decode kernel's instantiations for the split epilogue's lab options: Plain (the fp32 partials
// from the fragment, then the combine kernel) and, where instantiated (else nullptr), Tail (the
// combine tail: SNAPMLA_COMBINE_FUSED), Staged (PartialStore::kStaged: SNAPMLA_PARTIALS=staged),
// StagedTail (both) and Bf16Rows (PartialStore::kBf16Rows: SNAPMLA_PARTIALS=bf16; the kernel that
// stores a split's partials as bf16 rows in DecodeParams::partial_bf16, which may be Plain itself
// where Plain makes that choice at run time). A setting without its instantiation falls back to the
// one without it (for Bf16Rows, fp32 partials and an fp32 combine: launch_decode). The
// instantiations with the combine tail go out as cooperative launches: their CTAs wait on each
// other, and a cooperative launch starts the grid only where all of it can be resident at once
// (the SM-count guard alone cannot see SMs held by other streams' kernels or a smaller SM
// partition); where the runtime refuses it, the kernel without the tail runs instead.
template <auto Plain, auto Tail = nullptr, auto Staged = nullptr, auto StagedTail = nullptr, auto Bf16Rows = nullptr>
struct SplitKernels {
  static constexpr bool kHasTail = kInstantiated<Tail>;
  static constexpr bool kHasBf16Rows = kInstantiated<Bf16Rows>;

  // Launches the instantiation of the settings (`programmatic`: as a programmatic dependent of the
  // kernel before it, SNAPMLA_DECODE_PDL; not with the combine tail, a cooperative launch); returns
  // whether it was one with the combine tail.
  template <typename... Args>
  static bool launch(bool fused, PartialStore store, bool programmatic, dim3 grid, int threads, int smem,
                     cudaStream_t stream, const Args&... args) {
    const bool staged = store == PartialStore::kStaged;
    if (fused && launch_tail(staged, grid, threads, smem, stream, args...)) return true;
    if constexpr (kHasBf16Rows) {
      if (store == PartialStore::kBf16Rows) {
        run<Bf16Rows>(programmatic, grid, threads, smem, stream, args...);
        return false;
      }
    }
    if constexpr (kInstantiated<Staged>) {
      if (staged) {
        run<Staged>(programmatic, grid, threads, smem, stream, args...);
        return false;
      }
    }
    run<Plain>(programmatic, grid, threads, smem, stream, args...);
    return false;
  }

 private:
  template <typename... Args>
  static bool launch_tail(bool staged, dim3 grid, int threads, int smem, cudaStream_t stream, const Args&... args) {
    if constexpr (kInstantiated<StagedTail>)
      if (staged) return cooperative<StagedTail>(grid, threads, smem, stream, args...);
    if constexpr (kInstantiated<Tail>) return cooperative<Tail>(grid, threads, smem, stream, args...);
    return false;
  }
  template <auto Kernel, typename... Args>
  static void run(bool programmatic, dim3 grid, int threads, int smem, cudaStream_t stream, const Args&... args) {
    allow_dynamic_smem<Kernel>(smem);
    if (!programmatic) {
      Kernel<<<grid, threads, smem, stream>>>(args...);
      return;
    }
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    check(launch_with<Kernel>(attribute, grid, threads, smem, stream, args...), "cudaLaunchKernelEx (decode kernel)");
  }
  // A cooperative launch of Kernel; false (the error cleared) where the runtime refuses it.
  template <auto Kernel, typename... Args>
  static bool cooperative(dim3 grid, int threads, int smem, cudaStream_t stream, const Args&... args) {
    allow_dynamic_smem<Kernel>(smem);
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeCooperative;
    attribute.val.cooperative = 1;
    if (launch_with<Kernel>(attribute, grid, threads, smem, stream, args...) == cudaSuccess) return true;
    cudaGetLastError();
    return false;
  }
  // Kernel launched with one launch attribute.
  template <auto Kernel, typename... Args>
  static cudaError_t launch_with(cudaLaunchAttribute attribute, dim3 grid, int threads, int smem, cudaStream_t stream,
                                 const Args&... args) {
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = dim3(unsigned(threads));
    config.dynamicSmemBytes = size_t(smem);
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = 1;
    return cudaLaunchKernelEx(&config, Kernel, args...);
  }
};

// A decode kernel set (SplitKernels; Config::kThreads per CTA, `smem` bytes of dynamic shared
// memory, arguments p and then `extra`) over the decode grid, then the combine of split sequences:
// by the combine kernel, or under SNAPMLA_COMBINE_FUSED by the set's instantiation with the combine
// tail.
template <typename Config, typename Kernels, typename... Extra>
void launch_decode(const char* op, int smem, const DecodeParams& p, const DecodeOptions& options,
                   const Extra&... extra) {
  const cudaStream_t stream = as_stream(options.stream);
  const dim3 grid = decode_grid(op, p, options);
  // The lab options are read (and checked) before anything runs.
  const CombineLaunch launch = combine_launch(op);
  const bool wave_over_workers = combine_wave_over_workers(op);
  const CombineTasks tasks = combine_tasks(op);
  // (decode_bf16's params carry its BF16 query; decode_fp8's do not.)
  const PartialStore store =
      partial_store(op, p.q_bf16 != nullptr ? detail::DecodePath::kBf16 : detail::DecodePath::kFp8);
  const bool programmatic = decode_pdl(op);
  const bool q_first = narrow_q_first(op);
  const bool prefetch = prefetch_next(op);
  const PlanLookup lookup = plan_lookup(op);
  // bf16 partials where the kernel set has a kernel that stores them (else fp32, the combine too;
  // SplitKernels::launch then runs Plain).
  const bool bf16_partials = Kernels::kHasBf16Rows && store == PartialStore::kBf16Rows;
  // (A failed SM-count query gives 0: the combine kernel then. The combine tail reads fp32
  // partials only.)
  const bool fused = combine_fused(op) && Kernels::kHasTail && options.plan && !bf16_partials &&
                     int64_t(grid.x) <= current_sm_count();
  DecodeParams kp = p;
  if (bf16_partials) kp.partial_bf16 = reinterpret_cast<uint16_t*>(p.partial_out);  // null without a plan
  kp.dependents_late = launch == CombineLaunch::kProgrammaticLate;
  // (Not where the combine tail asks for a cooperative launch: if that is refused, the kernel
  // without the tail goes out the ordinary way, its params saying so.)
  kp.wait_previous_grid = programmatic && !fused;
  kp.q_before_pages = q_first;
  kp.prefetch_next = prefetch;
  kp.lookup_window = lookup.window;
  kp.prefetch_plan = lookup.prefetch;
  if (fused) {
    kp.combine_counters = combine_counters_of(p, options);
    check(cudaMemsetAsync(kp.combine_counters, 0, combine_counter_count(p, options) * sizeof(int), stream),
          "cudaMemsetAsync (combine counters)");
  }
  // SNAPMLA_FAST_SMS (a lab option): on calls of at most 16 rows, whose plans the planner weighs
  // under it, the CTAs claim their workers, the plan's first ones on the listed SMs (claimed_worker).
  // The two claim counters borrow the combine tail's, zeroed before the launch.
  const detail::FastSms fast = detail::fast_sms(op);
  if (fast.count > 0 && p.worker_splits != nullptr && p.rows <= detail::kNarrowRows) {
    if (fused)
      detail::fail(op, "SNAPMLA_FAST_SMS", "expected unset with SNAPMLA_COMBINE_FUSED=1 (they share the workspace's "
                   "counters), got '" + std::string(std::getenv("SNAPMLA_FAST_SMS")) + "'");
    kp.worker_claims = combine_counters_of(p, options);
    check(cudaMemsetAsync(kp.worker_claims, 0, 2 * sizeof(int), stream), "cudaMemsetAsync (worker claims)");
    static_assert(sizeof(fast.mask) == sizeof(kp.fast_sm_mask), "the kernels' SM mask holds every listed id");
    std::copy(std::begin(fast.mask), std::end(fast.mask), kp.fast_sm_mask);
    kp.fast_workers = std::min(fast.count, p.num_workers);
  }
  const bool tail =
      Kernels::launch(fused, store, kp.wait_previous_grid, grid, Config::kThreads, smem, stream, kp, extra...);
  check_launch(op);
  if (options.plan && !tail)
    combine(combine_params(kp, wave_over_workers), stream, launch != CombineLaunch::kOrdinary, tasks);
}

}  // namespace snapmla::cuda
