"""The native API: the C++ functions of include/snapmla/snapmla.hpp over DLPack arrays.

Every function runs where its arrays live (CPU: the reference implementation; CUDA: the sm_90a
kernels), on the caller's current CUDA stream unless `stream=` is given, without host
synchronization. Results come back in the framework of the first array argument; pass `out=`
arrays to reuse memory. Bad arguments raise SnapMLAError (a ValueError and a TypeError) naming
the operation, the argument, what was expected and what was given.
"""

from __future__ import annotations

import functools
import math
import operator
from typing import Any, NamedTuple, Optional

from . import _C, _fastpath
from ._frameworks import (allocating_for, bits_view, current_stream, device_index, empty, framework_of,
                          is_cuda, raw, stream_getter)

SnapMLAError = _C.SnapMLAError
LATENT_DIM, ROPE_DIM, HEAD_DIM, PAGE_SIZE = _C.LATENT_DIM, _C.ROPE_DIM, _C.HEAD_DIM, _C.PAGE_SIZE


class PagedFp8Cache(NamedTuple):
    """SnapMLA FP8 cache planes: latent [P, 64, 512] e4m3, scale [P, 64] f32, rope [P, 64, 64]
    bf16 (pre-divided by the scale). 644 bytes per token."""

    latent: Any
    scale: Any
    rope: Any

    @property
    def num_pages(self) -> int:
        return int(self.scale.shape[0]) if len(self.scale.shape) == 2 else _numel(self.scale) // PAGE_SIZE


class QuantizedQuery(NamedTuple):
    """quantize_query's result: nope [b, s_q, h, 512] e4m3, rope [b, s_q, h, 64] bf16 (pre-divided
    by the scale), scale [b, s_q, h] f32."""

    nope: Any
    rope: Any
    scale: Any


class SplitPlan(NamedTuple):
    """plan_splits' result: split_offsets [b + 1], split_begin [capacity] and worker_splits
    [capacity] (int32; worker k runs splits worker_splits[k] .. worker_splits[k + 1] - 1, across
    sequence boundaries, all workers with the same work; None: one worker per split)."""

    split_offsets: Any
    split_begin: Any
    num_workers: int
    worker_splits: Any = None


# --- argument checks at the Python level (the extension checks the arrays themselves) ----------

def _given(x: Any) -> str:
    """What an argument is, for an error message: an array's type, shape and dtype, else its type."""
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    if shape is not None and dtype is not None:
        return f"{type(x).__module__.split('.')[0]}.{type(x).__name__} {list(shape)} {dtype}"
    return f"a {type(x).__name__}"


def _fail(op: str, arg: str, expected: str, x: Any):
    raise SnapMLAError(f"snapmla::{op}: argument '{arg}': expected {expected}, got {_given(x)}")


def _array(op: str, arg: str, x: Any) -> Any:
    if x is not None:
        try:
            framework_of(x)
        except TypeError:
            _fail(op, arg, "a PyTorch, NumPy or CuPy array (or any DLPack array)", x)
    return x


def _triple(op: str, arg: str, x: Any, kind: type, expected: str):
    """An argument of three arrays: a `kind` (QuantizedQuery, PagedFp8Cache), or a plain tuple or
    list of three arrays taken as one (its parts checked by name); anything else is an error."""
    if type(x) is kind:
        return x
    if type(x) in (tuple, list) and len(x) == 3:
        return kind(*(_array(op, f"{arg}.{f}", v) for f, v in zip(kind._fields, x)))
    _fail(op, arg, expected, x)


def _query(op: str, q: Any) -> QuantizedQuery:
    return _triple(op, "q", q, QuantizedQuery, "a QuantizedQuery (nope, rope, scale) from "
                   "snapmla.quantize_query(q) (a bf16 query [b, s_q, h, 576] goes to decode_bf16)")


def _fp8_cache(op: str, cache: Any) -> PagedFp8Cache:
    return _triple(op, "cache", cache, PagedFp8Cache, "a PagedFp8Cache (latent, scale, rope) from "
                   "snapmla.alloc_fp8_cache (the BF16 cache [pages, 64, 576] goes to decode_bf16)")


def _count(op: str, arg: str, n: Any) -> int:
    if isinstance(n, bool) or not hasattr(n, "__index__"):
        _fail(op, arg, "an integer >= 0", n)
    v = n.__index__()
    if v < 0:
        raise SnapMLAError(f"snapmla::{op}: argument '{arg}': expected an integer >= 0, got {v}")
    return v


def _numel(x: Any) -> int:
    n = 1
    for s in x.shape:
        n *= int(s)
    return n


