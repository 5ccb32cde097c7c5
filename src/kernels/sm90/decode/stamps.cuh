// Profiling aid (not built unless SNAPMLA_STAMPS is defined): clock64 stamps of chosen threads
// in grid item 0, pairs kStampFirst .. kStampFirst + kStampPairs - 1, copied out by the host
// function on its 8th call and printed to stderr.
#pragma once
#include <cstdio>
#include <cuda_runtime.h>

namespace snapmla::cuda {
#ifdef SNAPMLA_STAMPS
constexpr int kStampFirst = 20, kStampPairs = 6, kStampSlots = 20, kStampRoles = 4;
__device__ long long g_stamps[kStampRoles][kStampPairs][kStampSlots];
#define STAMP(role, k, slot)                                                                   \
  do {                                                                                         \
    if (blockIdx.x == 0 && (k) >= kStampFirst && (k) < kStampFirst + kStampPairs)              \
      g_stamps[role][(k) - kStampFirst][slot] = clock64();                                     \
  } while (0)
inline void dump_stamps(const char* op) {
  static int calls = 0;
  if (++calls != 8) return;
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
}
#else
#define STAMP(role, k, slot) \
  do {                       \
  } while (0)
inline void dump_stamps(const char*) {}
#endif
}  // namespace snapmla::cuda
