// The memory formats SnapMLA reads and writes. Every type here is a view over caller-owned,
// contiguous, row-major memory: the library never copies or owns it. All views of one call
// must live on the same device. `validate()` (validate.hpp) is the one place that checks them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

#include "snapmla/types.hpp"

namespace snapmla {

// BF16 paged cache, the FlashMLA layout: data [num_pages, 64, 576] bf16 (latent, then rope).
// 1152 bytes per token.
struct PagedBf16Cache {
  bf16* data = nullptr;
  int64_t num_pages = 0;
  Device device{};

  static constexpr size_t bytes_per_token = kHeadDim * sizeof(bf16);
  size_t bytes() const { return static_cast<size_t>(num_pages) * kPageSize * bytes_per_token; }
};

// SnapMLA FP8 paged cache: three planes sharing one block table (the SGLang-FluentLLM layout).
//   latent [num_pages, 64, 512] e4m3   e4m3(c_t * 448 / amax|c_t|)
//   scale  [num_pages, 64]      fp32   s_t = amax|c_t| / 448
//   rope   [num_pages, 64, 64]  bf16   bf16(k_t * 448 / amax|c_t|)   (pre-scaled by 1 / s_t)
// so c_t ~ s_t * latent_t and k_t ~ s_t * rope_t. 644 bytes per token.
struct PagedFp8Cache {
  e4m3* latent = nullptr;
  float* scale = nullptr;
  bf16* rope = nullptr;
  int64_t num_pages = 0;
  Device device{};