def built_with_cuda() -> bool:
    return _C.built_with_cuda()


def cuda_device_available() -> bool:
    """True when this build has the CUDA kernels and an sm_90 GPU is present."""
    return _C.cuda_device_available()


def split_plan_capacity(batch: int, num_workers: int) -> int:
    return _C.split_plan_capacity(batch, num_workers)


def decode_workspace_bytes(split_capacity: int, seqlen_q: int, num_heads: int) -> int:
    return _C.decode_workspace_bytes(split_capacity, seqlen_q, num_heads)


@functools.lru_cache(maxsize=None)
def _workers(cuda: bool, index: int, seqlen_q: int, num_heads: int) -> int:
    return _C.recommended_num_workers(cuda, index, seqlen_q, num_heads)


def recommended_num_workers(like: Any, seqlen_q: int, num_heads: int) -> int:
    """A num_workers for plan_splits that fills the device `like` lives on."""
    return _workers(is_cuda(like), device_index(like), int(seqlen_q), int(num_heads))


# --- allocation ------------------------------------------------------------------------------

def alloc_fp8_cache(num_pages: int, like: Any) -> PagedFp8Cache:
    """Zero-filled FP8 cache planes for `num_pages` pages, in the framework and on the device of
    `like` (any array)."""
    num_pages = _count("alloc_fp8_cache", "num_pages", num_pages)
    _array("alloc_fp8_cache", "like", like)
    cache = PagedFp8Cache(empty(like, (num_pages, PAGE_SIZE, LATENT_DIM), "e4m3"),
                          empty(like, (num_pages, PAGE_SIZE), "f32"),
                          empty(like, (num_pages, PAGE_SIZE, ROPE_DIM), "bf16"))
    for plane in cache:
        _zero(plane)
    return cache


def alloc_bf16_cache(num_pages: int, like: Any):
    """A zero-filled BF16 cache [num_pages, 64, 576] like `like`."""
    num_pages = _count("alloc_bf16_cache", "num_pages", num_pages)
    _array("alloc_bf16_cache", "like", like)
    cache = empty(like, (num_pages, PAGE_SIZE, HEAD_DIM), "bf16")
    _zero(cache)
    return cache


def _zero(x: Any) -> None:
    r = bits_view(x)  # float8 has no fill in every framework; its bytes do
    if hasattr(r, "zero_"):
        r.zero_()
    else:
        r.fill(0)


# --- operations ------------------------------------------------------------------------------

def append(cache: Any, kv: Any, slots: Any, *, stream: Any = None) -> None:
    """Write kv rows [n, 576] (bf16) to `slots` ([n] int32, slot = page * 64 + offset, -1 =
    skip). A PagedFp8Cache quantizes on write; a plain array is the BF16 cache [P, 64, 576]."""
    _array("append", "kv", kv)
    _array("append", "slots", slots)
    if isinstance(cache, (tuple, list)):
        cache = _fp8_cache("append", cache)
    else:
        _array("append", "cache", cache)
    s = current_stream(kv, stream)
    if isinstance(cache, PagedFp8Cache):
        _C.append_fp8(raw(kv), raw(slots), raw(cache.latent), raw(cache.scale), raw(cache.rope), s)
    else:
        _C.append_bf16(raw(kv), raw(slots), raw(cache), s)


def quantize_query(q: Any, *, out: Optional[QuantizedQuery] = None,
                   stream: Any = None) -> QuantizedQuery:
    """Per-(token, head) quantization of q [b, s_q, h, 576] (bf16) for decode_fp8."""
    _array("quantize_query", "q", q)
    if out is None:
        lead = tuple(q.shape[:-1])
        with allocating_for(q, stream):
            out = QuantizedQuery(empty(q, lead + (LATENT_DIM,), "e4m3"), empty(q, lead + (ROPE_DIM,), "bf16"),
                                 empty(q, lead, "f32"))
    _C.quantize_query(raw(q), raw(out.nope), raw(out.rope), raw(out.scale), current_stream(q, stream))
    return out


def gather_dequant(cache: PagedFp8Cache, slots: Any, *, out: Any = None,
                   stream: Any = None):
    """Rows [n, 576] (bf16) = dequantized cache entries at `slots` (a slot of -1 gives zeros)."""
    cache = _fp8_cache("gather_dequant", cache)
    _array("gather_dequant", "slots", slots)
    if out is None:
        with allocating_for(slots, stream):
            out = empty(cache.scale, (_numel(slots), HEAD_DIM), "bf16")
    _C.gather_dequant(raw(cache.latent), raw(cache.scale), raw(cache.rope), raw(slots), raw(out),
                      current_stream(slots, stream))
    return out


