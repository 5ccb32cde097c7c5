// The CPU reference: the oracle for every GPU kernel, and the path that runs without a GPU.
//
// snapmla::ref::X has the signature and meaning of snapmla::X (snapmla.hpp) and accepts only
// host memory. decode_fp8 emulates the SnapMLA kernel's arithmetic step by step (see
// docs/reference.md): every sum of e4m3 x e4m3 products is formed exactly (in double, where
// such sums are exact), then rounded to fp32 where the kernel's fp32 accumulator would be, and
// the softmax state, the P quantization and the rescaling follow the kernel's order.
#pragma once

#include <vector>

#include "snapmla/formats.hpp"

namespace snapmla::ref {

void append(const PagedFp8Cache& cache, const KvRows& kv, const SlotMapping& slots);
void append(const PagedBf16Cache& cache, const KvRows& kv, const SlotMapping& slots);
void quantize_query(const QueryBf16& q, const QuantizedQuery& out);
void gather_dequant(const PagedFp8Cache& cache, const SlotMapping& slots, const KvRows& out);
void plan_splits(const PageTable& pages, int num_workers, const SplitPlan& plan, int query_rows = 0,
                 int split_blocks = 0);
void decode_fp8(const QuantizedQuery& q, const PagedFp8Cache& cache, const PageTable& pages,
                const DecodeOutput& out, const DecodeOptions& options);
void decode_bf16(const QueryBf16& q, const PagedBf16Cache& cache, const PageTable& pages,
                 const DecodeOutput& out, const DecodeOptions& options);

// Decode results before the final bf16 rounding, for tests and accuracy studies.
struct DecodeResultF32 {
  std::vector<float> out;  // [batch, seqlen_q, num_heads, 512]
  std::vector<float> lse;  // [batch, num_heads, seqlen_q]
};
DecodeResultF32 decode_fp8_f32(const QuantizedQuery& q, const PagedFp8Cache& cache,
                               const PageTable& pages, const DecodeOptions& options);
DecodeResultF32 decode_bf16_f32(const QueryBf16& q, const PagedBf16Cache& cache,
                                const PageTable& pages, const DecodeOptions& options);

// decode_fp8's arithmetic for one sequence (batch 1, one split) on operands already quantized
// by any recipe and decoded to float, for studies of other quantization recipes:
//   q [seqlen_q, num_heads, 576] and keys [seqlen_k, 576] hold the operand values as the tensor
//   cores see them (e4m3 or bf16 values); q_factor [seqlen_q * num_heads] is softmax_scale
//   times the row's query scale; key_scale [seqlen_k] the token's scale.
// p_block_tokens: the online-softmax step and P' quantization block (one sigma per row per
// block of 64, 128 or 256 tokens). decode_fp8's kernels use 64 (kPageSize), as decode_fp8_f32.
// p_scale: the P' scale rule, resolved as decode_fp8's DecodeOptions::p_scale is (kAuto: per page,
// unless the environment's SNAPMLA_FP8_P_SCALE picks the carried scales).
// Results as decode_fp8_f32's: out [seqlen_q, num_heads, 512], lse [num_heads, seqlen_q].
DecodeResultF32 decode_fp8_decoded(const float* q, const float* q_factor, int seqlen_q,
                                   int num_heads, const float* keys, const float* key_scale,
                                   int seqlen_k, bool causal, int p_block_tokens = kPageSize,
                                   Fp8PScale p_scale = Fp8PScale::kAuto);

// Merge the partial results of one query row's splits (each normalized, with its lse) into
// one: lse = ln sum_k exp(lse_k), out = sum_k exp(lse_k - lse) * out_k, in fp32 as the combine
// kernel does. Partials with lse = -inf (empty splits) contribute nothing; if all are empty,
// out = 0 and lse = -inf.
void combine_row(int num_splits, const float* partial_out /* [num_splits, 512] */,
                 const float* partial_lse /* [num_splits] */, float* out /* [512] */,
                 float* lse);

// Ground truth: exact attention in float64 on unquantized inputs for one sequence.
//   q   [seqlen_q, num_heads, 576], kv [seqlen_k, 576] (latent, then rope)
//   out [seqlen_q, num_heads, 512], lse [num_heads, seqlen_q] (-inf where nothing is seen)
//   entropy (optional) [num_heads, seqlen_q]: entropy of each attention distribution, nats
void attention_f64(const float* q, int seqlen_q, int num_heads, const float* kv, int seqlen_k,
                   double softmax_scale, bool causal, double* out, double* lse,
                   double* entropy = nullptr);

// Threads the reference uses (default: hardware concurrency, or SNAPMLA_NUM_THREADS).
int num_threads();

}  // namespace snapmla::ref
