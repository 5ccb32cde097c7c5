// decode_fp8 (version 6): TMA page pipeline, warp-specialized, token-split consumers.
//
// CTA = one split of one sequence x 64 query rows (one wgmma M tile), 3 warpgroups:
//   WG0  producer. Warps 0-1 load: the Q tile once (cp.async), then one thread streams pages
//        into a 3-stage ring with TMA (latent and rope as 64 x 128-byte boxes with 128-byte
//        swizzle, the 64 scales as a bulk copy), completing on the stage's mbarrier. Warps 2-3
//        transpose each landed page's latent into a 2-stage V^T ring (ldmatrix.trans + byte
//        permutes), zeroing tokens past the split end.
//   WG1, WG2  consumers. Consumer c computes S for tokens [32 c, 32 c + 32) of the page and all
//        64 rows (HGMMA m64n32k16 over the rope, QGMMA m64n32k32 over the latent, one
//        accumulator); the row max and the max of P' are exchanged through shared memory, so
//        both apply the same m, sigma and rescale; each writes its half of P' / sigma as e4m3
//        into shared memory (over the page's rope tile, free by then), and accumulates PV for
//        its 256 output dims (QGMMA m64n256k32, P and V^T from shared memory).
// History, measurements and what bounds it: docs/kernels.md.
#include <cuda.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "../common/check.cuh"
#include "../common/ptx.cuh"
#include "../common/wgmma.cuh"
#include "../kernels.hpp"
#include "decode/epilogue.cuh"
#include "decode/launch.hpp"
#include "decode/pipeline.cuh"
#include "decode/scheduler.cuh"
#include "decode/softmax.cuh"

