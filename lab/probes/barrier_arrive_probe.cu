// Does compute-sanitizer racecheck model a bar.arrive -> bar.sync hand-off as
// ordering the arriving thread's earlier reads? (docs/archive/kernel_history.md,
// and Next 14.)
//
// A copy of decode_fp8's (64-row tile) hand-off protocol between its two
// consumer warpgroups, without the wgmma work: the owner of page j (j % 2 == c)
// publishes xs[j % 2] and arrives on P(c); the other syncs P(c), reads xs[j %
// 2], and afterwards signals on Free(c) that the slot may take page j + 2,
// which the owner syncs on before overwriting it. The running-max slots (xm,
// barrier Max) follow the kernel too. Mode 0 signals Free with bar.arrive (as
// the kernel does), mode 1 with bar.sync. Every read is checked against the
// value its page should have.
//
// Build (sm_90a, as the kernels) and run on the GPU machine:
//   nvcc -O2 -gencode arch=compute_90a,code=sm_90a -cudart static -o
//   barrier_arrive_probe \
//        lab/probes/barrier_arrive_probe.cu
//   compute-sanitizer --tool racecheck ./barrier_arrive_probe 0   # hazards
//   reported compute-sanitizer --tool racecheck ./barrier_arrive_probe 1   #
//   none
// Measured on the H200 (2026-11-30): mode 0 - racecheck reports hazards, 0 wrong
// reads; mode 1 - 0 hazards, 0 wrong reads; at 2, 3, 8 and 33 pages.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace {

__device__ __forceinline__ void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Barrier ids as in decode_fp8.cu: base + the consumer that owns the page.
constexpr int kBarMax = 2, kBarP = 4, kBarFree = 6, kBarOwn0 = 8;

__global__ void probe(int nblk, int *wrong, int mode) {
  __shared__ float xs[2][128]; // the (sigma, rho) slots: page j in slot j % 2
  __shared__ float xm[2][128]; // the running-max slots
  const int c = threadIdx.x / 128, t = threadIdx.x % 128;
  float sum = 0.f;
  for (int j = c; j <= nblk; j += 2) {
    const bool mine = j < nblk;
    if (mine) {
      float m_prev = 0.f;
      if (j > 0) {
        bar_sync(kBarMax + 1 - c, 256);
        m_prev = xm[(j - 1) % 2][t];
      }
      xm[j % 2][t] = m_prev + 1.f;
      if (j + 1 < nblk)
        bar_arrive(kBarMax + c, 256);
      if (j >= 2)
        bar_sync(kBarFree + c, 256); // the other has read page j - 2's slot
      xs[j % 2][t] = float(j);
      bar_arrive(kBarP + c, 256);
    }
    if (j > 0) {
      bar_sync(kBarP + 1 - c, 256);
      const float v = xs[(j - 1) % 2][t];
      if (v != float(j - 1))
        atomicAdd(wrong, 1);
      sum += v;
      if (j + 1 < nblk) { // page j + 1 (the other's) may take the slot
        if (mode == 0)
          bar_arrive(kBarFree + 1 - c, 256);
        else
          bar_sync(kBarFree + 1 - c, 256);
      }
    }
    if (mine && j == 0)
      bar_sync(kBarOwn0, 128);
  }
  bar_sync(1, 256);
  if (sum < 0.f)
    atomicAdd(wrong, 1); // keeps the reads
}

} // namespace

int main(int argc, char **argv) {
  const int only = argc > 1 ? std::atoi(argv[1]) : -1;
  int *wrong = nullptr;
  if (cudaMalloc(&wrong, sizeof(int)) != cudaSuccess) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  int status = 0;
  for (int mode = 0; mode < 2; ++mode) {
    if (only >= 0 && mode != only)
      continue;
    for (const int n : {2, 3, 8, 33}) {
      cudaMemset(wrong, 0, sizeof(int));
      probe<<<4, 256>>>(n, wrong, mode);
      const cudaError_t e = cudaDeviceSynchronize();
      int h = -1;
      cudaMemcpy(&h, wrong, sizeof(int), cudaMemcpyDeviceToHost);
      std::printf("mode %s, %d pages: %s, wrong reads %d\n",
                  mode ? "bar.sync" : "bar.arrive", n, cudaGetErrorString(e),
                  h);
      if (e != cudaSuccess || h != 0)
        status = 1;
    }
  }
  cudaFree(wrong);
  return status;
}
