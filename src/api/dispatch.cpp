// The public entry points: validate, then run where the data lives (CPU reference or CUDA).
#include "snapmla/reference.hpp"
#include "snapmla/snapmla.hpp"
#include "validate.hpp"

namespace snapmla {
namespace {

// The CUDA kernels land with the GPU path (docs/roadmap.md); until a build has them, a call
// on device memory is refused with a clear message instead of touching the pointers.
[[noreturn]] void no_cuda_path(const char* op, const char* arg, Device d) {
  detail::fail(op, std::string(arg) + ".device",
               "expected host memory: this build of SnapMLA has no CUDA kernels, got " +
                   to_string(d) + " (pass host memory to use the CPU reference)");
}

}  // namespace

bool built_with_cuda() { return false; }
bool cuda_device_available() { return false; }

void append(const PagedFp8Cache& cache, const KvRows& kv, const SlotMapping& slots, Stream) {
  detail::check_devices_match("append", cache.device, "kv", kv.device);
  detail::check_devices_match("append", cache.device, "slot_mapping", slots.device);
  if (!cache.device.is_cpu()) no_cuda_path("append", "cache", cache.device);
  ref::append(cache, kv, slots);
}

void append(const PagedBf16Cache& cache, const KvRows& kv, const SlotMapping& slots, Stream) {
  detail::check_devices_match("append", cache.device, "kv", kv.device);
  detail::check_devices_match("append", cache.device, "slot_mapping", slots.device);
  if (!cache.device.is_cpu()) no_cuda_path("append", "cache", cache.device);
  ref::append(cache, kv, slots);
}

void quantize_query(const QueryBf16& q, const QuantizedQuery& out, Stream) {
  detail::check_devices_match("quantize_query", q.device, "out", out.device);
  if (!q.device.is_cpu()) no_cuda_path("quantize_query", "q", q.device);
  ref::quantize_query(q, out);
}

void gather_dequant(const PagedFp8Cache& cache, const SlotMapping& slots, const KvRows& out,
                    Stream) {
  detail::check_devices_match("gather_dequant", cache.device, "slot_mapping", slots.device);
  detail::check_devices_match("gather_dequant", cache.device, "out", out.device);
  if (!cache.device.is_cpu()) no_cuda_path("gather_dequant", "cache", cache.device);
  ref::gather_dequant(cache, slots, out);
}

void plan_splits(const PageTable& pages, int num_workers, const SplitPlan& plan, Stream) {
  detail::check_devices_match("plan_splits", pages.device, "plan", plan.device);
  if (!pages.device.is_cpu()) no_cuda_path("plan_splits", "pages", pages.device);
  ref::plan_splits(pages, num_workers, plan);
}

void decode_fp8(const QuantizedQuery& q, const PagedFp8Cache& cache, const PageTable& pages,
                const DecodeOutput& out, const DecodeOptions& options) {
  detail::check_devices_match("decode_fp8", q.device, "cache", cache.device);
  detail::check_devices_match("decode_fp8", q.device, "pages", pages.device);
  detail::check_devices_match("decode_fp8", q.device, "out", out.device);
  if (options.plan) detail::check_devices_match("decode_fp8", q.device, "options.plan", options.plan->device);
  if (!q.device.is_cpu()) no_cuda_path("decode_fp8", "q", q.device);
  ref::decode_fp8(q, cache, pages, out, options);
}

void decode_bf16(const QueryBf16& q, const PagedBf16Cache& cache, const PageTable& pages,
                 const DecodeOutput& out, const DecodeOptions& options) {
  detail::check_devices_match("decode_bf16", q.device, "cache", cache.device);
  detail::check_devices_match("decode_bf16", q.device, "pages", pages.device);
  detail::check_devices_match("decode_bf16", q.device, "out", out.device);
  if (options.plan) detail::check_devices_match("decode_bf16", q.device, "options.plan", options.plan->device);
  if (!q.device.is_cpu()) no_cuda_path("decode_bf16", "q", q.device);
  ref::decode_bf16(q, cache, pages, out, options);
}

}  // namespace snapmla