namespace snapmla::cuda {
namespace {

constexpr int kStages = 3;    // pages in flight (K-major latent, rope, scales)
constexpr int kVtStages = 2;  // transposed latents (V^T) ready for PV
constexpr int kRows = 64;
// The producer warpgroup's two roles, two warps each, so that loads never wait on the
// transposition: kLoaders threads stream pages into the ring as fast as it frees up;
// kTransposers threads turn each landed page's latent into V^T (stage i % kVtStages, once PV
// of the page that used it is done) and then count as readers of the page's stage.
constexpr int kLoaders = 64, kTransposers = 64;

// Byte sizes of the shared-memory tiles (K-major, 8 x 16 B core matrices, 128 B each).
constexpr int kQnBytes = kRows * kLatentDim;       // 32 KB, SBO 4096
constexpr int kQrBytes = kRows * kRopeDim * 2;     // 8 KB, SBO 1024
constexpr int kKlBytes = kPageSize * kLatentDim;   // 32 KB
constexpr int kKrBytes = kPageSize * kRopeDim * 2; // 8 KB
constexpr int kStageBytes = kKlBytes + kKrBytes;  // 1024-aligned tiles (128-byte swizzle)
constexpr int kLatentBox = 128;                   // TMA box: 64 tokens x 128 bytes of latent
constexpr int kVtBytes = 256 * kPageSize;          // one half: 256 dims x 64 tokens, SBO 512
using Ring = PageRing<kStages>;
constexpr int kVtBarBytes = 2 * kVtStages * 8;
constexpr int kXchgBytes = 2 * 2 * kRows * 4;  // row maxima of S and of P', per warpgroup
constexpr int kScaleBytes = kPageSize * 4;
constexpr int kSmemBytes = kQnBytes + kQrBytes + kStages * kStageBytes + kVtStages * 2 * kVtBytes +
                           kStages * kScaleBytes + Ring::kBytes + kVtBarBytes + kXchgBytes;
static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on sm_90");

struct Smem {
  uint8_t* qn;
  uint8_t* qr;
  uint8_t* stage;
  uint8_t* vt_base;
  float* scales;  // [kStages][64]
  Ring ring;
  uint64_t* vt_full;   // [kVtStages]: 128 producer arrivals (V^T written)
  uint64_t* vt_empty;  // [kVtStages]: 256 consumer arrivals (PV done reading)
  float* xmax;         // [2][64]: each consumer's row maxima of its half of S
  float* xpmax;        // [2][64]: the same for P (times the token scales)
  __device__ explicit Smem(uint8_t* base)
      : qn(base),
        qr(base + kQnBytes),
        stage(base + kQnBytes + kQrBytes),
        vt_base(stage + kStages * kStageBytes),
        scales(reinterpret_cast<float*>(vt_base + kVtStages * 2 * kVtBytes)),
        ring(scales + kStages * kPageSize),
        vt_full(reinterpret_cast<uint64_t*>(reinterpret_cast<uint8_t*>(scales + kStages * kPageSize) + Ring::kBytes)),
        vt_empty(vt_full + kVtStages),
        xmax(reinterpret_cast<float*>(vt_empty + kVtStages)),
        xpmax(xmax + 2 * kRows) {}
  __device__ uint8_t* kl(int s) const { return stage + s * kStageBytes; }
  __device__ uint8_t* kr(int s) const { return stage + s * kStageBytes + kKlBytes; }
  // The page's P / sigma as e4m3 [64 rows x 64 slots] (K-major, in V^T's slot order), written
  // over the stage's rope tile once both consumers' QK of the page is done with it.
  __device__ uint8_t* p_tile(int s) const { return kr(s); }
  __device__ float* scale(int s) const { return scales + s * kPageSize; }
  // V^T of page j, output half c (the halves are contiguous).
  __device__ uint8_t* vt(int j, int c) const { return vt_base + ((j % kVtStages) * 2 + c) * kVtBytes; }
  __device__ void init_vt() const {
    for (int v = 0; v < kVtStages; ++v) {
      wg::mbar_init(&vt_full[v], kTransposers);
      wg::mbar_init(&vt_empty[v], 256);
    }
  }
};

// Loader (one thread): the page holding tokens [blk, blk + 64) into stage s: four TMA boxes of
// latent (64 tokens x 128 bytes each, 128-byte swizzle), one of rope, and the 64 scales as a
// bulk copy, all completing on the stage's `full` barrier with their byte count. An
// out-of-range page index loads nothing (the stage keeps stale data): the consumers see the
// same index and turn their rows into NaN. Tokens past the split end are loaded as they are in the cache; the
// transposer zeroes them in V^T and the softmax masks them.
__device__ __forceinline__ void load_page(const DecodeParams& p, const CUtensorMap* tm_latent,
                                          const CUtensorMap* tm_rope, const Work& w, int blk,
                                          const Smem& sm, int s) {
  const int32_t page = page_of(p, w, blk);
  uint64_t* bar = &sm.ring.full[s];
  if (!page_ok(p, page)) {  // nothing to copy: complete the phase with the arrival alone
    wg::mbar_arrive_expect_tx(bar, 0);
    return;
  }
  const int y = page * kPageSize;
  wg::mbar_arrive_expect_tx(bar, kKlBytes + kKrBytes + kScaleBytes);
#pragma unroll
  for (int b = 0; b < kLatentDim / kLatentBox; ++b)
    wg::tma_load_2d(sm.kl(s) + b * (kPageSize * kLatentBox), tm_latent, b * kLatentBox, y, bar);
  wg::tma_load_2d(sm.kr(s), tm_rope, 0, y, bar);
  wg::bulk_load(sm.scale(s), p.k_scale + int64_t(page) * kPageSize, kScaleBytes, bar);
}

// The latent of one page (64 tokens x 512 dims, K-major) -> V^T for PV: two halves of 256 dims
// x 64 token slots, K-major, slot 16 h + 4 q + j of 32-token chunk k holding token
// 32 k + 16 h + {2q, 2q+1, 2q+8, 2q+9}[j]: the order of P's register fragment, so P feeds PV
// from registers. This moves tokens [16 w, 16 w + 16) for one warp: per step 32 dims with
// one transposing ldmatrix (b16 units: two tokens x two dims per register), then byte
// permutes split the dim pairs and four 4-byte stores write four dims' 4-token words.
__device__ __forceinline__ void transpose_tokens16(const uint8_t* kl, uint8_t* vt, int w, int lane,
                                                   int ntok) {
  const int m = lane / 8;
  const int token = 16 * w + (m % 2) * 8 + lane % 8;
  // The latent tile as TMA wrote it: box b = bytes [128 b, 128 b + 128) of each token's row,
  // 128 bytes per token, 16-byte chunk k of row t at chunk k ^ (t % 8).
  const uint8_t* row = kl + token * kLatentBox;
  const int c = lane / 4, q = lane % 4;
  uint8_t* dst = vt + (c / 4) * 512 + ((2 * c) % 8) * 16 + w * 128 + 4 * q;
  // Bytes of tokens at or past the split end are zeroed (P is 0 there, but V may be NaN).
  const int t0 = 16 * w + 2 * q;
  const uint32_t keep = (t0 < ntok ? 0xFFu : 0u) | (t0 + 1 < ntok ? 0xFF00u : 0u) |
                        (t0 + 8 < ntok ? 0xFF0000u : 0u) | (t0 + 9 < ntok ? 0xFF000000u : 0u);
#pragma unroll 4
  for (int i = 0; i < kLatentDim / 32; ++i) {
    const int chunk = (2 * i + m / 2) % 8;  // 16-byte chunk within the box row
    uint32_t r[4];
    ptx::ldsm_x4_trans(row + (i / 4) * (kPageSize * kLatentBox) + ((chunk ^ (token % 8)) * 16), r);
    uint8_t* d = dst + i * 2048;
    ptx::sts32(d, ptx::prmt(r[0], r[1], 0x6420) & keep);
    ptx::sts32(d + 16, ptx::prmt(r[0], r[1], 0x7531) & keep);
    ptx::sts32(d + 1024, ptx::prmt(r[2], r[3], 0x6420) & keep);
    ptx::sts32(d + 1040, ptx::prmt(r[2], r[3], 0x7531) & keep);
  }
}

__device__ __forceinline__ void transpose_page(const Smem& sm, int i, int t, int ntok) {
  sm.ring.wait(i);
  if (i >= kVtStages) wg::mbar_wait(&sm.vt_empty[i % kVtStages], ((i / kVtStages) - 1) & 1);
  const int w = t / 32, lane = t % 32;
#pragma unroll
  for (int k = 0; k < kPageSize / 16 / (kTransposers / 32); ++k)
    transpose_tokens16(sm.kl(i % kStages), sm.vt(i, 0), w + k * (kTransposers / 32), lane, ntok);
  wg::fence_proxy_async();  // V^T written with st.shared, read by wgmma (async proxy)
  wg::mbar_arrive(&sm.vt_full[i % kVtStages]);
  sm.ring.release(i);       // done reading the stage's latent
}

__global__ void __launch_bounds__(384, 1)
    decode_fp8_kernel(const __grid_constant__ DecodeParams p, const __grid_constant__ CUtensorMap tm_latent,
                      const __grid_constant__ CUtensorMap tm_rope) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  Work w;
  if (!find_work(p, blockIdx.x, w)) return;
  const Smem sm(smem_raw);
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  const int row0 = blockIdx.y * kRows;
  const int nblk = (w.end - w.begin + kPageSize - 1) / kPageSize;
  if (threadIdx.x == 0) {
    if (ptx::smem_addr(smem_raw) % 1024 != 0) __trap();  // the swizzled tiles need it
    sm.ring.init(1, 256 + kTransposers, kLoaders);
    sm.init_vt();
  }
  __syncthreads();

