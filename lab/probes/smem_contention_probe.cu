// How slow do a warpgroup's shared-memory reads and shuffles get while another warpgroup's
// wgmmas read their operands from shared memory? (docs/archive/kernel_history.md.)
//
// decode_fp8's stamps show the softmax's probabilities taking ~1000 cycles when they run beside
// the other consumer's PVs and ~1600 beside its QK, and the output rescale (one 8-byte load of the
// page's factors, then 128 multiplies) ~230 cycles or ~1000. The QK's 16 FP8 m64n64k32 with both
// operands in shared memory read 4 KB per 32 tensor cycles, the whole 128 bytes per clock of the
// shared-memory pipe. This probe isolates that: warpgroup 0 times chains of dependent 4-byte
// shared loads, groups of eight independent 8-byte loads (the softmax's per-page scale loads),
// dependent shuffles and dependent multiplies (the control), while warpgroup 1 does nothing, runs
// QK-like batches (16 x m64n64k32, A and B from shared memory), the same with A from registers
// (half the operand bytes), or PV-like batches (2 x m64n256k32 from shared memory). Operands are
// zeros: the timing does not depend on the values.
//
// Build (sm_90a) and run on the GPU machine:
//   nvcc -O2 -std=c++20 -gencode arch=compute_90a,code=sm_90a -cudart static -I src \
//        -o smem_contention_probe lab/probes/smem_contention_probe.cu
//   ./smem_contention_probe
#include <cuda_runtime.h>

#include <cstdio>

#include "kernels/common/wgmma.cuh"
#include "probe_clock.cuh"

namespace {

namespace wg = snapmla::cuda::wg;

// S[64 x 64] += A[64 x 32] * B[32 x 64], e4m3, A from registers (the QK with Q held in registers).
__device__ __forceinline__ void mma_64x64x32_e4m3_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

constexpr int kSmem = 96 * 1024;  // A tile 32 KB, B tile 32 KB, the load chains' words 32 KB
constexpr int kBatches = 400;     // warpgroup 1's batches: longer than warpgroup 0's timings
enum Mode { kIdle, kQkSS, kQkRS, kPvSS, kModes };
constexpr int kTests = 4;  // dependent LDS, 8 x LDS.64 groups, dependent SHFL, dependent FMUL

// Warpgroup 1's work: kBatches batches of one kind, each committed and waited for.
template <int kMode>
__device__ __forceinline__ void run_batches(uint8_t* smem, long long* results) {
  const uint64_t a = wg::desc(smem, 128, 512), b = wg::desc(smem + 32 * 1024, 128, 512);
  constexpr int kN = kMode == kPvSS ? 32 : 8;  // accumulator n-tiles: 64 x 256 or 64 x 64
  float d[kN][4];
  for (int n = 0; n < kN; ++n) d[n][0] = d[n][1] = d[n][2] = d[n][3] = 0.f;
  const uint32_t ra[4] = {0u, 0u, 0u, 0u};
#pragma unroll 1
  for (int it = 0; it < kBatches; ++it) {
    wg::fence_operands(d);
    wg::fence();
    if constexpr (kMode == kPvSS) {
      wg::mma_64x256x32_e4m3_ss(d, a, b);
      wg::mma_64x256x32_e4m3_ss(d, wg::desc_add(a, 256), wg::desc_add(b, 256));
    } else {
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        if constexpr (kMode == kQkSS) wg::mma_64x64x32_e4m3_ss(d, wg::desc_add(a, 32 * k), wg::desc_add(b, 32 * k));
        else mma_64x64x32_e4m3_rs(d, ra, wg::desc_add(b, 32 * k));
      }
    }
    wg::commit();
    wg::wait<0>();
    wg::fence_operands(d);
  }
  if (d[0][0] != 0.f) results[0] = -1;  // keep the accumulator alive
}

