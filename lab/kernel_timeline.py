"""Where a decode call's time goes at small batches: the device time of each kernel of one call
(the decode, the combine; the peers' decode and combine) beside the call's graph-replayed time,
so the difference is what the GPU spends between kernels (launch, ramp-up, tail). decode_fp8 is
also timed under lab settings of the environment (--env; default SNAPMLA_COMBINE_PDL=1 and =late; several
settings at once joined by commas), in the same interleaved rounds, for a same-run A/B of a lab option.

    python lab/kernel_timeline.py [--peers DIR] [--cases b,h,s_q,s_k ...] [--replays N] [--env NAME=VALUE ...]

Every kernel runs on the bench's inputs (snapmla.bench.case_inputs: randn / 10, permuted pages),
as a CUDA graph of --calls calls; the per-call time is the median of 5 interleaved rounds (as the
bench), and the kernels' durations come from the CUDA activity records of --replays further
replays under torch.profiler (CUPTI records the kernels of graph launches). Prints one line per
(case, kernel): the call time, the summed kernel time per call and each kernel's share.
"""

from __future__ import annotations

import argparse
import statistics


def kernel_times(torch, graph, replays):
    """{kernel name: total device us} and the kernel count over `replays` replays of `graph`."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    totals, count = {}, 0
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA or "memcpy" in e.name.lower() or "memset" in e.name.lower():
            continue
        totals[e.name] = totals.get(e.name, 0.0) + e.time_range.elapsed_us()
        count += 1
    return totals, count


def short(name: str) -> str:
    """A kernel's name without its template arguments and namespaces."""
    base = name.replace("(anonymous namespace)::", "").removeprefix("void ")
    base = base.split("(")[0].split("<")[0]
    return base.split("::")[-1] or name[:40]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", metavar="DIR", help="folder with peers.py (FlashMLA BF16 and FP8 loaders)")
    ap.add_argument("--cases", nargs="+", default=["1,16,1,8192", "1,128,1,8192", "2,16,1,8192", "4,64,1,8192",
                                                    "1,128,1,1024", "8,128,1,8192"])
    ap.add_argument("--calls", type=int, default=10, help="decode calls per CUDA graph")
    ap.add_argument("--replays", type=int, default=20, help="graph replays under the profiler")
    ap.add_argument("--env", nargs="*", default=["SNAPMLA_COMBINE_PDL=1", "SNAPMLA_COMBINE_PDL=late"], metavar="NAME=VALUE",
                    help="also time decode_fp8 with each of these environment settings (read per call, kept "
                         "by the graph captured under it); default: SNAPMLA_COMBINE_PDL=1 and =late")
    args = ap.parse_args(argv)
    import torch

    import snapmla
    from snapmla import bench

    peers = bench.load_peers(args.peers) if args.peers else None
    for text in args.cases:
        case = bench.parse_case(text)
        b, h, s_q, s_k = case
        x = bench.case_inputs(torch, snapmla, case, args.calls)
        workers = snapmla.recommended_num_workers(x.q, s_q, h)
        plan = snapmla.plan_splits(x.seqlens, workers, query_rows=s_q * h)
        kernels = {
            "fp8": lambda t: snapmla.decode_fp8(x.qq, x.fp8_cache, t, x.seqlens, softmax_scale=x.scale, plan=plan),
            "bf16": lambda t: snapmla.decode_bf16(x.q, x.bf_cache, t, x.seqlens, softmax_scale=x.scale, plan=plan),
        }
        # decode_fp8 under each lab setting of --env (default: the programmatic combine).
        for setting in args.env:
            kernels[f"fp8 {setting}"] = bench.with_env_settings(kernels["fp8"], setting)
        if peers is not None:
            kernels.update(bench.peer_kernels(torch, peers, x, s_q, h))
        graphs = bench.capture_graphs(torch, kernels, x.tables, x.calls)
        times = bench.time_interleaved(torch, graphs, x.calls, 5)
        splits = int(plan.split_offsets[-1])
        print(f"b={b} h={h} s_q={s_q} s_k={s_k} (workers {workers}, splits {splits})", flush=True)
        for name, graph in graphs.items():
            totals, count = kernel_times(torch, graph, args.replays)
            calls = args.replays * x.calls
            call_us = statistics.median(times[name])
            busy = sum(totals.values()) / calls
            parts = ", ".join(f"{short(k)} {v / calls:.2f}" for k, v in sorted(totals.items(), key=lambda kv: -kv[1]))
            print(f"  {name:28s} call {call_us:7.2f} us, kernels {busy:7.2f} us ({count / calls:.1f} per call), "
                  f"between {call_us - busy:6.2f} us: {parts}", flush=True)
        del graphs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
