"""How many splits small batches want: decode_fp8 timed with fewer workers than
recommended_num_workers gives, beside the peers, in one process (CUDA graphs, interleaved rounds,
medians), for the cases where a split holds only a few pages.

    python lab/split_sweep.py --peers .peers [--out DIR]

Per case it prints decode_fp8's time for each worker count and with the planner's own split
length rule (plan_splits' query_rows), pages per split in brackets, and the peers' times. The planner today splits a sequence into about num_workers pieces; a split's fixed
cost (its fp32 partials written and read back by the combine: rows x 4 KB) makes pieces of one or
two pages cost more than they save. These numbers are what a cost model for the planner needs
(and the one probe so far: b = 1, h = 128, 8K, 24.1 us at 66 workers against 20.6 us at 33).
Needs PyTorch, an sm_90 GPU and the package installed.

    python lab/split_sweep.py --peers .peers --lengths [--out DIR]

instead times the split length at the recommended worker count: the planner's rule with its
query_rows scaled by each of ROW_SCALES (0: equal shares; the rule's split length grows with the
square root of query_rows), on the small-batch cases of the bench's sweep (SMALL_CASES).
`--env NAME=VALUE ...` times every plan also under each lab setting (e.g.
SNAPMLA_COMBINE_PDL=late: whether a later combine launch moves the best split length; several
settings at once joined by commas).
"""

import argparse
import json
import math
import os
import statistics

import torch

import snapmla
from snapmla.bench import capture_graphs, load_peers, time_interleaved, with_env_settings

CASES = [(1, 128, 1, 1024), (1, 128, 1, 4096), (1, 128, 1, 8192), (1, 128, 1, 16384), (2, 128, 1, 8192),
         (4, 128, 1, 4096), (8, 128, 1, 16384), (1, 128, 2, 8192), (1, 64, 1, 8192), (1, 16, 1, 8192)]
FRACTIONS = [1.0, 0.75, 0.5, 1 / 3, 0.25, 1 / 6]
SMALL_CASES = [(b, h, 1, s_k) for s_k in (8192, 32768) for h in (128, 64, 16, 8) for b in (1, 2, 4, 8)]
ROW_SCALES = [0, 0.25, 0.5, 1, 2, 4]


def run_case(case, peers, calls, rounds, lengths=False, settings=()):
    b, h, s_q, s_k = case
    dev = "cuda"
    pages_per_seq = (s_k + 63) // 64
    sets = max(1, min(32, math.ceil(256e6 / (b * s_k * 1152))))
    num_pages = b * pages_per_seq * sets
    kv = (torch.randn(num_pages * 64, 576, device=dev) / 10).to(torch.bfloat16)
    fp8 = snapmla.alloc_fp8_cache(num_pages, kv)
    snapmla.append(fp8, kv, torch.arange(num_pages * 64, device=dev, dtype=torch.int32))
    perm = torch.randperm(num_pages, device=dev, dtype=torch.int32)
    tables = [perm[i * b * pages_per_seq:(i + 1) * b * pages_per_seq].view(b, -1).contiguous() for i in range(sets)]
    seqlens = torch.full((b,), s_k, dtype=torch.int32, device=dev)
    q = (torch.randn(b, s_q, h, 576, device=dev) / 10).to(torch.bfloat16)
    qq = snapmla.quantize_query(q)
    scale = 192 ** -0.5
    full = snapmla.recommended_num_workers(q, s_q, h)
    calls_by = {}
    plans = {}
    if lengths:  # the rule's split length, its query_rows scaled
        for k in ROW_SCALES:
            plans[f"fp8 x{k}"] = snapmla.plan_splits(seqlens, full, query_rows=round(k * h * s_q))
    else:
        for w in sorted({max(1, round(full * f)) for f in FRACTIONS}, reverse=True):
            plans[f"fp8 w={w}"] = snapmla.plan_splits(seqlens, w)
        # The planner's own rule for the split length (query_rows), at the recommended worker count.
        plans[f"fp8 rows={h * s_q}"] = snapmla.plan_splits(seqlens, full, query_rows=h * s_q)
    for name, plan in plans.items():
        calls_by[name] = (lambda pl: lambda t: snapmla.decode_fp8(
            qq, fp8, t, seqlens, softmax_scale=scale, plan=pl))(plan)
        for setting in settings:  # the same plan under a lab setting, captured under it
            calls_by[f"{name} {setting}"] = with_env_settings(calls_by[name], setting)
    if peers is not None:
        fm, f8 = peers.FlashMLA(seqlens, s_q, h), peers.PR54(seqlens, s_q, h)
        cache4 = kv.view(num_pages, 64, 1, 576)
        q8, cache8 = q.to(torch.float8_e4m3fn), cache4.to(torch.float8_e4m3fn)
        calls_by["flashmla_bf16"] = lambda t: fm(q, cache4, t, seqlens, scale, True)
        calls_by["pr54_fp8"] = lambda t: f8(q8, cache8, t, seqlens, scale, True)
    n = max(calls, sets)
    graphs = capture_graphs(torch, calls_by, tables, n)
    got = {k: round(statistics.median(v), 2) for k, v in time_interleaved(torch, graphs, n, rounds).items()}
    pages_per_split = {name: round(b * pages_per_seq / int(plan.split_offsets[-1]), 2) for name, plan in plans.items()}
    for setting in settings:
        pages_per_split.update({f"{name} {setting}": pages_per_split[name] for name in plans})
    return {"b": b, "h": h, "s_q": s_q, "s_k": s_k, "recommended_workers": full,
            "pages_per_split": pages_per_split, "us": got}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", metavar="DIR")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", metavar="DIR")
    ap.add_argument("--lengths", action="store_true", help="the split length's scan on SMALL_CASES instead")
    ap.add_argument("--env", nargs="*", default=[], metavar="NAME=VALUE",
                    help="also time every plan under each of these lab settings of the environment")
    a = ap.parse_args()
    peers = load_peers(a.peers) if a.peers else None
    rows = []
    for case in SMALL_CASES if a.lengths else CASES:
        r = run_case(case, peers, a.calls, a.rounds, a.lengths, a.env)
        rows.append(r)
        fp8 = "  ".join(f"{k[4:]}[{r['pages_per_split'][k]}]: {v}" for k, v in r["us"].items() if k.startswith("fp8"))
        peer = "  ".join(f"{k} {v}" for k, v in r["us"].items() if not k.startswith("fp8"))
        print(f"b={r['b']} h={r['h']} s_q={r['s_q']} s_k={r['s_k']}: {fp8} | {peer}", flush=True)
        torch.cuda.empty_cache()
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "split_sweep.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
