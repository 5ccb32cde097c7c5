// CUDA error checking for the host side of the kernels.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace snapmla::cuda {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("snapmla: CUDA error in ") + what + ": " +
                             cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

// After a launch: configuration errors surface here (asynchronous faults surface later, at
// the caller's next synchronization, as with any CUDA library).
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// The current device's SM count, 0 where the query fails (the callers size grids by it, or decide
// whether a grid fits the GPU at once, and take a safe default then).
inline int current_sm_count() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return sms;
}

}  // namespace snapmla::cuda
