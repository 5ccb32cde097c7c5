// Host side: TMA tensor maps over the cache planes the decode kernels stream pages from, and
// over the queries' latent (the 64-row kernels' Q tile).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "../../common/check.cuh"
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
inline CUtensorMap plane_map(const void* base, int64_t rows, int row_bytes, CUtensorMapDataType type,
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

}  // namespace snapmla::cuda
