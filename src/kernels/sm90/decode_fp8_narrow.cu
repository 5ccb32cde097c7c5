// decode_fp8, narrow tile: up to 16 query rows per CTA (h * s_q <= 16: DeepSeek-V3's 128 heads
// over 8 GPUs, one query token). The 64-row tile of decode_fp8.cu would pad such rows to a
// wgmma M of 64 and pay the whole tile's chain per page; here the products are transposed so
// that the rows are the wgmma N (16) and the page's 64 tokens / 512 dims are M:
//   S^T (64 tokens x 16 rows)  = K Q^T:    A = the page's latent and rope tiles as TMA wrote them
//                                          (QGMMA m64n16k32 + HGMMA m64n16k16), B = the Q tiles;
//   O^T (512 dims x 16 rows)  += V^T P'^T: A = V^T in registers (ldmatrix.trans of the same latent
//                                          tile + byte permutes), B = P' (16 rows x 64 tokens).
// Nothing is transposed through shared memory and the tensor work per page is a quarter of the
// wide tile's. CTA = one split x the rows, 3 warpgroups:
//   WG0  producer: one thread requests the first pages, the warpgroup loads the Q tiles
//        (cp.async), then that thread streams the split's pages into a 4-stage ring with TMA
//        (pipeline.cuh's PageRing::stream).
//   WG1, WG2  consumers: consumer c runs the reference's loop (docs/reference.md) over pages
//        c, c + 2, c + 4, ... with its own m, l, sigma and a full O^T (64 registers per thread),
//        and the two are merged at the end as two splits of the sequence are (the result differs
//        from one chain over all pages only by fp32 rounding). No per-page hand-off between them.
// A thread holds tokens 16 w + g, + 8 of S^T and the 4 rows 8 n + 2 q + {0, 1} (n = 0, 1); the
// per-row max and the max of P' over the page's tokens are reduced over g with shuffles and over
// the consumer's four warps through shared memory. Design: docs/design.md; measurements: docs/kernels.md.
#include <cuda.h>
#include <cuda_runtime.h>

#include "kernels/common/check.cuh"
#include "kernels/common/mbarrier.cuh"
#include "kernels/common/numeric.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/tma.cuh"
#include "kernels/common/wgmma.cuh"
#include "kernels/kernels.hpp"
#include "decode/combine_tail.cuh"
#include "decode/epilogue.cuh"
#include "decode/launch.hpp"
#include "decode/tile_launches.hpp"
#include "decode/narrow_rows.cuh"
#include "decode/pipeline.cuh"
#include "decode/profile_stamps.cuh"
#include "decode/scheduler.cuh"
#include "decode/softmax.cuh"
#include "decode/tensor_map.hpp"

