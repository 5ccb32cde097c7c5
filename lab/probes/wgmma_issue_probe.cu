// How long does issuing a batch of wgmmas hold the issuing warpgroup? (docs/archive/kernel_history.md,
// and Next 18.)
//
// One warpgroup issues N chained wgmmas (FP8 m64n64k32 from shared memory, the QK's instruction,
// 32 tensor cycles each; or m64n256k32, the PV's, 128 each), commits, and waits; thread 0 reads
// clock64 before the first instruction goes out, after the commit, and after the wait. If issuing
// were asynchronous the first interval would stay flat as N grows; if the warp is held until the tensor
// pipe takes each instruction, it grows with N past the pipe's queue. Mode 1 runs a second
// warpgroup that keeps the pipe busy with 64 wgmmas of its own at the same time (as the other
// consumer does in decode_fp8). Operands are zeros: the timing does not depend on the values.
//
// Build (sm_90a) and run on the GPU machine:
//   nvcc -O2 -std=c++20 -gencode arch=compute_90a,code=sm_90a -cudart static -I src \
//        -o wgmma_issue_probe lab/probes/wgmma_issue_probe.cu
//   ./wgmma_issue_probe
#include <cuda_runtime.h>

#include <cstdio>

#include "kernels/common/wgmma.cuh"
#include "probe_clock.cuh"

namespace {

namespace wg = snapmla::cuda::wg;

template <int N, bool kWide>
__device__ __forceinline__ void batch(float (&s)[8][4], float (&o)[32][4], uint64_t a, uint64_t b, long long* t) {
  wg::fence_operands(s);
  wg::fence_operands(o);
  const long long t0 = clock_now();
  wg::fence();
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if constexpr (kWide) wg::mma_64x256x32_e4m3_ss(o, a, b);
    else wg::mma_64x64x32_e4m3_ss(s, a, b);
  }
  wg::commit();
  const long long t1 = clock_now();
  wg::wait<0>();
  wg::fence_operands(s);
  wg::fence_operands(o);
  const long long t2 = clock_now();
  t[0] = t1 - t0;
  t[1] = t2 - t0;
}

// results[mode][case][issue, total]; cases: m64n64 x 1, 2, 4, 8, 16, 32, m64n256 x 1, 2, 4.
constexpr int kCases = 9;

__global__ void probe(long long* results, int mode) {
  extern __shared__ __align__(1024) uint8_t smem[];
  for (int i = threadIdx.x; i < 64 * 1024; i += blockDim.x) smem[i] = 0;
  __syncthreads();
  float s[8][4], o[32][4];
  for (int n = 0; n < 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
  for (int n = 0; n < 32; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  const uint64_t a = wg::desc(smem, 128, 512), b = wg::desc(smem + 32 * 1024, 128, 512);
  const int w = threadIdx.x / 128;
  long long t[kCases][2] = {};
  for (int rep = 0; rep < 4; ++rep) {  // the last repetition is kept (warm instruction cache)
    __syncthreads();
    if (w == 1) {  // mode 1: the other warpgroup keeps the tensor pipe busy meanwhile
      long long dummy[2];
      batch<64, false>(s, o, a, b, dummy);
      continue;
    }
    batch<1, false>(s, o, a, b, t[0]);
    batch<2, false>(s, o, a, b, t[1]);
    batch<4, false>(s, o, a, b, t[2]);
    batch<8, false>(s, o, a, b, t[3]);
    batch<16, false>(s, o, a, b, t[4]);
    batch<32, false>(s, o, a, b, t[5]);
    batch<1, true>(s, o, a, b, t[6]);
    batch<2, true>(s, o, a, b, t[7]);
    batch<4, true>(s, o, a, b, t[8]);
  }
  if (threadIdx.x == 0)
    for (int c = 0; c < kCases; ++c) {
      results[(mode * kCases + c) * 2] = t[c][0];
      results[(mode * kCases + c) * 2 + 1] = t[c][1];
    }
  // Keep the accumulators alive.
  if (s[0][0] != 0.f || o[0][0] != 0.f) results[0] = -1;
}

}  // namespace

int main() {
  long long* d = nullptr;
  cudaMalloc(&d, 2 * kCases * 2 * sizeof(long long));
  cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024);
  probe<<<1, 128, 64 * 1024>>>(d, 0);
  probe<<<1, 256, 64 * 1024>>>(d, 1);
  long long h[2 * kCases * 2];
  if (cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost) != cudaSuccess) {
    std::printf("probe failed: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 1;
  }
  const char* names[kCases] = {"m64n64k32 x1",  "m64n64k32 x2",   "m64n64k32 x4",   "m64n64k32 x8",  "m64n64k32 x16",
                               "m64n64k32 x32", "m64n256k32 x1", "m64n256k32 x2", "m64n256k32 x4"};
  std::printf("%-16s | %24s | %24s\n", "batch", "alone: issue / total", "beside 64 others: issue / total");
  for (int c = 0; c < kCases; ++c)
    std::printf("%-16s | %11lld / %10lld | %11lld / %10lld\n", names[c], h[c * 2], h[c * 2 + 1], h[(kCases + c) * 2],
                h[(kCases + c) * 2 + 1]);
  return 0;
}