def plan_splits(cache_seqlens: Any, num_workers: int, *, out: Optional[SplitPlan] = None,
                stream: Any = None, query_rows: int = 0, split_blocks: int = 0,
                capacity: Optional[int] = None) -> SplitPlan:
    """Split-KV plan for `num_workers` workers from cache_seqlens ([b] int32), computed where
    cache_seqlens lives (on the GPU without host synchronization: CUDA-graph safe). query_rows:
    the decode's seqlen_q * num_heads, which keeps splits of a small total from being shorter than
    they are worth (0: equal shares only). split_blocks > 0: a batch-invariant plan (each sequence
    cut at multiples of split_blocks 64-token blocks, whatever else is in the batch: a row's
    result is the same bits in any batch), given room for its splits: capacity (default
    split_plan_capacity(b, num_workers)) at least sum(max(1, ceil(len_i / (64 split_blocks)))),
    else the default plan."""
    _array("plan_splits", "cache_seqlens", cache_seqlens)
    b = _numel(cache_seqlens)
    if out is None:
        cap = split_plan_capacity(b, num_workers) if capacity is None else \
            max(_count("plan_splits", "capacity", capacity), split_plan_capacity(b, num_workers))
        with allocating_for(cache_seqlens, stream):
            out = SplitPlan(empty(cache_seqlens, (b + 1,), "i32"), empty(cache_seqlens, (cap,), "i32"),
                            num_workers, empty(cache_seqlens, (cap,), "i32"))
    _C.plan_splits(raw(cache_seqlens), int(num_workers), raw(out.split_offsets), raw(out.split_begin),
                   current_stream(cache_seqlens, stream),
                   raw(out.worker_splits) if out.worker_splits is not None else None, int(query_rows),
                   _count("plan_splits", "split_blocks", split_blocks))
    return SplitPlan(out.split_offsets, out.split_begin, int(num_workers), out.worker_splits)


def _nbytes(x: Any) -> int:
    return 0 if x is None else _numel(x) * int(getattr(x, "itemsize", None) or x.element_size())


def _decode_outputs(q: Any, b: int, s_q: int, h: int, split_begin: Any, out: Any, lse: Any,
                    workspace: Any, stream: Any):
    """The outputs and workspace a decode call was not given, allocated for work on `stream`
    (a call given all of them enters no allocation context)."""
    needs_workspace = split_begin is not None and workspace is None and is_cuda(q)
    if out is not None and lse is not None and not needs_workspace:
        return out, lse, workspace
    with allocating_for(q, stream):
        if out is None:
            out = empty(q, (b, s_q, h, LATENT_DIM), "bf16")
        if lse is None:
            lse = empty(q, (b, h, s_q), "f32")
        if needs_workspace:
            workspace = empty(q, (decode_workspace_bytes(_numel(split_begin), s_q, h),), "u8")
    return out, lse, workspace


# --- decode: the inputs by name, one description per operation, one call path for both --------

class Fp8Inputs(NamedTuple):
    """decode_fp8's input arrays, in the order of _C.decode_fp8_raw's pointers (and of the torch
    op's tensors): the query's planes, the cache's planes, the page table, then the split plan
    (None where there is none)."""

    q_nope: Any
    q_rope: Any
    q_scale: Any
    latent: Any
    scale: Any
    rope: Any
    block_table: Any
    cache_seqlens: Any
    split_offsets: Any = None
    split_begin: Any = None
    worker_splits: Any = None


class Bf16Inputs(NamedTuple):
    """decode_bf16's input arrays, in the order of _C.decode_bf16_raw's pointers: as Fp8Inputs,
    with one array for the query and one for the cache."""

    q: Any
    cache: Any
    block_table: Any
    cache_seqlens: Any
    split_offsets: Any = None
    split_begin: Any = None
    worker_splits: Any = None


class DecodeOp:
    """One decode operation as its call path sees it: `name` (its _C entry points are _C.<name>
    and _C.<name>_raw, looked up at each call, since tests and lab/host_cost.py replace them),
    the key of its allocating calls' signatures, its inputs' type, each input as errors name it,
    the query (whose leading dims give b, s_q, h), the cache plane whose elements give the page
    count (rows of `cache_row`), and where the plan's inputs start (in the inputs and in the
    torch op's schema, after softmax_scale and causal)."""

    __slots__ = ("name", "raw", "allocated", "inputs", "arg_names", "query", "cache_plane", "cache_row",
                 "plan_at")

    def __init__(self, name: str, inputs: type, arg_names: tuple, query: str, cache_plane: str,
                 cache_row: int):
        self.name, self.raw, self.allocated = name, name + "_raw", (name, "allocated")
        self.inputs, self.arg_names = inputs, dict(zip(inputs._fields, arg_names))
        self.query, self.cache_plane = operator.attrgetter(query), operator.attrgetter(cache_plane)
        self.cache_row, self.plan_at = cache_row, inputs._fields.index("split_offsets")


