// mbarriers: the async pipelines' barriers (the TMA / bulk copies of tma.cuh and cp.async
// complete on them; consumers release stages by arriving). All on shared-memory mbarriers of
// this CTA.
#pragma once

#include <cstdint>

#include "kernels/common/ptx.cuh"

namespace snapmla::cuda::mbar {

__device__ __forceinline__ void init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(ptx::smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(ptx::smem_addr(bar)) : "memory");
}
// Arrives on `bar` when all of this thread's earlier cp.async copies have landed.
__device__ __forceinline__ void arrive_on_cp_async(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(ptx::smem_addr(bar)) : "memory");
}
// Arrive and add `bytes` to the transaction count the current phase waits for (TMA).
__device__ __forceinline__ void arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(ptx::smem_addr(bar)), "r"(bytes)
               : "memory");
}
// Waits for the phase `parity` of `bar` to complete.
__device__ __forceinline__ void wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(ptx::smem_addr(bar)),
      "r"(parity)
      : "memory");
}

}  // namespace snapmla::cuda::mbar
