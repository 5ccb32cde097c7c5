#include "tensor_args.hpp"

namespace snapmla::python {

namespace {
namespace dl = nb::dlpack;
constexpr uint8_t kInt = uint8_t(dl::dtype_code::Int);
constexpr uint8_t kUInt = uint8_t(dl::dtype_code::UInt);
constexpr uint8_t kFloat = uint8_t(dl::dtype_code::Float);
constexpr uint8_t kBfloat = uint8_t(dl::dtype_code::Bfloat);
constexpr uint8_t kFloat8E4m3fn = 10;  // DLPack 1.1's kDLFloat8_e4m3fn (newer than nanobind's enum)
constexpr int kDlCpu = 1, kDlCuda = 2;
}  // namespace

std::string dtype_name(const dl::dtype& t) {
  const std::string bits = std::to_string(t.bits);
  switch (t.code) {
    case kInt: return "int" + bits;
    case kUInt: return "uint" + bits;
    case kFloat: return "float" + bits;
    case kBfloat: return "bfloat" + bits;
    case kFloat8E4m3fn: return "float8_e4m3fn";
    default: return "DLPack type code " + std::to_string(t.code) + " with " + bits + " bits";
  }
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kBf16: return "bfloat16 (or uint16/int16 raw bits)";
    case Kind::kE4m3: return "float8_e4m3fn (or uint8/int8 raw bits)";
    case Kind::kF32: return "float32";
    case Kind::kI32: return "int32";
    case Kind::kBytes: return "any dtype";
  }
  return "?";
}

bool has_kind(const Array& a, Kind k) {
  const dl::dtype t = a.dtype();
  if (t.lanes != 1) return false;
  switch (k) {
    case Kind::kBf16: return t.bits == 16 && (t.code == kBfloat || t.code == kUInt || t.code == kInt);
    case Kind::kE4m3: return t.bits == 8 && (t.code == kFloat8E4m3fn || t.code == kUInt || t.code == kInt);
    case Kind::kF32: return t.bits == 32 && t.code == kFloat;
    case Kind::kI32: return t.bits == 32 && t.code == kInt;
    case Kind::kBytes: return true;
  }
  return false;
}

void Arg::fail(const std::string& what) const { throw Error(op_, name_, what); }

std::string Arg::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < a_.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a_.shape(i));
  return s + "]";
}

int64_t Arg::size() const {
  int64_t n = 1;
  for (size_t i = 0; i < a_.ndim(); ++i) n *= int64_t(a_.shape(i));
  return n;
}

int64_t Arg::bytes() const { return size() * ((a_.dtype().bits + 7) / 8); }

const Arg& Arg::kind(Kind k) const {
  if (!has_kind(a_, k)) {
    const dl::dtype t = a_.dtype();
    fail(std::string("expected dtype ") + kind_name(k) + ", got " + dtype_name(t));
  }
  // C-contiguous: strides (in elements) as a row-major array of this shape has them; extents
  // of 1 may have any stride, as PyTorch gives them, and an empty array any strides at all
  // (PyTorch's DLPack export of one has given zeros).
  int64_t expected = 1;
  const bool empty = size() == 0;
  for (size_t i = a_.ndim(); !empty && i-- > 0;) {
    if (a_.shape(i) != 1 && a_.stride(i) != expected)
      fail("expected a C-contiguous array, got shape " + shape_string() + " with stride " +
           std::to_string(a_.stride(i)) + " in dimension " + std::to_string(i) + " (call .contiguous())");
    expected *= int64_t(a_.shape(i));
  }
  if (size() > 0 && a_.data() == nullptr) fail("got a null data pointer");
  return *this;
}

const Arg& Arg::shape(std::initializer_list<int64_t> dims) const {
  bool ok = a_.ndim() == dims.size();
  std::string want = "[";
  size_t i = 0;
  for (int64_t d : dims) {
    want += (i ? ", " : "") + (d < 0 ? std::string("*") : std::to_string(d));
    if (ok && d >= 0 && int64_t(a_.shape(i)) != d) ok = false;
    ++i;
  }
  if (!ok) fail("expected shape " + want + "], got " + shape_string());
  return *this;
}

const Arg& Arg::rows_of(int64_t rows, int64_t last) const {
  if (a_.ndim() == 0 || dim(a_.ndim() - 1) != last || size() != rows * last)
    fail("expected " + std::to_string(rows) + " rows of " + std::to_string(last) +
         " (shape [..., " + std::to_string(last) + "] with " + std::to_string(rows * last) +
         " elements), got " + shape_string());
  return *this;
}

const Arg& Arg::numel(int64_t n) const {
  if (size() != n)
    fail("expected " + std::to_string(n) + " elements, got shape " + shape_string());
  return *this;
}

Device Arg::device() const {
  switch (a_.device_type()) {
    case kDlCpu: return Device::cpu();
    case kDlCuda: return Device::cuda(a_.device_id());
    default:
      fail("expected a CPU or CUDA array, got DLPack device type " +
           std::to_string(a_.device_type()) + " (pinned, managed and other memory is not supported)");
  }
}

Device same_device(const char* op, std::initializer_list<std::pair<const char*, Device>> devs) {
  const auto& first = *devs.begin();
  for (const auto& [name, d] : devs)
    if (!(d == first.second))
      throw Error(op, name,
                  "expected the same device as " + std::string(first.first) + " (" +
                      to_string(first.second) + "), got " + to_string(d));
  return first.second;
}

}  // namespace snapmla::python
