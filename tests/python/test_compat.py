"""The drop-in entry points (FlashMLA-style and SGLang-FluentLLM-style) give what the native API
gives, with their own argument orders and shapes (NumPy arrays: the CPU path)."""

import numpy as np
import pytest

import snapmla
from snapmla import flash_mla, fluentllm
from conftest import make_paged
from test_ops_numpy import build_case, random_rows


def test_flash_mla_with_kvcache_is_decode_bf16(rng):
    seqlens = np.array([300, 7, 129], np.int32)
    q, table, _, _, cache16 = build_case(rng, seqlens, 2, 16)
    k_cache = cache16.reshape(-1, 64, 1, 576)  # FlashMLA's [num_blocks, 64, h_kv, 576]
    meta, num_splits = flash_mla.get_mla_metadata(seqlens, 2 * 16, 1)
    assert num_splits.shape == (4,) and num_splits[0] == 0
    out, lse = flash_mla.flash_mla_with_kvcache(q, k_cache, table, seqlens, 512, meta, num_splits,
                                                causal=True)
    cap = len(meta) // 2  # the metadata: split_begin, then worker_splits
    plan = snapmla.SplitPlan(num_splits, meta[:cap], 0, meta[cap:])
    ref_out, ref_lse = snapmla.decode_bf16(q, cache16, table, seqlens, softmax_scale=576 ** -0.5,
                                           causal=True, plan=plan)
    assert np.array_equal(out, ref_out) and np.array_equal(lse, ref_lse)
    with pytest.raises(NotImplementedError):
        flash_mla.flash_mla_with_kvcache(q, k_cache, table, seqlens, 512, meta, num_splits,
                                         is_fp8_kvcache=True)
    with pytest.raises(ValueError):
        flash_mla.flash_mla_with_kvcache(q, k_cache, table, seqlens, 576, meta, num_splits)


def test_fluentllm_flow_is_the_native_flow(rng):
    """quantize_and_cache_k -> quantize_ckv_per_token_head -> flash_mla_ckv_fp8_per_token, on
    FluentLLM's flat per-slot cache shapes, equals append -> quantize_query -> decode_fp8."""
    seqlens = np.array([150, 64], np.int32)
    table, slots, num_pages = make_paged(rng, seqlens)
    n_slots = num_pages * 64
    lora = np.zeros((n_slots, 1, 512), np.uint8)
    scale = np.zeros((n_slots, 1), np.float32)
    rope = np.zeros((n_slots, 1, 64), np.uint16)
    native = snapmla.alloc_fp8_cache(num_pages, lora)
    for s in slots:
        key = random_rows(rng, len(s))
        fluentllm.quantize_and_cache_k(key.reshape(-1, 1, 576), lora, scale, rope, s, 512)
        snapmla.append(native, key, s)
    assert np.array_equal(lora.reshape(native.latent.shape), native.latent)
    assert np.array_equal(scale.reshape(native.scale.shape), native.scale)
    q = random_rows(rng, 2 * 1 * 32).reshape(2, 1, 32, 576)
    q_nope, q_scale, q_rope = fluentllm.quantize_ckv_per_token_head(q, 512)
    assert q_scale.shape == (2, 1, 32, 1)
    meta, num_splits = fluentllm.get_mla_metadata(seqlens, 32, 1)
    o, lse = fluentllm.flash_mla_ckv_fp8_per_token(
        q_nope, q_rope, lora.reshape(-1, 64, 1, 512), rope.reshape(-1, 64, 1, 64), q_scale,
        scale.reshape(-1, 64, 1, 1), table, seqlens, 512, meta, num_splits)
    ref_o, ref_lse = snapmla.decode_fp8(snapmla.quantize_query(q), native, table, seqlens,
                                        softmax_scale=576 ** -0.5, causal=False,
                                        plan=snapmla.SplitPlan(num_splits, meta[:len(meta) // 2], 0,
                                                               meta[len(meta) // 2:]))
    assert np.array_equal(o, ref_o) and np.array_equal(lse, ref_lse)
    k_lora, k_rope = fluentllm.dequantize_ckv_fused_indexed(lora, rope, scale, slots[0])
    assert k_lora.shape == (150, 1, 512) and k_rope.shape == (150, 1, 64)
    rows = snapmla.gather_dequant(native, slots[0])
    assert np.array_equal(k_lora[:, 0], rows[:, :512]) and np.array_equal(k_rope[:, 0], rows[:, 512:])
    with pytest.raises(ValueError):
        fluentllm.quantize_ckv_per_token_head(q, 448)
