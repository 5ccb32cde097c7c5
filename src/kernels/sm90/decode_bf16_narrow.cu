// decode_bf16, narrow tile: up to 16 query rows per CTA (h * s_q <= 16), the default for such calls
// at batches of at most 32 (Bf16Tile::kAuto, params.hpp; SNAPMLA_BF16_TILE=narrow / rows64 force
// either). The 64-row tile
// (decode_bf16.cu) pads such rows to a wgmma M of 64 and pays the whole tile's per-page chain, so
// at h <= 16 its period comes close to the page's load time; here the products are transposed, as
// in decode_fp8's narrow tile, so that the rows are the wgmma N (16) and the page's 64 tokens / 512
// dims are M:
//   S^T (64 tokens x 16 rows)  = K Q^T:    A = the page's nine boxes as TMA wrote them (K-major,
//                                          128-byte swizzle), B = the Q tile (HGMMA m64n16k16 x 36);
//   O^T (512 dims x 16 rows)  += V^T P^T:  A = the same latent boxes read MN-major (BF16 wgmma
//                                          transposes 16-bit operands itself), B = P (16 rows x 64
//                                          tokens), 8 M tiles x 4 K steps.
// The tensor work per page is a quarter of the 64-row tile's and nothing is transposed by hand, so
// one consumer warpgroup keeps up with the pages' loads: it runs the reference's loop over the
// pages in order (docs/reference.md: P rounded to bf16 at the running max, page by page), the same
// chain as the 64-row tile's, with no hand-off and no merge.
// CTA = one split x the rows, 2 warpgroups:
//   WG0  producer: one thread requests the first pages, the warpgroup loads the Q tile (cp.async),
//        then that thread streams the split's pages into a 2-stage ring with TMA (a stage is one
//        72 KB page: two stages and the Q tile fill what shared memory allows).
//   WG1  consumer: page j's QK is issued under page j - 1's PV; then the softmax of page j, its P
//        into the P tile, the output's rescale, and its PV.
// A thread holds tokens 16 w + g, + 8 of S^T and the 4 rows 8 n + 2 q + {0, 1} (n = 0, 1), and of
// O^T the dims 64 mt + 16 w + g, + 8 of the same rows; per-row reductions: narrow_rows.cuh.
#include <cuda.h>
#include <cuda_runtime.h>

#include "kernels/common/check.cuh"
#include "kernels/common/mbarrier.cuh"
#include "kernels/common/numeric.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/tma.cuh"
#include "kernels/common/wgmma.cuh"
#include "kernels/kernels.hpp"
#include "decode/epilogue.cuh"
#include "decode/launch.hpp"
#include "decode/tile_launches.hpp"
#include "decode/narrow_rows.cuh"
#include "decode/pipeline.cuh"
#include "decode/scheduler.cuh"
#include "decode/softmax.cuh"
#include "decode/tensor_map.hpp"