__global__ void probe(long long* results, int mode) {
  extern __shared__ __align__(1024) uint8_t smem[];
  uint32_t* words = reinterpret_cast<uint32_t*>(smem + 64 * 1024);  // 8192 words
  for (int i = threadIdx.x; i < 64 * 1024; i += blockDim.x) smem[i] = 0;
  // A pointer chase: word i holds the index of the next one, 97 words on (a different bank).
  for (int i = threadIdx.x; i < 8192; i += blockDim.x) words[i] = (i + 97) % 8192;
  __syncthreads();
  const int w = threadIdx.x / 128;
  if (w == 1) {
    if (mode == kQkSS) run_batches<kQkSS>(smem, results);
    else if (mode == kQkRS) run_batches<kQkRS>(smem, results);
    else if (mode == kPvSS) run_batches<kPvSS>(smem, results);
    return;
  }
  // Warpgroup 0: let warpgroup 1's wgmmas get going, then time each test (all 128 threads run it).
  const long long start = clock_now();
  while (clock_now() - start < 2000) {
  }
  long long t[kTests];
  {  // 64 dependent 4-byte loads
    uint32_t idx = threadIdx.x * 31 % 8192;
    const long long t0 = clock_now();
#pragma unroll 1
    for (int i = 0; i < 64; ++i) idx = words[idx];
    t[0] = clock_now() - t0;
    if (idx == 0xFFFFFFFFu) results[1] = -1;
  }
  {  // 16 groups of 8 independent 8-byte loads, each group summed before the next (a page's scales)
    float acc = 0.f;
    const float2* f = reinterpret_cast<const float2*>(words);
    const int q = threadIdx.x % 4;
    const long long t0 = clock_now();
#pragma unroll 1
    for (int g = 0; g < 16; ++g) {
      float2 v[8];
      const int base = (g * 64 + int(acc)) % 4096;  // depends on the previous group
#pragma unroll
      for (int n = 0; n < 8; ++n) v[n] = f[(base + 4 * n + q) % 4096];
#pragma unroll
      for (int n = 0; n < 8; ++n) acc += v[n].x + v[n].y;
      acc *= 1e-30f;
    }
    t[1] = clock_now() - t0;
    if (acc == 1.f) results[1] = -1;
  }
  {  // 64 dependent shuffles
    float v = float(threadIdx.x);
    const long long t0 = clock_now();
#pragma unroll 1
    for (int i = 0; i < 64; ++i) v = __shfl_xor_sync(0xffffffffu, v, 1 + (i & 1));
    t[2] = clock_now() - t0;
    if (v == -1.f) results[1] = -1;
  }
  {  // 64 dependent multiplies (the control)
    float v = 1.f + float(threadIdx.x) * 1e-9f;
    const long long t0 = clock_now();
#pragma unroll 1
    for (int i = 0; i < 64; ++i) v *= 1.0000001f;
    t[3] = clock_now() - t0;
    if (v == -1.f) results[1] = -1;
  }
  if (threadIdx.x == 0)
    for (int k = 0; k < kTests; ++k) results[2 + mode * kTests + k] = t[k];
}

}  // namespace

int main() {
  long long* d = nullptr;
  cudaMalloc(&d, (2 + kModes * kTests) * sizeof(long long));
  cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  long long h[2 + kModes * kTests];
  for (int rep = 0; rep < 2; ++rep) {  // the second repetition is printed (warm instruction cache)
    for (int m = 0; m < kModes; ++m) probe<<<1, 256, kSmem>>>(d, m);
    if (cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost) != cudaSuccess) {
      std::printf("probe failed: %s\n", cudaGetErrorString(cudaGetLastError()));
      return 1;
    }
  }
  const char* modes[kModes] = {"other warpgroup idle", "QK: 16 m64n64k32 SS", "QK: 16 m64n64k32 RS",
                               "PV: 2 m64n256k32 SS"};
  std::printf("cycles per operation, warpgroup 0, while warpgroup 1 runs ...\n");
  std::printf("%-22s | %12s | %16s | %12s | %12s\n", "", "dep. LDS.32", "8 x LDS.64 group", "dep. SHFL",
              "dep. FMUL");
  for (int m = 0; m < kModes; ++m)
    std::printf("%-22s | %12.1f | %16.1f | %12.1f | %12.1f\n", modes[m], h[2 + m * kTests] / 64.0,
                h[2 + m * kTests + 1] / 16.0, h[2 + m * kTests + 2] / 64.0, h[2 + m * kTests + 3] / 64.0);
  return 0;
}
