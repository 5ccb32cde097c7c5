"""SGLang-FluentLLM-style SnapMLA calls (the paper's reference engine, module flash_mla_fp8),
over SnapMLA's native FP8 operations, with their argument orders and shapes.

    FluentLLM                                        SnapMLA native
    quantize_and_cache_k(key, k_lora_cache,          append(PagedFp8Cache(latent, scale, rope),
        k_lora_scale_cache, k_rope_cache,                   kv, slots)
        indices, head_dim_v)
    quantize_ckv_per_token_head(q, kv_lora_rank)     quantize_query(q) -> (nope, rope, scale)
        -> (q_nope, q_scale, q_rope)
    get_mla_metadata(cache_seqlens, s_q * h_q, 1)    plan_splits(...)
    flash_mla_ckv_fp8_per_token(q_nope, q_rope,      decode_fp8(QuantizedQuery(nope, rope,
        k_cache_lora, k_cache_rope, q_scale,             scale), cache, block_table,
        k_scale, block_table, cache_seqlens,             cache_seqlens, softmax_scale=...,
        head_dim_v, tile_scheduler_metadata,             causal=..., plan=...)
        num_splits, softmax_scale=None, causal=False)
      -> (o [b, s_q, h, 512], lse [b, h, s_q])
    dequantize_ckv_fused_indexed(k_lora_cache,       gather_dequant(cache, slots) -> [n, 576]
        k_rope_cache, k_scale_cache, indices)
      -> (k_lora [n, .., 512], k_rope [n, .., 64])

Caches may have FluentLLM's flat per-slot shapes ([slots, 1, 512], [slots, 1], [slots, 1, 64]),
FlashMLA-style [pages, 64, 1, D], or SnapMLA's [pages, 64, D]: any contiguous layout of whole
64-token pages (slot = page * 64 + offset). Stored as uint8 or float8_e4m3fn alike.
q_scale comes back as [b, s_q, h, 1] (any shape with b*s_q*h elements is accepted).
The default softmax_scale is 576 ** -0.5, as FlashMLA's for a 576-wide query, and a query
that sees no token gets out = 0 and lse = +inf, as in FlashMLA (of which FluentLLM's kernel is a
fork). get_mla_metadata is FlashMLA's older interface (arguments required).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Tuple

from ._api import (LATENT_DIM, PagedFp8Cache, QuantizedQuery, append, decode_fp8,
                   gather_dequant, quantize_query)
from . import flash_mla
from .flash_mla import plan_of_metadata

__all__ = ["quantize_and_cache_k", "quantize_ckv_per_token_head", "get_mla_metadata",
           "flash_mla_ckv_fp8_per_token", "dequantize_ckv_fused_indexed"]


def _check_latent_width(name: str, value: int) -> None:
    if int(value) != LATENT_DIM:
        raise ValueError(f"snapmla.fluentllm: {name} must be {LATENT_DIM}, got {value}")


def _rows(x: Any) -> Any:
    return x.reshape(-1, x.shape[-1])


def get_mla_metadata(cache_seqlens: Any, num_q_tokens_per_head_k: int,
                     num_heads_k: int) -> Tuple[Any, Any]:
    """(tile_scheduler_metadata, num_splits) for flash_mla_ckv_fp8_per_token."""
    return flash_mla.get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k)


def quantize_and_cache_k(key: Any, k_lora_cache: Any, k_lora_scale_cache: Any, k_rope_cache: Any,
                         indices: Any, head_dim_v: int = LATENT_DIM) -> None:
    _check_latent_width("head_dim_v", head_dim_v)
    append(PagedFp8Cache(k_lora_cache, k_lora_scale_cache, k_rope_cache), _rows(key), indices)


def quantize_ckv_per_token_head(q: Any, kv_lora_rank: int = LATENT_DIM) -> Tuple[Any, Any, Any]:
    _check_latent_width("kv_lora_rank", kv_lora_rank)
    nope, rope, scale = quantize_query(q)
    return nope, scale.reshape(tuple(scale.shape) + (1,)), rope


def flash_mla_ckv_fp8_per_token(q_nope: Any, q_rope: Any, k_cache_lora: Any, k_cache_rope: Any,
                                q_scale: Any, k_scale: Any, block_table: Any, cache_seqlens: Any,
                                head_dim_v: int, tile_scheduler_metadata: Any, num_splits: Any,
                                softmax_scale: Optional[float] = None,
                                causal: bool = False) -> Tuple[Any, Any]:
    _check_latent_width("head_dim_v", head_dim_v)
    if softmax_scale is None:
        softmax_scale = (q_nope.shape[-1] + q_rope.shape[-1]) ** -0.5
    plan = plan_of_metadata(tile_scheduler_metadata, num_splits)
    return decode_fp8(QuantizedQuery(q_nope, q_rope, q_scale),
                      PagedFp8Cache(k_cache_lora, k_scale, k_cache_rope), block_table,
                      cache_seqlens, softmax_scale=softmax_scale, causal=causal, plan=plan,
                      empty_lse=math.inf)


def _contiguous(x: Any) -> Any:
    return x.contiguous() if hasattr(x, "contiguous") else x.copy()


def dequantize_ckv_fused_indexed(k_lora_cache: Any, k_rope_cache: Any, k_scale_cache: Any,
                                 indices: Any) -> Tuple[Any, Any]:
    """Contiguous (k_lora [n, .., 512], k_rope [n, .., 64]) in bf16: one fused gather-dequant,
    then a split of its [n, 576] rows (the native gather_dequant returns the rows unsplit)."""
    rows = gather_dequant(PagedFp8Cache(k_lora_cache, k_scale_cache, k_rope_cache), indices)
    n = rows.shape[0]
    per_head = len(k_lora_cache.shape) == 3 and int(k_lora_cache.shape[1]) == 1
    lora, rope = _contiguous(rows[:, :LATENT_DIM]), _contiguous(rows[:, LATENT_DIM:])
    if per_head:
        lora, rope = lora.reshape(n, 1, -1), rope.reshape(n, 1, -1)
    return lora, rope