  if (wg == 0) {
    wg::setmaxnreg_dec<56>();
    if (t >= kLoaders) {
      for (int i = 0; i < nblk; ++i) {
        const int blk = w.begin + i * kPageSize;
        transpose_page(sm, i, t - kLoaders, page_ok(p, page_of(p, w, blk)) ? min(kPageSize, w.end - blk) : 0);
      }
      return;
    }
    // The Q tile: nope and rope, K-major; rows past the query rows are zero.
    for (int c = t; c < kRows * 32; c += kLoaders) {
      const int r = c / 32, part = c % 32;
      const bool ok = row0 + r < p.rows;
      const int64_t row = int64_t(w.seq) * p.rows + (ok ? row0 + r : 0);
      ptx::cp_async_16(sm.qn + km_offset(r, part * 16, kLatentDim), p.q_nope + row * kLatentDim + part * 16, ok);
    }
    for (int c = t; c < kRows * 8; c += kLoaders) {
      const int r = c / 8, part = c % 8;
      const bool ok = row0 + r < p.rows;
      const int64_t row = int64_t(w.seq) * p.rows + (ok ? row0 + r : 0);
      ptx::cp_async_16(sm.qr + km_offset(r, part * 16, kRopeDim * 2),
                       reinterpret_cast<const uint8_t*>(p.q_rope + row * kRopeDim) + part * 16, ok);
    }
    wg::cp_async_arrive(sm.ring.qbar);
    if (t == 0) {
      for (int j = 0; j < nblk; ++j) {
        sm.ring.acquire(j);
        load_page(p, &tm_latent, &tm_rope, w, w.begin + j * kPageSize, sm, j % kStages);
      }
    }
    return;
  }