namespace snapmla::cuda {
namespace {

// The CTA: a producer warpgroup (loads) and two consumer warpgroups (the pages of their stage parity).
struct NarrowConfig : WarpgroupRoles<2, 48, 224> {};
constexpr int kN = kNarrowTileRows;  // query rows per CTA: the wgmma N
constexpr int kCols = kNarrowCols;   // rows (S^T / O^T columns) per thread: 8 n + 2 q + e
constexpr int kStages = 4;           // page stages; consumer c owns the stages s = c (mod 2)
constexpr int kMTiles = kLatentDim / 64;  // O^T's M tiles of 64 dims

constexpr int kKlBytes = kPageSize * kLatentDim;    // 32 KB, four 8 KB TMA boxes
constexpr int kKrBytes = kPageSize * kRopeDim * 2;  // 8 KB
constexpr int kStageBytes = kKlBytes + kKrBytes;    // 1024-aligned (128-byte swizzle)
constexpr int kQnBytes = kN * kLatentDim;           // K-major no swizzle, SBO 8 x 512
constexpr int kQrBytes = kN * kRopeDim * 2;         // K-major no swizzle, SBO 8 x 128
constexpr int kPBytes = kN * kPageSize;             // P' of one page, K-major, SBO 8 x 64
constexpr int kRedBytes = 2 * 2 * 4 * kN * 4;           // [consumer][max, P' max][warp][row]
constexpr int kXferBytes = 128 * kMTiles * 2 * 4 * 4;   // consumer 1's O^T, thread-major
constexpr int kStatBytes = 3 * kN * 4;                  // consumer 1's m, l, sigma per row
using Ring = PageRing<kStages>;
// The shared-memory plan: offsets and size from this struct, not from hand-kept sums (the page
// stages first, at the dynamic shared memory's 1024-byte aligned base, for the TMA's swizzle).
struct NarrowSmemLayout {
  uint8_t stage[kStages][kStageBytes];
  uint8_t qn[kQnBytes];
  uint8_t qr[kQrBytes];
  uint8_t pbuf[4][kPBytes];  // [consumer][2]: P' / sigma of the consumer's current and previous page
  float scales[kStages][kPageSize];
  float red[kRedBytes / 4];  // [consumer][2][warp][kN]
  float xfer[kXferBytes / 4];  // [kMTiles * 8][128]
  float stat[kStatBytes / 4];  // [3][kN]
  alignas(8) uint8_t ring[Ring::kBytes];
};
static_assert(kStageBytes % 1024 == 0, "each stage's boxes keep the 128-byte swizzle's alignment");
static_assert(kCombineTailScratchBytes<128 * NarrowConfig::kConsumers> <= kStages * kStageBytes, "the combine tail's scratch fits the stages");
constexpr int kSmemBytes = int(sizeof(NarrowSmemLayout));
static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on sm_90");

// Named barrier ids (id 0 is __syncthreads'): kConsumerWarps + c among consumer c's warps (the
// reductions and its P' tile), kMerge over both consumers at the end.
enum class NarrowBarrier : int {
  kConsumerWarps = 1,  // 1, 2
  kMerge = 3,
};

struct Smem {
  uint8_t* stage;
  uint8_t* qn;
  uint8_t* qr;
  uint8_t* pbuf;  // [consumer][2]: P' / sigma of the consumer's current and previous page
  float* scales;  // [kStages][64]
  float* red;     // [consumer][2][warp][kN]
  float* xfer;    // [kMTiles * 8][128]
  float* stat;    // [3][kN]
  Ring ring;
  __device__ explicit Smem(uint8_t* base)
      : stage(&reinterpret_cast<NarrowSmemLayout*>(base)->stage[0][0]),
        qn(reinterpret_cast<NarrowSmemLayout*>(base)->qn),
        qr(reinterpret_cast<NarrowSmemLayout*>(base)->qr),
        pbuf(&reinterpret_cast<NarrowSmemLayout*>(base)->pbuf[0][0]),
        scales(&reinterpret_cast<NarrowSmemLayout*>(base)->scales[0][0]),
        red(reinterpret_cast<NarrowSmemLayout*>(base)->red),
        xfer(reinterpret_cast<NarrowSmemLayout*>(base)->xfer),
        stat(reinterpret_cast<NarrowSmemLayout*>(base)->stat),
        ring(reinterpret_cast<NarrowSmemLayout*>(base)->ring) {}
  __device__ uint8_t* kl(int s) const { return stage + s * kStageBytes; }
  __device__ uint8_t* kr(int s) const { return stage + s * kStageBytes + kKlBytes; }
  __device__ float* scale(int s) const { return scales + s * kPageSize; }
  __device__ uint8_t* p_tile(int c, int k) const { return pbuf + (2 * c + k % 2) * kPBytes; }
  __device__ float* red_at(int c, int kind, int warp) const { return red + ((2 * c + kind) * 4 + warp) * kN; }
};

// The per-row maximum over the page's 64 tokens (narrow_rows.cuh) of the scores (kind 0) or of P' (kind 1).
__device__ __forceinline__ void rows_max(float (&v)[kCols], const Smem& sm, int c, int kind, int warp, int lane) {
  narrow_rows_reduce(v, sm.red_at(c, kind, 0), int(NarrowBarrier::kConsumerWarps) + c, warp, lane, NarrowMax{});
}

// V^T of the page for all 512 dims as wgmma A fragments (m64 x k32 per M tile mt and K step
// ks). Per warp and fragment, 16 dims (chunk 4 (mt % 2) + w of box mt / 2) x 32 tokens: lane
// 8 m + r gives the row of token 32 ks + 16 (m / 2) + 2 (m % 2) + 4 (r / 2) + r % 2, so that
// ldmatrix.trans hands thread (g, q) dims 2g, 2g + 1 of tokens 4q, 4q + 1 (matrix 0), 4q + 2,
// 4q + 3 (matrix 1) and the same at + 16 (matrices 2, 3); the permutes make one word per dim over
// four consecutive tokens. M row g is dim 2g, row g + 8 dim 2g + 1; K slot k is token 32 ks + k
// (the P' tile holds tokens in order). Tokens at or past ntok are zeroed (P' is 0 there, but the
// cache slot may hold NaN), and NaN bytes of tokens at or past `band` (tokens some query rows do
// not see; the scores read the stage, not these fragments).
__device__ __forceinline__ void load_v(uint32_t (&a)[kMTiles][2][4], const uint8_t* kl, int w, int lane, int ntok,
                                       int band) {
  const int m = lane / 8, r = lane % 8, q = lane % 4;
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    const int t = 32 * ks + 16 * (m / 2) + 2 * (m % 2) + 4 * (r / 2) + r % 2;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      const int box = mt / 2, chunk = 4 * (mt % 2) + w;
      uint32_t v[4];
      ptx::ldsm_x4_trans(kl + box * (kPageSize * kTmaBoxBytes) + t * kTmaBoxBytes + ((chunk ^ (t % 8)) * 16), v);
      a[mt][ks][0] = ptx::prmt(v[0], v[1], 0x6420u);
      a[mt][ks][1] = ptx::prmt(v[0], v[1], 0x7531u);
      a[mt][ks][2] = ptx::prmt(v[2], v[3], 0x6420u);
      a[mt][ks][3] = ptx::prmt(v[2], v[3], 0x7531u);
    }
  }
  if (ntok < kPageSize || band < kPageSize) {
#pragma unroll
    for (int ks = 0; ks < 2; ++ks)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int t0 = 32 * ks + 16 * h + 4 * q;
        const uint32_t keep = (t0 < ntok ? 0xFFu : 0u) | (t0 + 1 < ntok ? 0xFF00u : 0u) |
                              (t0 + 2 < ntok ? 0xFF0000u : 0u) | (t0 + 3 < ntok ? 0xFF000000u : 0u);
        const uint32_t sanitize = (t0 >= band ? 0xFFu : 0u) | (t0 + 1 >= band ? 0xFF00u : 0u) |
                                  (t0 + 2 >= band ? 0xFF0000u : 0u) | (t0 + 3 >= band ? 0xFF000000u : 0u);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          a[mt][ks][2 * h] = zero_e4m3_nan(a[mt][ks][2 * h] & keep, sanitize);
          a[mt][ks][2 * h + 1] = zero_e4m3_nan(a[mt][ks][2 * h + 1] & keep, sanitize);
        }
      }
  }
}

