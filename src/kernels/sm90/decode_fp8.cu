// decode_fp8, version 1: SnapMLA decoding on the FP8 cache with warp-level FP8 tensor-core MMAs
// (mma.sync m16n8k32 e4m3 for QK and PV, m16n8k16 bf16 for the rope part of QK, all into fp32).
//
// CTA = one split of one sequence x 16 * RG query rows. Each row group of 16 rows has 4 warps,
// one per quarter of the dimensions: a warp computes the QK partial over its 128 latent + 16
// rope dims, the four partials are summed through shared memory (in a fixed order, so all four
// warps hold bit-identical scores), every warp runs the same softmax, and each accumulates PV
// for its 128 output dims. Pages stream through a two-stage cp.async ring; PV needs the latent
// with tokens contiguous (FP8 MMA operands are K-major), so each page is transposed once in
// shared memory into a token-permuted layout that matches the P fragments' register order.
// docs/kernels.md has this version's measurements and the plan for the wgmma/TMA version.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "../common/check.cuh"
#include "../common/ptx.cuh"
#include "../kernels.hpp"
#include "../smxx/combine.hpp"
#include "decode/epilogue.cuh"
#include "decode/launch.hpp"
#include "decode/scheduler.cuh"
#include "decode/softmax.cuh"

namespace snapmla::cuda {
namespace {

constexpr int kLatStride = kLatentDim + 16;     // bytes per token row in shared memory
constexpr int kRopeStride = (kRopeDim + 8) * 2;  // bytes per rope row
constexpr int kVtStride = kPageSize + 16;        // bytes per dim row of the transposed latent
constexpr int kStageLat = kPageSize * kLatStride;
constexpr int kStageRope = kPageSize * kRopeStride;
constexpr int kStageBytes = kStageLat + kStageRope + kPageSize * 4;
constexpr int kVtBytes = kLatentDim * kVtStride;

template <int RG>
constexpr int smem_bytes() {
  return 2 * kStageBytes + kVtBytes + 4 * RG * 32 * 32 * 4;
}

struct Stage {
  uint8_t* lat;
  uint8_t* rope;
  float* scale;
};

__device__ __forceinline__ Stage stage_at(uint8_t* smem, int s) {
  uint8_t* base = smem + s * kStageBytes;
  return {base, base + kStageLat, reinterpret_cast<float*>(base + kStageLat + kStageRope)};
}

// Issues the copies of the page holding tokens [blk, blk + 64); tokens at or past `end` are
// zero-filled, as is everything when the page index is out of range (which sets *fault).
__device__ __forceinline__ void load_page(const DecodeParams& p, const Work& w, int blk, Stage st,
                                          int* fault) {
  const int32_t page = p.block_table[int64_t(w.seq) * p.max_pages + blk / kPageSize];
  const bool page_ok = page >= 0 && page < p.num_pages;
  if (!page_ok && threadIdx.x == 0) *fault = 1;
  const int ntok = page_ok ? min(kPageSize, w.end - blk) : 0;
  const int64_t slot0 = int64_t(page_ok ? page : 0) * kPageSize;
  for (int c = threadIdx.x; c < kPageSize * 32; c += blockDim.x) {
    const int tok = c / 32, part = c % 32;
    ptx::cp_async_16(st.lat + tok * kLatStride + part * 16,
                     p.latent + (slot0 + tok) * kLatentDim + part * 16, tok < ntok);
  }
  for (int c = threadIdx.x; c < kPageSize * 8; c += blockDim.x) {
    const int tok = c / 8, part = c % 8;
    ptx::cp_async_16(st.rope + tok * kRopeStride + part * 16,
                     reinterpret_cast<const uint8_t*>(p.k_rope + (slot0 + tok) * kRopeDim) + part * 16,
                     tok < ntok);
  }
  for (int tok = threadIdx.x; tok < kPageSize; tok += blockDim.x)
    ptx::cp_async_4(st.scale + tok, p.k_scale + slot0 + tok, tok < ntok);
}

// latent [token][dim] -> vt [dim][slot]. Within each 32-token chunk, slot 16 h + 4 q + j holds
// token 16 h + {2q, 2q+1, 2q+8, 2q+9}[j]: exactly the tokens a thread's P fragment (C layout of
// QK, 4 n-tiles) holds in A-operand order, so P can feed the PV MMA straight from registers.
__device__ __forceinline__ void transpose_page(const uint8_t* lat, uint8_t* vt) {
  for (int item = threadIdx.x; item < 128 * 16; item += blockDim.x) {
    const int dq = item / 16, tq = item % 16;  // dim quad, token quad
    const int c = tq / 8, h = (tq / 4) % 2, q = tq % 4;
    const int t0 = 32 * c + 16 * h + 2 * q;
    const uint32_t w0 = *reinterpret_cast<const uint32_t*>(lat + (t0)*kLatStride + 4 * dq);
    const uint32_t w1 = *reinterpret_cast<const uint32_t*>(lat + (t0 + 1) * kLatStride + 4 * dq);
    const uint32_t w2 = *reinterpret_cast<const uint32_t*>(lat + (t0 + 8) * kLatStride + 4 * dq);
    const uint32_t w3 = *reinterpret_cast<const uint32_t*>(lat + (t0 + 9) * kLatStride + 4 * dq);
    const uint32_t x0 = ptx::prmt(w0, w1, 0x5140), x1 = ptx::prmt(w0, w1, 0x7362);
    const uint32_t y0 = ptx::prmt(w2, w3, 0x5140), y1 = ptx::prmt(w2, w3, 0x7362);
    uint8_t* dst = vt + (4 * dq) * kVtStride + 32 * c + 16 * h + 4 * q;
    *reinterpret_cast<uint32_t*>(dst) = ptx::prmt(x0, y0, 0x5410);
    *reinterpret_cast<uint32_t*>(dst + kVtStride) = ptx::prmt(x0, y0, 0x7632);
    *reinterpret_cast<uint32_t*>(dst + 2 * kVtStride) = ptx::prmt(x1, y1, 0x5410);
    *reinterpret_cast<uint32_t*>(dst + 3 * kVtStride) = ptx::prmt(x1, y1, 0x7632);
  }
}

template <int RG>
__global__ void __launch_bounds__(128 * RG, 1) decode_fp8_kernel(DecodeParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int fault;
  Work w;
  if (!find_work(p, blockIdx.x, w)) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int rg = warp / 4, cq = warp % 4;
  const int row0 = blockIdx.y * 16 * RG + rg * 16;
  uint8_t* vt = smem + 2 * kStageBytes;
  float* xch = reinterpret_cast<float*>(vt + kVtBytes);
  if (threadIdx.x == 0) fault = 0;

  // Query fragments for this warp's quarter: nope dims [128 cq, +128), rope dims [16 cq, +16).
  int rows_[2] = {row0 + g, row0 + g + 8};
  uint32_t qa[4][4], qr[4];
  float factor[2];
  int vis[2];
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const bool ok = rows_[ri] < p.rows;
    const int64_t r = int64_t(w.seq) * p.rows + (ok ? rows_[ri] : 0);
    factor[ri] = p.softmax_scale * p.q_scale[r];
    vis[ri] = ok ? visible_end(p, w, rows_[ri]) : 0;
    const uint8_t* qn = p.q_nope + r * kLatentDim + cq * 128 + 4 * q;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      qa[kk][ri] = *reinterpret_cast<const uint32_t*>(qn + kk * 32);
      qa[kk][ri + 2] = *reinterpret_cast<const uint32_t*>(qn + kk * 32 + 16);
    }
    const uint16_t* qrp = p.q_rope + r * kRopeDim + cq * 16 + 2 * q;
    qr[ri] = *reinterpret_cast<const uint32_t*>(qrp);
    qr[ri + 2] = *reinterpret_cast<const uint32_t*>(qrp + 8);
  }

