// The TMA unit's copies into shared memory, each completing on an mbarrier (mbarrier.cuh): 2-D
// tensor boxes through a tensor map, and plain bulk copies of contiguous bytes; and the same
// reads as L2 prefetches (no destination, no completion: a hint).
#pragma once

#include <cstdint>

#include "kernels/common/ptx.cuh"

namespace snapmla::cuda::tma {

// A 2-D box of `tmap` at (x, y) into shared memory, completing on `bar`.
__device__ __forceinline__ void load_2d(void* dst, const void* tmap, int x, int y, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          ptx::smem_addr(dst)),
      "l"(tmap), "r"(x), "r"(y), "r"(ptx::smem_addr(bar))
      : "memory");
}
// Fetches a tensor map (a __grid_constant__ kernel parameter) into the descriptor cache, so
// that the first copy does not wait for it.
__device__ __forceinline__ void prefetch_map(const void* tmap) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
}
// Bulk copy of `bytes` contiguous bytes (a multiple of 16, both ends 16-byte aligned).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   ptx::smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(ptx::smem_addr(bar))
               : "memory");
}

// load_2d's box as an L2 prefetch: no destination, no completion.
__device__ __forceinline__ void prefetch_2d(const void* tmap, int x, int y) {
  asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];\n" ::"l"(tmap), "r"(x), "r"(y)
               : "memory");
}
// bulk_load's bytes as an L2 prefetch (a multiple of 16, 16-byte aligned).
__device__ __forceinline__ void bulk_prefetch(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}

}  // namespace snapmla::cuda::tma