  static constexpr size_t bytes_per_token =
      kLatentDim * sizeof(e4m3) + sizeof(float) + kRopeDim * sizeof(bf16);
  size_t bytes() const { return static_cast<size_t>(num_pages) * kPageSize * bytes_per_token; }
};
static_assert(PagedFp8Cache::bytes_per_token == 644);
static_assert(PagedBf16Cache::bytes_per_token == 1152);

// Where each sequence's tokens live. Token j of sequence i is at slot
//   block_table[i * max_pages + j / 64] * 64 + j % 64,   for j < cache_seqlens[i].
// Entries past a sequence's last page are never read.
struct PageTable {
  const int32_t* block_table = nullptr;    // [batch, max_pages]
  const int32_t* cache_seqlens = nullptr;  // [batch], tokens in the cache, new ones included
  int batch = 0;
  int max_pages = 0;  // row length of block_table
  Device device{};
};

// Rows of full 576-wide cache entries, latent first: new tokens for `append`, and the output
// of `gather_dequant`. [num_tokens, 576] bf16.
struct KvRows {
  bf16* data = nullptr;
  int64_t num_tokens = 0;
  Device device{};
};

// slot = page * 64 + offset for each row of a KvRows. A slot of -1 means "no token here"
// (padding, as vLLM and SGLang use it): append skips it, gather_dequant writes a zero row.
struct SlotMapping {
  const int32_t* slots = nullptr;  // [num_tokens]
  int64_t num_tokens = 0;
  Device device{};
};

// Queries in absorbed MLA form: [batch, seqlen_q, num_heads, 576] bf16, nope (512) then rope.
// With seqlen_q > 1 the queries are the sequence's last seqlen_q tokens (MTP / speculative
// decoding): query i sees cache tokens t < cache_seqlens - seqlen_q + i + 1 when causal.
struct QueryBf16 {
  bf16* data = nullptr;
  int batch = 0;
  int seqlen_q = 0;
  int num_heads = 0;
  Device device{};
};

// Output of quantize_query, input of decode_fp8. Per (token, head) scale s_q:
//   nope  [batch, seqlen_q, num_heads, 512] e4m3   e4m3(q_nope * 448 / amax|q_nope|)
//   rope  [batch, seqlen_q, num_heads, 64]  bf16   bf16(q_rope * 448 / amax|q_nope|)
//   scale [batch, seqlen_q, num_heads]      fp32   amax|q_nope| / 448
struct QuantizedQuery {
  e4m3* nope = nullptr;
  bf16* rope = nullptr;
  float* scale = nullptr;
  int batch = 0;
  int seqlen_q = 0;
  int num_heads = 0;
  Device device{};
};

// Decode results. out [batch, seqlen_q, num_heads, 512] bf16; lse [batch, num_heads, seqlen_q]
// fp32, natural log of the softmax denominator (scores include softmax_scale). A query that
// sees no token (cache_seqlens 0, or a causal query before the first token) gets out = 0 and
// lse = -inf: the log of an empty sum, which merges correctly with other partial results.
struct DecodeOutput {
  bf16* out = nullptr;
  float* lse = nullptr;
  Device device{};
};

// Split-KV plan: each sequence's tokens divided into contiguous splits that are processed
// independently and merged by the combine step, and the splits dealt out to workers (one CTA
// per worker and 64-row tile on the GPU). Fixed-size buffers (sized by split_plan_capacity), so
// planning needs no allocation and can run inside a CUDA graph.
//   split_offsets [batch + 1]: the splits of sequence i are split_offsets[i] .. [i+1] - 1
//   split_begin   [capacity]:  first token of each split, a multiple of 64; a split ends where
//                              the next split of its sequence begins, or at the sequence end.
//   worker_splits [capacity]:  optional. The plan's workers are its capacity - batch slots
//                              (split_plan_capacity(batch, num_workers) gives num_workers);
//                              worker k runs splits worker_splits[k] .. worker_splits[k + 1] - 1,
//                              a contiguous run that may cross sequence boundaries, and
//                              worker_splits[capacity - batch] is the number of splits. plan_splits
//                              gives every worker the same work (blocks plus a fixed cost per
//                              split). Null: one worker per split, in index order.
// A sequence with no tokens has exactly one (empty) split.
struct SplitPlan {
  int32_t* split_offsets = nullptr;
  int32_t* split_begin = nullptr;
  int capacity = 0;
  int batch = 0;
  Device device{};
  int32_t* worker_splits = nullptr;  // last, so that older aggregate initializers still compile
};

// Enough room for any seqlens when planning for `num_workers` parallel workers: batch +
// num_workers (each worker boundary adds at most one split).
int split_plan_capacity(int batch, int num_workers);

// Options common to decode_fp8 and decode_bf16.
// Which tile decode_fp8's GPU path runs. kAuto: the 16-row narrow tile when num_heads * seqlen_q
// <= 16 (memory-bound: the rows on the wgmma N dimension), else the 64-row tile. The others force
// one, for benchmarks and tests (kNarrow16 with more than 16 rows is an error). kRows64VRegs is a
// second 64-row tile, not yet the default: V^T read into registers for a transposed PV instead of
// transposed through shared memory. kRows64Trio is a third, not yet the default: the transposing
// tile's pages dealt to three consumer warpgroups instead of two. All compute the reference's
// function up to fp32 rounding (docs/reference.md); the CPU path ignores it.
enum class Fp8Tile { kAuto, kRows64, kNarrow16, kRows64VRegs, kRows64Trio };

// How decode_fp8 picks the e4m3 scale sigma of P' = P * s_t per row and 64-token page (both paths
// compute the same rule; docs/reference.md).
//   kPerPage: sigma = max P' / 448 on every page, the paper's rule; the output accumulator is
//             rescaled on every page.
//   kCarried: the previous page's sigma (moved into this page's running max) is kept while the
//             page's max P' quantizes to [448 / 32, 448] under it; otherwise a new sigma puts
//             max P' at 448 / 4. The accumulator is rescaled only on the pages that take a new
//             sigma. An option: faster on the bench's flat attention, slower in the e2e engine
//             (docs/kernels.md). The transposing 64-row tile only (a call that asks for it runs
//             that tile whatever its rows; the narrow and V^T-register tiles are errors).
//   kAuto:    kPerPage, unless the environment's SNAPMLA_FP8_P_SCALE says `carried` (every call)
//             or `carried_wide` (the calls that run the transposing 64-row tile: more than 16
//             rows under fp8_tile kAuto, any under kRows64); read per call, for comparing the
//             rules in an engine without code changes.
enum class Fp8PScale { kAuto, kPerPage, kCarried };

// P' quantized under a carried sigma: kept while max P' / sigma lies in [448 / kCarryFall, 448];
// a new sigma puts max P' at 448 / kCarryHeadroom.
inline constexpr float kCarryFall = 32.0f;
inline constexpr float kCarryHeadroom = 4.0f;

struct DecodeOptions {
  float softmax_scale = 0.0f;  // required, > 0 (DeepSeek-V3: 1/sqrt(192) times yarn mscale^2)
  bool causal = true;          // only matters for seqlen_q > 1
  // The lse of a query row that sees no token (its out is 0): -inf, the log of the empty sum,
  // or +inf, what FlashMLA reports. Nothing else is accepted.
  float empty_lse = -std::numeric_limits<float>::infinity();
  const SplitPlan* plan = nullptr;  // null: one split per sequence
  // Room for the fp32 partial results of split sequences (and a counter per split and 64-row
  // tile), decode_workspace_bytes() large.
  // Needed by the GPU path when a plan is given; the CPU path uses its own scratch.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  Stream stream = nullptr;
  Fp8Tile fp8_tile = Fp8Tile::kAuto;  // decode_fp8 on the GPU only
  Fp8PScale p_scale = Fp8PScale::kAuto;  // decode_fp8, both paths
};

size_t decode_workspace_bytes(int split_capacity, int seqlen_q, int num_heads);

}  // namespace snapmla
