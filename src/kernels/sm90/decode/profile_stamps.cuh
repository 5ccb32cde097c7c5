// Profiling build only (CMake -DSNAPMLA_PROFILE_STAMPS=ON; the product never defines it): the
// global timer at a few milestones of each CTA of decode_fp8's tiles (the 64-row tile and the
// narrow one), and a report on stderr for one call: where a CTA's time goes before its first
// score and after its last page, which the tensor-pipe counters of Nsight Compute do not show.
// The question it answers: what a split's fixed cost is made of (the plan and work lookups, the
// Q tile and first page loads, the epilogue's stores) at small batches, where a CTA has only a
// few pages.
//
// Milestones of the CTA's first split (the ones after it are overwritten by later splits, so
// kLoopDone and kStored are the CTA's last split's): see Mark. The call reported is the
// SNAPMLA_PROFILE_CALL-th launch of the tile in the process (default 8: after a warm-up); the
// table is cleared just before it, and read after it with a device synchronization (so the
// reported call must be an eager one: a synchronization inside a CUDA graph's capture fails it).
// Everything here has internal linkage: each kernel's file (translation unit) has its own table
// and count.
#pragma once

#ifdef SNAPMLA_PROFILE_STAMPS
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/common/ptx.cuh"

namespace snapmla::cuda::profile {
namespace {

enum class Mark : int {
  kStart,        // thread 0 enters the kernel
  kWorkKnown,    // the loader has its first split (plan and work lookups done)
  kQIssued,      // the loader has issued the Q tile's load (64-row tile: its page loads follow;
                 // narrow tile: the first pages' loads came first)
  kQLanded,      // consumer 0 saw the Q tile arrive
  kFirstScore,   // consumer 0's first QK retired (its first page had landed)
  kLoopDone,     // consumer 0 past its last page and the l exchange (narrow: the merge barrier)
  kStored,       // consumer 0 issued its output or partial stores
  kCount
};
constexpr int kMarks = int(Mark::kCount);
constexpr int kMaxCtas = 4096;

struct CtaRecord {
  unsigned long long ns[kMarks];                 // %globaltimer
  unsigned long long clock_start, clock_stored;  // clock64 at kStart and kStored (the SM clock)
  unsigned sm, splits, first_pages, pages;  // pages: over all of the CTA's splits
};

__device__ CtaRecord g_records[kMaxCtas];

// One thread of the CTA records milestone m.
__device__ __forceinline__ void mark(Mark m) {
  if (blockIdx.x >= kMaxCtas) return;
  CtaRecord& r = g_records[blockIdx.x];
  r.ns[int(m)] = ptx::global_timer_ns();
  if (m == Mark::kStart) {
    r.clock_start = clock64();
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    r.sm = sm;
  } else if (m == Mark::kStored) {
    r.clock_stored = clock64();
  }
}

__device__ __forceinline__ void note_work(int splits, int first_pages) {
  if (blockIdx.x >= kMaxCtas) return;
  g_records[blockIdx.x].splits = unsigned(splits);
  g_records[blockIdx.x].first_pages = unsigned(first_pages);
}

// One thread of the CTA, once per split: the split's pages, summed into the CTA's.
__device__ __forceinline__ void note_split(int pages) {
  if (blockIdx.x >= kMaxCtas) return;
  g_records[blockIdx.x].pages += unsigned(pages);
}

inline const char* mark_name(int m) {
  static const char* const names[kMarks] = {"start", "work known", "Q issued", "Q landed",
                                            "first score", "loop done", "stored"};
  return names[m];
}

// Host side, around each launch of the tile: before_launch clears the table ahead of the
// reported launch, after_launch prints the report after it.
inline int& launches() {
  static int n = 0;
  return n;
}

inline int reported_launch() {
  static const int at = [] {
    const char* v = std::getenv("SNAPMLA_PROFILE_CALL");
    const int n = v != nullptr ? std::atoi(v) : 0;
    return n > 0 ? n : 8;
  }();
  return at;
}

inline void before_launch() {
  if (launches() + 1 != reported_launch()) return;
  static const std::vector<CtaRecord> zero(kMaxCtas, CtaRecord{});
  cudaDeviceSynchronize();
  cudaMemcpyToSymbol(g_records, zero.data(), sizeof(CtaRecord) * kMaxCtas);
}

// SNAPMLA_PROFILE_DUMP=PATH: every CTA's record appended to PATH as CSV (with a header when the
// file is new), each milestone in us after the grid's first start: whether the CTAs' ends follow
// their pages or their SMs (lab/sm_balance.py reads it).
inline void dump_records(const std::vector<CtaRecord>& h, const char* op, int at, unsigned long long first_start) {
  const char* path = std::getenv("SNAPMLA_PROFILE_DUMP");
  if (path == nullptr || *path == 0) return;
  FILE* f = std::fopen(path, "a");
  if (f == nullptr) {
    std::fprintf(stderr, "%s profile: could not open %s\n", op, path);
    return;
  }
  std::fseek(f, 0, SEEK_END);
  if (std::ftell(f) == 0) {
    std::fprintf(f, "op,launch,cta,sm,splits,first_pages,pages,mhz");
    for (int m = 0; m < kMarks; ++m) std::fprintf(f, ",%s", mark_name(m));
    std::fprintf(f, "\n");
  }
  for (size_t i = 0; i < h.size(); ++i) {
    const CtaRecord& r = h[i];
    if (r.ns[0] == 0) continue;
    const unsigned long long end = r.ns[int(Mark::kStored)];
    const double mhz = end > r.ns[0] ? double(r.clock_stored - r.clock_start) / double(end - r.ns[0]) * 1e3 : 0.0;
    std::fprintf(f, "%s,%d,%zu,%u,%u,%u,%u,%.0f", op, at, i, r.sm, r.splits, r.first_pages, r.pages, mhz);
    for (int m = 0; m < kMarks; ++m)
      std::fprintf(f, ",%.3f", r.ns[m] != 0 ? double(r.ns[m] - first_start) / 1e3 : -1.0);
    std::fprintf(f, "\n");
  }
  std::fclose(f);
}

inline double percentile(std::vector<double> v, double f) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[size_t(f * double(v.size() - 1))];
}

inline void after_launch(const char* op) {
  const int at = reported_launch();
  if (++launches() != at) return;
  std::vector<CtaRecord> h(kMaxCtas);
  cudaDeviceSynchronize();
  if (cudaMemcpyFromSymbol(h.data(), g_records, sizeof(CtaRecord) * kMaxCtas) != cudaSuccess) {
    std::fprintf(stderr, "%s profile: could not read the stamps\n", op);
    return;
  }
  // Per CTA with work, each milestone's time after the CTA's start (us); CTAs without work are
  // only counted.
  std::vector<std::vector<double>> after(kMarks);
  std::vector<double> mhz, starts;  // starts: each CTA's kStart (ns), with or without work
  unsigned long long t0 = ~0ull, t1 = 0, first_start = ~0ull;
  int idle = 0, longest = -1;
  double longest_us = -1;
  for (int i = 0; i < kMaxCtas; ++i) {
    const CtaRecord& r = h[size_t(i)];
    if (r.ns[0] == 0) continue;
    starts.push_back(double(r.ns[0]));
    first_start = std::min(first_start, r.ns[0]);
    const unsigned long long end = r.ns[int(Mark::kStored)];
    if (end == 0) {
      ++idle;
      continue;
    }
    t0 = std::min(t0, r.ns[0]);
    t1 = std::max(t1, end);
    for (int m = 1; m < kMarks; ++m)
      if (r.ns[m] != 0) after[size_t(m)].push_back(double(r.ns[m] - r.ns[0]) / 1e3);
    if (end > r.ns[0]) mhz.push_back(double(r.clock_stored - r.clock_start) / double(end - r.ns[0]) * 1e3);
    const double us = double(end - r.ns[0]) / 1e3;
    if (us > longest_us) {
      longest_us = us;
      longest = i;
    }
  }
  if (longest < 0) {
    std::fprintf(stderr, "%s profile (launch %d): no CTA recorded its work\n", op, at);
    return;
  }
  dump_records(h, op, at, first_start);
  std::fprintf(stderr, "%s profile (launch %d): %zu CTAs with work, %d without; span %.2f us; SM MHz p50 %.0f\n", op,
               at, after[size_t(kMarks) - 1].size(), idle, double(t1 - t0) / 1e3, percentile(mhz, 0.5));
  // The launch's ramp: when the CTAs (all of them, those without work too) started after the
  // grid's first, so that a late start (an SM still held by the kernel before) is told apart from
  // a CTA's own fixed cost.
  for (double& v : starts) v = (v - double(first_start)) / 1e3;
  std::fprintf(stderr, "%s profile: CTA start after the grid's first (us), p10 / p50 / p90 / max: %.2f %.2f %.2f %.2f\n",
               op, percentile(starts, 0.1), percentile(starts, 0.5), percentile(starts, 0.9), percentile(starts, 1.0));
  std::fprintf(stderr, "%s profile: us after the CTA's start, p10 / p50 / p90 / max over CTAs\n", op);
  for (int m = 1; m < kMarks; ++m) {
    const std::vector<double>& v = after[size_t(m)];
    std::fprintf(stderr, "  %-13s %8.2f %8.2f %8.2f %8.2f\n", mark_name(m), percentile(v, 0.1), percentile(v, 0.5),
                 percentile(v, 0.9), percentile(v, 1.0));
  }
  const CtaRecord& b = h[size_t(longest)];
  std::fprintf(stderr, "%s profile: the longest CTA (%d, SM %u, %u splits, %u pages in its first):", op, longest, b.sm,
               b.splits, b.first_pages);
  for (int m = 1; m < kMarks; ++m)
    std::fprintf(stderr, " %s %.2f", mark_name(m), b.ns[m] ? double(b.ns[m] - b.ns[0]) / 1e3 : -1.0);
  std::fprintf(stderr, " us\n");
}

}  // namespace
}  // namespace snapmla::cuda::profile

#define SNAPMLA_MARK(m) ::snapmla::cuda::profile::mark(::snapmla::cuda::profile::Mark::m)
#define SNAPMLA_NOTE_WORK(splits, pages) ::snapmla::cuda::profile::note_work(splits, pages)
#define SNAPMLA_NOTE_SPLIT(pages) ::snapmla::cuda::profile::note_split(pages)
#else
namespace snapmla::cuda::profile {
namespace {
inline void before_launch() {}
inline void after_launch(const char*) {}
}  // namespace
}  // namespace snapmla::cuda::profile

#define SNAPMLA_MARK(m) \
  do {                  \
  } while (0)
#define SNAPMLA_NOTE_WORK(splits, pages) \
  do {                                   \
  } while (0)
#define SNAPMLA_NOTE_SPLIT(pages) \
  do {                            \
  } while (0)
#endif