// kRole: where the consumers' indices come from (RoleIndex, a lab option); kTail: the split
// sequences merged by the kernel's own combine tail (SNAPMLA_COMBINE_FUSED, a lab option).
template <RoleIndex kRole, bool kTail = false>
__global__ void __launch_bounds__(NarrowConfig::kThreads, 1)
    decode_fp8_narrow_kernel(const __grid_constant__ DecodeParams p, const __grid_constant__ CUtensorMap tm_latent,
                             const __grid_constant__ CUtensorMap tm_rope) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  dependents_at_start(p);  // a programmatic combine's blocks may start (they wait for this grid)
  if (threadIdx.x == 0) SNAPMLA_MARK(kStart);  // profiling builds only (decode/profile_stamps.cuh)
  const SplitRange range = cta_splits(p, reinterpret_cast<int*>(smem_raw));  // (a word of the stages, loaded later)
  if (range.first >= range.last) return;
  const Smem sm(smem_raw);
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  // A stage is read by the consumer that owns it; the Q tiles come with 128 cp.async arrivals.
  // Again before each further split of the worker (split_boundary).
  const auto init_barriers = [&] { sm.ring.init(128, 128); };
  start_cta(smem_raw, init_barriers, &tm_latent, &tm_rope);

  if (wg == 0) {
    // The launch gives every thread 168 registers: producer P and consumers C need P + 2 C <= 504.
    // 48 (not 40): the split loop holds its range and lookup across the Q loads without spilling;
    // the consumers need no more than 224.
    ptx::setmaxnreg_dec<NarrowConfig::kProducerRegs>();
    for (int item = range.first; item < range.last; ++item) {
      if (item > range.first) split_boundary<NarrowConfig::kThreads>(init_barriers);
      const Work w = lookup_work(p, item);
      const int nblk = w.pages();
      // The first pages (Ring::pages_before_q), then the Q tiles by the whole warpgroup, then the
      // rest: all of them stand between the CTA's start and its first QK.
      const int first = Ring::pages_before_q(p, nblk);
      if (t == 0 && item == range.first) {
        SNAPMLA_MARK(kWorkKnown);
        SNAPMLA_NOTE_WORK(range.last - range.first, nblk);
      }
      if (t == 0) SNAPMLA_NOTE_SPLIT(nblk);
      if (t == 0) sm.ring.stream(p, w, &tm_latent, &tm_rope, sm, 0, first);
      load_q_latent<kLatentDim, kN>(sm.qn, p.q_nope, kLatentDim, p, w, 0, t, 128);
      load_q_latent<kRopeDim * 2, kN>(sm.qr, reinterpret_cast<const uint8_t*>(p.q_rope), kRopeDim * 2, p, w, 0, t,
                                      128);
      mbar::arrive_on_cp_async(sm.ring.qbar);
      if (t == 0 && item == range.first) SNAPMLA_MARK(kQIssued);
      if (t == 0) sm.ring.stream(p, w, &tm_latent, &tm_rope, sm, first, nblk);
      // SNAPMLA_PREFETCH_NEXT: the next split's first pages and Q rows into L2 while the consumers
      // finish this one (its lookup by the whole warp; warp 0's other lanes wait here for lane 0).
      if (p.prefetch_next && item + 1 < range.last && t < 32) {
        const Work next = lookup_work(p, item + 1);
        if (t == 0) {
          sm.ring.prefetch_first_pages(p, next, &tm_latent, &tm_rope);
          const int64_t row0 = int64_t(next.seq) * p.rows;
          tma::bulk_prefetch(p.q_nope + row0 * kLatentDim, uint32_t(p.rows * kLatentDim));
          tma::bulk_prefetch(p.q_rope + row0 * kRopeDim, uint32_t(p.rows * kRopeDim * 2));
        }
      }
    }
    return;
  }

  ptx::setmaxnreg_inc<NarrowConfig::kConsumerRegs>();
  for (int item = range.first; item < range.last; ++item) {
    if (item > range.first) split_boundary<NarrowConfig::kThreads>(NoInit{});
    const Work w = lookup_work(p, item);
    const int nblk = w.pages();
    const int c = uniform_in_warp<kRole>(wg) - 1;
    const int warp = uniform_in_warp<kRole>(t / 32), lane = t % 32, g = lane / 4, q = lane % 4;
    const int tok0 = 16 * warp + g;  // the thread's tokens in S^T: tok0, tok0 + 8
    int vis[kCols];
    float factor[kCols], m[kCols], l[kCols], sigma[kCols];
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      const int r = narrow_col(i, q);
      const bool ok = r < p.rows;
      vis[i] = ok ? visible_end(p, w, r) : 0;
      factor[i] = p.softmax_scale * p.q_scale[int64_t(w.seq) * p.rows + (ok ? r : 0)];
      m[i] = -INFINITY;
      l[i] = 0.f;  // this thread's tokens' part of l / sigma (reduced at the end)
      sigma[i] = 1.f;
    }
    float o[kMTiles][2][4];  // O^T / sigma: dims 64 mt + 16 warp + {2g, 2g + 1} x this thread's rows
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int n = 0; n < 2; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
    sm.ring.wait_q_copied();
    const bool stamps = threadIdx.x == 128 && item == range.first;  // consumer 0's thread 0, first split
    if (stamps) SNAPMLA_MARK(kQLanded);
    const uint64_t qn = wg::desc(sm.qn, 128, 8 * kLatentDim), qr = wg::desc(sm.qr, 128, 8 * kRopeDim * 2);

    const int band = band_start(p, w);  // tokens from here on are not seen by every query row
    for (int k = 0, j = c; j < nblk; ++k, j += 2) {
      const int s = j % kStages;
      const int blk = w.begin + j * kPageSize;
      const int ntok = min(kPageSize, w.end - blk);
      sm.ring.wait(j);
      // S^T of page j: the bf16 rope product first (it starts the accumulator), then the FP8
      // latent. Waited for together with the PV of this consumer's previous page.
      float acc[2][4];
      wg::fence();
      {
        const uint64_t kr = wg::desc_sw128(sm.kr(s)), kl = wg::desc_sw128(sm.kl(s));
        wg::mma_64x16x16_bf16_ss_zero(acc, kr, qr);
#pragma unroll
        for (int ks = 1; ks < 4; ++ks) wg::mma_64x16x16_bf16_ss(acc, wg::desc_add(kr, ks * 32), wg::desc_add(qr, ks * 256));
#pragma unroll
        for (int kk = 0; kk < 16; ++kk)
          wg::mma_64x16x32_e4m3_ss(acc, wg::desc_add(kl, (kk / 4) * (kPageSize * kTmaBoxBytes) + (kk % 4) * 32),
                                   wg::desc_add(qn, kk * 256));
      }
      wg::commit();
      wg::wait<0>();
      wg::fence_operands(acc);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) wg::fence_operands(o[mt]);
      if (stamps && j == 0) SNAPMLA_MARK(kFirstScore);

      // Scores (the reference's rounding: (raw * (softmax_scale * s_q)) * s_t), masked to -inf past
      // each row's visible end; the per-row max over the page.
      const float ks[2] = {sm.scale(s)[tok0], sm.scale(s)[tok0 + 8]};
      float mx[kCols];
