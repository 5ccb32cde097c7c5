"""SnapMLA as torch.library custom ops (namespace `snapmla`), for PyTorch engines.

Each op has a fake (meta) implementation, so a decode step traces under torch.compile
(fullgraph) and records into a CUDA graph: the ops allocate outputs with torch (the caching
allocator, graph-pool aware), launch on torch's current stream and never synchronize the host.

    torch.ops.snapmla.append_fp8(kv, slots, latent, scale, rope)           (mutates the cache)
    torch.ops.snapmla.append_bf16(kv, slots, cache)                         (mutates the cache)
    torch.ops.snapmla.quantize_query(q) -> (nope, rope, scale)
    torch.ops.snapmla.gather_dequant(latent, scale, rope, slots) -> rows
    torch.ops.snapmla.plan_splits(cache_seqlens, num_workers)
        -> (split_offsets, split_begin, split_order)
    torch.ops.snapmla.decode_fp8(q_nope, q_rope, q_scale, latent, scale, rope, block_table,
                                 cache_seqlens, softmax_scale, causal, split_offsets,
                                 split_begin, split_order=None) -> (out, lse)
    torch.ops.snapmla.decode_bf16(q, cache, block_table, cache_seqlens, softmax_scale, causal,
                                  split_offsets, split_begin, split_order=None) -> (out, lse)

The functions below wrap them with the native API's argument style (snapmla.decode_fp8 ...).
"""

from __future__ import annotations

import contextlib
import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _C
from ._frameworks import raw as _dl
from ._api import (HEAD_DIM, LATENT_DIM, ROPE_DIM, PagedFp8Cache, QuantizedQuery, SplitPlan,
                   decode_workspace_bytes, recommended_num_workers, run_decode_bf16, run_decode_fp8,
                   split_plan_capacity)
from ._frameworks import current_stream

__all__ = ["append", "quantize_query", "gather_dequant", "plan_splits", "decode_fp8",
           "decode_bf16", "recommended_num_workers"]


def _stream(t: Tensor) -> int:
    return current_stream(t, None)


def _on(t: Tensor):
    """t's device made current for the call and restored after (a no-op, and nearly free, when
    it is already current: the common case)."""
    if t.is_cuda and t.get_device() != torch.cuda.current_device():
        return torch.cuda.device(t.device)
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


