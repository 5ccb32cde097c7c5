#include <cuda_runtime.h>

#include <mutex>
#include <vector>

#include "../core/validate.hpp"
#include "common/check.cuh"
#include "kernels.hpp"

namespace snapmla::cuda {

bool device_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) == cudaSuccess && p.major == 9 && p.minor == 0) return true;
  }
  return false;
}

void copy_to_host(void* dst, const void* src, size_t bytes, Stream s) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, as_stream(s)), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(as_stream(s)), "cudaStreamSynchronize");
}

int require_sm90(const char* op, const char* argument, Device d) {
  static std::mutex mu;
  static std::vector<int> sm_count;  // per ordinal: 0 unknown, -1 not sm_90, else SM count
  std::lock_guard<std::mutex> lock(mu);
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || d.index < 0 || d.index >= n) {
    cudaGetLastError();
    detail::fail(op, std::string(argument) + ".device",
                 "expected a CUDA device ordinal in [0, " + std::to_string(n) + "), got " +
                     to_string(d));
  }
  if (sm_count.size() < size_t(n)) sm_count.resize(n, 0);
  if (sm_count[d.index] == 0) {
    cudaDeviceProp p{};
    check(cudaGetDeviceProperties(&p, d.index), "cudaGetDeviceProperties");
    sm_count[d.index] = (p.major == 9 && p.minor == 0) ? p.multiProcessorCount : -1;
    if (sm_count[d.index] < 0)
      detail::fail(op, std::string(argument) + ".device",
                   "expected a Hopper GPU (sm_90: H100/H200/H800/H20), got " + to_string(d) +
                       " = " + p.name + " (sm_" + std::to_string(p.major) +
                       std::to_string(p.minor) + ")");
  }
  if (sm_count[d.index] < 0)
    detail::fail(op, std::string(argument) + ".device",
                 "expected a Hopper GPU (sm_90), got " + to_string(d));
  int cur = -1;
  check(cudaGetDevice(&cur), "cudaGetDevice");
  if (cur != d.index) check(cudaSetDevice(d.index), "cudaSetDevice");
  return sm_count[d.index];
}

}  // namespace snapmla::cuda
