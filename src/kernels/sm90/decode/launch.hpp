// Host-side set-up shared by decode_fp8 and decode_bf16: the common parameters, the grid, and
// the launch of a decode kernel plus combine. The arguments arrive checked (api/dispatch.cpp,
// core/validate.hpp, workspace included); only the grid's size limit is checked here, since it
// depends on the kernels' tile.
#pragma once

#include <string>

#include "../../../core/validate.hpp"
#include "../../common/check.cuh"
#include "../../smxx/combine.hpp"
#include "params.hpp"
#include "snapmla/formats.hpp"

namespace snapmla::cuda {

inline DecodeParams make_params(int batch, int s_q, int h, const PageTable& pages,
                                const DecodeOutput& out, const DecodeOptions& options) {
  DecodeParams p;
  p.block_table = pages.block_table;
  p.seqlens = pages.cache_seqlens;
  p.max_pages = pages.max_pages;
  p.batch = batch;
  p.seqlen_q = s_q;
  p.num_heads = h;
  p.rows = s_q * h;
  p.softmax_scale = options.softmax_scale;
  p.causal = options.causal;
  p.empty_lse = options.empty_lse;
  p.out = reinterpret_cast<uint16_t*>(out.out);
  p.lse = out.lse;
  if (options.plan) {
    p.split_offsets = options.plan->split_offsets;
    p.split_begin = options.plan->split_begin;
    p.split_order = options.plan->split_order;
    p.partial_out = static_cast<float*>(options.workspace);
    p.partial_lse = p.partial_out + size_t(options.plan->capacity) * p.rows * kLatentDim;
  }
  return p;
}

// The decode grid: one CTA per (work item, 64-row tile), row tile fastest (grid_item /
// grid_row0 on the device). Work items: the plan's capacity, or one per sequence.
inline dim3 decode_grid(const char* op, const DecodeParams& p, const DecodeOptions& options) {
  const int64_t items = options.plan ? options.plan->capacity : p.batch;
  const int64_t ctas = items * ((p.rows + kTileRows - 1) / kTileRows);
  if (ctas > 0x7FFFFFFF)
    detail::fail(op, options.plan ? "options.plan.capacity" : "q.batch",
                 "expected (work items) x (64-row tiles) <= 2^31 - 1 CTAs, got " + std::to_string(ctas));
  return dim3(static_cast<unsigned>(ctas));
}

inline CombineParams combine_params(const DecodeParams& p) {
  return {p.split_offsets, p.partial_out, p.partial_lse, p.out, p.lse,
          p.batch,         p.rows,        p.seqlen_q,    p.num_heads, p.empty_lse};
}

// A decode kernel (384 threads, `smem` bytes of dynamic shared memory, arguments p and then
// `extra`) over the decode grid, then the combine of split sequences.
template <typename... Extra>
void launch_decode(const char* op, void (*kernel)(DecodeParams, Extra...), int smem, const DecodeParams& p,
                   const DecodeOptions& options, const Extra&... extra) {
  const cudaStream_t stream = as_stream(options.stream);
  const dim3 grid = decode_grid(op, p, options);
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
        "cudaFuncSetAttribute (decode kernel)");
  kernel<<<grid, 384, smem, stream>>>(p, extra...);
  check_launch(op);
  if (options.plan) combine(combine_params(p), stream);
}

}  // namespace snapmla::cuda
