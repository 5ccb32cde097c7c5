// decode_fp8's three-consumer 64-row tile (Fp8Tile::kRows64Trio, decode_fp8_trio.cu): its
// configuration, shared-memory plan and named barriers.
//
// One CTA = one split of one sequence x 64 query rows, four warpgroups:
//   WG0, the producer: warp 0 loads (TMA), warps 1-3 transpose each page's latent into V^T (the
//   transposing tile's producer, transposer.cuh);
//   WG1-WG3, the consumers: consumer c owns the pages j = c (mod 3) (QK and softmax of its own
//   pages) and holds 176 output dims of all 64 rows (PV of every page). The transposing tile's
//   per-page chain (the owner's softmax, the P' hand-off, the output's rescale) is spread over
//   three pages instead of two: each consumer has three page periods for one softmax and three
//   PVs of 176 dims, and twelve consumer warps instead of eight hide each other's latencies.
// Why 176: wgmma's N must be a multiple of 8 and every consumer runs the same code (one
// accumulator shape, no branch around a wgmma), so the three slices are 176 dims wide and the
// last one starts at 512 - 176 = 336: it computes its first 16 dims also computed by consumer 1
// and writes only its own 160.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/mbarrier.cuh"
#include "fp8_tile.cuh"
#include "params.hpp"
#include "pipeline.cuh"

namespace snapmla::cuda {

// Warpgroups: the producer (a loading warp and three transposer warps) with 32 registers and three
// consumers with 160 (512 threads: 128 registers per thread at launch, 32 + 3 x 160 = 4 x 128).
struct Fp8TrioConfig : WarpgroupRoles<3, 32, 160> {
  static constexpr int kRows = kTileRows;
  static constexpr int kPageTokens = kPageSize;
  static constexpr int kStages = 2;       // pages in flight (latent, rope, scales): one page of look-ahead
  static constexpr int kVtStages = 3;     // V^T slots: a page's V^T is read by its last consumer two pages later
  static constexpr int kPageSlots = 2;    // P' buffers and factor slots (page j: j % 2)
  static constexpr int kLoaderThreads = 32;
  static constexpr int kTransposerWarps = 3;
  static constexpr int kTransposers = 32 * kTransposerWarps;
  static constexpr int kOutDims = 176;              // output dims per consumer: one m64n176 accumulator
  static constexpr int kOutTiles = kOutDims / 8;    // its n-tiles of 8 dims
  static constexpr int kLastOverlapTiles = (kConsumers * kOutDims - kLatentDim) / 8;  // consumer 2's shared n-tiles
  // Consumer c's first output dim: 0, 176, 336.
  __host__ __device__ static constexpr int dim0(int c) { return c == kConsumers - 1 ? kLatentDim - kOutDims : c * kOutDims; }

  static_assert(kRows == 64 && kPageTokens == 64, "the S fragment m64n64 and two PV k-steps of 32 per page");
  static_assert(kOutDims % 8 == 0 && kOutDims <= 256, "wgmma N: a multiple of 8, at most 256");
  static_assert(kLatentDim - kOutDims <= (kConsumers - 1) * kOutDims &&
                    kLatentDim - kOutDims >= (kConsumers - 2) * kOutDims + kOutDims / 2,
                "the slices cover the 512 dims; the last one, from the end back, overlaps only the one before");
  static_assert(kLastOverlapTiles == 2, "consumer 2 skips its first two n-tiles in the epilogue");
  static_assert(kLoaderThreads == Fp8TileConfig::kLoaderThreads && kTransposers == Fp8TileConfig::kTransposers &&
                    kPageTokens == Fp8TileConfig::kPageTokens,
                "transposer.cuh's warps and lanes are the transposing tile's");
};

// Named barrier ids. The hand-offs take id `base + owner` (the consumer that owns page j is j % 3):
// the running max after page j (Max: the owner arrives, the next page's owner waits: 256 threads),
// page j's P' and factors in place (P: the owner arrives, the other two wait: 384), and the PVs of
// page j - 2 by the two consumers other than page j's owner are done, so page j's P' and factors
// may take that page's slot (Free + page j's owner: they arrive, the owner waits: 384; the owner's
// own PV of page j - 2 retires earlier in the same iteration). Id 0 is __syncthreads', 15 the
// split boundary's (scheduler.cuh).
enum class Fp8TrioBarrier : int {
  kAllConsumers = 1,  // all three consumers: the parts of l after the pages, the output rows assembled
  kMax = 2,          // 2, 3, 4
  kP = 5,            // 5, 6, 7
  kFree = 8,         // 8, 9, 10
  kOwnPage = 11,     // 11, 12, 13: consumer c's warps among themselves after its page's P'
  kTransposers = 14,  // the transposer warps among themselves (a page's V^T fix-up)
};
static_assert(int(Fp8TrioBarrier::kMax) == int(Fp8Barrier::kMax), "fp8_page_steps.cuh's Max hand-off ids");
static_assert(int(Fp8TrioBarrier::kTransposers) < 15, "id 15 is the split boundary's");

// The shared-memory plan (226.8 KB of the 227). The stages, Q tile and V^T slots as in the
// transposing tile. The Q rope is here, not in the consumers' registers as there: 160 registers per
// consumer thread hold the output slice (88), the scores (32) and the softmax's state, and with the
// rope's 16 more ptxas spilled 284 bytes and serialized the wgmmas. Its 8 KB come from a third P'
// buffer, which the page chain does without (Free).
struct Fp8TrioSmem {
  using C = Fp8TrioConfig;
  static constexpr int kLatentBytes = C::kPageTokens * kLatentDim;  // one page's latent, 32 KB
  static constexpr int kRopeBytes = C::kPageTokens * kRopeDim * 2;  // one page's rope, 8 KB
  static constexpr int kVtBytes = kLatentDim * C::kPageTokens;      // one page's V^T, 512 dims x 64 slots, SBO 512
  static constexpr int kPBytes = C::kRows * C::kPageTokens;         // one page's P' (e4m3), SBO 512
  static constexpr int kAssembledRowBytes = kLatentDim * 2;          // the epilogue's bf16 rows
  using Ring = PageRing<C::kStages>;