namespace snapmla::cuda {
namespace {

// The CTA: a producer warpgroup and one consumer warpgroup. No register reallocation: at 256
// threads the launch leaves each thread up to 255 registers, more than the consumer needs.
struct Bf16NarrowConfig {
  static constexpr int kThreads = 256;
};
constexpr int kN = kNarrowTileRows;       // query rows per CTA: the wgmma N
constexpr int kStages = 2;                // page stages
constexpr int kMTiles = kLatentDim / 64;  // O^T's M tiles of 64 dims: one latent box each
constexpr int kKSteps = kPageSize / 16;   // the PV's K steps of 16 tokens
constexpr int kQRowBytes = kHeadDim * 2;  // a query row: 576 bf16
constexpr int kPRowBytes = kPageSize * 2; // a row of P: 64 bf16

using Ring = PageRing<kStages>;
// The shared-memory plan: offsets and size from this struct (the page stages first, at the dynamic
// shared memory's 1024-byte aligned base, for the TMA's swizzle).
struct Bf16NarrowSmemLayout {
  uint8_t stage[kStages][kBf16PageBytes];
  uint8_t q[kN * kQRowBytes];  // K-major no swizzle, SBO 8 x 1152
  uint8_t p[kN * kPRowBytes];  // P of the current page, K-major no swizzle, SBO 8 x 128
  float red[4 * kN];           // [warp][row]: the per-row reductions
  alignas(8) uint8_t ring[Ring::kBytes];
};
static_assert(kBf16PageBytes % 1024 == 0, "each stage's boxes keep the 128-byte swizzle's alignment");
static_assert(kBf16Boxes == kMTiles + 1, "eight latent boxes, then the rope box");
constexpr int kSmemBytes = int(sizeof(Bf16NarrowSmemLayout));
static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on sm_90");

// Named barrier ids (id 0 is __syncthreads'): the consumer's four warps (the reductions, the P tile).
enum class Bf16NarrowBarrier : int {
  kConsumerWarps = 1,
};

struct Smem {
  uint8_t* stage;
  uint8_t* q;
  uint8_t* p;
  float* red;
  Ring ring;
  __device__ explicit Smem(uint8_t* base)
      : stage(&reinterpret_cast<Bf16NarrowSmemLayout*>(base)->stage[0][0]),
        q(reinterpret_cast<Bf16NarrowSmemLayout*>(base)->q),
        p(reinterpret_cast<Bf16NarrowSmemLayout*>(base)->p),
        red(reinterpret_cast<Bf16NarrowSmemLayout*>(base)->red),
        ring(reinterpret_cast<Bf16NarrowSmemLayout*>(base)->ring) {}
  __device__ uint8_t* page(int s) const { return stage + s * kBf16PageBytes; }
  __device__ uint8_t* box(int s, int b) const { return page(s) + b * kBf16BoxBytes; }
};

// S^T of the page in stage s into acc (issued and committed, not waited for): box b's four K steps
// of 16 dims against the Q tile's K steps 4 b .. 4 b + 3; the first product starts the accumulator.
__device__ __forceinline__ void issue_qk(float (&acc)[2][4], const Smem& sm, int s, uint64_t qd) {
  wg::fence_operands(acc);
  wg::fence();
#pragma unroll
  for (int b = 0; b < kBf16Boxes; ++b) {
    const uint64_t kb = wg::desc_sw128(sm.box(s, b));
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t a = wg::desc_add(kb, kk * 32), bq = wg::desc_add(qd, (4 * b + kk) * 256);
      if (b == 0 && kk == 0) wg::mma_64x16x16_bf16_ss_zero(acc, a, bq);
      else wg::mma_64x16x16_bf16_ss(acc, a, bq);
    }
  }
  wg::commit();
}

// O^T += V^T P^T for the page in stage s (issued and committed, not waited for): M tile mt is latent
// box mt read MN-major, K step ks its token rows 16 ks .. 16 ks + 15 (2 KB each in the swizzle atom
// order), against the P tile's K step ks.
__device__ __forceinline__ void issue_pv(float (&o)[kMTiles][2][4], const Smem& sm, int s) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) wg::fence_operands(o[mt]);
  wg::fence();
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks)
      wg::mma_64x16x16_bf16_ss_ta(o[mt], wg::desc_sw128_mn(sm.box(s, mt) + ks * 2048, kBf16BoxBytes),
                                  wg::desc(sm.p + ks * 256, 128, 8 * kPRowBytes));
  wg::commit();
}

// The page's latent values that its PV must not meet, by the consumer's 128 threads after the QK
// has read them: every value of the tokens at or past ntok (past the split end: the cache slot may
// hold anything, and 0 x NaN is NaN), and the non-finite values (bf16 exponent all ones) of tokens
// in [band, ntok) (tokens some query rows do not see: those rows' P is 0; the rows that see them
// already have a non-finite score). A token's 64 dims of a box are one 128-byte row, whatever the
// swizzle's order of its 16-byte chunks.
__device__ __forceinline__ void sanitize_latent(const Smem& sm, int s, int band, int ntok, int t) {
  const int from = max(min(band, ntok), 0);
  constexpr int kChunksPerToken = kMTiles * (kTmaBoxBytes / 16);  // 64
  for (int c = t; c < (kPageSize - from) * kChunksPerToken; c += 128) {
    const int tok = from + c / kChunksPerToken, box = (c % kChunksPerToken) / 8, x = c % 8;
    uint4* v = reinterpret_cast<uint4*>(sm.box(s, box) + tok * kTmaBoxBytes + x * 16);
    if (tok >= ntok) {
      *v = make_uint4(0u, 0u, 0u, 0u);
      continue;
    }
    uint4 w = *v;
    uint32_t* h = &w.x;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if ((h[k] & 0x7F80u) == 0x7F80u) h[k] &= 0xFFFF0000u;
      if ((h[k] & 0x7F800000u) == 0x7F800000u) h[k] &= 0x0000FFFFu;
    }
    *v = w;
  }
}