#pragma unroll
      for (int i = 0; i < kCols; ++i) mx[i] = -INFINITY;
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 2 * n + e % 2, h = e / 2;
          // kPoison: a non-finite score makes its row NaN, as in the reference.
          const float sc = masked_score<true, true>(acc[n][e], factor[i], ks[h], blk + tok0 + 8 * h < vis[i]);
          acc[n][e] = sc;
          mx[i] = fmaxf(mx[i], sc);
        }
      rows_max(mx, sm, c, 0, warp, lane);
      // P = exp(s - m_new), P' = P * s_t, and the max of P' over the page.
      float m_new[kCols], ml[kCols], sum[kCols], pmax[kCols];
#pragma unroll
      for (int i = 0; i < kCols; ++i) {
        m_new[i] = fmaxf(m[i], mx[i]);
        ml[i] = m_new[i] * kLog2e;
        sum[i] = 0.f;
        pmax[i] = 0.f;
      }
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 2 * n + e % 2, h = e / 2;
          const float2 pw = page_weight<true>(acc[n][e], ml[i], ks[h]);
          sum[i] += pw.x;
          pmax[i] = fmaxf(pmax[i], pw.y);
          acc[n][e] = pw.y;
        }
      rows_max(pmax, sm, c, 1, warp, lane);
      // The page's P' scale (the reference's kFp8 step, as the 64-row tile's), then the output's
      // factor and l over sigma, as the 64-row tile applies a page (apply_page).
      float inv[kCols], r[kCols];
