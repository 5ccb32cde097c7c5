"""FlashMLA-style entry points over SnapMLA's BF16 decode (drop-in for engines that call
flash_mla.get_mla_metadata / flash_mla.flash_mla_with_kvcache on a BF16 cache).

    FlashMLA                                       SnapMLA native
    get_mla_metadata(cache_seqlens,                plan_splits(cache_seqlens,
        num_q_tokens_per_head_k, num_heads_k)          recommended_num_workers(...))
      -> (tile_scheduler_metadata, num_splits)       -> SplitPlan(split_offsets, split_begin)
    flash_mla_with_kvcache(q, k_cache,             decode_bf16(q, cache, block_table,
        block_table, cache_seqlens, head_dim_v,        cache_seqlens, softmax_scale=...,
        tile_scheduler_metadata, num_splits,           causal=..., plan=...)
        softmax_scale=None, causal=False)
      -> (out [b, s_q, h, 512], lse [b, h, s_q])   -> (out, lse)

Shapes as FlashMLA's: q [b, s_q, h_q, 576] bf16, k_cache [num_blocks, 64, 1, 576] bf16,
block_table [b, max_blocks] int32, cache_seqlens [b] int32. `num_splits` has FlashMLA's meaning
(cumulative split counts [b + 1]); `tile_scheduler_metadata` holds SnapMLA's split_begin and
split_order arrays back to back (opaque to callers in both libraries). Unlike FlashMLA, `causal` only masks within the last
s_q positions (FlashMLA's meaning too) and the page size must be 64.

Not supported: FlashMLA's FP8 sparse format (is_fp8_kvcache=True) and sparse attention
(indices/topk): SnapMLA's FP8 cache is a different format; see snapmla.fluentllm.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from ._api import (SplitPlan, _numel, decode_bf16, plan_splits, recommended_num_workers,
                   split_plan_capacity)
from ._frameworks import empty

__all__ = ["get_mla_metadata", "flash_mla_with_kvcache"]


def get_mla_metadata(cache_seqlens: Any, num_q_tokens_per_head_k: int, num_heads_k: int,
                     num_heads_q: Optional[int] = None, is_fp8_kvcache: bool = False,
                     topk: Optional[int] = None) -> Tuple[Any, Any]:
    """Split-KV metadata computed on cache_seqlens' device (no host synchronization)."""
    if topk is not None:
        raise NotImplementedError("snapmla.flash_mla: sparse attention (topk) is not supported")
    if num_heads_k != 1:
        raise ValueError(f"snapmla.flash_mla: MLA has one KV head, got num_heads_k={num_heads_k}")
    rows = int(num_q_tokens_per_head_k) * int(num_heads_k)
    workers = recommended_num_workers(cache_seqlens, 1, rows)
    b = _numel(cache_seqlens)
    cap = split_plan_capacity(b, workers)
    meta = empty(cache_seqlens, (2 * cap,), "i32")  # split_begin, then split_order
    offsets = empty(cache_seqlens, (b + 1,), "i32")
    plan_splits(cache_seqlens, workers, out=SplitPlan(offsets, meta[:cap], workers, meta[cap:]))
    return meta, offsets


def plan_of_metadata(tile_scheduler_metadata: Any, num_splits: Any) -> SplitPlan:
    """The SplitPlan get_mla_metadata's results stand for (the metadata holds split_begin, then
    split_order)."""
    cap = _numel(tile_scheduler_metadata) // 2
    return SplitPlan(num_splits, tile_scheduler_metadata[:cap], 0, tile_scheduler_metadata[cap:])


def flash_mla_with_kvcache(q: Any, k_cache: Any, block_table: Any, cache_seqlens: Any,
                           head_dim_v: int, tile_scheduler_metadata: Any, num_splits: Any,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           is_fp8_kvcache: bool = False, indices: Any = None,
                           **unsupported: Any) -> Tuple[Any, Any]:
    if is_fp8_kvcache or indices is not None:
        raise NotImplementedError(
            "snapmla.flash_mla: FlashMLA's FP8 sparse cache format and sparse indices are not "
            "supported; use snapmla.decode_fp8 (or snapmla.fluentllm) with the SnapMLA FP8 cache")
    if unsupported:
        raise TypeError(f"snapmla.flash_mla: unsupported arguments {sorted(unsupported)}")
    if head_dim_v != 512:
        raise ValueError(f"snapmla.flash_mla: head_dim_v must be 512 (MLA's latent), got {head_dim_v}")
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    plan = plan_of_metadata(tile_scheduler_metadata, num_splits)
    return decode_bf16(q, k_cache, block_table, cache_seqlens, softmax_scale=softmax_scale,
                       causal=causal, plan=plan)
