"""SnapMLA as torch.library custom ops (namespace `snapmla`), for PyTorch engines.

Each op has a fake (meta) implementation, so a decode step traces under torch.compile
(fullgraph) and records into a CUDA graph: the ops allocate outputs with torch (the caching
allocator, graph-pool aware), launch on torch's current stream and never synchronize the host.

    torch.ops.snapmla.append_fp8(kv, slots, latent, scale, rope)           (mutates the cache)
    torch.ops.snapmla.append_bf16(kv, slots, cache)                         (mutates the cache)
    torch.ops.snapmla.quantize_query(q) -> (nope, rope, scale)
    torch.ops.snapmla.gather_dequant(latent, scale, rope, slots) -> rows
    torch.ops.snapmla.plan_splits(cache_seqlens, num_workers, query_rows=0, split_blocks=0)
        -> (split_offsets, split_begin, worker_splits)
    torch.ops.snapmla.decode_fp8(q_nope, q_rope, q_scale, latent, scale, rope, block_table,
                                 cache_seqlens, softmax_scale, causal, split_offsets,
                                 split_begin, worker_splits=None) -> (out, lse)
    torch.ops.snapmla.decode_bf16(q, cache, block_table, cache_seqlens, softmax_scale, causal,
                                  split_offsets, split_begin, worker_splits=None) -> (out, lse)

The functions below wrap them with the native API's argument style (snapmla.decode_fp8 ...).
"""

from __future__ import annotations

import contextlib
import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _C, _fastpath
from ._frameworks import raw as _dl
from ._api import (BF16, FP8, HEAD_DIM, LATENT_DIM, ROPE_DIM, Bf16Inputs, DecodeOp, Fp8Inputs, PagedFp8Cache,
                   QuantizedQuery, SplitPlan, bf16_inputs, decode, fp8_inputs, recommended_num_workers,
                   split_plan_capacity)
from ._frameworks import current_stream

__all__ = ["append", "quantize_query", "gather_dequant", "plan_splits", "decode_fp8",
           "decode_bf16", "recommended_num_workers"]


def _stream(t: Tensor) -> int:
    return current_stream(t, None)


# The current CUDA device's index: torch.cuda.current_device without its Python layer (which
# checks its lazy initialisation first; the C++ getter initialises CUDA itself where needed).
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def _on(t: Tensor):
    """t's device made current for the call and restored after (a no-op, and nearly free, when
    it is already current: the common case)."""
    index = t.get_device()
    if index >= 0 and index != _current_device():
        return torch.cuda.device(index)
    return _NO_GUARD


_NO_GUARD = contextlib.nullcontext()


@torch.library.custom_op("snapmla::append_fp8", mutates_args=("latent", "scale", "rope"))
def _append_fp8(kv: Tensor, slots: Tensor, latent: Tensor, scale: Tensor, rope: Tensor) -> None:
    with _on(kv):
        _C.append_fp8(_dl(kv), _dl(slots), _dl(latent), _dl(scale), _dl(rope), _stream(kv))


@_append_fp8.register_fake
def _(kv, slots, latent, scale, rope) -> None:
    return None


@torch.library.custom_op("snapmla::append_bf16", mutates_args=("cache",))
def _append_bf16(kv: Tensor, slots: Tensor, cache: Tensor) -> None:
    with _on(kv):
        _C.append_bf16(_dl(kv), _dl(slots), _dl(cache), _stream(kv))


@_append_bf16.register_fake
def _(kv, slots, cache) -> None:
    return None


# The functional ops (no argument mutated) are defined with torch.library.Library: a schema, the
# Python implementation for the CPU and CUDA keys, the fake for Meta and FakeTensor. That is what
# custom_op builds on, without its per-call layers (an Autograd kernel that redispatches, and an
# aliasing check of the outputs), which cost these ops about 9 us per eager call (measured with
# lab/host_cost.py: 13 against 4 us for an op of decode_fp8's schema whose body does nothing).
# None of those layers does work here: no op has a backward, and every output is a new tensor.
# Autograd falls back to PyTorch's default for ops without a formula. The mutating ops above
# stay custom_ops, whose ADInplaceOrView layer bumps the mutated tensors' version counters.
_lib = torch.library.Library("snapmla", "FRAGMENT")


def _define(schema: str, impl, fake):
    name = schema[:schema.index("(")]
    # pt2_compliant_tag as custom_op sets it: the op works with torch.compile and export.
    _lib.define(schema, tags=(torch.Tag.pt2_compliant_tag,))
    _lib.impl(name, impl, "CPU")
    _lib.impl(name, impl, "CUDA")
    torch.library.register_fake(f"snapmla::{name}", fake, lib=_lib)
    return getattr(torch.ops.snapmla, name).default