  SoftmaxState st;
  float o[16][4];
#pragma unroll
  for (int n = 0; n < 16; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

  const int nblk = (w.end - w.begin + kPageSize - 1) / kPageSize;
  __syncthreads();  // fault initialized
  if (nblk > 0) load_page(p, w, w.begin, stage_at(smem, 0), &fault);
  ptx::cp_async_commit();
  const int mat = lane / 8, mrow = lane % 8;
  for (int j = 0; j < nblk; ++j) {
    const int blk = w.begin + j * kPageSize;
    ptx::cp_async_wait<0>();
    __syncthreads();
    if (j + 1 < nblk) load_page(p, w, blk + kPageSize, stage_at(smem, (j + 1) & 1), &fault);
    ptx::cp_async_commit();
    const Stage cur = stage_at(smem, j & 1);
    transpose_page(cur.lat, vt);

    // QK partial over this warp's dims.
    float s[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      const int tok = 16 * np + (mat >> 1) * 8 + mrow;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        uint32_t b0, b1, b2, b3;
        ptx::ldmatrix_x4(b0, b1, b2, b3, cur.lat + tok * kLatStride + cq * 128 + kk * 32 + (mat & 1) * 16);
        ptx::mma_e4m3_16832(s[2 * np], qa[kk], b0, b1);
        ptx::mma_e4m3_16832(s[2 * np + 1], qa[kk], b2, b3);
      }
      uint32_t b0, b1, b2, b3;
      ptx::ldmatrix_x4(b0, b1, b2, b3, cur.rope + tok * kRopeStride + (cq * 16 + (mat & 1) * 8) * 2);
      ptx::mma_bf16_16816(s[2 * np], qr, b0, b1);
      ptx::mma_bf16_16816(s[2 * np + 1], qr, b2, b3);
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
    softmax_block<true>(st, s, factor, vis, blk, cur.scale, q, rescale);
#pragma unroll
    for (int n = 0; n < 16; ++n) {
      o[n][0] *= rescale[0];
      o[n][1] *= rescale[0];
      o[n][2] *= rescale[1];
      o[n][3] *= rescale[1];
    }
    // P' / sigma -> e4m3 A fragments, one per 32-token chunk (see transpose_page).
    uint32_t pa[2][4];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      pa[c][0] = e4m3x4(s[4 * c][0], s[4 * c][1], s[4 * c + 1][0], s[4 * c + 1][1]);
      pa[c][1] = e4m3x4(s[4 * c][2], s[4 * c][3], s[4 * c + 1][2], s[4 * c + 1][3]);
      pa[c][2] = e4m3x4(s[4 * c + 2][0], s[4 * c + 2][1], s[4 * c + 3][0], s[4 * c + 3][1]);
      pa[c][3] = e4m3x4(s[4 * c + 2][2], s[4 * c + 2][3], s[4 * c + 3][2], s[4 * c + 3][3]);
    }
#pragma unroll
    for (int np = 0; np < 8; ++np) {
      const int dim = cq * 128 + 16 * np + (mat >> 1) * 8 + mrow;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        uint32_t b0, b1, b2, b3;
        ptx::ldmatrix_x4(b0, b1, b2, b3, vt + dim * kVtStride + 32 * c + (mat & 1) * 16);
        ptx::mma_e4m3_16832(o[2 * np], pa[c], b0, b1);
        ptx::mma_e4m3_16832(o[2 * np + 1], pa[c], b2, b3);
      }
    }
  }
  __syncthreads();  // fault flag visible
  write_rows<true>(p, w, st, o, row0, cq * 128, lane, cq == 0, fault != 0);
}