@torch.library.custom_op("snapmla::quantize_query", mutates_args=())
def _quantize_query(q: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    nope, rope, scale = _quantize_query_fake(q)
    with _on(q):
        _C.quantize_query(_dl(q), _dl(nope), _dl(rope), _dl(scale), _stream(q))
    return nope, rope, scale


@_quantize_query.register_fake
def _quantize_query_fake(q):
    lead = tuple(q.shape[:-1])
    return (q.new_empty(lead + (LATENT_DIM,), dtype=torch.float8_e4m3fn),
            q.new_empty(lead + (ROPE_DIM,), dtype=torch.bfloat16),
            q.new_empty(lead, dtype=torch.float32))


@torch.library.custom_op("snapmla::gather_dequant", mutates_args=())
def _gather_dequant(latent: Tensor, scale: Tensor, rope: Tensor, slots: Tensor) -> Tensor:
    out = _gather_dequant_fake(latent, scale, rope, slots)
    with _on(slots):
        _C.gather_dequant(_dl(latent), _dl(scale), _dl(rope), _dl(slots), _dl(out), _stream(slots))
    return out


@_gather_dequant.register_fake
def _gather_dequant_fake(latent, scale, rope, slots):
    return rope.new_empty((slots.numel(), HEAD_DIM), dtype=torch.bfloat16)


@torch.library.custom_op("snapmla::plan_splits", mutates_args=())
def _plan_splits(cache_seqlens: Tensor, num_workers: int) -> Tuple[Tensor, Tensor, Tensor]:
    offsets, begin, order = _plan_splits_fake(cache_seqlens, num_workers)
    with _on(cache_seqlens):
        _C.plan_splits(_dl(cache_seqlens), num_workers, _dl(offsets), _dl(begin), _stream(cache_seqlens),
                       _dl(order))
    return offsets, begin, order


@_plan_splits.register_fake
def _plan_splits_fake(cache_seqlens, num_workers):
    b = cache_seqlens.shape[0]
    cap = split_plan_capacity(int(b), int(num_workers))
    return (cache_seqlens.new_empty((b + 1,), dtype=torch.int32),
            cache_seqlens.new_empty((cap,), dtype=torch.int32),
            cache_seqlens.new_empty((cap,), dtype=torch.int32))


def _decode_outputs(q: Tensor, split_begin: Optional[Tensor]):
    b, s_q, h = q.shape[0], q.shape[1], q.shape[2]
    out = q.new_empty((b, s_q, h, LATENT_DIM), dtype=torch.bfloat16)
    lse = q.new_empty((b, h, s_q), dtype=torch.float32)
    ws = None
    if split_begin is not None and q.is_cuda:
        ws = q.new_empty((decode_workspace_bytes(split_begin.numel(), s_q, h),), dtype=torch.uint8)
    return out, lse, ws


@torch.library.custom_op("snapmla::decode_fp8", mutates_args=())
def _decode_fp8(q_nope: Tensor, q_rope: Tensor, q_scale: Tensor, latent: Tensor, scale: Tensor,
                rope: Tensor, block_table: Tensor, cache_seqlens: Tensor, softmax_scale: float,
                causal: bool, split_offsets: Optional[Tensor], split_begin: Optional[Tensor],
                split_order: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    out, lse, ws = _decode_outputs(q_nope, split_begin)
    # The pointer path where an earlier call with these layouts passed every check
    # (snapmla/_fastpath.py), else the array path.
    with _on(q_nope):
        run_decode_fp8(q_nope, q_rope, q_scale, latent, scale, rope, block_table, cache_seqlens, out, lse,
                       split_offsets, split_begin, split_order, ws, softmax_scale, causal, -math.inf,
                       _stream(q_nope))
    return out, lse


@_decode_fp8.register_fake
def _(q_nope, q_rope, q_scale, latent, scale, rope, block_table, cache_seqlens, softmax_scale,
      causal, split_offsets, split_begin, split_order=None):
    out, lse, _ = _decode_outputs(q_nope, None)
    return out, lse


@torch.library.custom_op("snapmla::decode_bf16", mutates_args=())
def _decode_bf16(q: Tensor, cache: Tensor, block_table: Tensor, cache_seqlens: Tensor,
                 softmax_scale: float, causal: bool, split_offsets: Optional[Tensor],
                 split_begin: Optional[Tensor], split_order: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    out, lse, ws = _decode_outputs(q, split_begin)
    with _on(q):
        run_decode_bf16(q, cache, block_table, cache_seqlens, out, lse, split_offsets, split_begin,
                        split_order, ws, softmax_scale, causal, -math.inf, _stream(q))
    return out, lse


@_decode_bf16.register_fake
def _(q, cache, block_table, cache_seqlens, softmax_scale, causal, split_offsets, split_begin,
      split_order=None):
    out, lse, _ = _decode_outputs(q, None)
    return out, lse


# --- the native API's argument style over the ops ---------------------------------------------

def append(cache, kv: Tensor, slots: Tensor) -> None:
    if isinstance(cache, PagedFp8Cache):
        torch.ops.snapmla.append_fp8(kv, slots, cache.latent, cache.scale, cache.rope)
    else:
        torch.ops.snapmla.append_bf16(kv, slots, cache)


def quantize_query(q: Tensor) -> QuantizedQuery:
    return QuantizedQuery(*torch.ops.snapmla.quantize_query(q))


def gather_dequant(cache: PagedFp8Cache, slots: Tensor) -> Tensor:
    return torch.ops.snapmla.gather_dequant(cache.latent, cache.scale, cache.rope, slots)


def plan_splits(cache_seqlens: Tensor, num_workers: int) -> SplitPlan:
    offsets, begin, order = torch.ops.snapmla.plan_splits(cache_seqlens, int(num_workers))
    return SplitPlan(offsets, begin, int(num_workers), order)


def decode_fp8(q: QuantizedQuery, cache: PagedFp8Cache, block_table: Tensor,
               cache_seqlens: Tensor, *, softmax_scale: float, causal: bool = True,
               plan: Optional[SplitPlan] = None) -> Tuple[Tensor, Tensor]:
    return torch.ops.snapmla.decode_fp8(
        q.nope, q.rope, q.scale, cache.latent, cache.scale, cache.rope, block_table,
        cache_seqlens, float(softmax_scale), bool(causal),
        plan.split_offsets if plan is not None else None,
        plan.split_begin if plan is not None else None,
        plan.split_order if plan is not None else None)


def decode_bf16(q: Tensor, cache: Tensor, block_table: Tensor, cache_seqlens: Tensor, *,
                softmax_scale: float, causal: bool = True,
                plan: Optional[SplitPlan] = None) -> Tuple[Tensor, Tensor]:
    return torch.ops.snapmla.decode_bf16(
        q, cache, block_table, cache_seqlens, float(softmax_scale), bool(causal),
        plan.split_offsets if plan is not None else None,
        plan.split_begin if plan is not None else None,
        plan.split_order if plan is not None else None)
