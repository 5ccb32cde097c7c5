// The planner's rule for how long a split is, shared by the reference planner (C++) and the GPU
// planner (CUDA) so that both make the same plan by construction.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SNAPMLA_HOST_DEVICE __host__ __device__
#else
#define SNAPMLA_HOST_DEVICE
#endif

namespace snapmla::detail {

// The share of one worker in 64-token blocks. Equal shares of the total (num_workers of them),
// but, given the decode's query rows per sequence (seqlen_q x num_heads; 0: equal shares only),
// no shorter than a split is worth: each split costs its fp32 partials (rows x 2 KB, written by
// the decode and read back by the combine) and a CTA's start, so for a small total the time
//   chunk x t_page + (total / chunk) x rows x c_row
// is least at chunk^2 = total x rows x c_row / t_page. The ratio c_row / t_page = 1 / 1024 is
// what one H200 measurement gives (b = 1, h = 128, 8K: 24.1 us with 2-block splits, 20.6 us with
// 4, so the 4 blocks this rule picks there); the result is rounded to the nearest integer, and
// a total large enough that equal shares are longer is left alone.
SNAPMLA_HOST_DEVICE inline int64_t split_chunk(int64_t total_blocks, int num_workers, int query_rows) {
  int64_t chunk = (total_blocks + num_workers - 1) / num_workers;
  if (chunk < 1) chunk = 1;
  if (query_rows > 0) {
    // The largest c with (c - 1/2)^2 <= total x rows / 1024, i.e. (2c - 1)^2 x 256 <= x, from
    // the equal share up (no iteration once the equal share is longer).
    const int64_t x = total_blocks * query_rows;
    while ((2 * chunk + 1) * (2 * chunk + 1) * 256 <= x) ++chunk;
  }
  return chunk;
}

}  // namespace snapmla::detail
