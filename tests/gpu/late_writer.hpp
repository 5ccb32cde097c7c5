// A test kernel for the programmatic launches: it lets its dependent grid start at once
// (griddepcontrol.launch_dependents as its first instruction), then waits `delay_us` on the
// global timer before it writes anything. A kernel launched after it as a programmatic dependent
// (SNAPMLA_DECODE_PDL=1) therefore runs beside it for that long, and reads what was there before
// these copies unless it waits for this grid (griddepcontrol.wait) before its first read.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace snapmla::test {

struct LateCopy {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;  // a multiple of 4, both pointers 4-byte aligned
};

inline constexpr int kMaxLateCopies = 8;

// Copies copies[0..count) (count <= kMaxLateCopies) after the delay, on `stream`.
void late_copies_async(const LateCopy* copies, int count, unsigned delay_us, cudaStream_t stream);

}  // namespace snapmla::test
