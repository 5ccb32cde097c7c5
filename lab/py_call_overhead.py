"""Host cost of one eager decode call from Python, in one process: snapmla.decode_fp8 /
decode_bf16 (DLPack functions, pointer path after the first call), the torch ops, the
FlashMLA drop-in and a CUDA-graph replay, and, through a hook, other libraries' calls on the
same inputs.

    python lab/py_call_overhead.py [--batch 4 --heads 128 --context 256 --calls 500 --rounds 7]
                                     [--peers path/to/peers.py]

"host" is the time the Python loop takes per call without waiting (what an eager engine pays
per layer when the GPU waits on the host), "wall" the time per call until the GPU is done,
"GPU" the CUDA-event span of the loop per call (the kernels' time where they, not the host,
are the bottleneck; the host's where it is). Each is the median over --rounds loops of --calls
calls, the calls of all entries interleaved round by round.
Needs PyTorch and an sm_90 GPU.

"library" (snapmla's calls only) is what the call costs past the Python side: host minus the
same call's host time with _C's decode entry points replaced by a Python no-op (lab/host_cost.py's
stubs, in this process, on these tensors), plus that no-op's own cost; so it is the binding, the
checks in C++, the tensor maps and the launches.

The hook: --peers names a Python file defining

    def peer_calls(case) -> dict[str, Callable[[], object]]

that returns named zero-argument calls to time beside SnapMLA's, or the peers.py of the shared
peers folder (its FlashMLA and PR54 classes, FlashMLA's dense BF16 decode and its FP8 fork, are
then called as an engine does: metadata once, outside the timed call). `case` holds the inputs as
torch tensors on the GPU, FlashMLA's layout: case.q [b, 1, h, 576] bf16, case.k_cache
[pages, 64, 1, 576] bf16, case.block_table [b, max_pages] int32, case.cache_seqlens [b] int32,
case.softmax_scale, and the FP8 forms case.qq (snapmla.QuantizedQuery) and case.fp8
(snapmla.PagedFp8Cache). A peer call should do what its library's eager decode step does
(metadata once outside, the decode inside).
"""

import argparse
import contextlib
import importlib.util
import os
import statistics
import sys
import time
from types import SimpleNamespace

import torch

import snapmla
import snapmla.torch as st
from snapmla import flash_mla

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import host_cost  # noqa: E402  (lab/host_cost.py: the stubs and the timing loop)


