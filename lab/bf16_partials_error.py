"""What bf16 partials would cost in accuracy, on the CPU reference (no GPU needed).

A split sequence's decode writes each split's normalized rows and lse as fp32 partials, which the
combine merges. Storing those rows as bf16 would halve the bytes of the split epilogue and of the
combine (docs/kernels.md, "Small batches"). This measures the price against float64 attention on
the unquantized inputs, the accuracy study's truth:
  fp32 partials: the reference's decode_fp8 with a plan of equal splits (what runs today);
  bf16 partials: each split decoded alone by the same reference (its rows come out as bf16, its
                 lse as fp32), merged in float64 by the combine's rule, then rounded to bf16.
Both runs quantize the same cache and query, so the difference is the partials' rounding alone.
Prints the rel-L2 error against the truth of each, and of one against the other, per split length.
  python lab/bf16_partials_error.py [--tokens 32768] [--heads 16] [--q-gain 1 4] [--seed 1]
"""

from __future__ import annotations

import argparse
import math

import numpy as np

import snapmla

PAGE = 64


def bf16_bits(x):
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(bits):
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def mla_rows(rng, n, rope_scale):
    """MLA-like rows (as the Python tests make them): latent ~ N(0, 1) with a few large channels."""
    rows = rng.standard_normal((n, 576)).astype(np.float32)
    rows[:, :512] *= np.where(rng.random(512) < 0.02, 8.0, 1.0).astype(np.float32)
    rows[:, 512:] *= rope_scale
    return bf16_bits(rows)


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def run(tokens, heads, q_gain, split_pages, rng):
    pages = (tokens + PAGE - 1) // PAGE
    perm = rng.permutation(pages).astype(np.int32)
    slots = (perm[np.arange(tokens) // PAGE] * PAGE + np.arange(tokens) % PAGE).astype(np.int32)
    kv = mla_rows(rng, tokens, 30.0)
    cache = snapmla.alloc_fp8_cache(pages, np.zeros(1))
    snapmla.append(cache, kv, slots)
    q = mla_rows(rng, heads, 3.0).astype(np.uint16)
    q = bf16_bits(bf16_value(q) * q_gain).reshape(1, 1, heads, 576)
    scale = 1.0 / math.sqrt(192)
    qq = snapmla.quantize_query(q)
    truth, _ = snapmla.reference.attention_f64(bf16_value(q).reshape(1, heads, 576), bf16_value(kv), scale)
    truth = truth.reshape(heads, 512)
    table = perm.reshape(1, pages)
    seqlens = np.array([tokens], np.int32)
    whole, _ = snapmla.decode_fp8(qq, cache, table, seqlens, softmax_scale=scale)
    print(f"tokens {tokens}, h {heads}, query gain {q_gain}: one split  rel-L2 {rel_l2(bf16_value(whole).reshape(heads, 512), truth):.3e}")
    for sp in split_pages:
        n = (pages + sp - 1) // sp
        # fp32 partials: the reference's planned decode, n equal splits (n workers).
        plan = snapmla.plan_splits(seqlens, n)
        fp32_out, _ = snapmla.decode_fp8(qq, cache, table, seqlens, softmax_scale=scale, plan=plan)
        fp32_out = bf16_value(fp32_out).reshape(heads, 512).astype(np.float64)
        # bf16 partials: split k alone (its pages as a sequence of its own), rows rounded to bf16.
        begins = np.asarray(plan.split_begin)[:int(np.asarray(plan.split_offsets)[1])]
        bounds = list(begins) + [tokens]
        outs, lses = [], []
        for a, b in zip(bounds[:-1], bounds[1:]):
            sub = perm[a // PAGE:(b + PAGE - 1) // PAGE].reshape(1, -1)
            o, lse = snapmla.decode_fp8(qq, cache, sub, np.array([b - a], np.int32), softmax_scale=scale)
            outs.append(bf16_value(o).reshape(heads, 512).astype(np.float64))
            lses.append(np.asarray(lse, np.float64).reshape(heads))
        lse = np.stack(lses)  # [splits, h]
        top = lse.max(axis=0)
        w = np.exp(lse - top)
        merged = np.einsum("kh,khd->hd", w, np.stack(outs)) / w.sum(axis=0)[:, None]
        bf16_out = bf16_value(bf16_bits(merged)).astype(np.float64)
        print(f"  {len(outs):3d} splits of {sp:2d} pages: fp32 partials rel-L2 {rel_l2(fp32_out, truth):.3e}, "
              f"bf16 partials {rel_l2(bf16_out, truth):.3e} (x{rel_l2(bf16_out, truth) / rel_l2(fp32_out, truth):.3f}); "
              f"bf16 against fp32 partials {rel_l2(bf16_out, fp32_out):.3e}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--q-gain", type=float, nargs="+", default=[1.0, 4.0])
    ap.add_argument("--split-pages", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    for g in args.q_gain:
        run(args.tokens, args.heads, g, args.split_pages, rng)


if __name__ == "__main__":
    main()
