"""Host cost of one decode call from Python: snapmla.decode_fp8 (DLPack arguments), the torch
custom op, and a CUDA-graph replay of the same step, against the kernel time (CUDA events).
Needs PyTorch and an sm_90 GPU: `python lab/py_call_overhead.py`."""

import time

import torch

import snapmla
import snapmla.torch as st


def main(b=64, h=128, n=4096, calls=200):
    dev = "cuda"
    pages = b * ((n + 63) // 64)
    table = torch.randperm(pages, dtype=torch.int32, device=dev).view(b, -1)
    seqlens = torch.full((b,), n, dtype=torch.int32, device=dev)
    cache = snapmla.alloc_fp8_cache(pages, table)
    kv = torch.randn(pages * 64, 576, device=dev).to(torch.bfloat16)
    snapmla.append(cache, kv, torch.arange(pages * 64, dtype=torch.int32, device=dev))
    qq = snapmla.quantize_query(torch.randn(b, 1, h, 576, device=dev).to(torch.bfloat16))
    plan = snapmla.plan_splits(seqlens, snapmla.recommended_num_workers(table, 1, h))
    variants = {
        "snapmla.decode_fp8 (DLPack)": lambda: snapmla.decode_fp8(qq, cache, table, seqlens, softmax_scale=0.07, plan=plan),
        "torch.ops.snapmla.decode_fp8": lambda: st.decode_fp8(qq, cache, table, seqlens, softmax_scale=0.07, plan=plan),
    }
    graph = torch.cuda.CUDAGraph()
    variants["torch.ops.snapmla.decode_fp8"]()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        variants["torch.ops.snapmla.decode_fp8"]()
    variants["CUDA graph replay"] = graph.replay
    for name, fn in variants.items():
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        host_us = (time.perf_counter() - t0) / calls * 1e6
        torch.cuda.synchronize()
        wall_us = (time.perf_counter() - t0) / calls * 1e6
        print(f"{name:32} host {host_us:8.1f} us/call, wall {wall_us:8.1f} us/call")


if __name__ == "__main__":
    main()
