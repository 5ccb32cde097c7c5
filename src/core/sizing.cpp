// Buffer sizes a caller needs before a call: the split plan's capacity and the decode
// workspace for split partials. They belong to the bottom layer because the validation checks
// buffers against them.
#include <cstddef>

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
  return static_cast<size_t>(split_capacity) * seqlen_q * num_heads * (kLatentDim + 1) *
         sizeof(float);
}

}  // namespace snapmla
