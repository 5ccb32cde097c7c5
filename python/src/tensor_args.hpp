// Turning DLPack arrays (nanobind ndarrays from PyTorch, NumPy, CuPy, JAX...) into the views of
// include/snapmla/formats.hpp. The C++ views carry no shapes, so this is where a Python
// caller's dtype, shape, device and layout mistakes are caught, each with a message that names
// the operation and the argument, as snapmla::Error does for the C++ API.
#pragma once

#include <nanobind/ndarray.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "snapmla/types.hpp"

namespace snapmla::python {

namespace nb = nanobind;
using Array = nb::ndarray<>;

// Element types by meaning. bf16 and e4m3 also accept same-width integer arrays (raw bits):
// NumPy and CuPy have no bfloat16 or float8 dtype, and that is how they carry them.
enum class Kind { kBf16, kE4m3, kF32, kI32, kBytes };

const char* kind_name(Kind k);
bool has_kind(const Array& a, Kind k);

// One argument of one operation: checks are methods so every message names both.
class Arg {
 public:
  Arg(const char* op, const char* name, const Array& a) : op_(op), name_(name), a_(a) {}

  [[noreturn]] void fail(const std::string& what) const;

  // dtype and C-contiguity, which every argument needs.
  const Arg& kind(Kind k) const;
  // Exact shape (-1: any extent).
  const Arg& shape(std::initializer_list<int64_t> dims) const;
  // Any leading shape with a fixed last dimension and `rows` rows of it in all.
  const Arg& rows_of(int64_t rows, int64_t last) const;
  // Exactly `n` elements, any shape.
  const Arg& numel(int64_t n) const;

  int64_t size() const;  // number of elements
  int64_t dim(size_t i) const { return int64_t(a_.shape(i)); }
  size_t ndim() const { return a_.ndim(); }
  int64_t bytes() const;
  Device device() const;
  void* data() const { return a_.data(); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(a_.data());
  }

  std::string shape_string() const;

 private:
  const char* op_;
  const char* name_;
  const Array& a_;
};

// All arrays of one call on one device; returns it.
Device same_device(const char* op, std::initializer_list<std::pair<const char*, Device>> devs);

// The cudaStream_t a Python caller passes as an integer (0: the legacy default stream).
inline Stream to_stream(uintptr_t s) { return reinterpret_cast<Stream>(s); }

}  // namespace snapmla::python
