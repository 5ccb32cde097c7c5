// Pieces of the decode kernels' page pipelines: decode_fp8's ring of shared-memory stages (a
// producer fills them, completion signalled on `full` mbarriers; readers release a stage on its
// `empty` mbarrier), the no-swizzle K-major tile layout of the wgmma operands the kernels write
// themselves (Q, P), and the page lookup.
#pragma once

#include "../../common/wgmma.cuh"
#include "params.hpp"
#include "scheduler.cuh"

namespace snapmla::cuda {

// Byte k of row r in a K-major no-swizzle tile with `row_bytes`-long rows: 8 x 16 B core
// matrices stored as contiguous 128 B blocks, LBO = 128 (along K), SBO = 8 rows (along M/N).
__device__ __forceinline__ int km_offset(int r, int k, int row_bytes) {
  return (r / 8) * (row_bytes * 8) + (k / 16) * 128 + (r % 8) * 16 + (k % 16);
}

__device__ __forceinline__ int32_t page_of(const DecodeParams& p, const Work& w, int blk) {
  return p.block_table[int64_t(w.seq) * p.max_pages + blk / kPageSize];
}
__device__ __forceinline__ bool page_ok(const DecodeParams& p, int32_t page) {
  return page >= 0 && page < p.num_pages;
}

// decode_fp8's ring: mbarriers of kStages page stages filled by TMA, plus one for the Q tile.
template <int kStages>
struct PageRing {
  uint64_t* full;   // [kStages]: the loader's arrival with the page's bytes
  uint64_t* empty;  // [kStages]: one arrival per thread that reads the stage
  uint64_t* qbar;   // one arrival per Q loading thread (cp.async completion)
  static constexpr int kBytes = (2 * kStages + 1) * 8;

  __device__ explicit PageRing(void* at) {
    full = static_cast<uint64_t*>(at);
    empty = full + kStages;
    qbar = empty + kStages;
  }
  // One thread, before a __syncthreads.
  __device__ void init(uint32_t readers, uint32_t q_loaders) const {
    for (int s = 0; s < kStages; ++s) {
      wg::mbar_init(&full[s], 1);
      wg::mbar_init(&empty[s], readers);
    }
    wg::mbar_init(qbar, q_loaders);
  }
  // Producer: wait until page j's stage is free.
  __device__ void acquire(int j) const {
    if (j >= kStages) wg::mbar_wait(&empty[j % kStages], ((j / kStages) & 1) ^ 1);
  }
  // Consumers: wait until page j is in its stage.
  __device__ void wait(int j) const { wg::mbar_wait(&full[j % kStages], (j / kStages) & 1); }
  // Readers: done reading page j's stage.
  __device__ void release(int j) const { wg::mbar_arrive(&empty[j % kStages]); }
};

}  // namespace snapmla::cuda
