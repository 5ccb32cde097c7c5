// Thin wrappers over the PTX the kernels use besides wgmma (wgmma.cuh), the mbarriers
// (mbarrier.cuh) and the TMA (tma.cuh): cp.async with zero-fill, ldmatrix / stmatrix, byte
// permutes, shared stores, named barriers, setmaxnreg, the grid dependency wait and L1 prefetches.
#pragma once

#include <cstdint>

namespace snapmla::cuda::ptx {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; when !valid the destination is zero-filled and the
// source is not read. Completion is tracked with cp.async.mbarrier.arrive (wgmma.cuh).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)),
               "l"(gmem), "r"(valid ? 16 : 0));
}

// A hint: the 128-byte line holding gmem into this SM's L1 (and L2), no destination, no wait.
// A later ordinary load of the line then hits L1.
__device__ __forceinline__ void prefetch_l1(const void* gmem) {
  asm volatile("prefetch.global.L1 [%0];\n" ::"l"(gmem));
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// Four 8x8 b16 matrices from shared memory, transposed: lanes 8m..8m+7 give matrix m's row
// addresses (16 B each); lane 4c + q receives rows 2q, 2q + 1 of column c of each matrix.
__device__ __forceinline__ void ldsm_x4_trans(const void* smem, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem)));
}

// Four 8x8 b16 matrices to shared memory: lanes 8m..8m+7 give matrix m's row addresses (16 B
// each); register m of lane 4c + q holds columns 2q, 2q + 1 of matrix m's row c.
__device__ __forceinline__ void stsm_x4(void* smem, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr(smem)), "r"(a),
               "r"(b), "r"(c), "r"(d)
               : "memory");
}

__device__ __forceinline__ void sts32(void* smem, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(smem_addr(smem)), "r"(v) : "memory");
}

// Named barrier over `threads` threads (a multiple of 32). The memory clobber keeps the
// compiler from moving shared-memory accesses across it (the exchanges rely on that).
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrive on named barrier `id` without waiting (the producer side of a producer / consumer
// hand-off: the consumers bar.sync on the same id and count).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// A named barrier with the id and count as immediates.
template <int kId, int kThreads>
__device__ __forceinline__ void bar_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}

// The same over threads that need not arrive converged within their warps (barrier.sync without
// .aligned; bar.sync is barrier.sync.aligned, which requires every thread of a warp at the same
// instruction): for the barrier between a persistent CTA's splits, where each role arrives from
// its own loop and synccheck flagged the aligned form as divergent.
template <int kId, int kThreads>
__device__ __forceinline__ void barrier_sync_unaligned() {
  asm volatile("barrier.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}

// Moves registers between the warpgroups of the CTA (within its launch allocation).
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// A counter in global memory read with acquire semantics at GPU scope: the writes other CTAs made
// before their release (a fence, then an atomic on the counter) are visible after it.
__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The GPU's global nanosecond timer.
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

// A grid launched as a programmatic dependent (cudaLaunchAttributeProgrammaticStreamSerialization)
// may start before the grid it follows has finished: this waits until that grid has completed and
// its memory is visible. A no-op for a grid launched the ordinary way.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets the grid launched after this one as its programmatic dependent start once every CTA of this
// grid has executed this (or exited): its blocks then wait in grid_dependency_wait, so its launch
// latency overlaps this grid's work instead of following it. A no-op without such a dependent.
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace snapmla::cuda::ptx