_PLAN_ARGS = ("plan.split_offsets", "plan.split_begin", "plan.worker_splits")
FP8 = DecodeOp("decode_fp8", Fp8Inputs, ("q.nope", "q.rope", "q.scale", "cache.latent", "cache.scale",
                                         "cache.rope", "block_table", "cache_seqlens") + _PLAN_ARGS,
               "q_nope", "latent", LATENT_DIM)
BF16 = DecodeOp("decode_bf16", Bf16Inputs, ("q", "cache", "block_table", "cache_seqlens") + _PLAN_ARGS,
                "q", "cache", HEAD_DIM)
# The inputs' constructors without the Python-level __new__ of a NamedTuple (one C call: the
# inputs are built on every decode call).
_fp8_inputs = functools.partial(tuple.__new__, Fp8Inputs)
_bf16_inputs = functools.partial(tuple.__new__, Bf16Inputs)


def fp8_inputs(q: QuantizedQuery, cache: PagedFp8Cache, block_table: Any, cache_seqlens: Any,
               plan: Optional[SplitPlan]) -> Fp8Inputs:
    """decode_fp8's inputs from the native API's arguments (q and cache: their NamedTuples, or
    tuples of three arrays)."""
    if type(q) is not QuantizedQuery:
        q = _query("decode_fp8", q)
    if type(cache) is not PagedFp8Cache:
        cache = _fp8_cache("decode_fp8", cache)
    if plan is None:
        return _fp8_inputs((q.nope, q.rope, q.scale, cache.latent, cache.scale, cache.rope, block_table,
                            cache_seqlens, None, None, None))
    return _fp8_inputs((q.nope, q.rope, q.scale, cache.latent, cache.scale, cache.rope, block_table,
                        cache_seqlens, plan.split_offsets, plan.split_begin, plan.worker_splits))


def bf16_inputs(q: Any, cache: Any, block_table: Any, cache_seqlens: Any,
                plan: Optional[SplitPlan]) -> Bf16Inputs:
    """decode_bf16's inputs from the native API's arguments."""
    if type(q) is QuantizedQuery:
        _fail("decode_bf16", "q", "a bf16 query [b, s_q, h, 576] (a QuantizedQuery goes to decode_fp8)", q)
    if isinstance(cache, tuple):
        _fail("decode_bf16", "cache", "the BF16 cache, one array [pages, 64, 576] bf16 (a PagedFp8Cache goes to "
              "decode_fp8)", cache)
    if plan is None:
        return _bf16_inputs((q, cache, block_table, cache_seqlens, None, None, None))
    return _bf16_inputs((q, cache, block_table, cache_seqlens, plan.split_offsets, plan.split_begin,
                         plan.worker_splits))


def _name_non_arrays(op: DecodeOp, inputs: tuple) -> None:
    """An error naming the first of a decode's inputs that is not an array (off the pointer path:
    only a call that cannot take it pays for the check)."""
    for field, x in zip(inputs._fields, inputs):
        _array(op.name, op.arg_names[field], x)


def decode(op: DecodeOp, inputs: tuple, softmax_scale: float, causal: bool, empty_lse: float,
           out: Any = None, lse: Any = None, workspace: Any = None, stream: Any = None, *,
           pointer_types_only: bool = False):
    """decode_fp8 / decode_bf16 (`op`) on `inputs` (op.inputs): returns (out, lse), allocated here
    where not given. Each call takes one signature (_fastpath.prepare) and looks it up once: a
    call that leaves out, lse, workspace and stream to snapmla (the engine's call, and every call
    of the torch ops) that of its inputs, any other call that of all its arrays. Where it was
    accepted before, the pointer path; else the array path (every check), which records it.
    pointer_types_only: None, and nothing run, for an allocating call some of whose inputs have
    no pointer path (a tensor subclass: snapmla.torch's wrappers then call the op)."""
    if out is None and lse is None and workspace is None and stream is None:
        sig, ptrs = _fastpath.prepare(op.allocated, inputs)
        done = _fastpath.decode_allocated(op.raw, sig, ptrs, softmax_scale, causal, empty_lse)
        if done is not None:
            return done
        if sig is None and pointer_types_only:
            return None
        return _decode_arrays(op, inputs, None, None, None, softmax_scale, causal, empty_lse, None, sig)
    return _decode_arrays(op, inputs, out, lse, workspace, softmax_scale, causal, empty_lse, stream, None)


