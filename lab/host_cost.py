"""Host cost of one eager decode call before the C++ library, without a GPU: the Python and
binding overhead of snapmla.decode_fp8 / decode_bf16 (DLPack functions, pointer path) and of
torch.ops.snapmla.decode_fp8 / decode_bf16 (the wrappers snapmla.torch.* and the ops called
directly), with _C's decode entry points replaced by a no-op, and the pieces that make it up.

    python lab/host_cost.py [--batch 4 --heads 128 --context 256 --device cpu] [--json FILE]

The arrays are PyTorch tensors of the real shapes (FP8 query [b, 1, h, 512], cache planes of
b * ceil(context / 64) pages, a split plan for 132 SMs) on --device (cpu by default; cuda on a
GPU machine, where the stream lookup and workspace allocation are the real ones). A first call
goes through the real entry points (the array path, every check, the CPU reference on cpu), so
the signature is known; then decode_fp8_raw / decode_bf16_raw are replaced by Python no-ops and
each entry is timed: the median over --rounds rounds of the mean of --calls calls, in us.

"floor" rows are what the pieces cannot go below: a nanobind function with decode_fp8_raw's
argument list and an empty body (lab/host_cost/floor.cpp, built here with g++ and nanobind's
combined source, once, into --build-dir), the Python no-op stub, and torch.empty. "stub" is
the cost of the Python no-op that stands in for the binding: entry rows include it, so
(entry - stub + nanobind floor) is the host cost an eager call pays before the C++ library.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import time

import torch

import snapmla
import snapmla.torch as st
from snapmla import _C

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def build_floor(build_dir):
    """The floor extension (floor.cpp), built once into build_dir; None where it cannot be."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    target = os.path.join(build_dir, "host_cost_floor" + suffix)
    source = os.path.join(HERE, "host_cost", "floor.cpp")
    if not os.path.exists(target) or os.path.getmtime(target) < os.path.getmtime(source):
        import nanobind

        nb = os.path.dirname(nanobind.include_dir())
        os.makedirs(build_dir, exist_ok=True)
        cmd = ["g++", "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden", "-DNDEBUG",
               "-I", nanobind.include_dir(), "-I", os.path.join(nb, "ext", "robin_map", "include"),
               "-I", sysconfig.get_paths()["include"], source, os.path.join(nb, "src", "nb_combined.cpp"),
               "-o", target]
        print("building the floor extension:", " ".join(cmd[:6]), "...", file=sys.stderr)
        try:
            subprocess.run(cmd, check=True)
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"no floor extension ({e})", file=sys.stderr)
            return None
    sys.path.insert(0, build_dir)
    import host_cost_floor

    return host_cost_floor


