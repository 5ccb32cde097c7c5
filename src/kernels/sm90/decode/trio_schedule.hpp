// The three-consumer tile's page bookkeeping (decode_fp8_trio.cu), as plain index functions that
// the kernel and the CPU tests (tests/test_layouts.cpp) share. Consumer c's iteration k is over its
// page j = 3 k + c and touches pages j - 2 .. j + 1. A page's owner and its V^T slot are both
// page mod 3, and its V^T slot's full phase is page / 3, so for page j + d they are c + d and
// k + (c + d) / 3 with c + d in -2 .. 4: a compare and a select each, where the direct forms would
// be an integer division per use in the loop (~60 instructions per iteration in the SASS).
#pragma once

#if defined(__CUDACC__)
#define SNAPMLA_TRIO_FN __host__ __device__ constexpr inline
#else
#define SNAPMLA_TRIO_FN constexpr inline
#endif

namespace snapmla::cuda::trio {

// x mod 3 and floor(x / 3), for -3 <= x < 6.
SNAPMLA_TRIO_FN int mod3(int x) { return x < 0 ? x + 3 : x >= 3 ? x - 3 : x; }
SNAPMLA_TRIO_FN int floor_div3(int x) { return x < 0 ? -1 : x >= 3 ? 1 : 0; }

// Page j + d of consumer c's iteration k (d in -2 .. 1, the page at least 0): its V^T slot (also
// its owner) and the parity of the slot's full phase for it.
struct PageSlot {
  int slot, parity;
};
SNAPMLA_TRIO_FN PageSlot page_slot(int c, int k, int d) { return {mod3(c + d), (k + floor_div3(c + d)) & 1}; }

// The consumer that takes page j + d's P' slot next: the owner of page j + d + 2 (d in -2 .. 0).
SNAPMLA_TRIO_FN int slot_taker(int c, int d) { return mod3(c + d + 2); }

}  // namespace snapmla::cuda::trio
