#include <cuda_runtime.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "core/validate.hpp"
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

namespace {

// Makes ordinal `index` the calling thread's current device (the kernels launch there).
void select_device(int index) {
  int cur = -1;
  check(cudaGetDevice(&cur), "cudaGetDevice");
  if (cur != index) check(cudaSetDevice(index), "cudaSetDevice");
}

// SM counts of the ordinals below kKnownDevices already checked to be sm_90 GPUs (0: not yet).
// The set of devices and their properties cannot change during a process (CUDA reads
// CUDA_VISIBLE_DEVICES once), so an ordinal found good stays good: every later call takes it
// from here without the lock, the device count or the properties. Written once per ordinal,
// with the same value by any thread that does, so relaxed atomics suffice.
constexpr int kKnownDevices = 64;
std::atomic<int> known_sm_count[kKnownDevices];

}  // namespace

int require_sm90(const char* op, const char* argument, Device d) {
  if (d.index >= 0 && d.index < kKnownDevices) {
    const int sms = known_sm_count[d.index].load(std::memory_order_relaxed);
    if (sms > 0) {
      select_device(d.index);
      return sms;
    }
  }
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
  if (d.index < kKnownDevices) known_sm_count[d.index].store(sm_count[d.index], std::memory_order_relaxed);
  select_device(d.index);
  return sm_count[d.index];
}

}  // namespace snapmla::cuda