template <int RG>
void launch(const DecodeParams& p, int grid_x, cudaStream_t stream) {
  constexpr int bytes = smem_bytes<RG>();
  check(cudaFuncSetAttribute(decode_fp8_kernel<RG>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
        "cudaFuncSetAttribute(decode_fp8_kernel)");
  const dim3 grid(grid_x, (p.rows + 16 * RG - 1) / (16 * RG));
  decode_fp8_kernel<RG><<<grid, 128 * RG, bytes, stream>>>(p);
  check_launch("decode_fp8_kernel");
}

}  // namespace

void decode_fp8(const QuantizedQuery& q, const PagedFp8Cache& cache, const PageTable& pages,
                const DecodeOutput& out, const DecodeOptions& options) {
  DecodeParams p = make_params("decode_fp8", q.batch, q.seqlen_q, q.num_heads, pages, out, options);
  if (q.batch == 0) return;
  p.q_nope = reinterpret_cast<const uint8_t*>(q.nope);
  p.q_rope = reinterpret_cast<const uint16_t*>(q.rope);
  p.q_scale = q.scale;
  p.latent = reinterpret_cast<const uint8_t*>(cache.latent);
  p.k_scale = cache.scale;
  p.k_rope = reinterpret_cast<const uint16_t*>(cache.rope);
  p.num_pages = cache.num_pages;
  const cudaStream_t stream = as_stream(options.stream);
  const int grid_x = options.plan ? options.plan->capacity : p.batch;
  static const bool v2 = [] {
    const char* e = std::getenv("SNAPMLA_FP8_KERNEL");
    return e != nullptr && std::string(e) == "v2";
  }();
  if (const char* e = std::getenv("SNAPMLA_QK_CHUNK")) p.qk_chunk = std::max(1, std::atoi(e));
  if (v2) decode_fp8_wgmma(p, grid_x, stream);
  else if (p.rows % 32 == 0) launch<2>(p, grid_x, stream);
  else launch<1>(p, grid_x, stream);
  if (options.plan) combine(combine_params(p), stream);
}

}  // namespace snapmla::cuda
