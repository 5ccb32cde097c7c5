// append: quantize-on-write of new tokens into the FP8 cache (one warp per token), and the
// plain paged copy for the BF16 cache. Slots of -1 are padding and are skipped; a slot out of
// range is skipped too (the kernel never writes outside the cache).
#include <cuda_runtime.h>

#include "kernels/common/check.cuh"
#include "kernels/common/quantize_row.cuh"
#include "kernels/kernels.hpp"

namespace snapmla::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

// Each warp quantizes kRowsPerWarp tokens, all loads issued before the first use.
constexpr int kRowsPerWarp = 4;

__global__ void append_fp8_kernel(const uint16_t* __restrict__ kv, const int32_t* __restrict__ slots,
                                  int64_t n, int64_t num_slots, uint8_t* __restrict__ latent,
                                  float* __restrict__ scale, uint16_t* __restrict__ rope) {
  const int lane = threadIdx.x % 32;
  const int64_t first = (int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32) * kRowsPerWarp;
  RowFragment f[kRowsPerWarp];
  int64_t slot[kRowsPerWarp];
#pragma unroll
  for (int k = 0; k < kRowsPerWarp; ++k) {
    const int64_t t = first + k;
    slot[k] = t < n ? slots[t] : -1;
    if (slot[k] >= 0 && slot[k] < num_slots) f[k] = load_row(kv + t * kHeadDim, lane);
  }
#pragma unroll
  for (int k = 0; k < kRowsPerWarp; ++k)
    if (slot[k] >= 0 && slot[k] < num_slots)
      quantize_store(f[k], lane, latent + slot[k] * kLatentDim, rope + slot[k] * kRopeDim, scale + slot[k]);
}

// 1152 bytes per row = 72 uint4; one warp per token.
__global__ void append_bf16_kernel(const uint4* __restrict__ kv, const int32_t* __restrict__ slots,
                                   int64_t n, int64_t num_slots, uint4* __restrict__ cache) {
  const int lane = threadIdx.x % 32;
  const int64_t token = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (token >= n) return;
  const int64_t slot = slots[token];
  if (slot < 0 || slot >= num_slots) return;
  constexpr int kVec = kHeadDim * 2 / 16;
  for (int i = lane; i < kVec; i += 32) cache[slot * kVec + i] = kv[token * kVec + i];
}

}  // namespace

void append(const PagedFp8Cache& cache, const KvRows& kv, const SlotMapping& slots, Stream s) {
  if (kv.num_tokens == 0) return;
  constexpr int kPerBlock = kWarpsPerBlock * kRowsPerWarp;
  const unsigned blocks = unsigned((kv.num_tokens + kPerBlock - 1) / kPerBlock);
  append_fp8_kernel<<<blocks, kWarpsPerBlock * 32, 0, as_stream(s)>>>(
      reinterpret_cast<const uint16_t*>(kv.data), slots.slots, kv.num_tokens,
      cache.num_pages * kPageSize, reinterpret_cast<uint8_t*>(cache.latent), cache.scale,
      reinterpret_cast<uint16_t*>(cache.rope));
  check_launch("append_fp8_kernel");
}

void append(const PagedBf16Cache& cache, const KvRows& kv, const SlotMapping& slots, Stream s) {
  if (kv.num_tokens == 0) return;
  const unsigned blocks = unsigned((kv.num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock);
  append_bf16_kernel<<<blocks, kWarpsPerBlock * 32, 0, as_stream(s)>>>(
      reinterpret_cast<const uint4*>(kv.data), slots.slots, kv.num_tokens,
      cache.num_pages * kPageSize, reinterpret_cast<uint4*>(cache.data));
  check_launch("append_bf16_kernel");
}

}  // namespace snapmla::cuda