def _quantize_query_fake(q):
    lead = tuple(q.shape[:-1])
    return (q.new_empty(lead + (LATENT_DIM,), dtype=torch.float8_e4m3fn),
            q.new_empty(lead + (ROPE_DIM,), dtype=torch.bfloat16),
            q.new_empty(lead, dtype=torch.float32))


def _quantize_query(q: Tensor):
    nope, rope, scale = _quantize_query_fake(q)
    with _on(q):
        _C.quantize_query(_dl(q), _dl(nope), _dl(rope), _dl(scale), _stream(q))
    return nope, rope, scale


_quantize_query_op = _define("quantize_query(Tensor q) -> (Tensor, Tensor, Tensor)", _quantize_query,
                             _quantize_query_fake)


def _gather_dequant_fake(latent, scale, rope, slots):
    return rope.new_empty((slots.numel(), HEAD_DIM), dtype=torch.bfloat16)


def _gather_dequant(latent: Tensor, scale: Tensor, rope: Tensor, slots: Tensor) -> Tensor:
    out = _gather_dequant_fake(latent, scale, rope, slots)
    with _on(slots):
        _C.gather_dequant(_dl(latent), _dl(scale), _dl(rope), _dl(slots), _dl(out), _stream(slots))
    return out


_gather_dequant_op = _define("gather_dequant(Tensor latent, Tensor scale, Tensor rope, Tensor slots) -> Tensor",
                             _gather_dequant, _gather_dequant_fake)


def _plan_splits_fake(cache_seqlens, num_workers, query_rows=0, split_blocks=0):
    b = cache_seqlens.shape[0]
    cap = split_plan_capacity(int(b), int(num_workers))
    return (cache_seqlens.new_empty((b + 1,), dtype=torch.int32),
            cache_seqlens.new_empty((cap,), dtype=torch.int32),
            cache_seqlens.new_empty((cap,), dtype=torch.int32))


def _plan_splits(cache_seqlens: Tensor, num_workers: int, query_rows: int = 0, split_blocks: int = 0):
    offsets, begin, order = _plan_splits_fake(cache_seqlens, num_workers)
    with _on(cache_seqlens):
        _C.plan_splits(_dl(cache_seqlens), num_workers, _dl(offsets), _dl(begin), _stream(cache_seqlens),
                       _dl(order), query_rows, split_blocks)
    return offsets, begin, order


_plan_splits_op = _define(
    "plan_splits(Tensor cache_seqlens, int num_workers, int query_rows=0, int split_blocks=0) -> "
    "(Tensor, Tensor, Tensor)",
    _plan_splits, _plan_splits_fake)


def _decode_outputs_fake(q: Tensor):
    b, s_q, h = q.shape[0], q.shape[1], q.shape[2]
    return (q.new_empty((b, s_q, h, LATENT_DIM), dtype=torch.bfloat16),
            q.new_empty((b, h, s_q), dtype=torch.float32))


def _decode(op: DecodeOp, inputs: tuple, softmax_scale: float, causal: bool):
    """The decode ops' implementation: _api.decode with the outputs allocated there (torch.empty,
    the caching allocator) on the current stream, the pointer path where these inputs' layouts
    were accepted before (snapmla/_fastpath.py), else the array path. The device is made current
    for the call where it is not (the C++ entry point selects it and would leave it selected)."""
    index = op.query(inputs).get_device()
    if index >= 0 and index != _current_device():
        with torch.cuda.device(index):
            return decode(op, inputs, softmax_scale, causal, -math.inf)
    return decode(op, inputs, softmax_scale, causal, -math.inf)


def _decode_fp8(q_nope, q_rope, q_scale, latent, scale, rope, block_table, cache_seqlens, softmax_scale,
                causal, split_offsets, split_begin, worker_splits=None):
    return _decode(FP8, Fp8Inputs(q_nope, q_rope, q_scale, latent, scale, rope, block_table, cache_seqlens,
                                  split_offsets, split_begin, worker_splits), softmax_scale, causal)


def _decode_fp8_fake(q_nope, q_rope, q_scale, latent, scale, rope, block_table, cache_seqlens, softmax_scale,
                     causal, split_offsets, split_begin, worker_splits=None):
    return _decode_outputs_fake(q_nope)


_decode_fp8_op = _define(
    "decode_fp8(Tensor q_nope, Tensor q_rope, Tensor q_scale, Tensor latent, Tensor scale, Tensor rope, "
    "Tensor block_table, Tensor cache_seqlens, float softmax_scale, bool causal, Tensor? split_offsets, "
    "Tensor? split_begin, Tensor? worker_splits=None) -> (Tensor, Tensor)", _decode_fp8, _decode_fp8_fake)


def _decode_bf16(q, cache, block_table, cache_seqlens, softmax_scale, causal, split_offsets, split_begin,
                 worker_splits=None):
    return _decode(BF16, Bf16Inputs(q, cache, block_table, cache_seqlens, split_offsets, split_begin,
                                    worker_splits), softmax_scale, causal)


