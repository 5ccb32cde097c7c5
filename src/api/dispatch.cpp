// The public entry points: each checks its arguments once (core/validate.hpp's check_*, named
// for the operation called), then runs where the data lives: host memory on the CPU reference's
// computations (reference/unchecked.hpp), device memory on the kernels. Shapes, pointers,
// alignment and devices are checked for every call; the contents of int32 tables (page
// indices, seqlens, slots, plans) only where they are host memory, since reading device memory
// would need a host synchronization. The kernels never access memory outside the cache for a
// bad index: a bad page or length makes the sequence's rows NaN, a bad slot is skipped.
#include <algorithm>
#include <vector>

#include "core/validate.hpp"
#include "reference/unchecked.hpp"
#include "snapmla/snapmla.hpp"

#if SNAPMLA_HAVE_CUDA
#include "kernels/kernels.hpp"
#include "kernels/sm90/decode/params.hpp"
#endif

namespace snapmla {
namespace {

// Returns true when the call should run on the GPU (and checks the device is usable: the first
// check of every call, so that device memory in a build without kernels is named as such).
bool on_gpu(const char* op, const char* arg, Device d) {
  if (d.is_cpu()) return false;
#if SNAPMLA_HAVE_CUDA
  cuda::require_sm90(op, arg, d);
  return true;
#else
  detail::fail(op, std::string(arg) + ".device",
               "expected host memory: this build of SnapMLA has no CUDA kernels, got " +
                   to_string(d) + " (pass host memory to use the CPU reference)");
#endif
}

}  // namespace

bool built_with_cuda() {
#if SNAPMLA_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

bool cuda_device_available() {
#if SNAPMLA_HAVE_CUDA
  return cuda::device_available();
#else
  return false;
#endif
}

namespace {

// Both caches: same checks, then the reference or the kernel for that cache type.
template <typename Cache>
void append_impl(const Cache& cache, const KvRows& kv, const SlotMapping& slots, Stream s) {
  const bool gpu = on_gpu("append", "cache", cache.device);
  detail::check_append("append", cache, kv, slots);
  if (!gpu) return ref::unchecked::append(cache, kv, slots);
#if SNAPMLA_HAVE_CUDA
  cuda::append(cache, kv, slots, s);
#else
  (void)s;
#endif
}

}  // namespace

int recommended_num_workers(Device device, int seqlen_q, int num_heads) {
  detail::check_query_shape("recommended_num_workers", "seqlen_q", seqlen_q, "num_heads", num_heads);
  if (!on_gpu("recommended_num_workers", "device", device)) return ref::num_threads();
#if SNAPMLA_HAVE_CUDA
  const int sms = cuda::require_sm90("recommended_num_workers", "device", device);
  const int row_tiles = std::max(1, (seqlen_q * num_heads + cuda::kTileRows - 1) / cuda::kTileRows);
  return std::max(1, sms / row_tiles);
#else
  (void)seqlen_q;
  (void)num_heads;
  return 1;  // unreachable: on_gpu throws for device memory without CUDA kernels
#endif
}

void check_page_table(const PageTable& pages, int64_t num_pages, Stream s) {
  detail::validate("check_page_table", pages);
  if (!on_gpu("check_page_table", "pages", pages.device))
    return detail::check_page_table_contents("check_page_table", pages, num_pages);
#if SNAPMLA_HAVE_CUDA
  std::vector<int32_t> seqlens(pages.batch), table(size_t(pages.batch) * pages.max_pages);
  cuda::copy_to_host(seqlens.data(), pages.cache_seqlens, seqlens.size() * sizeof(int32_t), s);
  cuda::copy_to_host(table.data(), pages.block_table, table.size() * sizeof(int32_t), s);
  PageTable host = pages;
  host.cache_seqlens = seqlens.data();
  host.block_table = table.data();
  host.device = Device::cpu();
  detail::check_page_table_contents("check_page_table", host, num_pages);
#else
  (void)s;
#endif
}

void check_slot_mapping(const SlotMapping& slots, int64_t num_pages, Stream s) {
  detail::validate("check_slot_mapping", slots);
  if (!on_gpu("check_slot_mapping", "slot_mapping", slots.device))
    return detail::check_slots_in_range("check_slot_mapping", slots, num_pages);
#if SNAPMLA_HAVE_CUDA
  std::vector<int32_t> host(slots.num_tokens);
  cuda::copy_to_host(host.data(), slots.slots, host.size() * sizeof(int32_t), s);
  detail::check_slots_in_range("check_slot_mapping", {host.data(), slots.num_tokens, Device::cpu()}, num_pages);
#else
  (void)s;
#endif
}

void append(const PagedFp8Cache& cache, const KvRows& kv, const SlotMapping& slots, Stream s) {
  append_impl(cache, kv, slots, s);
}

void append(const PagedBf16Cache& cache, const KvRows& kv, const SlotMapping& slots, Stream s) {
  append_impl(cache, kv, slots, s);
}

void quantize_query(const QueryBf16& q, const QuantizedQuery& out, Stream s) {
  const bool gpu = on_gpu("quantize_query", "q", q.device);
  detail::check_quantize_query("quantize_query", q, out);
  if (!gpu) return ref::unchecked::quantize_query(q, out);
#if SNAPMLA_HAVE_CUDA
  cuda::quantize_query(q, out, s);
#else
  (void)s;
#endif
}

void gather_dequant(const PagedFp8Cache& cache, const SlotMapping& slots, const KvRows& out,
                    Stream s) {
  const bool gpu = on_gpu("gather_dequant", "cache", cache.device);
  detail::check_gather_dequant("gather_dequant", cache, slots, out);
  if (!gpu) return ref::unchecked::gather_dequant(cache, slots, out);
#if SNAPMLA_HAVE_CUDA
  cuda::gather_dequant(cache, slots, out, s);
#else
  (void)s;
#endif
}

void plan_splits(const PageTable& pages, int num_workers, const SplitPlan& plan, Stream s, int query_rows,
                 int split_blocks) {
  const bool gpu = on_gpu("plan_splits", "pages", pages.device);
  detail::check_plan_splits("plan_splits", pages, num_workers, query_rows, plan, split_blocks);
  const detail::PlanLabOptions lab = detail::plan_lab_options("plan_splits");
  if (!gpu) return ref::unchecked::plan_splits(pages, num_workers, plan, query_rows, split_blocks, lab);
#if SNAPMLA_HAVE_CUDA
  cuda::plan_splits(pages, num_workers, plan, s, query_rows, split_blocks, lab);
#else
  (void)s;
#endif
}

void decode_fp8(const QuantizedQuery& q, const PagedFp8Cache& cache, const PageTable& pages,
                const DecodeOutput& out, const DecodeOptions& options) {
  constexpr const char* op = "decode_fp8";
  const bool gpu = on_gpu(op, "q", q.device);
  detail::check_decode(op, q, cache, pages, &out, options, detail::TableFaults::kThrow);
  if (!gpu) return ref::unchecked::decode_fp8(q, cache, pages, out, options);
#if SNAPMLA_HAVE_CUDA
  cuda::decode_fp8(q, cache, pages, out, options);
#endif
}

void decode_bf16(const QueryBf16& q, const PagedBf16Cache& cache, const PageTable& pages,
                 const DecodeOutput& out, const DecodeOptions& options) {
  constexpr const char* op = "decode_bf16";
  const bool gpu = on_gpu(op, "q", q.device);
  detail::check_decode(op, q, cache, pages, &out, options, detail::TableFaults::kThrow);
  if (!gpu) return ref::unchecked::decode_bf16(q, cache, pages, out, options);
#if SNAPMLA_HAVE_CUDA
  cuda::decode_bf16(q, cache, pages, out, options);
#endif
}

}  // namespace snapmla