def _decode_arrays(op: DecodeOp, inputs: tuple, out: Any, lse: Any, workspace: Any, softmax_scale: float,
                   causal: bool, empty_lse: float, stream: Any, allocated_sig: Optional[tuple]):
    """decode past an allocating call's signature lookup (`allocated_sig`: that signature, None
    where some input has no pointer path), or for any other call: its outputs allocated, then for
    a call given outputs or a stream its signature looked up (the pointer path where it is known),
    else the array path and the signature recorded."""
    allocating = out is None and lse is None and workspace is None and stream is None
    q = op.query(inputs)
    if not hasattr(q, "shape"):
        _name_non_arrays(op, inputs)
    b, s_q, h = (int(d) for d in q.shape[:3])
    split_offsets, split_begin = inputs.split_offsets, inputs.split_begin
    out, lse, workspace = _decode_outputs(q, b, s_q, h, split_begin, out, lse, workspace, stream)
    s = current_stream(q, stream)
    if allocating:
        sig = allocated_sig
    else:
        sig, ptrs = _fastpath.prepare(op.name, inputs + (out, lse, workspace))
        record = _fastpath.lookup(sig)
        if record is not None:
            getattr(_C, op.raw)(*ptrs, record.shape, float(softmax_scale), bool(causal), float(empty_lse), s)
            return out, lse
    if sig is None:  # some argument has no pointer path: name it if it is not an array at all
        _name_non_arrays(op, inputs)
    getattr(_C, op.name)(*map(raw, inputs[:op.plan_at]), raw(out), raw(lse), float(softmax_scale), bool(causal),
                         raw(split_offsets), raw(split_begin), raw(workspace), s, raw(inputs.worker_splits),
                         float(empty_lse))
    shape = _fastpath.raw_shape(q, b, s_q, h, _numel(op.cache_plane(inputs)) // (PAGE_SIZE * op.cache_row),
                                int(inputs.block_table.shape[1]),
                                _numel(split_begin) if split_offsets is not None else 0, _nbytes(workspace))
    if not allocating:
        _fastpath.accept(sig, _fastpath.Accepted(shape))
        return out, lse
    # The record of an allocating call says how to allocate its outputs (where they are arrays
    # _fastpath can allocate; otherwise nothing is recorded and each call takes this path).
    outputs = _fastpath.allocator(out, lse, workspace)
    if outputs is not None:
        _fastpath.accept(sig, _fastpath.Accepted(shape, outputs, stream_getter(q)))
    return out, lse


def decode_fp8(q: QuantizedQuery, cache: PagedFp8Cache, block_table: Any, cache_seqlens: Any, *,
               softmax_scale: float, causal: bool = True, plan: Optional[SplitPlan] = None,
               workspace: Any = None, out: Any = None, lse: Any = None,
               stream: Any = None, empty_lse: float = -math.inf):
    """SnapMLA decoding: returns (out [b, s_q, h, 512] bf16, lse [b, h, s_q] f32). A query row
    that sees no token gets out = 0 and lse = empty_lse (-inf, or +inf as FlashMLA reports it)."""
    return decode(FP8, fp8_inputs(q, cache, block_table, cache_seqlens, plan), softmax_scale, causal, empty_lse,
                  out, lse, workspace, stream)


def decode_bf16(q: Any, cache: Any, block_table: Any, cache_seqlens: Any, *, softmax_scale: float,
                causal: bool = True, plan: Optional[SplitPlan] = None, workspace: Any = None,
                out: Any = None, lse: Any = None, stream: Any = None, empty_lse: float = -math.inf):
    """Decoding on the BF16 cache (the baseline): returns (out, lse) as decode_fp8."""
    return decode(BF16, bf16_inputs(q, cache, block_table, cache_seqlens, plan), softmax_scale, causal,
                  empty_lse, out, lse, workspace, stream)


def check_page_table(block_table: Any, cache_seqlens: Any, num_pages: int, *,
                     stream: Any = None) -> None:
    """Debug check of table contents (synchronizes on the GPU; not for the hot path)."""
    _C.check_page_table(raw(block_table), raw(cache_seqlens), int(num_pages),
                        current_stream(block_table, stream))


def check_slot_mapping(slots: Any, num_pages: int, *, stream: Any = None) -> None:
    """Debug check of slot contents (synchronizes on the GPU; not for the hot path)."""
    _C.check_slot_mapping(raw(slots), int(num_pages), current_stream(slots, stream))
