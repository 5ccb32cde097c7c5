// quantize_query: per-(token, head) scale, e4m3 nope, pre-scaled bf16 rope; one warp per row.
#include <cuda_runtime.h>

#include "kernels/common/check.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/quantize_row.cuh"
#include "kernels/kernels.hpp"

namespace snapmla::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void quantize_query_kernel(const uint16_t* __restrict__ q, int64_t rows,
                                      uint8_t* __restrict__ nope, uint16_t* __restrict__ rope,
                                      float* __restrict__ scale) {
  // A decode launched as this grid's programmatic dependent (SNAPMLA_DECODE_PDL) may start once
  // every block is running; it waits for this grid's writes itself.
  ptx::launch_dependents();
  const int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (r >= rows) return;
  const int lane = threadIdx.x % 32;
  quantize_store(load_row(q + r * kHeadDim, lane), lane, nope + r * kLatentDim, rope + r * kRopeDim,
                 scale + r);
}

}  // namespace

void quantize_query(const QueryBf16& q, const QuantizedQuery& out, Stream s) {
  const int64_t rows = int64_t(q.batch) * q.seqlen_q * q.num_heads;
  if (rows == 0) return;
  quantize_query_kernel<<<unsigned((rows + kWarpsPerBlock - 1) / kWarpsPerBlock), kWarpsPerBlock * 32,
                          0, as_stream(s)>>>(reinterpret_cast<const uint16_t*>(q.data), rows,
                                             reinterpret_cast<uint8_t*>(out.nope),
                                             reinterpret_cast<uint16_t*>(out.rope), out.scale);
  check_launch("quantize_query_kernel");
}

}  // namespace snapmla::cuda
