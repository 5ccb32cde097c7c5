// Profiling aid (not built unless SNAPMLA_STAMPS is defined): clock64 stamps of chosen threads
// in grid item 0, pairs kStampFirst .. kStampFirst + kStampPairs - 1, and every CTA's start and
// end (global timer ns and clock64) and SM, copied out by the host function on its 8th call (or
// the SNAPMLA_STAMP_CALL-th: late calls of a long run see the clock the power limit leaves) and
// printed to stderr (the CTA times as a summary: how long CTAs take, how they fill the SMs, and the
// SM clock they ran at, clock64 cycles over global-timer time).
#pragma once
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>

namespace snapmla::cuda {
#ifdef SNAPMLA_STAMPS
constexpr int kStampFirst = 20, kStampPairs = 6, kStampSlots = 20, kStampRoles = 4;
__device__ long long g_stamps[kStampRoles][kStampPairs][kStampSlots];
constexpr int kMaxCtaStamps = 1 << 15;
__device__ unsigned long long g_cta[kMaxCtaStamps][5];  // start ns, end ns, SM, start and end clock64
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// slot 0: the CTA starts (thread 0), 1: it is done (the thread that calls it last).
#define CTA_STAMP(slot)                                                                        \
  do {                                                                                         \
    if (blockIdx.x < kMaxCtaStamps) {                                                          \
      g_cta[blockIdx.x][slot] = global_ns();                                                   \
      g_cta[blockIdx.x][3 + (slot)] = clock64();                                               \
      if ((slot) == 0) {                                                                       \
        unsigned sm;                                                                           \
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));                                        \
        g_cta[blockIdx.x][2] = sm;                                                             \
      }                                                                                        \
    }                                                                                          \
  } while (0)
inline void dump_cta_times(const char* op) {
  std::vector<unsigned long long> h(size_t(kMaxCtaStamps) * 5);
  cudaMemcpyFromSymbol(h.data(), g_cta, h.size() * sizeof(h[0]));
  unsigned long long t0 = ~0ull, t1 = 0;
  std::vector<double> dur, mhz;
  std::vector<double> busy(1024, 0.0);
  std::vector<int> count(1024, 0);
  for (int i = 0; i < kMaxCtaStamps; ++i) {
    const unsigned long long* c = &h[size_t(i) * 5];
    if (c[0] == 0 || c[1] < c[0]) continue;
    t0 = std::min(t0, c[0]);
    t1 = std::max(t1, c[1]);
    dur.push_back(double(c[1] - c[0]) / 1e3);
    mhz.push_back(double(c[4] - c[3]) / double(c[1] - c[0]) * 1e3);
    busy[c[2] % 1024] += double(c[1] - c[0]) / 1e3;
    count[c[2] % 1024]++;
  }
  if (dur.empty()) return;
  std::vector<double> sorted = dur;
  std::sort(sorted.begin(), sorted.end());
  auto pct = [&](double f) { return sorted[size_t(f * double(sorted.size() - 1))]; };
  const double span = double(t1 - t0) / 1e3;
  int sms = 0, cmin = 1 << 30, cmax = 0;
  double bmin = 1e30, bmax = 0, bsum = 0;
  for (int s = 0; s < 1024; ++s)
    if (count[s] > 0) {
      ++sms;
      cmin = std::min(cmin, count[s]);
      cmax = std::max(cmax, count[s]);
      bmin = std::min(bmin, busy[s]);
      bmax = std::max(bmax, busy[s]);
      bsum += busy[s];
    }
  std::sort(mhz.begin(), mhz.end());
  std::fprintf(stderr, "%s SM clock during CTAs (MHz) p10/50/90 %.0f %.0f %.0f\n", op, mhz[mhz.size() / 10],
               mhz[mhz.size() / 2], mhz[mhz.size() * 9 / 10]);
  std::fprintf(stderr,
               "%s ctas: %zu on %d SMs (%d-%d each), span %.1f us; CTA us p0/10/50/90/100 %.1f %.1f %.1f %.1f "
               "%.1f; SM busy us min/mean/max %.1f %.1f %.1f\n",
               op, dur.size(), sms, cmin, cmax, span, pct(0), pct(0.1), pct(0.5), pct(0.9), pct(1), bmin,
               bsum / sms, bmax);
}
#define STAMP(role, k, slot)                                                                   \
  do {                                                                                         \
    if (blockIdx.x == 0 && (k) >= kStampFirst && (k) < kStampFirst + kStampPairs)              \
      g_stamps[role][(k) - kStampFirst][slot] = clock64();                                     \
  } while (0)
inline void dump_stamps(const char* op) {
  static int calls = 0;
  static const int at = std::getenv("SNAPMLA_STAMP_CALL") ? std::atoi(std::getenv("SNAPMLA_STAMP_CALL")) : 8;
  ++calls;
  if (calls == at - 1) {  // the stamped call's CTAs start from a clean table
    cudaDeviceSynchronize();
    static std::vector<unsigned long long> zero(size_t(kMaxCtaStamps) * 5, 0);
    cudaMemcpyToSymbol(g_cta, zero.data(), zero.size() * sizeof(zero[0]));
  }
  if (calls != at) return;
  long long h[kStampRoles][kStampPairs][kStampSlots];
  cudaDeviceSynchronize();
  cudaMemcpyFromSymbol(h, g_stamps, sizeof(h));
  long long base = h[0][0][0];
  for (int r = 0; r < kStampRoles; ++r)
    for (int k = 0; k < kStampPairs; ++k) {
      std::fprintf(stderr, "%s role %d pair %d:", op, r, k);
      for (int s = 0; s < kStampSlots; ++s)
        std::fprintf(stderr, " %6lld", h[r][k][s] ? h[r][k][s] - base : -1LL);
      std::fprintf(stderr, "\n");
    }
  dump_cta_times(op);
}
#else
#define CTA_STAMP(slot) \
  do {                  \
  } while (0)
#define STAMP(role, k, slot) \
  do {                       \
  } while (0)
inline void dump_stamps(const char*) {}
#endif
}  // namespace snapmla::cuda