def make_case(b, h, n):
    dev = "cuda"
    pages = b * ((n + 63) // 64)
    table = torch.randperm(pages, dtype=torch.int32, device=dev).view(b, -1)
    seqlens = torch.full((b,), n, dtype=torch.int32, device=dev)
    kv = (torch.randn(pages * 64, 576, device=dev) / 10).to(torch.bfloat16)
    slots = torch.arange(pages * 64, dtype=torch.int32, device=dev)
    fp8 = snapmla.alloc_fp8_cache(pages, table)
    snapmla.append(fp8, kv, slots)
    k_cache = kv.view(pages, 64, 1, 576).clone()
    q = (torch.randn(b, 1, h, 576, device=dev) / 10).to(torch.bfloat16)
    return SimpleNamespace(q=q, qq=snapmla.quantize_query(q), fp8=fp8, k_cache=k_cache, block_table=table,
                           cache_seqlens=seqlens, softmax_scale=576 ** -0.5, b=b, h=h)


def snapmla_calls(c):
    plan = snapmla.plan_splits(c.cache_seqlens, snapmla.recommended_num_workers(c.q, 1, c.h))
    k16 = c.k_cache.view(-1, 64, 576)
    meta, num_splits = flash_mla.get_mla_metadata(c.cache_seqlens, c.h, 1)
    sched, _ = flash_mla.get_mla_metadata()
    kw = dict(softmax_scale=c.softmax_scale, plan=plan)
    ops = torch.ops.snapmla
    return {
        "snapmla.decode_fp8": lambda: snapmla.decode_fp8(c.qq, c.fp8, c.block_table, c.cache_seqlens, **kw),
        "snapmla.decode_bf16": lambda: snapmla.decode_bf16(c.q, k16, c.block_table, c.cache_seqlens, **kw),
        "snapmla.torch.decode_fp8 (op wrapper)": lambda: st.decode_fp8(c.qq, c.fp8, c.block_table,
                                                                        c.cache_seqlens, **kw),
        "snapmla.torch.decode_bf16 (op wrapper)": lambda: st.decode_bf16(c.q, k16, c.block_table,
                                                                          c.cache_seqlens, **kw),
        "torch.ops.snapmla.decode_fp8": lambda: ops.decode_fp8(
            *c.qq, *c.fp8, c.block_table, c.cache_seqlens, c.softmax_scale, True, *plan[:2], plan.worker_splits),
        "torch.ops.snapmla.decode_bf16": lambda: ops.decode_bf16(
            c.q, k16, c.block_table, c.cache_seqlens, c.softmax_scale, True, *plan[:2], plan.worker_splits),
        "snapmla.flash_mla (arrays)": lambda: flash_mla.flash_mla_with_kvcache(
            c.q, c.k_cache, c.block_table, c.cache_seqlens, 512, meta, num_splits, causal=True),
        "snapmla.flash_mla (sched meta)": lambda: flash_mla.flash_mla_with_kvcache(
            c.q, c.k_cache, c.block_table, c.cache_seqlens, 512, sched, None, causal=True),
    }


def load_peers(path, case):
    spec = importlib.util.spec_from_file_location("peers", path)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec.loader.exec_module(mod)
    if hasattr(mod, "peer_calls"):
        return mod.peer_calls(case)
    # A peers.py with the FlashMLA and FP8-fork loaders (as snapmla.bench --peers takes): FlashMLA's
    # BF16 decode and its FP8 fork, on the same tensors (the fork's FP8 query and cache are casts, scale 1: its host cost does not depend
    # on the values).
    folder = os.path.dirname(os.path.abspath(path))
    fm = mod.FlashMLA(case.cache_seqlens, 1, case.h, folder=folder)
    f8 = mod.PR54(case.cache_seqlens, 1, case.h, folder=folder)
    q8, k8 = case.q.to(torch.float8_e4m3fn), case.k_cache.to(torch.float8_e4m3fn)
    return {
        "FlashMLA (BF16)": lambda: fm(case.q, case.k_cache, case.block_table, case.cache_seqlens,
                                      case.softmax_scale, True),
        "FlashMLA FP8 fork (PR #54)": lambda: f8(q8, k8, case.block_table, case.cache_seqlens,
                                                 case.softmax_scale, True),
    }


def time_loop(fn, calls):
    """(host, wall, GPU) us per call of one loop of `calls` calls."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(calls):
        fn()
    host_us = (time.perf_counter() - t0) / calls * 1e6
    end.record()
    torch.cuda.synchronize()
    wall_us = (time.perf_counter() - t0) / calls * 1e6
    return host_us, wall_us, start.elapsed_time(end) * 1e3 / calls


def time_all(calls, n, rounds):
    """Median (host, wall, GPU) per entry over `rounds` rounds, each round one loop per entry."""
    for fn in calls.values():
        for _ in range(20):
            fn()
    samples = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            samples[name].append(time_loop(fn, n))
    return {name: tuple(statistics.median(x[i] for x in s) for i in range(3)) for name, s in samples.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--peers", help="a Python file with peer_calls(case), or a peers.py with the FlashMLA / FP8-fork loaders")
    ap.add_argument("--inference-mode", action="store_true",
                    help="time under torch.inference_mode(), as engines run decode steps")
    a = ap.parse_args()
    case = make_case(a.batch, a.heads, a.context)
    calls = snapmla_calls(case)
    ours = list(calls)
    graph = torch.cuda.CUDAGraph()
    calls["snapmla.torch.decode_fp8 (op wrapper)"]()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        calls["snapmla.torch.decode_fp8 (op wrapper)"]()
    calls["CUDA graph replay (decode_fp8 op wrapper)"] = graph.replay
    if a.peers:
        calls.update({f"peer: {k}": v for k, v in load_peers(a.peers, case).items()})
    mode = torch.inference_mode if a.inference_mode else contextlib.nullcontext
    with mode():
        times = time_all(calls, a.calls, a.rounds)
    # The same calls with the decode entry points stubbed: the Python side alone.
    with host_cost.Stubs(), mode():
        stubbed = time_all({k: calls[k] for k in ours}, a.calls, a.rounds)
    stub = host_cost.time_per_call((lambda f: lambda: f(*range(19)))(lambda *x: None), a.calls, a.rounds)
    print(f"b={a.batch} h={a.heads} s_k={a.context}, torch {torch.__version__}, median of {a.rounds} rounds "
          f"x {a.calls} calls (us per call)" + (", under inference_mode" if a.inference_mode else ""))
    print(f"{'call':40} {'host':>8} {'wall':>8} {'GPU':>8} {'Python':>8} {'library':>8}")
    for name, (host, wall, gpu) in times.items():
        if name in stubbed:
            py = stubbed[name][0] - stub
            print(f"{name:40} {host:8.1f} {wall:8.1f} {gpu:8.1f} {py:8.1f} {host - py:8.1f}")
        else:
            print(f"{name:40} {host:8.1f} {wall:8.1f} {gpu:8.1f}")


if __name__ == "__main__":
    main()