def _decode_bf16_fake(q, cache, block_table, cache_seqlens, softmax_scale, causal, split_offsets, split_begin,
                      worker_splits=None):
    return _decode_outputs_fake(q)


_decode_bf16_op = _define(
    "decode_bf16(Tensor q, Tensor cache, Tensor block_table, Tensor cache_seqlens, float softmax_scale, "
    "bool causal, Tensor? split_offsets, Tensor? split_begin, Tensor? worker_splits=None) -> (Tensor, Tensor)",
    _decode_bf16, _decode_bf16_fake)


# --- the native API's argument style over the ops ---------------------------------------------

def append(cache, kv: Tensor, slots: Tensor) -> None:
    if isinstance(cache, PagedFp8Cache):
        torch.ops.snapmla.append_fp8(kv, slots, cache.latent, cache.scale, cache.rope)
    else:
        torch.ops.snapmla.append_bf16(kv, slots, cache)


def quantize_query(q: Tensor) -> QuantizedQuery:
    return QuantizedQuery(*_quantize_query_op(q))


def gather_dequant(cache: PagedFp8Cache, slots: Tensor) -> Tensor:
    return _gather_dequant_op(cache.latent, cache.scale, cache.rope, slots)


def plan_splits(cache_seqlens: Tensor, num_workers: int, query_rows: int = 0, split_blocks: int = 0) -> SplitPlan:
    offsets, begin, order = _plan_splits_op(cache_seqlens, int(num_workers), int(query_rows), int(split_blocks))
    return SplitPlan(offsets, begin, int(num_workers), order)


def _plain_eager_getters():
    """The functions _call asks, or None where this PyTorch lacks one (then the wrappers
    always call the ops)."""
    try:
        c = torch._C
        return (torch.compiler.is_compiling, c._is_torch_function_mode_enabled, c._len_torch_dispatch_stack,
                c._get_tracing_state, c._functorch.peek_interpreter_stack, torch.autograd.profiler,
                torch.is_grad_enabled)
    except AttributeError:
        return None


_EAGER_GETTERS = _plain_eager_getters()


def _call(op: DecodeOp, torch_op, inputs: tuple, softmax_scale: float, causal: bool):
    """torch_op (op's torch op) on `inputs`, or in plain eager mode on the current device what
    the op would run, without the dispatcher (whose call of a Python kernel costs 3 us of the
    op's 13 on the CPU of docs/python.md, and its Python entry another 1 us): _api.decode, the
    pointer path where the inputs' signature was accepted, else the array path, which records
    it. Plain eager: not under torch.compile, no torch function or dispatch mode (FakeTensorMode,
    a FlopCounter...), no TorchScript tracing, no functorch transform, no profiler (whose traces
    show the op), no input that autograd would follow, and every input exactly torch.Tensor (a
    fake or other subclass has no pointer path: the op)."""
    softmax_scale, causal = float(softmax_scale), bool(causal)
    g = _EAGER_GETTERS
    if g is not None:
        is_compiling, function_mode, dispatch_modes, tracing_state, interpreter, profiler, grad_enabled = g
        plain = not (is_compiling() or function_mode() or dispatch_modes() or tracing_state() is not None
                     or interpreter() is not None or profiler._is_profiler_enabled)
        if plain and grad_enabled():
            for x in inputs:
                if x is not None and x.requires_grad:
                    plain = False
                    break
        if plain:
            index = op.query(inputs).get_device()
            if index < 0 or index == _current_device():
                done = decode(op, inputs, softmax_scale, causal, -math.inf, pointer_types_only=True)
                if done is not None:
                    return done
    n = op.plan_at  # the op's schema: the tensors, softmax_scale, causal, then the plan's tensors
    return torch_op(*inputs[:n], softmax_scale, causal, *inputs[n:])


def decode_fp8(q: QuantizedQuery, cache: PagedFp8Cache, block_table: Tensor,
               cache_seqlens: Tensor, *, softmax_scale: float, causal: bool = True,
               plan: Optional[SplitPlan] = None) -> Tuple[Tensor, Tensor]:
    """torch.ops.snapmla.decode_fp8 in the native API's arguments (in plain eager mode what the op
    runs, without the dispatcher: see _call)."""
    return _call(FP8, _decode_fp8_op, fp8_inputs(q, cache, block_table, cache_seqlens, plan), softmax_scale,
                 causal)


def decode_bf16(q: Tensor, cache: Tensor, block_table: Tensor, cache_seqlens: Tensor, *,
                softmax_scale: float, causal: bool = True,
                plan: Optional[SplitPlan] = None) -> Tuple[Tensor, Tensor]:
    """torch.ops.snapmla.decode_bf16 in the native API's arguments (as decode_fp8)."""
    return _call(BF16, _decode_bf16_op, bf16_inputs(q, cache, block_table, cache_seqlens, plan), softmax_scale,
                 causal)
