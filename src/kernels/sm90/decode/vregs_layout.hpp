// The register layouts of decode_fp8's V^T-register tile (fp8_vregs_tile.cuh), as plain index
// functions that the kernel and the CPU tests (tests/test_layouts.cpp) share. The PV is
// O^T (dims x rows) += V^T (dims x tokens) P'^T (tokens x rows): A = V^T from registers, read
// with ldmatrix.trans out of the page's latent as TMA wrote it (token rows of 128-byte boxes,
// 128-byte swizzle) plus byte permutes; B = P' as the softmax stores it (rows x token slots,
// K-major). Both sides must agree on which token sits in each K slot, and the epilogue on which
// dim each accumulator row is.
#pragma once

#if defined(__CUDACC__)
#define SNAPMLA_LAYOUT_FN __host__ __device__ constexpr inline
#else
#define SNAPMLA_LAYOUT_FN constexpr inline
#endif

namespace snapmla::cuda::vregs {

// The token held by K slot k (0..63) of a page: the order of the softmax's S fragment, so that
// a thread's four P' bytes of one row (tokens 8 n + 2 q + {0, 1} of n-tiles n, n + 1) are one
// 4-byte word at slots 16 (n / 2) + 4 q .. + 3. Slot 32 h + 16 b + 4 q + 2 s + e holds token
// 32 h + 16 b + 8 s + 2 q + e.
SNAPMLA_LAYOUT_FN int slot_token(int k) {
  const int h = k / 32, b = (k / 16) % 2, q = (k / 4) % 4, s = (k / 2) % 2, e = k % 2;
  return 32 * h + 16 * b + 8 * s + 2 * q + e;
}

// The token whose latent row lane `lane` addresses in the ldmatrix.trans of K step ks (32
// slots): lanes 8 m + r give matrix m's row r, and ldmatrix.trans hands thread (g, q) rows 2 q,
// 2 q + 1 of each matrix, which the permutes put at slots 4 q .. 4 q + 3 (matrices 0, 1) and
// 16 + 4 q .. (matrices 2, 3). So row r of matrix m must be the token of slot
// 32 ks + 16 (m / 2) + 4 (r / 2) + 2 (m % 2) + r % 2.
SNAPMLA_LAYOUT_FN int lane_token(int ks, int lane) {
  const int m = lane / 8, r = lane % 8;
  return slot_token(32 * ks + 16 * (m / 2) + 4 * (r / 2) + 2 * (m % 2) + r % 2);
}

// The latent dim of M row `row` (0..63) of the consumer's M tile mt (0..3): consumer c's 256
// output dims are four M tiles of 64; in each, warp w's 16 rows are the 16-byte chunk
// 4 (mt % 2) + w of TMA box 2 c + mt / 2, and the permutes put dim 2 g at row g and dim 2 g + 1
// at row g + 8 of the warp's rows.
SNAPMLA_LAYOUT_FN int row_dim(int c, int mt, int row) {
  const int w = row / 16, g = row % 8, hi = (row / 8) % 2;
  return 256 * c + 64 * mt + 16 * w + 2 * g + hi;
}

// The latent box (128 dims) and swizzled 16-byte chunk of the bytes warp w reads for M tile mt of
// consumer c at token t.
SNAPMLA_LAYOUT_FN int vt_box(int c, int mt) { return 2 * c + mt / 2; }
SNAPMLA_LAYOUT_FN int vt_chunk(int mt, int w, int t) { return (4 * (mt % 2) + w) ^ (t % 8); }

}  // namespace snapmla::cuda::vregs
