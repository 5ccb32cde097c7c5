// decode_fp8 (version 15): TMA page pipeline, warp-specialized, ping-pong consumers.
//
// CTA = one split of one sequence x 64 query rows (one wgmma M tile), 3 warpgroups:
//   WG0  producer. One thread requests the Q latent tile (TMA, the pages' swizzled layout), then
//        streams pages into a 3-stage ring with TMA (latent and rope as 64 x 128-byte boxes with
//        128-byte swizzle, the 64 scales as a bulk copy), completing on the stage's mbarrier;
//        page indices are read two pages ahead. Warps 1-3
//        transpose each landed page's latent into a 2-stage V^T ring (ldmatrix.trans, byte
//        permutes, stmatrix), zeroing tokens past the split end.
//   WG1, WG2  consumers. Consumer c owns pages j = c (mod 2): it computes S of page j (all 64
//        tokens and rows: the rope product from Q registers, HGMMA m64n64k16, then QGMMA
//        m64n64k32 over the latent), takes the running max after page j - 1 from the other
//        consumer as soon as that one has its scores (the reference's per-page chain), turns
//        its page into P' / sigma (e4m3, sigma per row) in the page's P buffer, publishes sigma
//        and alpha / sigma per row and releases the stage; then it adds PV of page j - 1 (the
//        other's P') and of page j to its 256 output dims (QGMMA m64n256k32, P and V^T from
//        shared memory; the factor before each is one multiply), and issues the QK of page
//        j + 2. The two run half a pair apart: one's softmax under the other's wgmmas. After
//        the pages, a sequence with one split writes its bf16 output through shared memory as
//        whole 128-byte rows (epilogue.cuh).
// Calls whose rows all fit 16 (h * s_q <= 16) run the narrow tile instead (decode_fp8_narrow.cu,
// chosen by use_narrow_tile below).
// History, measurements and what bounds it: docs/kernels.md.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

#include "../common/check.cuh"
#include "../common/ptx.cuh"
#include "../common/wgmma.cuh"
#include "../kernels.hpp"
#include "decode/epilogue.cuh"
#include "decode/launch.hpp"
#include "decode/narrow.hpp"
#include "decode/pipeline.cuh"
#include "decode/scheduler.cuh"
#include "decode/softmax.cuh"
#include "decode/stamps.cuh"
#include "decode/tensor_map.hpp"