__global__ void __launch_bounds__(Bf16NarrowConfig::kThreads, 1)
    decode_bf16_narrow_kernel(const __grid_constant__ DecodeParams p, const __grid_constant__ CUtensorMap tm_kv) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  dependents_at_start(p);  // a programmatic combine's blocks may start (they wait for this grid)
  const SplitRange range = cta_splits(p, reinterpret_cast<int*>(smem_raw));  // (a word of the stages, loaded later)
  if (range.first >= range.last) return;
  const Smem sm(smem_raw);
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  // A stage is read by the consumer's 128 threads; the Q tile comes with 128 cp.async arrivals.
  // Again before each further split of the worker (split_boundary).
  const auto init_barriers = [&] { sm.ring.init(128, 128); };
  start_cta(smem_raw, init_barriers, &tm_kv);

  if (wg == 0) {
    const auto load = [&](int32_t page, int s, uint64_t* bar) {
      load_bf16_page(p, &tm_kv, page, sm.page(s), bar, sm.ring.bad);
    };
    for (int item = range.first; item < range.last; ++item) {
      if (item > range.first) split_boundary<Bf16NarrowConfig::kThreads>(init_barriers);
      const Work w = lookup_work(p, item);
      const int nblk = w.pages();
      // The first pages (Ring::pages_before_q), then the Q tile by the whole warpgroup, then the
      // rest: all of them stand between the split's start and its first QK.
      const int first = Ring::pages_before_q(p, nblk);
      if (t == 0) sm.ring.stream_pages(p, w, 0, first, load);
      load_q_latent<kQRowBytes, kN>(sm.q, reinterpret_cast<const uint8_t*>(p.q_bf16), kQRowBytes, p, w, 0, t, 128);
      mbar::arrive_on_cp_async(sm.ring.qbar);
      if (t == 0) sm.ring.stream_pages(p, w, first, nblk, load);
    }
    return;
  }

  for (int item = range.first; item < range.last; ++item) {
    if (item > range.first) split_boundary<Bf16NarrowConfig::kThreads>(NoInit{});
    const Work w = lookup_work(p, item);
    const int nblk = w.pages();
    const int warp = uniform_in_warp<RoleIndex::kUniform>(t / 32), lane = t % 32, g = lane / 4, q = lane % 4;
    const int tok0 = 16 * warp + g;  // the thread's tokens in S^T: tok0, tok0 + 8
    int vis[kNarrowCols];
    float m[kNarrowCols], l[kNarrowCols];
#pragma unroll
    for (int i = 0; i < kNarrowCols; ++i) {
      const int r = narrow_col(i, q);
      vis[i] = r < p.rows ? visible_end(p, w, r) : 0;
      m[i] = -INFINITY;
      l[i] = 0.f;  // this thread's tokens' part of l (reduced at the end)
    }
    float o[kMTiles][2][4];  // O^T: dims 64 mt + 16 warp + g, + 8 x this thread's rows
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int n = 0; n < 2; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
    sm.ring.wait_q_copied();
    const uint64_t qd = wg::desc(sm.q, 128, 8 * kQRowBytes);
    const int band = band_start(p, w);  // tokens from here on are not seen by every query row

    for (int j = 0; j < nblk; ++j) {
      const int s = j % kStages;
      const int blk = w.begin + j * kPageSize;
      const int ntok = min(kPageSize, w.end - blk);
      // Page j's QK, issued under page j - 1's PV; once both retire, page j - 1's stage is free and
      // the P tile and the output accumulators may be written.
      sm.ring.wait(j);
      float acc[2][4];
      issue_qk(acc, sm, s, qd);
      wg::wait<0>();
      wg::fence_operands(acc);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) wg::fence_operands(o[mt]);
      if (j > 0) sm.ring.release(j - 1);

      // Scores (raw * softmax_scale, the reference's rounding), -inf past each row's visible end,
      // +inf where not finite (the row's result is then NaN, docs/reference.md "Bad inputs").
      float mx[kNarrowCols];
#pragma unroll
      for (int i = 0; i < kNarrowCols; ++i) mx[i] = -INFINITY;
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 2 * n + e % 2, h = e / 2;
          const float sc = masked_score<false, true>(acc[n][e], p.softmax_scale, 1.f, blk + tok0 + 8 * h < vis[i]);
          acc[n][e] = sc;
          mx[i] = fmaxf(mx[i], sc);
        }
      narrow_rows_reduce(mx, sm.red, int(Bf16NarrowBarrier::kConsumerWarps), warp, lane, NarrowMax{});
      // The running max after the page, P = exp(s - m_new) and its row sums (this thread's tokens),
      // then the output's factor alpha = exp(m - m_new) and the state after the page (row_alpha:
      // 1 and the state kept while the row has seen nothing).
      float m_new[kNarrowCols], ml[kNarrowCols], alpha[kNarrowCols], sum[kNarrowCols];
