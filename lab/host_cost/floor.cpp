// The binding floor for lab/host_cost.py: nanobind functions with the argument lists of
// snapmla._C.decode_fp8_raw / decode_bf16_raw (pointers as integers, a shape object, floats, a
// bool, the stream) whose bodies do nothing, so their cost per call is what nanobind alone takes
// to dispatch and convert those arguments. Built by host_cost.py (one g++ line, nanobind's
// combined source); not part of the product.
#include <nanobind/nanobind.h>

#include <cstdint>

namespace nb = nanobind;

namespace {

// The same fields as snapmla::python::RawShape, so the call converts one bound object as the
// real one does.
struct Shape {
  int b, s_q, h;
  int64_t num_pages;
  int max_pages, plan_capacity;
  int64_t workspace_bytes;
  int device_type, device_index;
};

}  // namespace

NB_MODULE(host_cost_floor, m) {
  nb::class_<Shape>(m, "Shape")
      .def("__init__", [](Shape* s, int b, int s_q, int h, int64_t num_pages, int max_pages, int plan_capacity,
                          int64_t workspace_bytes, int device_type, int device_index) {
        new (s) Shape{b, s_q, h, num_pages, max_pages, plan_capacity, workspace_bytes, device_type, device_index};
      });
  m.def("nothing", [] {});
  m.def("decode_fp8_raw", [](uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t,
                             uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, const Shape&, float,
                             bool, float, uintptr_t) {});
  m.def("decode_bf16_raw", [](uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t,
                              uintptr_t, uintptr_t, const Shape&, float, bool, float, uintptr_t) {});
}
