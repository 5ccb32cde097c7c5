// Buffer sizes a caller needs before a call: the split plan's capacity and the decode
// workspace for split partials. They belong to the bottom layer because the validation checks
// buffers against them.
#include <cstddef>
#include <cstdint>

#include "snapmla/formats.hpp"

namespace snapmla {

int split_plan_capacity(int batch, int num_workers) {
  if (batch < 0) throw Error("split_plan_capacity", "batch", "expected >= 0");
  if (num_workers < 1) throw Error("split_plan_capacity", "num_workers", "expected >= 1");
  return batch + num_workers;
}

size_t decode_workspace_bytes(int split_capacity, int seqlen_q, int num_heads) {
  if (split_capacity < 0 || seqlen_q < 0 || num_heads < 0)
    throw Error("decode_workspace_bytes", "split_capacity", "sizes must be >= 0");
  // The fp32 partials and their lse per split and query row, then one int32 counter per split and
  // 64-row tile for the decode kernels' own combine (SNAPMLA_COMBINE_FUSED, a lab option).
  const size_t rows = static_cast<size_t>(seqlen_q) * num_heads;
  const size_t row_tiles = (rows + 63) / 64;
  return static_cast<size_t>(split_capacity) * (rows * (kLatentDim + 1) * sizeof(float) + row_tiles * sizeof(int32_t));
}

}  // namespace snapmla
