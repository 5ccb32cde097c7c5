"""One engine decode step for one MLA layer, with a BF16 and an FP8 (SnapMLA) cache side by side.

    append the new token's latent+rope row -> quantize the query -> plan splits -> decode

Prints each path's error against float64 attention on the unquantized data, and its time. Runs
on an sm_90 GPU with PyTorch (CUDA events, medians over repeats), else on the CPU reference
(NumPy, or PyTorch CPU tensors): `python examples/decode_step.py [--batch 8 --heads 128
--context 4096]`.
"""

import argparse
import math
import statistics
import time

import numpy as np

import snapmla

try:
    import torch
except ImportError:  # the CPU path needs only NumPy
    torch = None


def bf16(x):
    """float32 NumPy -> the framework's bf16 array (torch.bfloat16, or uint16 bits in NumPy)."""
    if torch is not None:
        return torch.from_numpy(x).to(torch.bfloat16)
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def as_f32(x):
    if torch is not None:
        return x.float().cpu().numpy()
    return (x.astype(np.uint32) << 16).view(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--context", type=int, default=4096, help="tokens already in the cache")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    b, h, n = args.batch, args.heads, args.context
    gpu = torch is not None and torch.cuda.is_available() and snapmla.cuda_device_available()
    print(snapmla.info())
    print(f"batch {b}, heads {h}, context {n} + 1 new token, on {'the GPU' if gpu else 'the CPU'}")

    rng = np.random.default_rng(0)
    dev = "cuda" if gpu else "cpu"
    move = (lambda x: x.to(dev)) if torch is not None else (lambda x: x)
    # The layer's state: a paged cache holding n tokens per sequence (random page order).
    pages_per_seq = (n + 1 + 63) // 64
    num_pages = b * pages_per_seq
    table = rng.permutation(num_pages).astype(np.int32).reshape(b, pages_per_seq)
    # MLA-like rows: latent ~ N(0, 1) with a few large channels, rope about 20x wider.
    kv = rng.standard_normal((b, n + 1, 576)).astype(np.float32)
    kv[..., :512] *= np.where(rng.random(512) < 0.02, 6.0, 1.0).astype(np.float32)
    kv[..., 512:] *= 20
    t = np.arange(n + 1)
    slots = (table[:, t // 64] * 64 + t % 64).astype(np.int32)  # [b, n + 1]

    like = move(bf16(np.zeros(1, np.float32)))
    fp8 = snapmla.alloc_fp8_cache(num_pages, like)
    bf = snapmla.alloc_bf16_cache(num_pages, like)
    history = move(bf16(kv[:, :n].reshape(-1, 576)))
    hist_slots = move(_i32(slots[:, :n].reshape(-1)))
    snapmla.append(fp8, history, hist_slots)
    snapmla.append(bf, history, hist_slots)

    # This step's inputs: the new token's row per sequence, the query, the new lengths.
    new_kv = move(bf16(kv[:, n]))
    new_slots = move(_i32(slots[:, n]))
    q_np = rng.standard_normal((b, 1, h, 576)).astype(np.float32)
    q_np[..., 512:] *= 0.3
    q = move(bf16(q_np))
    block_table = move(_i32(table))
    seqlens = move(_i32(np.full(b, n + 1)))
    scale = 1 / math.sqrt(192)
    workers = snapmla.recommended_num_workers(q, 1, h)

    def step_fp8():
        snapmla.append(fp8, new_kv, new_slots)
        qq = snapmla.quantize_query(q)
        plan = snapmla.plan_splits(seqlens, workers)
        return snapmla.decode_fp8(qq, fp8, block_table, seqlens, softmax_scale=scale, plan=plan)

    def step_bf16():
        snapmla.append(bf, new_kv, new_slots)
        plan = snapmla.plan_splits(seqlens, workers)
        return snapmla.decode_bf16(q, bf, block_table, seqlens, softmax_scale=scale, plan=plan)

    results = {}
    for name, step in (("bf16", step_bf16), ("fp8", step_fp8)):
        out, lse = step()
        times = []
        for _ in range(args.repeats if gpu else 2):
            times.append(_time(step, gpu))
        results[name] = (as_f32(out), statistics.median(times))

    # float64 truth on the unquantized (bf16-rounded) inputs, for a few sequences.
    check = range(min(b, 4))
    err = {k: [] for k in results}
    for i in check:
        qi, kvi = as_f32(q[i]), as_f32(move(bf16(kv[i])))
        ref, _ = snapmla.reference.attention_f64(np.ascontiguousarray(qi), np.ascontiguousarray(kvi), scale)
        for k, (out, _) in results.items():
            err[k].append(np.linalg.norm(out[i] - ref) / np.linalg.norm(ref))
    print(f"{'cache':6} {'bytes/token':>11} {'step time':>12} {'rel-L2 vs float64':>18}")
    for k, (out, us) in results.items():
        bpt = 644 if k == "fp8" else 1152
        print(f"{k:6} {bpt:>11} {us:>9.1f} us {statistics.mean(err[k]):>18.4%}")
    print(f"fp8 / bf16 step time: {results['fp8'][1] / results['bf16'][1]:.2f}")


def _i32(x):
    x = np.ascontiguousarray(x, np.int32)
    return torch.from_numpy(x) if torch is not None else x


def _time(step, gpu):
    if gpu:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3
    t0 = time.perf_counter()
    step()
    return (time.perf_counter() - t0) * 1e6


if __name__ == "__main__":
    main()
