// The probes' timer: the SM's cycle counter, read as an ordered point in the instruction stream
// (the "memory" clobber keeps the compiler from moving loads and stores across the read).
#pragma once

__device__ __forceinline__ long long clock_now() {
  long long t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
  return t;
}
