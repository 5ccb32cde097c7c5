// snapmla._C: the C++ API over DLPack arrays. One function per C++ entry point, with the same
// names and argument meanings; outputs are passed in (the Python layer, snapmla/_api.py,
// allocates them in the caller's framework). The GIL is released while an operation runs.
// What this file checks is what the C++ views cannot carry: each array's dtype, shape and
// layout, and that the arrays making up one view (a cache's planes, a page table, a plan, an
// output) share a device. Everything else, the devices of the views against each other
// included, the C++ entry point checks on every call (src/core/validate.hpp).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include <limits>
#include <optional>
#include <vector>

#include "kernels/sm90/decode/params.hpp"
#include "snapmla/reference.hpp"
#include "snapmla/snapmla.hpp"
#include "tensor_args.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace snapmla::python {
namespace {

using OptArray = std::optional<Array>;
using nb::gil_scoped_release;

// Caches: any leading shape (FlashMLA's [P, 64, 1, D], FluentLLM's flat [slots, 1, D], ours
// [P, 64, D]) as long as the memory is whole pages of contiguous rows.
int64_t pages_of(const char* op, const char* name, const Array& a, int64_t row) {
  Arg arg(op, name, a);
  const int64_t n = arg.size();
  if (arg.ndim() == 0 || arg.dim(arg.ndim() - 1) != row || n % (kPageSize * row) != 0)
    arg.fail("expected whole pages of 64 rows of " + std::to_string(row) +
             " (shape [num_pages, 64, " + std::to_string(row) + "] or any shape [..., " +
             std::to_string(row) + "] with a multiple of 64 rows)");
  return n / (kPageSize * row);
}

PagedFp8Cache fp8_cache(const char* op, const Array& latent, const Array& scale, const Array& rope) {
  const int64_t p = pages_of(op, "latent", latent, kLatentDim);
  Arg(op, "latent", latent).kind(Kind::kE4m3);
  Arg(op, "scale", scale).kind(Kind::kF32).numel(p * kPageSize);
  Arg(op, "rope", rope).kind(Kind::kBf16).rows_of(p * kPageSize, kRopeDim);
  const Device d = same_device(op, {{"latent", Arg(op, "latent", latent).device()},
                                    {"scale", Arg(op, "scale", scale).device()},
                                    {"rope", Arg(op, "rope", rope).device()}});
  return {static_cast<e4m3*>(latent.data()), static_cast<float*>(scale.data()),
          static_cast<bf16*>(rope.data()), p, d};
}

PagedBf16Cache bf16_cache(const char* op, const Array& cache) {
  const int64_t p = pages_of(op, "cache", cache, kHeadDim);
  const Arg a(op, "cache", cache);
  a.kind(Kind::kBf16);
  return {a.as<bf16>(), p, a.device()};
}

SlotMapping slot_mapping(const char* op, const Array& slots) {
  const Arg a(op, "slots", slots);
  a.kind(Kind::kI32);
  if (a.ndim() != 1) a.fail("expected a 1-D int32 array [num_tokens]");
  return {a.as<int32_t>(), a.size(), a.device()};
}

// Rows [n, 576] bf16 matching a slot mapping of n tokens (append's input, gather's output).
KvRows kv_rows(const char* op, const char* name, const Array& a, const SlotMapping& slots) {
  const Arg k(op, name, a);
  k.kind(Kind::kBf16);
  // One slot per row: a mismatch names both arguments (the count comes from slots).
  if (k.ndim() == 2 && k.dim(1) == kHeadDim && k.dim(0) != slots.num_tokens)
    k.fail("expected one row per entry of slots (" + std::to_string(slots.num_tokens) + " slots), got " +
           std::to_string(k.dim(0)) + " rows of 576");
  k.rows_of(slots.num_tokens, kHeadDim);
  return {k.as<bf16>(), slots.num_tokens, k.device()};
}

PageTable page_table(const char* op, const OptArray& block_table, const Array& seqlens) {
  const Arg s(op, "cache_seqlens", seqlens);
  s.kind(Kind::kI32);
  if (s.ndim() != 1) s.fail("expected a 1-D int32 array [batch]");
  PageTable t{nullptr, s.as<int32_t>(), int(s.size()), 0, s.device()};
  if (block_table) {
    const Arg b(op, "block_table", *block_table);
    b.kind(Kind::kI32);
    if (b.ndim() == 2 && b.dim(0) != t.batch)
      b.fail("expected one row per sequence: [" + std::to_string(t.batch) + ", max_pages] (cache_seqlens has " +
             std::to_string(t.batch) + " entries), got " + b.shape_string());
    b.shape({t.batch, -1});
    same_device(op, {{"cache_seqlens", t.device}, {"block_table", b.device()}});
    t.block_table = b.as<int32_t>();
    t.max_pages = int(b.dim(1));
  }
  return t;
}

// The query's batch against the page table's (both the caller's arguments, named so).
void same_batch(const char* op, const char* query, int b, const PageTable& pages) {
  if (pages.batch != b)
    throw Error(op, "cache_seqlens",
                "expected one entry per sequence of " + std::string(query) + " (batch " + std::to_string(b) +
                    "), got " + std::to_string(pages.batch));
}

// Decode's query shape: [b, s_q, h, width].
void query_dims(const Arg& q, int64_t width, int* b, int* s_q, int* h) {
  q.shape({-1, -1, -1, width});
  *b = int(q.dim(0));
  *s_q = int(q.dim(1));
  *h = int(q.dim(2));
}

struct DecodeArgs {
  DecodeOutput out;
  SplitPlan plan;
  DecodeOptions options;
};

// A split plan's arrays, checked against the batch b: split_offsets [b + 1], split_begin
// [capacity], optional worker_splits [capacity], on one device.
SplitPlan split_plan(const char* op, int b, const Array& split_offsets, const Array& split_begin,
                     const OptArray& worker_splits) {
  const Arg so(op, "split_offsets", split_offsets), sb(op, "split_begin", split_begin);
  so.kind(Kind::kI32).numel(int64_t(b) + 1);
  sb.kind(Kind::kI32);
  const Device d = same_device(op, {{"split_offsets", so.device()}, {"split_begin", sb.device()}});
  SplitPlan plan{so.as<int32_t>(), sb.as<int32_t>(), int(sb.size()), b, d};
  if (worker_splits) {
    const Arg sr(op, "worker_splits", *worker_splits);
    sr.kind(Kind::kI32).numel(sb.size());
    same_device(op, {{"split_offsets", d}, {"worker_splits", sr.device()}});
    plan.worker_splits = sr.as<int32_t>();
  }
  return plan;
}

DecodeArgs decode_args(const char* op, int b, int s_q, int h, Device d, const Array& out,
                       const Array& lse, float softmax_scale, bool causal,
                       const OptArray& split_offsets, const OptArray& split_begin,
                       const OptArray& workspace, uintptr_t stream, const OptArray& worker_splits,
                       float empty_lse) {
  const Arg o(op, "out", out), l(op, "lse", lse);
  o.kind(Kind::kBf16).numel(int64_t(b) * s_q * h * kLatentDim);
  l.kind(Kind::kF32).numel(int64_t(b) * h * s_q);
  DecodeArgs r;
  r.out = {o.as<bf16>(), l.as<float>(), same_device(op, {{"out", o.device()}, {"lse", l.device()}})};
  r.options.softmax_scale = softmax_scale;
  r.options.causal = causal;
  r.options.empty_lse = empty_lse;
  r.options.stream = to_stream(stream);
  if (split_offsets.has_value() != split_begin.has_value())
    throw Error(op, split_offsets ? "split_begin" : "split_offsets",
                "expected split_offsets and split_begin together (a plan from plan_splits)");
  if (split_offsets) {
    r.plan = split_plan(op, b, *split_offsets, *split_begin, worker_splits);
    r.options.plan = &r.plan;
  } else if (worker_splits) {
    throw Error(op, "worker_splits", "expected it with split_offsets and split_begin (a plan from plan_splits)");
  }
  if (workspace) {
    const Arg w(op, "workspace", *workspace);
    w.kind(Kind::kBytes);
    same_device(op, {{"q", d}, {"workspace", w.device()}});
    r.options.workspace = w.data();
    r.options.workspace_bytes = size_t(w.bytes());
  }
  return r;
}

// What the pointer path passes besides pointers: the sizes the array path derived from the
// arrays' shapes, and their device (one tuple, so a call converts one argument, not nine).
struct RawShape {
  int b = 0, s_q = 0, h = 0;
  int64_t num_pages = 0;
  int max_pages = 0;
  int plan_capacity = 0;  // 0: no plan
  int64_t workspace_bytes = 0;
  int device_type = 0, device_index = 0;  // DLPack's: 1 CPU, 2 CUDA
  Device device() const { return device_type == 2 ? Device::cuda(device_index) : Device::cpu(); }
};

// The page table, output, plan and options of a pointer-path decode call.
struct RawCall {
  PageTable pages;
  DecodeOutput out;
  SplitPlan plan;
  DecodeOptions options;
  RawCall(const RawShape& s, uintptr_t block_table, uintptr_t cache_seqlens, uintptr_t split_offsets,
          uintptr_t split_begin, uintptr_t worker_splits, uintptr_t out_p, uintptr_t lse, uintptr_t workspace,
          float softmax_scale, bool causal, float empty_lse, uintptr_t stream) {
    const Device d = s.device();
    pages = {reinterpret_cast<int32_t*>(block_table), reinterpret_cast<int32_t*>(cache_seqlens), s.b, s.max_pages, d};
    out = {reinterpret_cast<bf16*>(out_p), reinterpret_cast<float*>(lse), d};
    options.softmax_scale = softmax_scale;
    options.causal = causal;
    options.empty_lse = empty_lse;
    options.stream = to_stream(stream);
    if (s.plan_capacity > 0) {
      plan = {reinterpret_cast<int32_t*>(split_offsets), reinterpret_cast<int32_t*>(split_begin), s.plan_capacity,
              s.b, d, reinterpret_cast<int32_t*>(worker_splits)};
      options.plan = &plan;
    }
    options.workspace = reinterpret_cast<void*>(workspace);
    options.workspace_bytes = size_t(s.workspace_bytes);
  }
};

void bind_ops(nb::module_& m) {
  m.def(
      "append_fp8",
      [](const Array& kv, const Array& slots, const Array& latent, const Array& scale,
         const Array& rope, uintptr_t stream) {
        constexpr const char* op = "append";
        const PagedFp8Cache cache = fp8_cache(op, latent, scale, rope);
        const SlotMapping s = slot_mapping(op, slots);
        const KvRows rows = kv_rows(op, "kv", kv, s);
        gil_scoped_release release;
        append(cache, rows, s, to_stream(stream));
      },
      "kv"_a, "slots"_a, "latent"_a, "scale"_a, "rope"_a, "stream"_a = 0,
      "Quantize kv rows [n, 576] (bf16) into the FP8 cache planes at `slots`.");

  m.def(
      "append_bf16",
      [](const Array& kv, const Array& slots, const Array& cache, uintptr_t stream) {
        constexpr const char* op = "append";
        const PagedBf16Cache c = bf16_cache(op, cache);
        const SlotMapping s = slot_mapping(op, slots);
        const KvRows rows = kv_rows(op, "kv", kv, s);
        gil_scoped_release release;
        append(c, rows, s, to_stream(stream));
      },
      "kv"_a, "slots"_a, "cache"_a, "stream"_a = 0,
      "Copy kv rows [n, 576] (bf16) into the BF16 cache at `slots`.");

  m.def(
      "quantize_query",
      [](const Array& q, const Array& nope, const Array& rope, const Array& scale,
         uintptr_t stream) {
        constexpr const char* op = "quantize_query";
        const Arg qa(op, "q", q);
        int b, s_q, h;
        qa.kind(Kind::kBf16);
        query_dims(qa, kHeadDim, &b, &s_q, &h);
        const int64_t rows = int64_t(b) * s_q * h;
        const Arg n(op, "nope", nope), r(op, "rope", rope), s(op, "scale", scale);
        n.kind(Kind::kE4m3).rows_of(rows, kLatentDim);
        r.kind(Kind::kBf16).rows_of(rows, kRopeDim);
        s.kind(Kind::kF32).numel(rows);
        const QueryBf16 in{qa.as<bf16>(), b, s_q, h, qa.device()};
        const QuantizedQuery out{n.as<e4m3>(), r.as<bf16>(), s.as<float>(), b, s_q, h,
                                 same_device(op, {{"nope", n.device()}, {"rope", r.device()}, {"scale", s.device()}})};
        gil_scoped_release release;
        quantize_query(in, out, to_stream(stream));
      },
      "q"_a, "nope"_a, "rope"_a, "scale"_a, "stream"_a = 0,
      "Per-(token, head) quantization of q [b, s_q, h, 576] (bf16).");

  m.def(
      "gather_dequant",
      [](const Array& latent, const Array& scale, const Array& rope, const Array& slots,
         const Array& out, uintptr_t stream) {
        constexpr const char* op = "gather_dequant";
        const PagedFp8Cache cache = fp8_cache(op, latent, scale, rope);
        const SlotMapping s = slot_mapping(op, slots);
        const KvRows rows = kv_rows(op, "out", out, s);
        gil_scoped_release release;
        gather_dequant(cache, s, rows, to_stream(stream));
      },
      "latent"_a, "scale"_a, "rope"_a, "slots"_a, "out"_a, "stream"_a = 0,
      "Rows [n, 576] (bf16) dequantized from the FP8 cache at `slots`.");

  m.def(
      "plan_splits",
      [](const Array& cache_seqlens, int num_workers, const Array& split_offsets,
         const Array& split_begin, uintptr_t stream, const OptArray& worker_splits, int query_rows,
         int split_blocks) {
        constexpr const char* op = "plan_splits";
        const PageTable pages = page_table(op, std::nullopt, cache_seqlens);
        const SplitPlan plan = split_plan(op, pages.batch, split_offsets, split_begin, worker_splits);
        gil_scoped_release release;
        plan_splits(pages, num_workers, plan, to_stream(stream), query_rows, split_blocks);
      },
      "cache_seqlens"_a, "num_workers"_a, "split_offsets"_a, "split_begin"_a, "stream"_a = 0,
      "worker_splits"_a = nb::none(), "query_rows"_a = 0, "split_blocks"_a = 0,
      "Split-KV plan from cache_seqlens into split_offsets [b + 1], split_begin [capacity] and "
      "(optional) worker_splits [capacity], the worker ranges (worker k runs splits worker_splits[k] .. [k + 1] - 1).");

  m.def(
      "decode_fp8",
      [](const Array& q_nope, const Array& q_rope, const Array& q_scale, const Array& latent,
         const Array& scale, const Array& rope, const Array& block_table,
         const Array& cache_seqlens, const Array& out, const Array& lse, float softmax_scale,
         bool causal, const OptArray& split_offsets, const OptArray& split_begin,
         const OptArray& workspace, uintptr_t stream, const OptArray& worker_splits, float empty_lse) {
        constexpr const char* op = "decode_fp8";
        const Arg qn(op, "q_nope", q_nope), qr(op, "q_rope", q_rope), qs(op, "q_scale", q_scale);
        int b, s_q, h;
        qn.kind(Kind::kE4m3);
        query_dims(qn, kLatentDim, &b, &s_q, &h);
        const int64_t rows = int64_t(b) * s_q * h;
        qr.kind(Kind::kBf16).rows_of(rows, kRopeDim);
        qs.kind(Kind::kF32).numel(rows);
        const Device d = same_device(op, {{"q_nope", qn.device()}, {"q_rope", qr.device()},
                                          {"q_scale", qs.device()}});
        const QuantizedQuery q{qn.as<e4m3>(), qr.as<bf16>(), qs.as<float>(), b, s_q, h, d};
        const PagedFp8Cache cache = fp8_cache(op, latent, scale, rope);
        const PageTable pages = page_table(op, block_table, cache_seqlens);
        same_batch(op, "q_nope", b, pages);
        const DecodeArgs a = decode_args(op, b, s_q, h, d, out, lse, softmax_scale, causal,
                                         split_offsets, split_begin, workspace, stream, worker_splits,
                                         empty_lse);
        gil_scoped_release release;
        decode_fp8(q, cache, pages, a.out, a.options);
      },
      "q_nope"_a, "q_rope"_a, "q_scale"_a, "latent"_a, "scale"_a, "rope"_a, "block_table"_a,
      "cache_seqlens"_a, "out"_a, "lse"_a, "softmax_scale"_a, "causal"_a = true,
      "split_offsets"_a = nb::none(), "split_begin"_a = nb::none(), "workspace"_a = nb::none(),
      "stream"_a = 0, "worker_splits"_a = nb::none(), "empty_lse"_a = -std::numeric_limits<float>::infinity(),
      "SnapMLA decoding on the FP8 cache into out [b, s_q, h, 512], lse [b, h, s_q].");

  m.def(
      "decode_bf16",
      [](const Array& q, const Array& cache, const Array& block_table, const Array& cache_seqlens,
         const Array& out, const Array& lse, float softmax_scale, bool causal,
         const OptArray& split_offsets, const OptArray& split_begin, const OptArray& workspace,
         uintptr_t stream, const OptArray& worker_splits, float empty_lse) {
        constexpr const char* op = "decode_bf16";
        const Arg qa(op, "q", q);
        int b, s_q, h;
        qa.kind(Kind::kBf16);
        query_dims(qa, kHeadDim, &b, &s_q, &h);
        const QueryBf16 qv{qa.as<bf16>(), b, s_q, h, qa.device()};
        const PagedBf16Cache c = bf16_cache(op, cache);
        const PageTable pages = page_table(op, block_table, cache_seqlens);
        same_batch(op, "q", b, pages);
        const DecodeArgs a = decode_args(op, b, s_q, h, qv.device, out, lse, softmax_scale,
                                         causal, split_offsets, split_begin, workspace, stream,
                                         worker_splits, empty_lse);
        gil_scoped_release release;
        decode_bf16(qv, c, pages, a.out, a.options);
      },
      "q"_a, "cache"_a, "block_table"_a, "cache_seqlens"_a, "out"_a, "lse"_a, "softmax_scale"_a,
      "causal"_a = true, "split_offsets"_a = nb::none(), "split_begin"_a = nb::none(),
      "workspace"_a = nb::none(), "stream"_a = 0, "worker_splits"_a = nb::none(),
      "empty_lse"_a = -std::numeric_limits<float>::infinity(),
      "Decoding on the BF16 cache (the baseline) into out [b, s_q, h, 512], lse [b, h, s_q].");

  // The pointer path (snapmla/_fastpath.py): the same decode from data pointers and the sizes
  // that the array path derived, for calls whose arguments' dtypes, shapes, strides and device
  // match a call that the array path validated. What the arrays carried (dtype, shape,
  // contiguity, one device) is that earlier validation; everything the views carry (pointers,
  // alignment, head counts, plan and workspace sizes, table contents on the host) is checked by
  // decode_fp8 / decode_bf16 as on every call. The pointers come in the order of the Python
  // side's arrays (snapmla/_api.py): inputs, the plan, then out, lse and workspace.
  m.def(
      "decode_fp8_raw",
      [](uintptr_t q_nope, uintptr_t q_rope, uintptr_t q_scale, uintptr_t latent, uintptr_t scale,
         uintptr_t rope, uintptr_t block_table, uintptr_t cache_seqlens, uintptr_t split_offsets,
         uintptr_t split_begin, uintptr_t worker_splits, uintptr_t out, uintptr_t lse, uintptr_t workspace,
         const RawShape& shape, float softmax_scale, bool causal, float empty_lse, uintptr_t stream) {
        const Device d = shape.device();
        const QuantizedQuery q{reinterpret_cast<e4m3*>(q_nope), reinterpret_cast<bf16*>(q_rope),
                               reinterpret_cast<float*>(q_scale), shape.b, shape.s_q, shape.h, d};
        const PagedFp8Cache cache{reinterpret_cast<e4m3*>(latent), reinterpret_cast<float*>(scale),
                                  reinterpret_cast<bf16*>(rope), shape.num_pages, d};
        RawCall c(shape, block_table, cache_seqlens, split_offsets, split_begin, worker_splits, out, lse,
                  workspace, softmax_scale, causal, empty_lse, stream);
        gil_scoped_release release;
        decode_fp8(q, cache, c.pages, c.out, c.options);
      });

  m.def(
      "decode_bf16_raw",
      [](uintptr_t q, uintptr_t cache, uintptr_t block_table, uintptr_t cache_seqlens, uintptr_t split_offsets,
         uintptr_t split_begin, uintptr_t worker_splits, uintptr_t out, uintptr_t lse, uintptr_t workspace,
         const RawShape& shape, float softmax_scale, bool causal, float empty_lse, uintptr_t stream) {
        const Device d = shape.device();
        const QueryBf16 qv{reinterpret_cast<bf16*>(q), shape.b, shape.s_q, shape.h, d};
        const PagedBf16Cache c16{reinterpret_cast<bf16*>(cache), shape.num_pages, d};
        RawCall c(shape, block_table, cache_seqlens, split_offsets, split_begin, worker_splits, out, lse,
                  workspace, softmax_scale, causal, empty_lse, stream);
        gil_scoped_release release;
        decode_bf16(qv, c16, c.pages, c.out, c.options);
      });

  m.def(
      "check_page_table",
      [](const Array& block_table, const Array& cache_seqlens, int64_t num_pages, uintptr_t stream) {
        const PageTable pages = page_table("check_page_table", block_table, cache_seqlens);
        gil_scoped_release release;
        check_page_table(pages, num_pages, to_stream(stream));
      },
      "block_table"_a, "cache_seqlens"_a, "num_pages"_a, "stream"_a = 0,
      "Debug check of table contents (synchronizes on the GPU): raises for the first bad entry.");

  m.def(
      "check_slot_mapping",
      [](const Array& slots, int64_t num_pages, uintptr_t stream) {
        const SlotMapping s = slot_mapping("check_slot_mapping", slots);
        gil_scoped_release release;
        check_slot_mapping(s, num_pages, to_stream(stream));
      },
      "slots"_a, "num_pages"_a, "stream"_a = 0,
      "Debug check of slot contents (synchronizes on the GPU): raises for the first bad slot.");
}

void bind_reference(nb::module_& m) {
  // Float64 ground truth for one sequence (reference.hpp): q [s_q, h, 576] and kv [s_k, 576]
  // float32, unquantized. Returns NumPy arrays out [s_q, h, 512] and lse [h, s_q] (float64).
  m.def(
      "attention_f64",
      [](const Array& q, const Array& kv, double softmax_scale, bool causal) {
        constexpr const char* op = "attention_f64";
        const Arg qa(op, "q", q), ka(op, "kv", kv);
        qa.kind(Kind::kF32).shape({-1, -1, kHeadDim});
        ka.kind(Kind::kF32).shape({-1, kHeadDim});
        if (qa.device() != Device::cpu()) qa.fail("expected a CPU array");
        if (ka.device() != Device::cpu()) ka.fail("expected a CPU array");
        const int s_q = int(qa.dim(0)), h = int(qa.dim(1)), s_k = int(ka.dim(0));
        auto* out = new double[size_t(s_q) * h * kLatentDim];
        auto* lse = new double[size_t(h) * s_q];
        {
          gil_scoped_release release;
          ref::attention_f64(qa.as<float>(), s_q, h, ka.as<float>(), s_k, softmax_scale, causal,
                             out, lse);
        }
        nb::capsule own_out(out, [](void* p) noexcept { delete[] static_cast<double*>(p); });
        nb::capsule own_lse(lse, [](void* p) noexcept { delete[] static_cast<double*>(p); });
        return std::make_pair(
            nb::ndarray<nb::numpy, double>(out, {size_t(s_q), size_t(h), size_t(kLatentDim)}, own_out),
            nb::ndarray<nb::numpy, double>(lse, {size_t(h), size_t(s_q)}, own_lse));
      },
      "q"_a, "kv"_a, "softmax_scale"_a, "causal"_a = true);
}

}  // namespace
}  // namespace snapmla::python

