// decode_bf16, version 1: the baseline on the BF16 cache (FlashMLA's arithmetic: bf16 QK and
// PV with P rounded to bf16, fp32 accumulators), with the same structure, scheduler, softmax
// and combine as decode_fp8 so that speedups are measured against a like-for-like kernel:
// CTA = one split x 16 * RG rows, 4 warps per 16 rows splitting the 576 QK dims and the 512
// output dims in quarters, pages through a two-stage cp.async ring, V read with
// ldmatrix.trans (bf16 needs no explicit transpose).
#include <cuda_runtime.h>

#include "../common/check.cuh"
#include "../common/ptx.cuh"
#include "../kernels.hpp"
#include "decode/epilogue.cuh"
#include "decode/launch.hpp"
#include "decode/scheduler.cuh"
#include "decode/softmax.cuh"

namespace snapmla::cuda {
namespace {

constexpr int kRowStride = (kHeadDim + 8) * 2;  // bytes per token row in shared memory
constexpr int kStageBytes = kPageSize * kRowStride;
constexpr int kQuarter = kHeadDim / 4;           // 144 QK dims per warp
constexpr int kQkSteps = kQuarter / 16;          // 9

template <int RG>
constexpr int smem_bytes() {
  return 2 * kStageBytes + 4 * RG * 32 * 32 * 4;
}

__device__ __forceinline__ void load_page(const DecodeParams& p, const Work& w, int blk,
                                          uint8_t* stage, int* fault) {
  const int32_t page = p.block_table[int64_t(w.seq) * p.max_pages + blk / kPageSize];
  const bool page_ok = page >= 0 && page < p.num_pages;
  if (!page_ok && threadIdx.x == 0) *fault = 1;
  const int ntok = page_ok ? min(kPageSize, w.end - blk) : 0;
  const int64_t slot0 = int64_t(page_ok ? page : 0) * kPageSize;
  constexpr int kChunks = kHeadDim * 2 / 16;  // 72 per token
  for (int c = threadIdx.x; c < kPageSize * kChunks; c += blockDim.x) {
    const int tok = c / kChunks, part = c % kChunks;
    ptx::cp_async_16(stage + tok * kRowStride + part * 16,
                     reinterpret_cast<const uint8_t*>(p.kv_bf16 + (slot0 + tok) * kHeadDim) + part * 16,
                     tok < ntok);
  }
}

__device__ __forceinline__ uint32_t bf16x2(float lo, float hi) {
  return uint32_t(float_to_bf16_bits(lo)) | (uint32_t(float_to_bf16_bits(hi)) << 16);
}

template <int RG>
__global__ void __launch_bounds__(128 * RG, 1) decode_bf16_kernel(DecodeParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int fault;
  Work w;
  if (!find_work(p, blockIdx.x, w)) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int rg = warp / 4, cq = warp % 4;
  const int row0 = blockIdx.y * 16 * RG + rg * 16;
  float* xch = reinterpret_cast<float*>(smem + 2 * kStageBytes);
  if (threadIdx.x == 0) fault = 0;

  const int rows_[2] = {row0 + g, row0 + g + 8};
  uint32_t qb[kQkSteps][4];
  float factor[2];
  int vis[2];
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const bool ok = rows_[ri] < p.rows;
    const int64_t r = int64_t(w.seq) * p.rows + (ok ? rows_[ri] : 0);
    factor[ri] = p.softmax_scale;
    vis[ri] = ok ? visible_end(p, w, rows_[ri]) : 0;
    const uint16_t* qp = p.q_bf16 + r * kHeadDim + cq * kQuarter + 2 * q;
#pragma unroll
    for (int ks = 0; ks < kQkSteps; ++ks) {
      qb[ks][ri] = *reinterpret_cast<const uint32_t*>(qp + 16 * ks);
      qb[ks][ri + 2] = *reinterpret_cast<const uint32_t*>(qp + 16 * ks + 8);
    }
  }