#pragma unroll
      for (int i = 0; i < kCols; ++i) {
        const bool seen = mx[i] != -INFINITY;
        const RowPageScale f = per_page_scale(seen, pmax[i], sum[i], m[i], m_new[i]);
        inv[i] = f.inv;
        r[i] = apply_row_page(l[i], sigma[i], seen, f.sig, f.rho, f.lsum);
        m[i] = m_new[i];
      }
      // P' / sigma_b as e4m3 into this page's P' tile (row-major over tokens: the PV's B operand).
      uint8_t* pt = sm.p_tile(c, k);
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint16_t b2 = e4m3x2(__fmul_rn(acc[n][2 * h], inv[2 * n]), __fmul_rn(acc[n][2 * h + 1], inv[2 * n + 1]));
          const int tok = tok0 + 8 * h;
          pt[km_offset(8 * n + 2 * q, tok, kPageSize)] = uint8_t(b2 & 0xFF);
          pt[km_offset(8 * n + 2 * q + 1, tok, kPageSize)] = uint8_t(b2 >> 8);
        }
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          o[mt][n][0] *= r[2 * n];
          o[mt][n][1] *= r[2 * n + 1];
          o[mt][n][2] *= r[2 * n];
          o[mt][n][3] *= r[2 * n + 1];
        }
      uint32_t a[kMTiles][2][4];
      load_v(a, sm.kl(s), warp, lane, ntok, band - blk);
      sm.ring.release(j);  // the QK retired and V is in registers
      wg::fence_proxy_async();  // P' written with st.shared, read by wgmma
      ptx::named_barrier(int(NarrowBarrier::kConsumerWarps) + c, 128);
      wg::fence();
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) wg::mma_64x16x32_e4m3_rs(o[mt], a[mt][kk], wg::desc(pt + 256 * kk, 128, 512));
      wg::commit();
    }
    wg::wait<0>();
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) wg::fence_operands(o[mt]);

    // l over the consumer's 64 tokens per page: the warp's g, then its four warps. Written out
    // rather than through narrow_rows_reduce: with the helper here ptxas serializes this kernel's
    // wgmmas (C7515), which the maxima's calls above do not cause.