  wg::setmaxnreg_inc<224>();
  const int c = wg - 1;  // output half
  const int warp = t / 32, lane = t % 32, g = lane / 4, q = lane % 4;
  const int rows_[2] = {row0 + 16 * warp + g, row0 + 16 * warp + g + 8};
  float factor[2];
  int vis[2];
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const bool ok = rows_[ri] < p.rows;
    factor[ri] = p.softmax_scale * p.q_scale[int64_t(w.seq) * p.rows + (ok ? rows_[ri] : 0)];
    vis[ri] = ok ? visible_end(p, w, rows_[ri]) : 0;
  }
  SoftmaxState st;
  float o[32][4];
#pragma unroll
  for (int n = 0; n < 32; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  wg::mbar_wait(sm.ring.qbar, 0);
  bool fault = false;

  const int r0 = 16 * warp + g;
  for (int j = 0; j < nblk; ++j) {
    const int s = j % kStages;
    const int blk = w.begin + j * kPageSize;
    fault |= !page_ok(p, page_of(p, w, blk));
    sm.ring.wait(j);
    // This warpgroup's half of S: tokens [32 c, 32 c + 32) of the page, all 64 rows. The bf16
    // rope product first (the first MMA overwriting the accumulator), then the FP8 latent
    // product, one accumulator.
    float acc[4][4];
    wg::fence();
    // K tiles as TMA wrote them (128-byte swizzle, 128 bytes per token row): this half's 32
    // tokens start 32 rows in; a K step moves 32 bytes along the row, or to the next box.
    wg::mma_64x32x16_bf16_ss_zero(acc, wg::desc(sm.qr, 128, 1024), wg::desc_sw128(sm.kr(s) + 4096 * c));
#pragma unroll
    for (int ks = 1; ks < 4; ++ks)
      wg::mma_64x32x16_bf16_ss(acc, wg::desc(sm.qr + ks * 256, 128, 1024),
                               wg::desc_sw128(sm.kr(s) + 4096 * c + ks * 32));
#pragma unroll
    for (int kk = 0; kk < 16; ++kk)
      wg::mma_64x32x32_e4m3_ss(acc, wg::desc(sm.qn + kk * 256, 128, 4096),
                               wg::desc_sw128(sm.kl(s) + (kk / 4) * (kPageSize * kLatentBox) + 4096 * c + (kk % 4) * 32));
    wg::commit();
    wg::wait<0>();
    wg::fence_operands(acc);

    // Softmax across both halves (two exchanges; after the first, both consumers' QK of this
    // page is done, so the rope tile may take P).
    float pv[4][4], rescale[2];
    softmax_block_half(st, acc, pv, factor, vis, blk + 32 * c, sm.scale(s) + 32 * c, q, r0, c,
                       sm.xmax, sm.xpmax, rescale);
    // This half's P / sigma as e4m3 into slots [32 c, 32 c + 32): token 8 n + 2 q + e of the
    // half sits at slot 16 (n / 2) + 4 q + 2 (n % 2) + e, so each row's 4 bytes are one word.
    uint8_t* pt = sm.p_tile(s);
#pragma unroll
    for (int ri = 0; ri < 2; ++ri)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const uint32_t word = e4m3x4(pv[2 * hh][2 * ri], pv[2 * hh][2 * ri + 1], pv[2 * hh + 1][2 * ri],
                                     pv[2 * hh + 1][2 * ri + 1]);
        ptx::sts32(pt + km_offset(r0 + 8 * ri, 32 * c + 16 * hh + 4 * q, kPageSize), word);
      }
    wg::fence_proxy_async();  // P written with st.shared, read by wgmma
#pragma unroll
    for (int n = 0; n < 32; ++n) {
      o[n][0] *= rescale[0];
      o[n][1] *= rescale[0];
      o[n][2] *= rescale[1];
      o[n][3] *= rescale[1];
    }
    ptx::named_barrier(1, 256);  // both halves of P are in place
    const uint8_t* vt = sm.vt(j, c);
    wg::mbar_wait(&sm.vt_full[j % kVtStages], (j / kVtStages) & 1);
    wg::fence_operands(o);
    wg::fence();
    wg::mma_64x256x32_e4m3_ss(o, wg::desc(pt, 128, 512), wg::desc(vt, 128, 512));
    wg::mma_64x256x32_e4m3_ss(o, wg::desc(pt + 256, 128, 512), wg::desc(vt + 256, 128, 512));
    wg::commit();
    wg::wait<0>();
    wg::fence_operands(o);
    wg::mbar_arrive(&sm.vt_empty[j % kVtStages]);
    sm.ring.release(j);  // stage fully read (QK, scales, and P in the rope tile)
  }
  // Each consumer summed P over its half of the tokens: add the other half's sums.
  if (q == 0) {
    sm.xmax[c * kRows + r0] = st.l[0];
    sm.xmax[c * kRows + r0 + 8] = st.l[1];
  }
  ptx::named_barrier(1, 256);
  st.l[0] += sm.xmax[(1 - c) * kRows + r0];
  st.l[1] += sm.xmax[(1 - c) * kRows + r0 + 8];
  write_rows<true>(p, w, st, o, row0 + 16 * warp, 256 * c, lane, c == 0, fault);
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's tensor-map encoder, through the runtime (no link against libcuda).
EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found),
          "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)");
    if (f == nullptr || found != cudaDriverEntryPointSuccess)
      throw std::runtime_error("snapmla: the CUDA driver has no cuTensorMapEncodeTiled (needs CUDA 12+)");
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