NB_MODULE(_C, m) {
  using namespace snapmla;
  m.doc() = "SnapMLA C++ library over DLPack arrays (use the `snapmla` package, not this module)";
  // A ValueError and a TypeError: bad values and wrong kinds of argument are both reported as it.
  nb::exception<Error>(m, "SnapMLAError",
                       nb::make_tuple(nb::handle(PyExc_ValueError), nb::handle(PyExc_TypeError)));

  m.attr("LATENT_DIM") = kLatentDim;
  m.attr("ROPE_DIM") = kRopeDim;
  m.attr("HEAD_DIM") = kHeadDim;
  m.attr("PAGE_SIZE") = kPageSize;
  // The FP8 format's constants, for emulations of its arithmetic (tools/quality's diagnostics).
  m.attr("E4M3_MAX") = kE4m3Max;
  m.attr("MIN_AMAX") = kMinAmax;
  // The limits every entry point checks (src/core/validate.cpp), and the decode kernels' query
  // rows per CTA, for the Python layer (snapmla.flash_mla, snapmla.bench).
  m.attr("MIN_HEADS") = kMinHeads;
  m.attr("MAX_HEADS") = kMaxHeads;
  m.attr("MAX_QUERIES_PER_SEQ") = kMaxQueriesPerSeq;
  m.attr("TILE_ROWS") = cuda::kTileRows;
  m.def("built_with_cuda", &built_with_cuda);
  m.def("cuda_device_available", &cuda_device_available);
  m.def("split_plan_capacity", &split_plan_capacity, "batch"_a, "num_workers"_a);
  m.def("decode_workspace_bytes", &decode_workspace_bytes, "split_capacity"_a, "seqlen_q"_a,
        "num_heads"_a);
  m.def(
      "recommended_num_workers",
      [](bool cuda, int device_index, int seqlen_q, int num_heads) {
        return recommended_num_workers(cuda ? Device::cuda(device_index) : Device::cpu(),
                                       seqlen_q, num_heads);
      },
      "cuda"_a, "device_index"_a, "seqlen_q"_a, "num_heads"_a);
  nb::class_<python::RawShape>(m, "RawShape")
      .def("__init__",
           [](python::RawShape* r, int b, int s_q, int h, int64_t num_pages, int max_pages, int plan_capacity,
              int64_t workspace_bytes, int device_type, int device_index) {
             new (r) python::RawShape{b, s_q, h, num_pages, max_pages, plan_capacity, workspace_bytes,
                                      device_type, device_index};
           });
  python::bind_ops(m);
  nb::module_ ref = m.def_submodule("reference", "Float64 ground truth");
  python::bind_reference(ref);
}
