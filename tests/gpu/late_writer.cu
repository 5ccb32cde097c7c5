#include "late_writer.hpp"

#include <cstdint>
#include <stdexcept>
#include <string>

namespace snapmla::test {
namespace {

struct LateCopies {
  LateCopy copy[kMaxLateCopies];
  int count;
  unsigned long long delay_ns;
};

__device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

__global__ void late_copies_kernel(LateCopies c) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const unsigned long long t0 = global_ns();
  while (global_ns() - t0 < c.delay_ns) {
  }
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (int k = 0; k < c.count; ++k) {
    const auto* src = static_cast<const uint32_t*>(c.copy[k].src);
    auto* dst = static_cast<uint32_t*>(c.copy[k].dst);
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < c.copy[k].bytes / 4; i += stride) dst[i] = src[i];
  }
}

}  // namespace

void late_copies_async(const LateCopy* copies, int count, unsigned delay_us, cudaStream_t stream) {
  if (count < 0 || count > kMaxLateCopies) throw std::invalid_argument("late_copies_async: count");
  LateCopies c{};
  for (int k = 0; k < count; ++k) {
    if (copies[k].bytes % 4 != 0 || reinterpret_cast<uintptr_t>(copies[k].dst) % 4 != 0 ||
        reinterpret_cast<uintptr_t>(copies[k].src) % 4 != 0)
      throw std::invalid_argument("late_copies_async: copies of whole 4-byte words only");
    c.copy[k] = copies[k];
  }
  c.count = count;
  c.delay_ns = 1000ull * delay_us;
  // Few blocks: the dependent's CTAs (one per SM, most of its shared memory) fit beside them.
  late_copies_kernel<<<8, 256, 0, stream>>>(c);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("late_copies_kernel: ") + cudaGetErrorString(e));
}

}  // namespace snapmla::test