namespace snapmla::cuda {
namespace {

constexpr int kStages = 3;    // pages in flight (K-major latent, rope, scales)
constexpr int kVtStages = 2;  // transposed latents (V^T) ready for PV
constexpr int kRows = kTileRows;
// The producer warpgroup's two roles, so that loads never wait on the transposition: warp 0
// loads (one thread streams pages into the ring as fast as it frees up);
// warps 1-3 turn each landed page's latent into V^T (stage i % kVtStages, once PV of the page
// that used it is done) and then count as readers of the page's stage.
constexpr int kLoaders = 32, kTransposerWarps = 3, kTransposers = 32 * kTransposerWarps;

// Byte sizes of the shared-memory tiles (K-major, 8 x 16 B core matrices, 128 B each). The Q
// rope part lives in the consumers' registers (wgmma A operand), which pays for the P buffers.
constexpr int kQnBytes = kRows * kLatentDim;       // 32 KB, as a page's latent (TMA, 128-byte swizzle)
constexpr int kKlBytes = kPageSize * kLatentDim;   // 32 KB
constexpr int kKrBytes = kPageSize * kRopeDim * 2; // 8 KB
constexpr int kStageBytes = kKlBytes + kKrBytes;  // 1024-aligned tiles (128-byte swizzle)
constexpr int kLatentBox = kTmaBoxBytes;          // TMA box: 64 tokens x 128 bytes of latent
constexpr int kVtBytes = 256 * kPageSize;          // one half: 256 dims x 64 tokens, SBO 512
constexpr int kPBytes = kRows * kPageSize;         // one page's P' / sigma, e4m3, SBO 512
using Ring = PageRing<kStages>;
// Named barriers of the consumers' hand-offs (page j's owner arrives, the other syncs; ids by
// j % 2): the running max after page j is in xmax, page j's P' and sigma are in place, and the
// non-owner's PV of page j is done (its P buffer may take page j + 2). Id 1: add_other_sums;
// kBarOwn0: consumer 0's warps among themselves after page 0's P'.
constexpr int kBarMax = 2, kBarP = 4, kBarFree = 6, kBarOwn0 = 8;
// Hand-off `kBase + which` over both consumers (which: the consumer that owns the page, since
// consumer c owns the pages j = c mod 2). The id stays in a register: immediate ids need a
// predicated pair per hand-off, measured 4% slower at h = 128.
template <int kBase>
__device__ __forceinline__ void hand_sync(int which) { ptx::named_barrier(kBase + which, 256); }
template <int kBase>
__device__ __forceinline__ void hand_arrive(int which) { ptx::named_barrier_arrive(kBase + which, 256); }
constexpr int kVtBarBytes = 2 * kVtStages * 8;
constexpr int kXchgBytes = 4 * 2 * kRows * 4;  // running maxima, (sigma, rho) (per page parity), l (per consumer)
constexpr int kScaleBytes = kPageSize * 4;
constexpr int kSmemBytes = kQnBytes + kStages * kStageBytes + kVtStages * 2 * kVtBytes + 2 * kPBytes +
                           kStages * kScaleBytes + Ring::kBytes + kVtBarBytes + kXchgBytes;
static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on sm_90");

struct Smem {
  uint8_t* qn;
  uint8_t* stage;
  uint8_t* vt_base;
  uint8_t* pbuf;  // [2][kPBytes]: P' / sigma of the pair's pages
  float* scales;  // [kStages][64]
  Ring ring;
  uint64_t* vt_full;   // [kVtStages]: kTransposers arrivals (V^T written)
  uint64_t* vt_empty;  // [kVtStages]: 256 consumer arrivals (PV done reading)
  float* xmax;         // [2][64]: the running max after page j, in slot j % 2
  float2* xsig;        // [2][64]: page j's (sigma, rho) per row (sigma 0: nothing visible), slot j % 2
  float* xl;           // [2][64]: each consumer's part of l, after the pages
  __device__ explicit Smem(uint8_t* base)
      : qn(base),
        stage(base + kQnBytes),
        vt_base(stage + kStages * kStageBytes),
        pbuf(vt_base + kVtStages * 2 * kVtBytes),
        scales(reinterpret_cast<float*>(pbuf + 2 * kPBytes)),
        ring(scales + kStages * kPageSize),
        vt_full(reinterpret_cast<uint64_t*>(reinterpret_cast<uint8_t*>(scales + kStages * kPageSize) + Ring::kBytes)),
        vt_empty(vt_full + kVtStages),
        xmax(reinterpret_cast<float*>(vt_empty + kVtStages)),
        xsig(reinterpret_cast<float2*>(xmax + 2 * kRows)),
        xl(reinterpret_cast<float*>(xsig + 2 * kRows)) {}
  __device__ uint8_t* kl(int s) const { return stage + s * kStageBytes; }
  __device__ uint8_t* kr(int s) const { return stage + s * kStageBytes + kKlBytes; }
  // P' / sigma of page j as e4m3 [64 rows x 64 slots] (K-major, in V^T's slot order).
  __device__ uint8_t* p_tile(int j) const { return pbuf + (j % 2) * kPBytes; }
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

// The latent of one page (64 tokens x 512 dims, K-major) -> V^T for PV: two halves of 256 dims
// x 64 token slots, K-major, slot 16 h + 4 q + j of 32-token chunk k holding token
// 32 k + 16 h + {2q, 2q+1, 2q+8, 2q+9}[j]: the order of a thread's S fragment, so each row's
// P' bytes of four slots are one 4-byte word. One unit of work is 16 tokens (group gi) x 128
// dims (TMA box b) for one warp: per 32 dims one transposing ldmatrix (b16 units: two tokens x
// two dims per register), byte permutes split the dim pairs into 4-token words, and one
// stmatrix writes the 32 dims' 16-byte rows (each matrix row one dim's 16 slots). Lane 4 c + q
// holds dims 2 c, 2 c + 1 (and 16 more); lanes c >= 4 swap which of the two goes to the even
// matrix, so that each matrix's eight rows fall in eight different 16-byte bank groups (a V^T
// row's bank group is its dim % 8). Transposer warp tw takes units tw, tw + 3, ...; its lanes'
// offsets are the same for every page, so they are computed once.
constexpr int kUnitsPerWarp = (16 + kTransposerWarps - 1) / kTransposerWarps;
struct TransposeLanes {
  uint32_t src[kUnitsPerWarp];  // the lane's ldmatrix row in the latent tile, per unit
  uint32_t dst[kUnitsPerWarp];  // the lane's stmatrix row in the page's V^T, per unit
  uint32_t chunk[4];            // the lane's 16-byte chunk (swizzled) for each 32-dim step
  int t0[kUnitsPerWarp];        // the first of the lane's four tokens, per unit
  uint32_t sel_a, sel_b;        // byte permutes: the even matrix's dim first, then the odd one's
  __device__ TransposeLanes(int tw, int lane) {
    const int m = lane / 8, c = lane / 4, q = lane % 4, r = lane % 8;
    // The dim (within 32) of matrix m's row r: 16 (m / 2) + 2 r, + 1 for the odd matrices,
    // swapped for rows 4-7.
    const int dk = 16 * (m / 2) + 2 * r + ((m % 2) ^ (r / 4));
#pragma unroll
    for (int k = 0; k < kUnitsPerWarp; ++k) {
      const int u = tw + kTransposerWarps * k, gi = (u / 4) % 4, b = u % 4;
      // The latent tile as TMA wrote it: box b = bytes [128 b, 128 b + 128) of each token's
      // row, 128 bytes per token, 16-byte chunk x of row t at chunk x ^ (t % 8).
      src[k] = b * (kPageSize * kLatentBox) + (16 * gi + (m % 2) * 8 + lane % 8) * kLatentBox;
      dst[k] = (dk / 8) * 512 + (dk % 8) * 16 + gi * 128 + b * 4 * 2048;
      t0[k] = 16 * gi + 2 * q;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) chunk[i] = (((2 * i + m / 2) % 8) ^ (lane % 8)) * 16;
    sel_a = c < 4 ? 0x6420u : 0x7531u;
    sel_b = c < 4 ? 0x7531u : 0x6420u;
  }
};

// One unit; keep masks the bytes of tokens at or past the split end (P is 0 there, but V may
// be NaN). The four ldmatrix are issued before any store (they would otherwise wait on each
// other through the stores' memory order).
__device__ __forceinline__ void transpose_unit(const uint8_t* src, uint8_t* dst, const TransposeLanes& tl,
                                               uint32_t keep) {
  uint32_t r[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) ptx::ldsm_x4_trans(src + tl.chunk[i], r[i]);
#pragma unroll
  for (int i = 0; i < 4; ++i)
    ptx::stsm_x4(dst + i * 2048, ptx::prmt(r[i][0], r[i][1], tl.sel_a) & keep,
                 ptx::prmt(r[i][0], r[i][1], tl.sel_b) & keep, ptx::prmt(r[i][2], r[i][3], tl.sel_a) & keep,
                 ptx::prmt(r[i][2], r[i][3], tl.sel_b) & keep);
}

__device__ __forceinline__ void transpose_page(const Smem& sm, int i, int tw, const TransposeLanes& tl, int ntok) {
  const bool stamp = threadIdx.x == 32;
  if (stamp) STAMP(2, i / 2, (i % 2) * 4);
  sm.ring.wait(i);
  if (stamp) STAMP(2, i / 2, (i % 2) * 4 + 1);
  if (i >= kVtStages) wg::mbar_wait(&sm.vt_empty[i % kVtStages], ((i / kVtStages) - 1) & 1);
  if (stamp) STAMP(2, i / 2, (i % 2) * 4 + 2);
  const uint8_t* kl = sm.kl(i % kStages);
  uint8_t* vt = sm.vt(i, 0);
  if (ntok == kPageSize) {  // a whole page: no masks
#pragma unroll
    for (int k = 0; k < kUnitsPerWarp; ++k)
      if (tw + kTransposerWarps * k < 16) transpose_unit(kl + tl.src[k], vt + tl.dst[k], tl, 0xFFFFFFFFu);
  } else {
#pragma unroll
    for (int k = 0; k < kUnitsPerWarp; ++k) {
      const int t0 = tl.t0[k];
      const uint32_t keep = (t0 < ntok ? 0xFFu : 0u) | (t0 + 1 < ntok ? 0xFF00u : 0u) |
                            (t0 + 8 < ntok ? 0xFF0000u : 0u) | (t0 + 9 < ntok ? 0xFF000000u : 0u);
      if (tw + kTransposerWarps * k < 16) transpose_unit(kl + tl.src[k], vt + tl.dst[k], tl, keep);
    }
  }
  wg::fence_proxy_async();  // V^T written with st.shared, read by wgmma (async proxy)
  wg::mbar_arrive(&sm.vt_full[i % kVtStages]);
  sm.ring.release(i);       // done reading the stage's latent
  if (stamp) STAMP(2, i / 2, (i % 2) * 4 + 3);
}

// o = o * r (per row) + P' V^T of page jj for output half c (issued and committed, not waited
// for); page jj's P' is in P buffer jj % 2. slot, sk: clock64 stamp slots (SNAPMLA_STAMPS builds).
__device__ __forceinline__ void pv_page(float (&o)[32][4], const float (&r)[2], const Smem& sm, int jj, int c,
                                        int slot = -1, int sk = 0) {
  scale_rows(o, r);
  const uint8_t* pt = sm.p_tile(jj);
  const uint8_t* vt = sm.vt(jj, c);
  if (slot >= 0 && threadIdx.x % 128 == 0) STAMP(c, sk, slot);
  wg::mbar_wait(&sm.vt_full[jj % kVtStages], (jj / kVtStages) & 1);
  if (slot >= 0 && threadIdx.x % 128 == 0) STAMP(c, sk, slot + 1);
  wg::fence_operands(o);
  wg::fence();
  wg::mma_64x256x32_e4m3_ss(o, wg::desc(pt, 128, 512), wg::desc(vt, 128, 512));
  wg::mma_64x256x32_e4m3_ss(o, wg::desc(pt + 256, 128, 512), wg::desc(vt + 256, 128, 512));
  wg::commit();
}

__global__ void __launch_bounds__(384, 1)
    decode_fp8_kernel(const __grid_constant__ DecodeParams p, const __grid_constant__ CUtensorMap tm_latent,
                      const __grid_constant__ CUtensorMap tm_rope, const __grid_constant__ CUtensorMap tm_q) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const int item = grid_item(p);
  if (!has_work(p, item)) return;
  const Smem sm(smem_raw);
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  const int row0 = grid_row0(p);
  if (threadIdx.x == 0) {
    CTA_STAMP(0);
    if (ptx::smem_addr(smem_raw) % 1024 != 0) __trap();  // the swizzled tiles need it
    wg::prefetch_tensormap(&tm_latent);
    wg::prefetch_tensormap(&tm_rope);
    wg::prefetch_tensormap(&tm_q);
    // A stage is read by its page's owner (QK, scales) and the transposers; the Q tile comes
    // with one arrival and its bytes.
    sm.ring.init(128 + kTransposers, 1);
    sm.init_vt();
  }
  __syncthreads();

