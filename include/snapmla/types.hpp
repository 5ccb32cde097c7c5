// SnapMLA basic types: the MLA dimensions, storage types for bf16 and float8 e4m3, where
// memory lives, and the one error type every entry point throws on bad input.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace snapmla {

// MLA in absorbed ("MQA") form, as DeepSeek-V2/V3/R1, Kimi-K2 and LongCat-Flash use it.
inline constexpr int kLatentDim = 512;  // kv_lora_rank: the latent c_t, also the value
inline constexpr int kRopeDim = 64;     // qk_rope_head_dim: the rotated key k_t
inline constexpr int kHeadDim = kLatentDim + kRopeDim;  // 576: one q row / one cache row
inline constexpr int kPageSize = 64;    // tokens per cache page (and per softmax block)
inline constexpr float kE4m3Max = 448.0f;
// Smallest amax a scale is computed from: an all-zero latent row still gets a finite,
// positive scale, so the pre-scaled rope part stays finite (|k| / (1e-10 / 448) < 1e16 for
// |k| < 1e3, far inside bf16's range).
inline constexpr float kMinAmax = 1e-10f;

inline constexpr int kMinHeads = 1;
inline constexpr int kMaxHeads = 128;  // per GPU, any h in between (the kernels pad rows to their tile)
inline constexpr int kMaxQueriesPerSeq = 4;  // s_q: 1, or 2..4 with MTP / speculative decoding

// Storage types. Bit patterns only, so the public headers need no CUDA headers; they have the
// size and alignment of __nv_bfloat16 / __nv_fp8_e4m3 / torch.bfloat16 / torch.float8_e4m3fn,
// and a pointer to one can be reinterpret_cast to a pointer to the other.
struct bf16 {
  uint16_t bits;
};
struct e4m3 {
  uint8_t bits;
};
static_assert(sizeof(bf16) == 2 && alignof(bf16) == 2);
static_assert(sizeof(e4m3) == 1 && alignof(e4m3) == 1);

enum class DeviceType : int { kCpu = 0, kCuda = 1 };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;  // CUDA ordinal; 0 for the CPU

  static constexpr Device cpu() { return {DeviceType::kCpu, 0}; }
  static constexpr Device cuda(int ordinal = 0) { return {DeviceType::kCuda, ordinal}; }
  bool is_cpu() const { return type == DeviceType::kCpu; }
  bool is_cuda() const { return type == DeviceType::kCuda; }
  friend bool operator==(const Device&, const Device&) = default;
};

std::string to_string(Device d);

// A cudaStream_t, passed opaquely so host-only users need no CUDA headers. Ignored on the CPU.
using Stream = void*;

// Thrown for every invalid argument: names the operation, the argument and what was expected.
class Error : public std::invalid_argument {
 public:
  Error(std::string op, std::string argument, const std::string& what);
  const std::string& op() const { return op_; }
  const std::string& argument() const { return argument_; }

 private:
  std::string op_;
  std::string argument_;
};

}  // namespace snapmla