#pragma unroll
    for (int i = 0; i < kCols; ++i)
#pragma unroll
      for (int s = 4; s < 32; s <<= 1) l[i] += __shfl_xor_sync(0xffffffffu, l[i], s);
    if (lane < 4)
#pragma unroll
      for (int i = 0; i < kCols; ++i) sm.red_at(c, 0, warp)[narrow_col(i, lane)] = l[i];
    ptx::named_barrier(int(NarrowBarrier::kConsumerWarps) + c, 128);
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      const int col = narrow_col(i, q);
      l[i] = (sm.red_at(c, 0, 0)[col] + sm.red_at(c, 0, 1)[col]) + (sm.red_at(c, 0, 2)[col] + sm.red_at(c, 0, 3)[col]);
    }
    // Merge: consumer 1 hands its state and O^T over; consumer 0 writes the result.
    if (c == 1) {
      if (t < 4)
#pragma unroll
        for (int i = 0; i < kCols; ++i) {
          const int col = narrow_col(i, q);
          sm.stat[col] = m[i];
          sm.stat[kN + col] = l[i];
          sm.stat[2 * kN + col] = sigma[i];
        }
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) sm.xfer[((mt * 2 + n) * 4 + e) * 128 + t] = o[mt][n][e];
    }
    // One barrier instruction for both consumers: bar.sync is the .aligned form, which wants
    // every thread that reaches the barrier at the same instruction (compute-sanitizer's synccheck
    // flagged the two call sites this had, one per branch, as divergent).
    ptx::named_barrier(int(NarrowBarrier::kMerge), 256);
    dependents_after_pages(p, range, item);
    if (c == 1) continue;  // consumer 0 writes the result
    if (t == 0) SNAPMLA_MARK(kLoopDone);  // the CTA's last split's, in the end
    // Every page was acquired before the merge barrier; a bad length faults the whole sequence.
    const bool fault = sm.ring.faulted() || w.bad_len;
    // Both parts in the domain of the larger max: weight_c = sigma_c exp(m_c - M) (l_c and O^T_c
    // are kept over sigma_c), 0 for a part that saw nothing.
    float w0[kCols], w1[kCols], scale[kCols];
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      const int col = narrow_col(i, q);
      const float m1 = sm.stat[col], l1 = sm.stat[kN + col], s1 = sm.stat[2 * kN + col];
      const float mm = fmaxf(m[i], m1);
      w0[i] = m[i] == -INFINITY ? 0.f : sigma[i] * fast_exp(m[i] - mm);
      w1[i] = m1 == -INFINITY ? 0.f : s1 * fast_exp(m1 - mm);
      const float lt = l[i] * w0[i] + l1 * w1[i];
      scale[i] = row_scale(lt, 1.f, fault);
      if (warp == 0 && g == 0 && col < p.rows) store_lse(p, w, col, row_lse(mm, lt, fault));
    }
    const int d0 = 16 * warp + 2 * g;
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = 2 * n + e, col = narrow_col(i, q);
        if (col >= p.rows) continue;
        const int64_t row = int64_t(col) * kLatentDim + d0;
        uint16_t* out = bf16_rows_of(p, w) + row;  // (when as_bf16_rows)
        float* part = p.partial_out + int64_t(w.split) * p.rows * kLatentDim + row;
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          const float x1 = sm.xfer[((mt * 2 + n) * 4 + e) * 128 + t];
          const float y1 = sm.xfer[((mt * 2 + n) * 4 + e + 2) * 128 + t];
          // 0 * NaN cannot happen here: a fault sets the scale itself to NaN.
          const float v0 = (o[mt][n][e] * w0[i] + x1 * w1[i]) * scale[i];
          const float v1 = (o[mt][n][e + 2] * w0[i] + y1 * w1[i]) * scale[i];
          if (as_bf16_rows(p, w))
            *reinterpret_cast<uint32_t*>(out + 64 * mt) = bf16x2_bits(v0, v1);
          else
            *reinterpret_cast<float2*>(part + 64 * mt) = make_float2(v0, v1);
        }
      }
    if (t == 0) SNAPMLA_MARK(kStored);
  }
  // SNAPMLA_COMBINE_FUSED: the split sequences' rows merged here, not by the combine kernel.
  // Its scratch: the page stages, free once the CTA's splits are done.
  if constexpr (kTail)
    combine_tail<128 * NarrowConfig::kConsumers>(p, kNarrowTileRows, threadIdx.x - 128, reinterpret_cast<float4*>(sm.stage));
}

}  // namespace