// A 2-D map over one cache plane seen as [rows, row_bytes]: boxes of 64 rows x 128 bytes with the
// 128-byte swizzle the wgmma descriptors expect. A plane with no pages gets an unused dummy.
CUtensorMap plane_map(const void* base, int64_t rows, int row_bytes, CUtensorMapDataType type, int elem_bytes) {
  CUtensorMap m{};
  if (rows == 0) return m;  // no page index is valid: the loader never issues a copy
  const cuuint64_t dims[2] = {cuuint64_t(row_bytes / elem_bytes), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(row_bytes)};
  const cuuint32_t box[2] = {cuuint32_t(kLatentBox / elem_bytes), cuuint32_t(kPageSize)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode_tiled()(&m, type, 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                                    CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("snapmla: cuTensorMapEncodeTiled failed (" + std::to_string(int(r)) + ")");
  return m;
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
  check(cudaFuncSetAttribute(decode_fp8_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes),
        "cudaFuncSetAttribute(decode_fp8_kernel)");
  const dim3 grid(options.plan ? options.plan->capacity : p.batch, (p.rows + kRows - 1) / kRows);
  const int64_t rows = cache.num_pages * kPageSize;
  const CUtensorMap tm_latent = plane_map(cache.latent, rows, kLatentDim, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1);
  const CUtensorMap tm_rope = plane_map(cache.rope, rows, kRopeDim * 2, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2);
  decode_fp8_kernel<<<grid, 384, kSmemBytes, stream>>>(p, tm_latent, tm_rope);
  check_launch("decode_fp8_kernel");
  if (options.plan) combine(combine_params(p), stream);
}

}  // namespace snapmla::cuda
