// decode_fp8's V^T-register 64-row tile (Fp8Tile::kRows64VRegs): its configuration, shared-memory
// plan, V^T fragments and output.
//
// The same consumers as the transposing tile (fp8_tile.cuh: consumer c owns the pages j = c
// (mod 2), QK and softmax of its own pages, the running-max / P' / free hand-offs, P' in the same
// slot order), but the PV is transposed: O^T (256 dims of consumer c x 64 rows) += V^T P'^T, with
// V^T as the register A operand read from the page's latent stage (ldmatrix.trans and byte
// permutes, vregs_layout.hpp) and P' as the shared-memory B operand. So no V^T copy is written:
// the producer is one loading thread, the transposition's 64 KB of shared-memory traffic per page
// and its hand-off are gone, and the 64 KB of V^T slots become a fourth page stage. The costs: 8
// narrower PV wgmmas per page and consumer instead of 2, the V^T loads in the consumers, and the
// output's row factors per accumulator column (16 rows per thread instead of 2), which the page's
// owner publishes as the final factor r (so a page's P hand-off waits for the page before it), and
// the Q rope from shared memory (the register file holds O^T and a page of V^T at once).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/numeric.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/wgmma.cuh"
#include "epilogue.cuh"
#include "fp8_tile.cuh"
#include "params.hpp"
#include "pipeline.cuh"
#include "vregs_layout.hpp"

namespace snapmla::cuda {

// Registers: 40 for the producer (one loading thread), 232 for each consumer.
struct Fp8VRegsConfig : WarpgroupRoles<2, 40, 232> {
  static constexpr int kRows = kTileRows;
  static constexpr int kPageTokens = kPageSize;
  static constexpr int kStages = 4;           // a stage is freed after both consumers' PV of its page
  static constexpr int kOutHalf = kLatentDim / kConsumers;
  static constexpr int kMTiles = kOutHalf / 64;  // O^T's m64 tiles per consumer
  static constexpr int kStageReaders = 128 * kConsumers;  // every consumer thread reads V of every page

  static_assert(kRows == 64 && kPageTokens == 64, "m64n64 S and O^T fragments, two k32 PV steps per page");
  static_assert(kConsumers == 2 && kOutHalf == 256 && kMTiles == 4, "vregs_layout.hpp's row_dim");
  // The consumers issue page j + 2's QK while the other's PV of page j - 1 and their own of page
  // j may still read their stages: four stages keep one page in flight beyond those three.
  static_assert(kStages == 4, "pages j - 1 .. j + 2 resident and one more loading");
};

// The shared-memory plan. The page stages and Q as the transposing tile's (TMA, 128-byte swizzle);
// P' of the pair's pages; the exchanges of the running max, the page factors and l.
struct Fp8VRegsSmem {
  using C = Fp8VRegsConfig;
  using Stage = Fp8TileSmem::Stage;
  using Ring = PageRing<C::kStages>;
  static constexpr int kPBytes = C::kRows * C::kPageTokens;
  alignas(1024) uint8_t q_latent[C::kRows * kLatentDim];
  alignas(1024) uint8_t q_rope[C::kRows * kRopeDim * 2];  // as a page's rope (TMA, swizzled): the rope product's A
  Stage stages[C::kStages];
  alignas(1024) uint8_t p[2][kPBytes];
  float scales[C::kStages][C::kPageTokens];
  alignas(8) uint8_t ring[Ring::kBytes];
  float xmax[2][C::kRows];
  // Page j's (r, sigma after page j) per row, slot j % 2: r is the output's factor before the
  // page's PV (apply_page's), published by the page's owner once the page before is applied, so
  // that the accumulator columns need no sigma state; read as float4 (two neighbouring rows).
  alignas(16) float2 xsig[2][C::kRows];
  float xl[C::kConsumers][C::kRows];
  alignas(16) float out_scale[C::kRows];  // per row after the pages: sigma / l (0: empty row, NaN: fault)
  // The split's Work::single and bad_len, for the output: kept in registers across the main loop
  // they cost the consumers a spill.
  uint32_t split_flags;
};
static_assert(sizeof(Fp8VRegsSmem) <= 227 * 1024, "shared memory per block on sm_90");

// The kernel's view: the shared regions (PageTileView) and the output's per-row scales.
struct Fp8VRegsView : PageTileView<Fp8VRegsSmem, Fp8VRegsConfig::kStages> {
  using L = Fp8VRegsSmem;
  static constexpr bool kOwnerReleasesStage = false;  // both consumers release after their PV
  uint8_t* q_rope;
  float* out_scale;
  uint32_t* split_flags;

  __device__ explicit Fp8VRegsView(uint8_t* base)
      : PageTileView(base),
        q_rope(base + offsetof(L, q_rope)),
        out_scale(reinterpret_cast<float*>(base + offsetof(L, out_scale))),
        split_flags(reinterpret_cast<uint32_t*>(base + offsetof(L, split_flags))) {}
};

// Page jj's output factors r (xsig's first component) for the thread's 16 accumulator columns,
// query rows 8 n + 2 q + e.
__device__ __forceinline__ void column_factors(float (&r)[8][2], const Fp8VRegsView& sm, int jj, int q) {
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    const float4 x = *reinterpret_cast<const float4*>(&sm.factors_of(jj, 8 * n + 2 * q));
    r[n][0] = x.x;
    r[n][1] = x.z;
  }
}

