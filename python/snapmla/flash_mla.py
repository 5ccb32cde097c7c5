"""FlashMLA-style entry points over SnapMLA's BF16 decode (drop-in for engines that call
flash_mla.get_mla_metadata / flash_mla.flash_mla_with_kvcache on a BF16 cache).

    FlashMLA                                       SnapMLA native
    get_mla_metadata(cache_seqlens,                plan_splits(cache_seqlens,
        num_q_tokens_per_head_k, num_heads_k)          recommended_num_workers(...))
      -> (tile_scheduler_metadata, num_splits)       -> SplitPlan(split_offsets, split_begin)
    get_mla_metadata()                             (the plan is made at the first call)
      -> (FlashMLASchedMeta(), None)
    flash_mla_with_kvcache(q, k_cache,             decode_bf16(q, cache, block_table,
        block_table, cache_seqlens, head_dim_v,        cache_seqlens, softmax_scale=...,
        tile_scheduler_metadata, num_splits,           causal=..., plan=...,
        softmax_scale=None, causal=False)              empty_lse=+inf)
      -> (out [b, s_q, h, 512], lse [b, h, s_q])   -> (out, lse)

Both of FlashMLA's interfaces: the older one, get_mla_metadata(cache_seqlens, s_q * h_q // h_kv,
h_kv) returning (tile_scheduler_metadata, num_splits) arrays (what SGLang and vLLM call), and the
current one, get_mla_metadata() returning (FlashMLASchedMeta(), None): the first
flash_mla_with_kvcache call given that object plans the splits from its cache_seqlens and stores
the plan and the call's shapes in it; later calls reuse the plan and must have the same shapes
(checked, as FlashMLA does) and the same cache_seqlens values (not checked: that would need a
host synchronization).

Shapes as FlashMLA's: q [b, s_q, h_q, 576] bf16 with any h_q in 1..128, k_cache [num_blocks, 64,
1, 576] bf16, block_table [b, max_blocks] int32, cache_seqlens [b] int32. `num_splits` has
FlashMLA's meaning (cumulative split counts [b + 1]); `tile_scheduler_metadata` holds SnapMLA's
split_begin and worker_splits arrays back to back (opaque to callers in both libraries).
FlashMLA's conventions: the default softmax_scale is q.shape[-1] ** -0.5; a query that sees no
token gets out = 0 and lse = +inf; `causal` masks within the last s_q positions; the page size
must be 64 and h_kv 1 (MLA).

Not supported: FlashMLA's FP8 sparse format (is_fp8_kvcache=True), sparse attention (indices,
topk_length) and attention sinks: SnapMLA's FP8 cache is a different format; see
snapmla.fluentllm.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional, Tuple

from . import _C
from ._api import (PAGE_SIZE, SplitPlan, _numel, decode_bf16, plan_splits, recommended_num_workers,
                   split_plan_capacity)
from ._frameworks import empty

__all__ = ["FlashMLASchedMeta", "get_mla_metadata", "flash_mla_with_kvcache"]


@dataclasses.dataclass
class FlashMLASchedMeta:
    """The split plan of the current FlashMLA interface: empty from get_mla_metadata(), filled by
    the first flash_mla_with_kvcache call that is given it (FlashMLA's attribute names)."""

    @dataclasses.dataclass
    class Config:
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int
        causal: bool
        is_fp8_kvcache: bool
        topk: Optional[int] = None

    have_initialized: bool = False
    config: Optional[Config] = None
    tile_scheduler_metadata: Any = None  # split_begin, then worker_splits (int32)
    num_splits: Any = None               # split_offsets [b + 1] (int32)


def _query_shape(rows: int) -> Tuple[int, int]:
    """An (s_q, h) with s_q * h == rows and both within the limits the decode checks (s_q up to
    _C.MAX_QUERIES_PER_SEQ, h up to _C.MAX_HEADS; the plan depends on rows only)."""
    for s_q in range(1, _C.MAX_QUERIES_PER_SEQ + 1):
        if rows % s_q == 0 and _C.MIN_HEADS <= rows // s_q <= _C.MAX_HEADS:
            return s_q, rows // s_q
    raise ValueError(f"snapmla.flash_mla.get_mla_metadata: argument 'num_q_tokens_per_head_k': "
                     f"expected s_q * h_q with s_q in 1..{_C.MAX_QUERIES_PER_SEQ} and h_q in "
                     f"{_C.MIN_HEADS}..{_C.MAX_HEADS}, got {rows}")


def _plan_arrays(cache_seqlens: Any, s_q: int, h: int) -> Tuple[Any, Any]:
    """(tile_scheduler_metadata, num_splits) for cache_seqlens, made on its device."""
    workers = recommended_num_workers(cache_seqlens, s_q, h)
    b = _numel(cache_seqlens)
    cap = split_plan_capacity(b, workers)
    meta = empty(cache_seqlens, (2 * cap,), "i32")  # split_begin, then worker_splits
    offsets = empty(cache_seqlens, (b + 1,), "i32")
    plan_splits(cache_seqlens, workers, out=SplitPlan(offsets, meta[:cap], workers, meta[cap:]), query_rows=s_q * h)
    return meta, offsets


def get_mla_metadata(cache_seqlens: Any = None, num_q_tokens_per_head_k: Optional[int] = None,
                     num_heads_k: Optional[int] = None, num_heads_q: Optional[int] = None,
                     is_fp8_kvcache: bool = False, topk: Optional[int] = None) -> Tuple[Any, Any]:
    """With cache_seqlens: split-KV metadata computed on its device (no host synchronization),
    FlashMLA's older interface. Without: (FlashMLASchedMeta(), None), its current one."""
    if topk is not None:
        raise NotImplementedError("snapmla.flash_mla: sparse attention (topk) is not supported")
    if cache_seqlens is None:
        return FlashMLASchedMeta(), None
    if num_q_tokens_per_head_k is None or num_heads_k is None:
        raise TypeError("snapmla.flash_mla.get_mla_metadata: with cache_seqlens, expected "
                        "num_q_tokens_per_head_k and num_heads_k too (or no arguments at all)")
    if num_heads_k != 1:
        raise ValueError("snapmla.flash_mla.get_mla_metadata: argument 'num_heads_k': MLA has one "
                         f"KV head, expected 1, got {num_heads_k}")
    return _plan_arrays(cache_seqlens, *_query_shape(int(num_q_tokens_per_head_k) * int(num_heads_k)))


def plan_of_metadata(tile_scheduler_metadata: Any, num_splits: Any) -> SplitPlan:
    """The SplitPlan get_mla_metadata's results stand for (the metadata holds split_begin, then
    worker_splits)."""
    cap = _numel(tile_scheduler_metadata) // 2
    return SplitPlan(num_splits, tile_scheduler_metadata[:cap], 0, tile_scheduler_metadata[cap:])


def _fail(argument: str, what: str):
    raise ValueError(f"snapmla.flash_mla.flash_mla_with_kvcache: argument '{argument}': {what}")


def _sched_plan(meta: FlashMLASchedMeta, q: Any, k_cache: Any, cache_seqlens: Any, causal: bool,
                is_fp8_kvcache: bool) -> SplitPlan:
    """The plan a FlashMLASchedMeta holds, made at its first use; later uses must match it."""
    config = FlashMLASchedMeta.Config(int(q.shape[0]), int(q.shape[1]), int(q.shape[2]),
                                      int(k_cache.shape[1]), int(k_cache.shape[2]), bool(causal),
                                      bool(is_fp8_kvcache))
    if not meta.have_initialized:
        meta.tile_scheduler_metadata, meta.num_splits = _plan_arrays(cache_seqlens, config.s_q, config.h_q)
        meta.config = config
        meta.have_initialized = True
    elif meta.config != config:
        had, got = dataclasses.asdict(meta.config), dataclasses.asdict(config)
        diff = ", ".join(f"{k} {had[k]} -> {got[k]}" for k in had if had[k] != got[k])
        _fail("tile_scheduler_metadata", f"this FlashMLASchedMeta was filled by a call with other "
              f"arguments ({diff}); expected the same shapes, causal and cache_seqlens at every "
              "call that reuses it (make one per shape with get_mla_metadata())")
    return plan_of_metadata(meta.tile_scheduler_metadata, meta.num_splits)


def flash_mla_with_kvcache(q: Any, k_cache: Any, block_table: Any, cache_seqlens: Any,
                           head_dim_v: int, tile_scheduler_metadata: Any, num_splits: Any = None,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           is_fp8_kvcache: bool = False, indices: Any = None,
                           attn_sink: Any = None, extra_k_cache: Any = None,
                           extra_indices_in_kvcache: Any = None, topk_length: Any = None,
                           extra_topk_length: Any = None) -> Tuple[Any, Any]:
    """FlashMLA's dense decoding on a BF16 cache: (out [b, s_q, h_q, 512], lse [b, h_q, s_q])."""
    if is_fp8_kvcache or indices is not None or topk_length is not None:
        raise NotImplementedError(
            "snapmla.flash_mla: FlashMLA's FP8 sparse cache format and sparse indices are not "
            "supported; use snapmla.decode_fp8 (or snapmla.fluentllm) with the SnapMLA FP8 cache")
    for name, value in (("attn_sink", attn_sink), ("extra_k_cache", extra_k_cache),
                        ("extra_indices_in_kvcache", extra_indices_in_kvcache),
                        ("extra_topk_length", extra_topk_length)):
        if value is not None:
            raise NotImplementedError(f"snapmla.flash_mla: argument '{name}' is not supported")
    if head_dim_v != 512:
        _fail("head_dim_v", f"expected 512 (MLA's latent), got {head_dim_v}")
    if block_table is None or cache_seqlens is None:
        _fail("block_table" if block_table is None else "cache_seqlens",
              "expected an int32 array (dense decoding needs block_table and cache_seqlens)")
    if len(k_cache.shape) == 4 and (int(k_cache.shape[1]) != PAGE_SIZE or int(k_cache.shape[2]) != 1):
        _fail("k_cache", f"expected [num_blocks, {PAGE_SIZE}, 1, 576] (page size {PAGE_SIZE}, one KV "
              f"head), got {list(k_cache.shape)}")
    if softmax_scale is None:
        softmax_scale = int(q.shape[-1]) ** -0.5
    if isinstance(tile_scheduler_metadata, FlashMLASchedMeta):
        if num_splits is not None:
            _fail("num_splits", "expected None with a FlashMLASchedMeta (get_mla_metadata() "
                  "without arguments)")
        k4 = k_cache if len(k_cache.shape) == 4 else k_cache.reshape(-1, PAGE_SIZE, 1, k_cache.shape[-1])
        plan = _sched_plan(tile_scheduler_metadata, q, k4, cache_seqlens, causal, is_fp8_kvcache)
    else:
        if num_splits is None:
            _fail("num_splits", "expected the second result of get_mla_metadata(cache_seqlens, ...)")
        plan = plan_of_metadata(tile_scheduler_metadata, num_splits)
    return decode_bf16(q, k_cache, block_table, cache_seqlens, softmax_scale=softmax_scale,
                       causal=causal, plan=plan, empty_lse=math.inf)