void launch_decode_fp8_narrow(RoleIndex role, const DecodeParams& p, const CUtensorMap& tm_latent,
                              const CUtensorMap& tm_rope, const DecodeOptions& options) {
  profile::before_launch();  // profiling builds only: the stamps' table and report
  if (role == RoleIndex::kUniform)  // the default: with its combine-tail twin
    launch_decode<NarrowConfig, SplitKernels<decode_fp8_narrow_kernel<RoleIndex::kUniform>,
                                             decode_fp8_narrow_kernel<RoleIndex::kUniform, true>, nullptr, nullptr,
                                             decode_fp8_narrow_kernel<RoleIndex::kUniform>>>(
        "decode_fp8", kSmemBytes, p, options, tm_latent, tm_rope);
  else  // (Each kernel stores bf16 partials where DecodeParams::partial_bf16 says so.)
    launch_decode<NarrowConfig, SplitKernels<decode_fp8_narrow_kernel<RoleIndex::kThread>, nullptr, nullptr, nullptr,
                                             decode_fp8_narrow_kernel<RoleIndex::kThread>>>(
        "decode_fp8", kSmemBytes, p, options, tm_latent, tm_rope);
  profile::after_launch("decode_fp8 (narrow tile)");
}

}  // namespace snapmla::cuda
