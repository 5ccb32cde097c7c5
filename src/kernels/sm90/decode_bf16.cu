// decode_bf16 (version 2): the BF16 baseline on the same skeleton as decode_fp8 (warpgroup MMAs,
// warp-specialized page pipeline, same scheduler, softmax and combine), so speedups are
// measured against a like-for-like kernel. FlashMLA's arithmetic: bf16 QK and PV, P rounded
// to bf16, fp32 accumulators.
//
// CTA = one split of one sequence x 64 query rows, 3 warpgroups:
//   WG0  producer: the Q tile once, then pages into a 2-stage ring (cp.async on mbarriers)
//   WG1, WG2  consumers, one per half of the 512 output dims: the whole QK (HGMMA m64n64k16,
//        Q and K from shared memory), the online softmax, P to bf16 in registers, PV with
//        HGMMA m64n256k16 reading V straight from the page in shared memory (the page's rows
//        are token-major, which wgmma reads for bf16 with its transpose bit: no transpose).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

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

constexpr int kStages = 2;
constexpr int kRows = kTileRows;
constexpr int kRowBytes = kHeadDim * 2;                 // 1152: one token / one query row
constexpr int kTileBytes = kPageSize * kRowBytes;       // 72 KB, K-major, SBO = 8 rows = 9216
constexpr int kSbo = 8 * kRowBytes;
using Ring = PageRing<kStages>;
constexpr int kSmemBytes = kRows * kRowBytes + kStages * kTileBytes + Ring::kBytes;

struct Smem {
  uint8_t* q;
  uint8_t* stage;
  Ring ring;
  __device__ explicit Smem(uint8_t* base)
      : q(base), stage(base + kRows * kRowBytes), ring(stage + kStages * kTileBytes) {}
  __device__ uint8_t* kv(int s) const { return stage + s * kTileBytes; }
};

__device__ __forceinline__ void load_page(const DecodeParams& p, const Work& w, int blk, uint8_t* dst,
                                          int t) {
  const int32_t page = page_of(p, w, blk);
  const bool ok = page_ok(p, page);
  const int ntok = ok ? min(kPageSize, w.end - blk) : 0;
  const int64_t slot0 = int64_t(ok ? page : 0) * kPageSize;
  constexpr int kChunks = kRowBytes / 16;  // 72
  for (int c = t; c < kPageSize * kChunks; c += 128) {
    const int tok = c / kChunks, part = c % kChunks;
    ptx::cp_async_16(dst + km_offset(tok, part * 16, kRowBytes),
                     reinterpret_cast<const uint8_t*>(p.kv_bf16 + (slot0 + tok) * kHeadDim) + part * 16, tok < ntok);
  }
}

__device__ __forceinline__ uint32_t bf16x2(float lo, float hi) {
  return uint32_t(float_to_bf16_bits(lo)) | (uint32_t(float_to_bf16_bits(hi)) << 16);
}

__global__ void __launch_bounds__(384, 1) decode_bf16_kernel(DecodeParams p) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const int item = grid_item(p);
  if (!has_work(p, item)) return;
  const Work w = work_of(p, item);
  const Smem sm(smem_raw);
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  const int row0 = grid_row0(p);
  const int nblk = (w.end - w.begin + kPageSize - 1) / kPageSize;
  if (threadIdx.x == 0) sm.ring.init();
  __syncthreads();

  if (wg == 0) {
    wg::setmaxnreg_dec<40>();
    for (int c = t; c < kRows * (kRowBytes / 16); c += 128) {
      const int r = c / (kRowBytes / 16), part = c % (kRowBytes / 16);
      const bool ok = row0 + r < p.rows;
      const int64_t row = int64_t(w.seq) * p.rows + (ok ? row0 + r : 0);
      ptx::cp_async_16(sm.q + km_offset(r, part * 16, kRowBytes),
                       reinterpret_cast<const uint8_t*>(p.q_bf16 + row * kHeadDim) + part * 16, ok);
    }
    wg::cp_async_arrive(sm.ring.qbar);
    for (int j = 0; j < nblk; ++j) {
      sm.ring.acquire(j);
      load_page(p, w, w.begin + j * kPageSize, sm.kv(j % kStages), t);
      sm.ring.produced(j);
    }
    return;
  }

  wg::setmaxnreg_inc<232>();
  const int c = wg - 1;
  const int warp = t / 32, lane = t % 32, q = lane % 4, g = lane / 4;
  const int rows_[2] = {row0 + 16 * warp + g, row0 + 16 * warp + g + 8};
  float factor[2];
  int vis[2];
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const bool ok = rows_[ri] < p.rows;
    factor[ri] = p.softmax_scale;
    vis[ri] = ok ? visible_end(p, w, rows_[ri]) : 0;
  }
  SoftmaxState st;
  float o[32][4];
#pragma unroll
  for (int n = 0; n < 32; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  wg::mbar_wait(sm.ring.qbar, 0);
  bool fault = false;
  // V for this half, MN-major: LBO = distance between core matrices along K (8-token groups,
  // kSbo apart), SBO = along N (8-dim groups, 128 B apart) -- the same roles as for K-major
  // operands (measured: the other assignment reads out of bounds).
  constexpr uint32_t kVLbo = kSbo, kVSbo = 128;

  for (int j = 0; j < nblk; ++j) {
    const int s = j % kStages;
    const int blk = w.begin + j * kPageSize;
    fault |= !page_ok(p, page_of(p, w, blk));
    sm.ring.wait(j);
    float sc[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks)
      wg::mma_64x64x16_bf16_ss(sc, wg::desc(sm.q + ks * 256, 128, kSbo), wg::desc(sm.kv(s) + ks * 256, 128, kSbo));
    wg::commit();
    wg::wait<0>();

    float rescale[2];
    softmax_block_bf16(st, sc, factor, vis, blk, q, rescale);
    scale_rows(o, rescale);
    uint32_t pa[4][4];
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      pa[ks][0] = bf16x2(sc[2 * ks][0], sc[2 * ks][1]);
      pa[ks][1] = bf16x2(sc[2 * ks][2], sc[2 * ks][3]);
      pa[ks][2] = bf16x2(sc[2 * ks + 1][0], sc[2 * ks + 1][1]);
      pa[ks][3] = bf16x2(sc[2 * ks + 1][2], sc[2 * ks + 1][3]);
    }
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wg::mma_64x256x16_bf16_rs_tb(o, pa[ks], wg::desc(sm.kv(s) + 2 * ks * kSbo + c * 4096, kVLbo, kVSbo));
    wg::commit();
    wg::wait<0>();
    sm.ring.release(j);
  }
  write_rows<false>(p, w, st, o, row0 + 16 * warp, 256 * c, lane, c == 0, fault);
}

}  // namespace

void decode_bf16(const QueryBf16& q, const PagedBf16Cache& cache, const PageTable& pages,
                 const DecodeOutput& out, const DecodeOptions& options) {
  DecodeParams p = make_params("decode_bf16", q.batch, q.seqlen_q, q.num_heads, pages, out, options);
  if (q.batch == 0) return;
  p.q_bf16 = reinterpret_cast<const uint16_t*>(q.data);
  p.kv_bf16 = reinterpret_cast<const uint16_t*>(cache.data);
  p.num_pages = cache.num_pages;
  launch_decode("decode_bf16", decode_bf16_kernel, kSmemBytes, p, options);
}

}  // namespace snapmla::cuda
