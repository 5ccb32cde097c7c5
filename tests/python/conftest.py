"""Shared helpers for the Python tests: an independent NumPy formulation of SnapMLA's formats
(e4m3 and bf16 rounding from their bit layouts, the per-token quantization rule) and float64
attention. Nothing here calls snapmla, so the tests compare two independent implementations."""

import os

import numpy as np
import pytest

# --- bf16 -------------------------------------------------------------------------------------


def bf16_bits(x):
    """float32 -> bf16 bits, round to nearest even (finite inputs)."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(bits):
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


# --- e4m3 (OCP float8_e4m3fn: bias 7, no infinities, 0x7F/0xFF NaN, max 448) -------------------


def e4m3_value(codes):
    c = np.asarray(codes, np.uint8).astype(np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    exp = (c >> 3) & 0xF
    man = c & 0x7
    val = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1 + man / 8.0) * 2.0 ** (exp - 7.0))
    val = np.where((c & 0x7F) == 0x7F, np.nan, val)
    return (sign * val).astype(np.float64)


_POS = e4m3_value(np.arange(0x7F, dtype=np.uint8))  # codes 0..0x7E, increasing, 0..448


def e4m3_bits(x):
    """float32 values -> e4m3 codes: round to nearest, ties to even code, saturate at 448."""
    x = np.asarray(x, np.float32).astype(np.float64)
    a = np.minimum(np.abs(x), 448.0)
    hi = np.clip(np.searchsorted(_POS, a, side="left"), 1, len(_POS) - 1)
    lo = hi - 1
    d_lo, d_hi = a - _POS[lo], _POS[hi] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo)
    code = np.where(a == 0, 0, code)
    return (code | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


# --- the per-token quantization rule (docs/reference.md, scales) ---------------------------------


def quantize_rows(rows_bits):
    """rows [n, 576] bf16 bits -> (latent codes [n, 512], scale [n] f32, rope bits [n, 64])."""
    rows = bf16_value(rows_bits)
    amax = np.max(np.abs(rows[:, :512]), axis=1)
    a = np.maximum(amax, np.float32(1e-10)).astype(np.float32)
    scale = (a / np.float32(448.0)).astype(np.float32)
    inv = (np.float32(448.0) / a).astype(np.float32)
    latent = e4m3_bits((rows[:, :512] * inv[:, None]).astype(np.float32))
    rope = bf16_bits((rows[:, 512:] * inv[:, None]).astype(np.float32))
    return latent, scale, rope


def dequantize_rows(latent, scale, rope):
    """The values the FP8 cache holds, as float64 [n, 576]."""
    s = np.asarray(scale, np.float64)[:, None]
    return np.concatenate([e4m3_value(latent) * s, bf16_value(rope).astype(np.float64) * s], axis=1)


# --- float64 attention --------------------------------------------------------------------------


def attention(q, kv, softmax_scale, causal=True, with_abs=False):
    """q [s_q, h, 576], kv [s_k, 576] float64 -> out [s_q, h, 512], lse [h, s_q]; with_abs
    also gives sum_t p_t |v_t| [s_q, h, 512], the scale of rounding errors in the weights."""
    s_q, h, _ = q.shape
    s_k = kv.shape[0]
    out = np.zeros((s_q, h, 512))
    out_abs = np.zeros((s_q, h, 512))
    lse = np.full((h, s_q), -np.inf)
    for i in range(s_q):
        visible = s_k - s_q + i + 1 if causal else s_k
        if visible <= 0:
            continue
        s = softmax_scale * (q[i] @ kv[:visible].T)  # [h, visible]
        m = s.max(axis=1, keepdims=True)
        p = np.exp(s - m)
        lse[:, i] = np.log(p.sum(axis=1)) + m[:, 0]
        out[i] = (p / p.sum(axis=1, keepdims=True)) @ kv[:visible, :512]
        out_abs[i] = (p / p.sum(axis=1, keepdims=True)) @ np.abs(kv[:visible, :512])
    return (out, lse, out_abs) if with_abs else (out, lse)


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


@pytest.fixture
def rng():
    """Fresh random inputs each run; the seed is printed so a failure can be replayed."""
    seed = int(os.environ.get("SNAPMLA_TEST_SEED", np.random.SeedSequence().entropy % (2**32)))
    print(f"SNAPMLA_TEST_SEED={seed}")
    return np.random.default_rng(seed)


def make_paged(rng, seqlens, max_pages=None, nan_fill=True):
    """A random page permutation for `seqlens`: block_table [b, max_pages] and the slots of
    each sequence's tokens, in order. Unused table entries point at a page that exists."""
    b = len(seqlens)
    need = [(s + 63) // 64 for s in seqlens]
    max_pages = max_pages or max(1, max(need))
    num_pages = sum(need) + 3
    perm = rng.permutation(num_pages)
    table = np.zeros((b, max_pages), np.int32)
    slots, k = [], 0
    for i, s in enumerate(seqlens):
        pages = perm[k:k + need[i]]
        k += need[i]
        table[i, :need[i]] = pages
        t = np.arange(s)
        slots.append((pages[t // 64] * 64 + t % 64).astype(np.int32) if s else np.zeros(0, np.int32))
    return table, slots, num_pages
