// Host side: TMA tensor maps over the cache planes the decode kernels stream pages from, and
// over the queries' latent (the 64-row kernels' Q tile).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/common/check.cuh"
#include "snapmla/formats.hpp"

namespace snapmla::cuda {

// Every TMA box is 64 rows (one page) x 128 bytes, written with the 128-byte swizzle that the
// wgmma descriptors (wg::desc_sw128 and its MN-major form) expect.
inline constexpr int kTmaBoxBytes = 128;

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's tensor-map encoder, through the runtime (no link against libcuda).
inline EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found),
          "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)");
    if (f == nullptr || found != cudaDriverEntryPointSuccess)
      throw std::runtime_error("snapmla: the CUDA driver has no cuTensorMapEncodeTiled (needs CUDA 12+)");
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

// A 2-D map over one plane seen as [rows, row_bytes] of `elem_bytes`-wide elements, boxes of 64
// rows x 128 bytes: a cache plane (64 rows = one page), or the queries' latent (64 rows = one
// row tile). A plane with no rows gets an unused dummy (no page index is valid, so the loader
// never issues a copy).
inline CUtensorMap encode_plane_map(const void* base, int64_t rows, int row_bytes, CUtensorMapDataType type,
                                    int elem_bytes) {
  CUtensorMap m{};
  if (rows == 0) return m;
  const cuuint64_t dims[2] = {cuuint64_t(row_bytes / elem_bytes), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(row_bytes)};
  const cuuint32_t box[2] = {cuuint32_t(kTmaBoxBytes / elem_bytes), cuuint32_t(kPageSize)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode_tiled()(&m, type, 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                                    CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("snapmla: cuTensorMapEncodeTiled failed (" + std::to_string(int(r)) + ")");
  return m;
}

// The last maps this thread encoded, with what they were encoded from. A map is a function of
// those arguments alone (the encoder is host code: it reads no device memory and no context
// state; the address is a virtual one, unique across devices), and a decode step encodes the
// same cache planes on every call (the cache does not move; the query's buffer often comes back
// at the same address from a caching allocator), so a map whose arguments all match is reused
// instead of encoded again. Least recently used goes first: the cache planes, used on every
// call, stay while a query at ever new addresses cycles through the rest. Per thread: no lock.
class PlaneMapCache {
 public:
  const CUtensorMap& get(const void* base, int64_t rows, int row_bytes, CUtensorMapDataType type, int elem_bytes) {
    ++clock_;
    Entry* oldest = &entries_[0];
    for (Entry& e : entries_) {
      if (e.used != 0 && e.base == base && e.rows == rows && e.row_bytes == row_bytes && e.type == type &&
          e.elem_bytes == elem_bytes) {
        e.used = clock_;
        return e.map;
      }
      if (e.used < oldest->used) oldest = &e;
    }
    oldest->map = encode_plane_map(base, rows, row_bytes, type, elem_bytes);  // may throw: entry unchanged
    oldest->base = base;
    oldest->rows = rows;
    oldest->row_bytes = row_bytes;
    oldest->type = type;
    oldest->elem_bytes = elem_bytes;
    oldest->used = clock_;
    return oldest->map;
  }

 private:
  struct Entry {
    CUtensorMap map{};
    const void* base = nullptr;
    int64_t rows = 0;
    int row_bytes = 0;
    CUtensorMapDataType type{};
    int elem_bytes = 0;
    uint64_t used = 0;  // clock_ at the last use; 0: empty
  };
  Entry entries_[8];  // decode_fp8 uses 3 maps a call, decode_bf16 2: both fit, with room for queries
  uint64_t clock_ = 0;
};

inline CUtensorMap plane_map(const void* base, int64_t rows, int row_bytes, CUtensorMapDataType type,
                             int elem_bytes) {
  thread_local PlaneMapCache cache;
  return cache.get(base, rows, row_bytes, type, elem_bytes);
}

}  // namespace snapmla::cuda