  SoftmaxState st;
  float o[16][4];
#pragma unroll
  for (int n = 0; n < 16; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

  const int nblk = (w.end - w.begin + kPageSize - 1) / kPageSize;
  __syncthreads();
  if (nblk > 0) load_page(p, w, w.begin, smem, &fault);
  ptx::cp_async_commit();
  const int mat = lane / 8, mrow = lane % 8;
  for (int j = 0; j < nblk; ++j) {
    const int blk = w.begin + j * kPageSize;
    ptx::cp_async_wait<0>();
    __syncthreads();
    if (j + 1 < nblk) load_page(p, w, blk + kPageSize, smem + ((j + 1) & 1) * kStageBytes, &fault);
    ptx::cp_async_commit();
    const uint8_t* kv = smem + (j & 1) * kStageBytes;

    float s[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      const int tok = 16 * np + (mat >> 1) * 8 + mrow;
#pragma unroll
      for (int ks = 0; ks < kQkSteps; ++ks) {
        uint32_t b0, b1, b2, b3;
        ptx::ldmatrix_x4(b0, b1, b2, b3, kv + tok * kRowStride + (cq * kQuarter + 16 * ks + (mat & 1) * 8) * 2);
        ptx::mma_bf16_16816(s[2 * np], qb[ks], b0, b1);
        ptx::mma_bf16_16816(s[2 * np + 1], qb[ks], b2, b3);
      }
    }
    float* mine = xch + warp * 1024;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) mine[(n * 4 + e) * 32 + lane] = s[n][e];
    __syncthreads();
    const float* grp = xch + rg * 4 * 1024;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = (n * 4 + e) * 32 + lane;
        s[n][e] = ((grp[i] + grp[1024 + i]) + grp[2048 + i]) + grp[3072 + i];
      }

    float rescale[2];
    softmax_block<false>(st, s, factor, vis, blk, nullptr, q, rescale);
#pragma unroll
    for (int n = 0; n < 16; ++n) {
      o[n][0] *= rescale[0];
      o[n][1] *= rescale[0];
      o[n][2] *= rescale[1];
      o[n][3] *= rescale[1];
    }
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const uint32_t pa[4] = {bf16x2(s[2 * ks][0], s[2 * ks][1]), bf16x2(s[2 * ks][2], s[2 * ks][3]),
                              bf16x2(s[2 * ks + 1][0], s[2 * ks + 1][1]),
                              bf16x2(s[2 * ks + 1][2], s[2 * ks + 1][3])};
      const int tok = 16 * ks + (mat & 1) * 8 + mrow;
#pragma unroll
      for (int np = 0; np < 8; ++np) {
        uint32_t b0, b1, b2, b3;
        ptx::ldmatrix_x4_trans(b0, b1, b2, b3,
                               kv + tok * kRowStride + (cq * 128 + 16 * np + (mat >> 1) * 8) * 2);
        ptx::mma_bf16_16816(o[2 * np], pa, b0, b1);
        ptx::mma_bf16_16816(o[2 * np + 1], pa, b2, b3);
      }
    }
  }
  __syncthreads();
  write_rows<false>(p, w, st, o, row0, cq * 128, lane, cq == 0, fault != 0);
}

template <int RG>
void launch(const DecodeParams& p, int grid_x, cudaStream_t stream) {
  constexpr int bytes = smem_bytes<RG>();
  check(cudaFuncSetAttribute(decode_bf16_kernel<RG>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
        "cudaFuncSetAttribute(decode_bf16_kernel)");
  const dim3 grid(grid_x, (p.rows + 16 * RG - 1) / (16 * RG));
  decode_bf16_kernel<RG><<<grid, 128 * RG, bytes, stream>>>(p);
  check_launch("decode_bf16_kernel");
}

}  // namespace

void decode_bf16(const QueryBf16& q, const PagedBf16Cache& cache, const PageTable& pages,
                 const DecodeOutput& out, const DecodeOptions& options) {
  DecodeParams p = make_params("decode_bf16", q.batch, q.seqlen_q, q.num_heads, pages, out, options);
  if (q.batch == 0) return;
  p.q_bf16 = reinterpret_cast<const uint16_t*>(q.data);
  p.kv_bf16 = reinterpret_cast<const uint16_t*>(cache.data);
  p.num_pages = cache.num_pages;
  const cudaStream_t stream = as_stream(options.stream);
  const int grid_x = options.plan ? options.plan->capacity : p.batch;
  if (p.rows % 32 == 0) launch<2>(p, grid_x, stream); else launch<1>(p, grid_x, stream);
  if (options.plan) combine(combine_params(p), stream);
}

}  // namespace snapmla::cuda