def make_case(b, h, context, device):
    dev = torch.device(device)
    pages_per_seq = (context + 63) // 64
    pages = b * pages_per_seq
    gen = torch.Generator().manual_seed(0)
    table = torch.randperm(pages, generator=gen).to(torch.int32).view(b, pages_per_seq).to(dev)
    seqlens = torch.full((b,), context, dtype=torch.int32, device=dev)
    kv = (torch.randn(pages * 64, 576, generator=gen) / 10).to(torch.bfloat16).to(dev)
    slots = torch.arange(pages * 64, dtype=torch.int32, device=dev)
    fp8 = snapmla.alloc_fp8_cache(pages, kv)
    snapmla.append(fp8, kv, slots)
    k16 = kv.view(pages, 64, 576).clone()
    q = (torch.randn(b, 1, h, 576, generator=gen) / 10).to(torch.bfloat16).to(dev)
    qq = snapmla.quantize_query(q)
    # H200: 132 SMs over ceil(h / 64) row tiles (recommended_num_workers on the GPU).
    plan = snapmla.plan_splits(seqlens, max(1, 132 // ((h + 63) // 64)))
    return dict(q=q, qq=qq, fp8=fp8, k16=k16, block_table=table, cache_seqlens=seqlens, plan=plan,
                softmax_scale=576 ** -0.5)


def time_per_call(fn, calls, rounds):
    """Median over rounds of the mean time per call of `calls` calls, in us (GC off, as timeit)."""
    for _ in range(min(calls, 50)):
        fn()
    samples = []
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(rounds):
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                fn()
            samples.append((time.perf_counter_ns() - t0) / calls / 1e3)
    finally:
        if gc_was:
            gc.enable()
    return statistics.median(samples)


class Stubs:
    """_C's decode entry points replaced by Python no-ops that count their calls."""

    NAMES = ("decode_fp8", "decode_bf16", "decode_fp8_raw", "decode_bf16_raw")

    def __init__(self):
        self.real = {n: getattr(_C, n) for n in self.NAMES}
        self.calls = dict.fromkeys(self.NAMES, 0)

    def _stub(self, name):
        def stub(*args):
            self.calls[name] += 1
        return stub

    def __enter__(self):
        for n in self.NAMES:
            setattr(_C, n, self._stub(n))
        return self

    def __exit__(self, *exc):
        for n, f in self.real.items():
            setattr(_C, n, f)


def entry_calls(c):
    plan, qq, fp8 = c["plan"], c["qq"], c["fp8"]
    kw = dict(softmax_scale=c["softmax_scale"], plan=plan)
    t, s = c["block_table"], c["cache_seqlens"]
    ops = torch.ops.snapmla
    scale = float(c["softmax_scale"])
    return {
        "snapmla.decode_fp8": lambda: snapmla.decode_fp8(qq, fp8, t, s, **kw),
        "snapmla.decode_bf16": lambda: snapmla.decode_bf16(c["q"], c["k16"], t, s, **kw),
        "snapmla.torch.decode_fp8 (op wrapper)": lambda: st.decode_fp8(qq, fp8, t, s, **kw),
        "snapmla.torch.decode_bf16 (op wrapper)": lambda: st.decode_bf16(c["q"], c["k16"], t, s, **kw),
        "torch.ops.snapmla.decode_fp8": lambda: ops.decode_fp8(
            qq.nope, qq.rope, qq.scale, fp8.latent, fp8.scale, fp8.rope, t, s, scale, True,
            plan.split_offsets, plan.split_begin, plan.worker_splits),
        "torch.ops.snapmla.decode_fp8.default": lambda: ops.decode_fp8.default(
            qq.nope, qq.rope, qq.scale, fp8.latent, fp8.scale, fp8.rope, t, s, scale, True,
            plan.split_offsets, plan.split_begin, plan.worker_splits),
    }


def piece_calls(c, floor):
    """The building blocks: what one tensor's attributes, one allocation, one stream lookup and
    a nanobind call cost here."""
    q = c["qq"].nope
    dev, bf16 = q.device, torch.bfloat16
    b, s_q, h = q.shape[:3]
    pieces = {
        "floor: Python no-op stub, 19 args": (lambda f: lambda: f(*range(19)))(lambda *a: None),
        "floor: torch.empty (dtype, device cached)": lambda: torch.empty((b, s_q, h, 512), dtype=bf16, device=dev),
        "floor: Tensor.new_empty": lambda: q.new_empty((b, s_q, h, 512), dtype=bf16),
        "tensor: .shape": lambda: q.shape,
        "tensor: .stride()": lambda: q.stride(),
        "tensor: .dtype": lambda: q.dtype,
        "tensor: .get_device()": lambda: q.get_device(),
        "tensor: .data_ptr()": lambda: q.data_ptr(),
        "tensor: .is_contiguous()": lambda: q.is_contiguous(),
        "tensor: .device": lambda: q.device,
        "tensor: .is_cuda": lambda: q.is_cuda,
        "snapmla: current_stream(q, None)": lambda: snapmla._frameworks.current_stream(q, None),
        "snapmla: _frameworks.empty": lambda: snapmla._frameworks.empty(q, (b, s_q, h, 512), "bf16"),
    }
    if floor is not None:
        shape = floor.Shape(4, 1, 128, 16, 4, 70, 1 << 20, 2, 0)
        ptrs = [q.data_ptr()] * 14
        pieces["floor: nanobind, no arguments"] = floor.nothing
        pieces["floor: nanobind, decode_fp8_raw's arguments"] = lambda: floor.decode_fp8_raw(
            *ptrs, shape, 0.1, True, float("-inf"), 0)
        pieces["floor: nanobind, decode_bf16_raw's arguments"] = lambda: floor.decode_bf16_raw(
            *ptrs[:10], shape, 0.1, True, float("-inf"), 0)
    return pieces


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=101)
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build", "lab_host_cost"))
    ap.add_argument("--no-floor", action="store_true", help="skip building the nanobind floor extension")
    ap.add_argument("--json", help="write the medians here")
    ap.add_argument("--inference-mode", action="store_true",
                    help="time under torch.inference_mode(), as engines run decode steps (autograd has nothing to follow)")
    a = ap.parse_args()
    floor = None if a.no_floor else build_floor(a.build_dir)
    c = make_case(a.batch, a.heads, a.context, a.device)
    entries = entry_calls(c)
    for fn in entries.values():  # the array path once: every check, the signature recorded
        fn()
    results = {}
    with Stubs() as stubs, (torch.inference_mode() if a.inference_mode else contextlib.nullcontext()):
        for name, fn in entries.items():
            before = dict(stubs.calls)
            results[name] = time_per_call(fn, a.calls, a.rounds)
            took = [n for n in stubs.NAMES if stubs.calls[n] != before[n]]
            if took not in (["decode_fp8_raw"], ["decode_bf16_raw"]):
                raise SystemExit(f"{name}: expected the pointer path, the calls went to {took}")
    for name, fn in piece_calls(c, floor).items():
        results[name] = time_per_call(fn, a.calls, a.rounds)
    print(f"b={a.batch} h={a.heads} s_k={a.context} on {a.device}, torch {torch.__version__}, "
          f"median of {a.rounds} rounds x {a.calls} calls (us per call)"
          + (", entries under inference_mode" if a.inference_mode else ""))
    for name, us in results.items():
        print(f"{name:52} {us:8.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
