// SnapMLA public API: FP8 MLA decoding with a RoPE-aware per-token FP8 KV cache.
//
// Every operation takes views (formats.hpp) and runs where the views live: on the CPU it runs
// the reference implementation (reference.hpp), on a CUDA device the sm_90a kernels. The names
// and argument meanings are the same on both. Arguments are validated first; a bad one throws
// snapmla::Error naming it. Nothing here allocates device memory or synchronizes the host.
#pragma once

#include "snapmla/formats.hpp"
#include "snapmla/numeric.hpp"
#include "snapmla/types.hpp"

namespace snapmla {

// Quantize-on-write: each row of `kv` (latent 512 + rope 64, bf16) goes to its slot, the
// latent as e4m3 with one fp32 scale per token, the rope as bf16 pre-divided by that scale.
void append(const PagedFp8Cache& cache, const KvRows& kv, const SlotMapping& slots,
            Stream stream = nullptr);
// The BF16 baseline cache: a plain paged copy.
void append(const PagedBf16Cache& cache, const KvRows& kv, const SlotMapping& slots,
            Stream stream = nullptr);

// Per-(token, head) query quantization: e4m3 nope, bf16 rope pre-divided by the scale.
void quantize_query(const QueryBf16& q, const QuantizedQuery& out, Stream stream = nullptr);

// Fetch tokens by slot from the FP8 cache back to bf16 rows [n, 576] (chunked prefill,
// prefix-cache reuse): out = bf16(latent * s_t) || bf16(rope * s_t).
void gather_dequant(const PagedFp8Cache& cache, const SlotMapping& slots, const KvRows& out,
                    Stream stream = nullptr);

// Divide each sequence into splits of whole 64-token blocks so that `num_workers` workers get
// about equal work (at most capacity = split_plan_capacity(batch, num_workers) splits).
// query_rows: the decode's query rows per sequence (seqlen_q x num_heads, 1..512), or 0. Given,
// splits are no shorter than their fixed cost (fp32 partials and the combine) makes worthwhile
// for a small total (a batch of one 8K sequence at h = 128: 32 splits of 4 blocks rather than 64
// of 2); 0 gives equal shares only. Reads only pages.cache_seqlens. On the GPU it runs as a
// kernel, without host synchronization.
// split_blocks > 0: a batch-invariant plan, for debugging numerics: every sequence is cut at
// multiples of split_blocks 64-token blocks whatever else is in the batch, so a row's result is
// the same bits in any batch (the workers still share the work). It needs room for
// sum(max(1, ceil(blocks_i / split_blocks))) splits: size the plan with
// split_plan_capacity(batch, num_workers) or more; a plan without that room gets the default plan.
void plan_splits(const PageTable& pages, int num_workers, const SplitPlan& plan,
                 Stream stream = nullptr, int query_rows = 0, int split_blocks = 0);

// SnapMLA decoding on the FP8 cache (docs/design.md, the method): FP8 QK with per-token and
// per-(token, head) scales plus the pre-scaled bf16 rope product in one fp32 accumulator,
// online softmax over 64-token blocks, P' = P * s_t quantized to e4m3 per row and block.
void decode_fp8(const QuantizedQuery& q, const PagedFp8Cache& cache, const PageTable& pages,
                const DecodeOutput& out, const DecodeOptions& options);

// The same decoding on the BF16 cache: the baseline.
void decode_bf16(const QueryBf16& q, const PagedBf16Cache& cache, const PageTable& pages,
                 const DecodeOutput& out, const DecodeOptions& options);

// A num_workers for plan_splits that fills `device` (CPU: its reference threads; GPU: one split
// per multiprocessor and 64-row tile of the decode kernel, like FlashMLA's num_sm_parts;
// measured against twice as many: docs/archive/kernel_history.md).
int recommended_num_workers(Device device, int seqlen_q, int num_heads);

// Debug checks of table contents. The GPU path cannot read device-resident tables without a
// host synchronization, so there a bad page index or a length outside the block-table row turns
// that sequence's rows into NaN and a bad slot is skipped, instead of an error
// (docs/reference.md, "Bad inputs"). These functions copy the tables to the host
// (synchronizing `stream` on the GPU; not for the hot path, not capturable in a CUDA graph) and
// throw snapmla::Error for the first bad entry, exactly as the CPU path does.
void check_page_table(const PageTable& pages, int64_t num_pages, Stream stream = nullptr);
void check_slot_mapping(const SlotMapping& slots, int64_t num_pages, Stream stream = nullptr);

// Whether this build has the CUDA kernels, and whether a usable sm_90 device is present.
bool built_with_cuda();
bool cuda_device_available();

}  // namespace snapmla