// V^T of consumer c's 256 dims of a page as A fragments (M tile mt, K step ks), from the stage's
// latent kl: one ldmatrix.trans per fragment (lane rows: vregs::lane_token), two permutes split
// its dim pairs into one word per dim over four token slots. Bytes of tokens at or past ntok are
// zeroed (P' is 0 there, but the cache slot may hold NaN), and NaN bytes of tokens at or past
// `band` (tokens some query rows do not see; the scores read the stage, not these fragments).
__device__ __forceinline__ void load_vt(uint32_t (&a)[4][2][4], const uint8_t* kl, int c, int w, int lane, int ntok,
                                        int band) {
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    const int t = vregs::lane_token(ks, lane);
#pragma unroll
    for (int mt = 0; mt < Fp8VRegsConfig::kMTiles; ++mt) {
      uint32_t v[4];
      ptx::ldsm_x4_trans(kl + vregs::vt_box(c, mt) * (kPageSize * kTmaBoxBytes) + t * kTmaBoxBytes +
                             vregs::vt_chunk(mt, w, t) * 16,
                         v);
      a[mt][ks][0] = ptx::prmt(v[0], v[1], 0x6420u);
      a[mt][ks][1] = ptx::prmt(v[0], v[1], 0x7531u);
      a[mt][ks][2] = ptx::prmt(v[2], v[3], 0x6420u);
      a[mt][ks][3] = ptx::prmt(v[2], v[3], 0x7531u);
    }
  }
  if (ntok < kPageSize || band < kPageSize) {
    const int q = lane % 4;
#pragma unroll
    for (int ks = 0; ks < 2; ++ks)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t keep = 0u, sanitize = 0u;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int tok = vregs::slot_token(32 * ks + 16 * h + 4 * q + i);
          keep |= tok < ntok ? 0xFFu << (8 * i) : 0u;
          sanitize |= tok >= band ? 0xFFu << (8 * i) : 0u;
        }
#pragma unroll
        for (int mt = 0; mt < Fp8VRegsConfig::kMTiles; ++mt) {
          a[mt][ks][2 * h] = zero_e4m3_nan(a[mt][ks][2 * h] & keep, sanitize);
          a[mt][ks][2 * h + 1] = zero_e4m3_nan(a[mt][ks][2 * h + 1] & keep, sanitize);
        }
      }
  }
}

// The consumer's output after the pages: O^T / sigma per column -> O^T sigma / l (out_scale per
// row: 0 for a row that saw nothing, which gets 0 whatever its accumulator holds; NaN for a
// fault), as bf16 rows (bf16_rows_of: a sequence with one split, or bf16 partials) or the split's
// fp32 partials. Thread (warp, g, q) holds dims row_dim(c, mt, 16 warp + g) and + 1 (accumulator
// elements e and e + 2) of rows 8 n + 2 q + e: one 4-byte (bf16) or 8-byte (fp32) store per row, dim pair and M tile,
// eight lanes' pairs contiguous (32 or 64 bytes of a row).
template <typename T, typename Pack>
__device__ __forceinline__ void store_columns(T* base, const float (&o)[4][8][4], const float* out_scale, int rows,
                                              int q, const Pack& pack) {
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = 8 * n + 2 * q + e;
      const float scale = out_scale[col];
      const bool empty = scale == 0.f;
      if (col >= rows) continue;
#pragma unroll
      for (int mt = 0; mt < Fp8VRegsConfig::kMTiles; ++mt)
        pack(base + col * kLatentDim + vregs::row_dim(0, mt, 0), empty ? 0.f : o[mt][n][e] * scale,
             empty ? 0.f : o[mt][n][e + 2] * scale);
    }
}

__device__ __forceinline__ void write_columns(const DecodeParams& p, const Work& w, const float (&o)[4][8][4],
                                              const float* out_scale, int row0, int c, int warp, int lane) {
  // One base per thread (its first row and dim pair); rows and M tiles are offsets from it.
  const int64_t at = int64_t(row0) * kLatentDim + vregs::row_dim(c, 0, 16 * warp + lane / 4);
  if (as_bf16_rows(p, w))
    store_columns(bf16_rows_of(p, w) + at, o, out_scale, p.rows - row0, lane % 4, [](uint16_t* d, float a, float b) {
      *reinterpret_cast<uint32_t*>(d) = bf16x2_bits(a, b);
    });
  else
    store_columns(p.partial_out + int64_t(w.split) * p.rows * kLatentDim + at, o, out_scale, p.rows - row0, lane % 4,
                  [](float* d, float a, float b) {
      *reinterpret_cast<float2*>(d) = make_float2(a, b);
    });
}

}  // namespace snapmla::cuda