#pragma unroll
      for (int i = 0; i < kNarrowCols; ++i) {
        m_new[i] = fmaxf(m[i], mx[i]);
        ml[i] = m_new[i] * kLog2e;
        sum[i] = 0.f;
      }
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 2 * n + e % 2, h = e / 2;
          const float pe = page_weight<true, false>(acc[n][e], ml[i], 1.f).x;
          sum[i] += pe;
          // P as bf16 into the P tile (row-major over tokens: the PV's B operand).
          const int col = narrow_col(i, q), tok = tok0 + 8 * h;
          *reinterpret_cast<uint16_t*>(sm.p + km_offset(col, 2 * tok, kPRowBytes)) = float_to_bf16_bits(pe);
        }
#pragma unroll
      for (int i = 0; i < kNarrowCols; ++i) alpha[i] = row_alpha(m[i], l[i], m_new[i], sum[i]);
      if (ntok < kPageSize || band - blk < kPageSize) sanitize_latent(sm, s, band - blk, ntok, t);
      if (!(p.skip_unit_rescale && warp_factors_unit(alpha))) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int n = 0; n < 2; ++n) {
            o[mt][n][0] *= alpha[2 * n];
            o[mt][n][1] *= alpha[2 * n + 1];
            o[mt][n][2] *= alpha[2 * n];
            o[mt][n][3] *= alpha[2 * n + 1];
          }
      }
      wg::fence_proxy_async();  // P (and the sanitized values) written with st.shared, read by wgmma
      ptx::named_barrier(int(Bf16NarrowBarrier::kConsumerWarps), 128);
      issue_pv(o, sm, s);
    }
    wg::wait<0>();
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) wg::fence_operands(o[mt]);
    if (nblk > 0) sm.ring.release(nblk - 1);

    // l over the page's 64 tokens: the warp's g, then its four warps (the last reduction's reads
    // are behind the last P barrier).
    narrow_rows_reduce(l, sm.red, int(Bf16NarrowBarrier::kConsumerWarps), warp, lane, NarrowSum{});
    dependents_after_pages(p, range, item);
    // Every page was acquired by every consumer thread; a bad length faults the whole sequence.
    const bool fault = sm.ring.faulted() || w.bad_len;
    float scale[kNarrowCols];
#pragma unroll
    for (int i = 0; i < kNarrowCols; ++i) {
      const int col = narrow_col(i, q);
      scale[i] = row_scale(l[i], 1.f, fault);
      if (warp == 0 && g == 0 && col < p.rows) store_lse(p, w, col, row_lse(m[i], l[i], fault));
    }
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 2 * n + e % 2, col = narrow_col(i, q);
        if (col >= p.rows) continue;
        const bool zero = l[i] == 0.f && !fault;  // a row that saw no token: 0
        const int64_t row = int64_t(col) * kLatentDim + 16 * warp + g + 8 * (e / 2);
        uint16_t* out = bf16_rows_of(p, w) + row;  // (when as_bf16_rows)
        float* part = p.partial_out + int64_t(w.split) * p.rows * kLatentDim + row;
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          const float v = zero ? 0.f : o[mt][n][e] * scale[i];
          if (as_bf16_rows(p, w)) out[64 * mt] = float_to_bf16_bits(v);
          else part[64 * mt] = v;
        }
      }
  }
}

}  // namespace

void launch_decode_bf16_narrow(const DecodeParams& p, const CUtensorMap& tm_kv, const DecodeOptions& options) {
  // (The kernel stores bf16 partials where DecodeParams::partial_bf16 says so: its own Bf16Rows.)
  launch_decode<Bf16NarrowConfig, SplitKernels<decode_bf16_narrow_kernel, nullptr, nullptr, nullptr,
                                               decode_bf16_narrow_kernel>>("decode_bf16", kSmemBytes, p, options, tm_kv);
}

}  // namespace snapmla::cuda