  struct Stage {
    alignas(1024) uint8_t latent[kLatentBytes];
    alignas(1024) uint8_t rope[kRopeBytes];
  };
  alignas(1024) uint8_t q_latent[C::kRows * kLatentDim];
  Stage stages[C::kStages];
  alignas(1024) uint8_t vt[C::kVtStages][kVtBytes];
  alignas(1024) uint8_t p[C::kPageSlots][kPBytes];
  alignas(1024) uint8_t q_rope[C::kRows * kRopeDim * 2];  // as a page's rope (TMA, swizzled): the rope product's A
  float scales[C::kStages][C::kPageTokens];
  alignas(8) uint8_t ring[Ring::kBytes];
  uint64_t vt_full[C::kVtStages];   // kTransposers arrivals: V^T written
  uint64_t vt_empty[C::kVtStages];  // 384 consumer arrivals: every PV of the page done
  float xmax[2][C::kRows];          // the running max after page j, slot j % 2
  float2 xsig[C::kPageSlots][C::kRows];  // page j's (sigma, rho) per row, slot j % 2
  float xl[C::kConsumers][C::kRows];     // each consumer's part of l, after the pages
};
static_assert(sizeof(Fp8TrioSmem) <= 227 * 1024, "shared memory per block on sm_90");
static_assert(sizeof(Fp8TrioSmem::Stage) % 1024 == 0, "stages keep the 1024-byte alignment of the swizzle");
static_assert(Fp8TrioSmem::kVtBytes == 2 * Fp8TileSmem::kVtHalfBytes, "transposer.cuh's V^T layout");
static_assert(Fp8TrioConfig::kRows * Fp8TrioSmem::kAssembledRowBytes <=
                  Fp8TrioConfig::kStages * int(sizeof(Fp8TrioSmem::Stage)),
              "the epilogue assembles a tile's bf16 rows in the page stages");

// The three-consumer tile's view: the shared regions (PageTileView), the Q rope, and the V^T slots
// with their barriers.
struct Fp8TrioView : PageTileView<Fp8TrioSmem, Fp8TrioConfig::kStages, Fp8TrioConfig::kPageSlots> {
  using C = Fp8TrioConfig;
  using L = Fp8TrioSmem;
  static constexpr int kVtStages = C::kVtStages;
  static constexpr int kTransposerBarrier = int(Fp8TrioBarrier::kTransposers);
  static constexpr int kTransposerInFlight = 2;  // two of a unit's ldmatrix at a time: the producer has 32 registers
  uint8_t* q_rope;
  uint8_t* vt_base;
  uint64_t* vt_full;   // [kVtStages]
  uint64_t* vt_empty;  // [kVtStages]

  __device__ explicit Fp8TrioView(uint8_t* base)
      : PageTileView(base),
        q_rope(base + offsetof(L, q_rope)),
        vt_base(base + offsetof(L, vt)),
        vt_full(reinterpret_cast<uint64_t*>(base + offsetof(L, vt_full))),
        vt_empty(reinterpret_cast<uint64_t*>(base + offsetof(L, vt_empty))) {}
  // V^T of page j (512 dims x 64 slots, K-major: dims d .. d + 7 at (d / 8) x 512).
  __device__ uint8_t* vt_page(int j) const { return vt_base + (j % kVtStages) * L::kVtBytes; }
  // Consumer c's slice of V^T slot `slot`: dims dim0(c) .. dim0(c) + 175.
  __device__ uint8_t* vt_slice(int slot, int c) const { return vt_base + slot * L::kVtBytes + (C::dim0(c) / 8) * 512; }
  // One thread, before a __syncthreads.
  __device__ void init_vt() const {
    for (int v = 0; v < kVtStages; ++v) {
      mbar::init(&vt_full[v], C::kTransposers);
      mbar::init(&vt_empty[v], 128 * C::kConsumers);
    }
  }
};

}  // namespace snapmla::cuda