  // Each role looks its work up after its register reallocation (values live across setmaxnreg
  // have to fit the producer's budget).
  if (wg == 0) {
    wg::setmaxnreg_dec<56>();
    const Work w = work_of(p, item);
    const int nblk = w.pages();
    if (t >= kLoaders) {
      const int tw = (t - kLoaders) / 32;
      const TransposeLanes tl(tw, t % 32);
      for (int i = 0; i < nblk; ++i)
        transpose_page(sm, i, tw, tl, min(kPageSize, w.end - (w.begin + i * kPageSize)));
      return;
    }
    // The Q latent tile first (one TMA request; it needs no page index), then the pages: both
    // stand between the CTA's start and its first QK.
    if (t == 0) {
      load_q_tile<kLatentDim, 1>(&tm_q, sm.qn, int(int64_t(w.seq) * p.rows + row0), sm.ring.qbar);
      sm.ring.stream(p, w, &tm_latent, &tm_rope, sm, 0, nblk);
    }
    return;
  }

  wg::setmaxnreg_inc<224>();
  const Work w = work_of(p, item);
  const int nblk = w.pages();
  const int c = wg - 1;  // owns pages j = c (mod 2); output half c
  const int warp = t / 32, lane = t % 32, g = lane / 4, q = lane % 4;
  const int r0 = 16 * warp + g;  // the thread's first row in the tile (and r0 + 8)
  int64_t row[2];
  int vis[2];
  uint32_t qa[4][4];  // Q rope, the rope product's A operand
  load_q_rows(p, w, row0, r0, q, p.q_rope, kRopeDim, row, vis, qa);
  const float factor[2] = {p.softmax_scale * p.q_scale[row[0]], p.softmax_scale * p.q_scale[row[1]]};
  SoftmaxState st;
  float o[32][4];
#pragma unroll
  for (int n = 0; n < 32; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  wg::mbar_wait(sm.ring.qbar, 0);

  // S of page j (this warpgroup's) into acc: issued behind the PVs of the previous iteration,
  // waited for at the top of the next.
  float acc[8][4];
  const uint64_t qn = wg::desc_sw128(sm.qn);
  auto issue_qk = [&](int j) {
    const int s = j % kStages;
    sm.ring.wait(j);
    wg::fence_operands(acc);
    wg::fence();
    // K tiles as TMA wrote them (128-byte swizzle, 128 bytes per token row): a K step moves
    // 32 bytes along the row, or to the next box. The bf16 rope product first (overwriting
    // the accumulator), then the FP8 latent product.
    const uint64_t kr = wg::desc_sw128(sm.kr(s)), kl = wg::desc_sw128(sm.kl(s));
    wg::mma_64x64x16_bf16_rs_zero(acc, qa[0], kr);
#pragma unroll
    for (int ks = 1; ks < 4; ++ks) wg::mma_64x64x16_bf16_rs(acc, qa[ks], wg::desc_add(kr, ks * 32));
#pragma unroll
    for (int kk = 0; kk < 16; ++kk)
      wg::mma_64x64x32_e4m3_ss(acc, wg::desc_add(qn, (kk / 4) * (kRows * kLatentBox) + (kk % 4) * 32),
                               wg::desc_add(kl, (kk / 4) * (kPageSize * kLatentBox) + (kk % 4) * 32));
    wg::commit();
  };
  // Iteration j: the softmax of page j (if j < nblk), then the PVs of pages j - 1 (the other
  // consumer's) and j for this output half, then the QK of page j + 2. Every iteration issues
  // exactly one QK and waits for it (past the last page it repeats the last one, whose stage
  // still holds it); the PVs depend only on j and nblk, and every wait is on all paths (ptxas
  // serializes every wgmma when it cannot see a group retired before its registers are used).
  // Consumer c's last iteration is page nblk - 1 or nblk (the PV of the other's last page).
  const int jlast = nblk > 0 ? nblk : -1;
  if (nblk > 0) issue_qk(min(c, nblk - 1));
  for (int j = c; j <= jlast; j += 2) {
    const bool mine = j < nblk;
    const bool stamp = t == 0;
    if (stamp) STAMP(c, j / 2, 0);
    wg::wait<0>();
    wg::fence_operands(acc);
    if (stamp) STAMP(c, j / 2, 1);
    float m_prev[2] = {-INFINITY, -INFINITY}, m_cur[2], sig[2] = {0.f, 0.f}, rho[2] = {0.f, 0.f};
    float lsum[2] = {0.f, 0.f};
    if (mine) {
      const int s = j % kStages;
      const int blk = w.begin + j * kPageSize;
      // The common case, every token of the page visible to every row of the warp, skips the
      // masks; a warp whose rows see nothing of the page (padding rows past h * s_q, causal
      // rows) skips the softmax.
      const bool full = __all_sync(0xffffffffu, blk + kPageSize <= min(vis[0], vis[1]));
      const bool none = __all_sync(0xffffffffu, blk >= max(vis[0], vis[1]));
      float mx[2] = {-INFINITY, -INFINITY};
      if (full) page_scores<false>(acc, factor, vis, blk, sm.scale(s), q, mx);
      else if (!none) page_scores<true>(acc, factor, vis, blk, sm.scale(s), q, mx);
      if (stamp) STAMP(c, j / 2, 2);
      // The running max after page j - 1, from its owner (the chain of the reference).
      if (j > 0) {
        hand_sync<kBarMax>(1 - c);
        m_prev[0] = sm.xmax[((j - 1) % 2) * kRows + r0];
        m_prev[1] = sm.xmax[((j - 1) % 2) * kRows + r0 + 8];
      }
      m_cur[0] = fmaxf(m_prev[0], mx[0]);
      m_cur[1] = fmaxf(m_prev[1], mx[1]);
      if (q == 0) {
        sm.xmax[(j % 2) * kRows + r0] = m_cur[0];
        sm.xmax[(j % 2) * kRows + r0 + 8] = m_cur[1];
      }
      if (j + 1 < nblk) hand_arrive<kBarMax>(c);
      if (stamp) STAMP(c, j / 2, 3);
      // P' / sigma as e4m3: token 8 n + 2 q + e of 32-token chunk h sits at slot
      // 32 h + 16 (n / 2 % 2) + 4 q + 2 (n % 2) + e, so each row's 4 bytes are one word.
      uint8_t* pt = sm.p_tile(j);
      auto p_word = [&](int ri, int hh) { return pt + km_offset(r0 + 8 * ri, 16 * hh + 4 * q, kPageSize); };
      if (none) {
        sm.ring.release(j);
        if (j >= 2) hand_sync<kBarFree>(c);  // the other's PV of page j - 2 is done
#pragma unroll
        for (int ri = 0; ri < 2; ++ri)
#pragma unroll
          for (int hh = 0; hh < 4; ++hh) ptx::sts32(p_word(ri, hh), 0u);
      } else {
        float pmax[2] = {0.f, 0.f}, sum[2] = {0.f, 0.f};
        if (full) page_probs<false>(acc, m_cur, sm.scale(s), q, sum, pmax);
        else page_probs<true>(acc, m_cur, sm.scale(s), q, sum, pmax);
        sm.ring.release(j);  // QK operands and scales are read: the loader may refill the stage
        // sigma = max(max P', 1e-10) / 448 and its inverse without branches, the inverse as
        // MUFU.RCP and a multiply (2 ulp; the reference divides exactly - see
        // docs/reference.md). Rows that saw nothing in this page: P' = 0, sigma 0.
        float inv[2];
#pragma unroll
        for (int ri = 0; ri < 2; ++ri) {
          const bool seen = mx[ri] != -INFINITY;
          const float a = fmaxf(pmax[ri], kMinAmax);
          inv[ri] = seen ? __fdividef(kE4m3Max, a) : 0.f;
          sig[ri] = seen ? a * (1.f / kE4m3Max) : 0.f;
          rho[ri] = fast_exp(m_prev[ri] - m_cur[ri]) * inv[ri];  // alpha_j / sigma_j (0 on a row's first page)
          lsum[ri] = sum[ri] * inv[ri];
        }
        if (stamp) STAMP(c, j / 2, 4);
        if (j >= 2) hand_sync<kBarFree>(c);  // the other's PV of page j - 2 is done
        if (stamp) STAMP(c, j / 2, 5);
#pragma unroll
        for (int ri = 0; ri < 2; ++ri)
#pragma unroll
          for (int hh = 0; hh < 4; ++hh)
            ptx::sts32(p_word(ri, hh), e4m3x4(__fmul_rn(acc[2 * hh][2 * ri], inv[ri]),
                                              __fmul_rn(acc[2 * hh][2 * ri + 1], inv[ri]),
                                              __fmul_rn(acc[2 * hh + 1][2 * ri], inv[ri]),
                                              __fmul_rn(acc[2 * hh + 1][2 * ri + 1], inv[ri])));
      }
      wg::fence_proxy_async();  // P written with st.shared, read by wgmma
      if (q == 0) {
        sm.xsig[(j % 2) * kRows + r0] = make_float2(sig[0], rho[0]);
        sm.xsig[(j % 2) * kRows + r0 + 8] = make_float2(sig[1], rho[1]);
      }
      hand_arrive<kBarP>(c);  // the other applies every page
      if (stamp) STAMP(c, j / 2, 6);
    }
    // PV of page j - 1 (the other's P', in place once its owner arrived), then of page j.
    if (j > 0) {
      const int jo = j - 1;
      hand_sync<kBarP>(1 - c);
      if (stamp) STAMP(c, j / 2, 7);
      float r[2];
#pragma unroll
      for (int ri = 0; ri < 2; ++ri) {
        const float2 x = sm.xsig[(jo % 2) * kRows + r0 + 8 * ri];
        r[ri] = apply_page(st, ri, x.x, x.y, 0.f);
      }
      pv_page(o, r, sm, jo, c, 13, j / 2);
      if (stamp) STAMP(c, j / 2, 8);
      wg::wait<0>();
      wg::fence_operands(o);
      if (stamp) STAMP(c, j / 2, 9);
      wg::mbar_arrive(&sm.vt_empty[jo % kVtStages]);
      if (j + 1 < nblk) hand_arrive<kBarFree>(1 - c);  // page j + 1's P' may go there
    }
    if (mine) {
      float r[2];
#pragma unroll
      for (int ri = 0; ri < 2; ++ri) r[ri] = apply_page(st, ri, sig[ri], rho[ri], lsum[ri]);
      // All of this page's P' is written: for j > 0 the P(j - 1) sync above ordered this
      // consumer's warps; page 0 has none before it.
      if (j == 0) ptx::bar_sync<kBarOwn0, 128>();
      pv_page(o, r, sm, j, c, 15, j / 2);
    }
    if (stamp) STAMP(c, j / 2, 10);
    issue_qk(min(j + 2, nblk - 1));
    if (stamp) STAMP(c, j / 2, 11);
    wg::wait<1>();
    wg::fence_operands(o);
    if (stamp) STAMP(c, j / 2, 12);
    if (mine) wg::mbar_arrive(&sm.vt_empty[j % kVtStages]);
  }
  wg::wait<0>();
  wg::fence_operands(acc);
  add_other_sums(st, sm.xl, c, r0, q);
  const bool fault = sm.ring.faulted();  // every page was acquired before add_other_sums' barrier
  // l was kept over sigma; the running max after the last page (lse) is in its xmax slot (the
  // barrier in add_other_sums made it visible to every thread).
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    st.l[ri] *= st.sigma[ri];
    if (nblk > 0) st.m[ri] = sm.xmax[((nblk - 1) % 2) * kRows + r0 + 8 * ri];
  }
  // Past add_other_sums' barrier no wgmma is in flight and every page was consumed: each warp
  // stages its 8 KB of bf16 in the page stages.
  if (w.single) write_rows_staged(p, w, st, o, sm.stage + (4 * c + warp) * 8192, row0 + 16 * warp, 256 * c, lane, c == 0, fault);
  else write_partials(p, w, st, o, row0 + 16 * warp, 256 * c, lane, c == 0, fault);
  if (t == 0 && c == 0) CTA_STAMP(1);
}

// The tile a call runs: the narrow one (decode_fp8_narrow.cu) when all of a sequence's query
// rows fit it, else the 64-row one. SNAPMLA_FP8_TILE=64 / 16 forces one (benchmarks and tests
// compare the two on the same inputs; 16 with more rows than the narrow tile holds is an error).
bool use_narrow_tile(int rows) {
  const char* env = std::getenv("SNAPMLA_FP8_TILE");
  const std::string force = env != nullptr ? env : "";
  if (force.empty()) return rows <= kNarrowTileRows;
  if (force == "64") return false;
  if (force != "16") detail::fail("decode_fp8", "SNAPMLA_FP8_TILE", "expected 16, 64 or unset, got '" + force + "'");
  if (rows > kNarrowTileRows)
    detail::fail("decode_fp8", "SNAPMLA_FP8_TILE",
                 "expected 64 or a call with at most 16 query rows (num_heads * seqlen_q) for 16 (the narrow tile), "
                 "got " + std::to_string(rows) + " rows");
  return true;
}

}  // namespace

void decode_fp8(const QuantizedQuery& q, const PagedFp8Cache& cache, const PageTable& pages,
                const DecodeOutput& out, const DecodeOptions& options) {
  DecodeParams p = make_params("decode_fp8", q.batch, q.seqlen_q, q.num_heads, pages, out, options);
  if (q.batch == 0) return;
  p.q_nope = reinterpret_cast<const uint8_t*>(q.nope);
  p.q_rope = reinterpret_cast<const uint16_t*>(q.rope);
  p.q_scale = q.scale;
  p.k_scale = cache.scale;
  p.num_pages = cache.num_pages;
  const int64_t rows = cache.num_pages * kPageSize;
  const CUtensorMap tm_latent = plane_map(cache.latent, rows, kLatentDim, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1);
  const CUtensorMap tm_rope = plane_map(cache.rope, rows, kRopeDim * 2, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2);
  if (use_narrow_tile(p.rows)) {
    launch_decode_fp8_narrow(p, tm_latent, tm_rope, options);
    return;
  }
  // The query latent as one more plane: [batch * rows, 512] bytes, a tile's 64 rows per box row.
  const CUtensorMap tm_q = plane_map(q.nope, int64_t(q.batch) * p.rows, kLatentDim, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1);
  launch_decode("decode_fp8", decode_fp8_kernel, kSmemBytes, p, options, tm_latent, tm_rope, tm_q);
  dump_stamps("decode_fp8");
}

}  // namespace snapmla::cuda
