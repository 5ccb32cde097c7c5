"""What the balanced plan's cost model should be: decode_fp8 timed on hand-made plans that vary
the fixed cost per piece (F, in 64-token blocks) and a snap of worker boundaries to sequence
edges, beside the planner's own plan, the same plan without worker ranges (one CTA per split,
in waves), no plan (one CTA per sequence) and the peers, in one process (CUDA graphs,
interleaved rounds, medians).

    python lab/plan_probe.py --peers .peers [--out DIR] [--cases b,h,s_q,s_k ...]   (s_k: a number or U,
    the bench's U(1..32K) lengths; the inputs are the bench's, snapmla.bench.case_inputs)

The hand-made plans follow the rule of src/core/split_rule.hpp with F and `snap` as parameters
(snap s: a boundary within s blocks of a sequence's first or last block moves to that edge, so
that no split shorter than s blocks is cut off). Needs PyTorch, an sm_90 GPU and the package.
"""

import argparse
import json
import os
import statistics

import numpy as np
import torch

import snapmla
from snapmla.bench import capture_graphs, case_inputs, load_peers, parse_case, peer_kernels, time_interleaved

CASES = ["128,128,1,8192", "82,128,1,32768", "46,128,1,32768", "256,128,1,8192", "20,128,1,8192",
         "160,64,1,8192", "46,16,1,32768", "1,16,1,8192", "1,128,1,8192", "128,128,1,U"]
VARIANTS = [(0, 0), (4, 0), (8, 0), (16, 0), (4, 8), (4, 32), (8, 32)]


def split_chunk(total, workers, rows):
    chunk = max(1, -(-total // workers))
    if rows > 0:
        chunk = max(chunk, 2)
        while (chunk + 1) ** 2 * 1024 <= total * rows:
            chunk += 1
    return chunk


def balanced_plan(lens, workers, rows, fixed, snap):
    """(split_offsets, split_begin, worker_splits) as numpy int32, capacity = b + workers."""
    b = len(lens)
    blocks = [(int(n) + 63) // 64 for n in lens]
    total_blocks = sum(blocks)
    chunk = split_chunk(total_blocks, workers, rows)
    used = min(workers, max(1, -(-total_blocks // chunk)))
    axis = total_blocks + fixed * max(0, b - 1)
    share = max(1, -(-axis // used))
    starts = []  # (seq, block) where each worker k >= 1 starts
    fixed_of = [0] + [fixed] * (b - 1)
    cs = np.cumsum([0] + [fixed_of[j] + blocks[j] for j in range(b)])
    for k in range(1, used):
        x = k * share
        if x >= axis:
            break
        i = int(np.searchsorted(cs, x, side="right") - 1)
        off = x - cs[i] - fixed_of[i]
        if off <= 0 or off <= snap:
            starts.append((i, 0))
        elif blocks[i] - off <= snap:
            starts.append((i + 1, 0) if i + 1 < b else (i, blocks[i]))
        else:
            starts.append((i, off))
    cuts = [set() for _ in range(b)]
    for s, blk in starts:
        if 0 < blk < blocks[s]:
            cuts[s].add(blk)
    offsets, begins, first_split = [0], [], {}
    for s in range(b):
        for blk in [0] + sorted(cuts[s]):
            first_split[(s, blk)] = len(begins)
            begins.append(blk * 64)
        offsets.append(len(begins))
    k = len(begins)
    cap = b + workers
    ws = [0] + [first_split.get(st, k) if st[0] < b and st[1] < max(1, blocks[st[0]]) else k for st in starts]
    ws = ws + [k] * (workers + 1 - len(ws))
    ws = np.maximum.accumulate(np.array(ws, np.int64))
    worker_splits = np.full(cap, -1, np.int32)
    worker_splits[:workers + 1] = ws
    split_begin = np.full(cap, -1, np.int32)
    split_begin[:k] = begins
    return np.array(offsets, np.int32), split_begin, worker_splits


def whole_plan(lens, workers):
    """Whole sequences, n = ceil(b / workers) per worker in order: no cuts, no combine."""
    b = len(lens)
    n = -(-b // workers)
    cap = b + workers
    ws = np.full(cap, -1, np.int32)
    ws[:workers + 1] = np.minimum(np.arange(workers + 1) * n, b)
    sb = np.full(cap, -1, np.int32)
    sb[:b] = 0
    return np.arange(b + 1, dtype=np.int32), sb, ws


def run_case(spec, peers, calls, rounds):
    b, h, s_q, s_k = parse_case(spec)
    x = case_inputs(torch, snapmla, (b, h, s_q, s_k), calls)  # the bench's inputs for the case
    lens, seqlens, qq, fp8, scale = x.lens, x.seqlens, x.qq, x.fp8_cache, x.scale
    dev = seqlens.device
    workers = snapmla.recommended_num_workers(x.q, s_q, h)
    rows = s_q * h
    own = snapmla.plan_splits(seqlens, workers, query_rows=rows)
    plans = {"planner": own, "per-split CTAs": snapmla.SplitPlan(own.split_offsets, own.split_begin, workers, None),
             "no plan": None}
    splits = {"planner": int(own.split_offsets[-1]), "per-split CTAs": int(own.split_offsets[-1]), "no plan": b}
    for fixed, snap in VARIANTS:
        off, sb, ws = balanced_plan(lens.tolist(), workers, rows, fixed, snap)
        name = f"F={fixed} snap={snap}"
        plans[name] = snapmla.SplitPlan(*(torch.from_numpy(a).to(dev) for a in (off, sb)), workers,
                                        torch.from_numpy(ws).to(dev))
        splits[name] = int(off[-1])
    off, sb, ws = whole_plan(lens.tolist(), workers)
    plans["whole"] = snapmla.SplitPlan(*(torch.from_numpy(a).to(dev) for a in (off, sb)), workers,
                                       torch.from_numpy(ws).to(dev))
    splits["whole"] = b
    # The planner's plan against the same rule made here (F=4, snap=0), entry by entry, and a copy
    # of it in new memory (is a difference in time the plan or where it lies?).
    same = all(torch.equal(a.cpu(), b_) for a, b_ in zip(own[:2] + (own.worker_splits,),
                                                          (plans["F=4 snap=0"].split_offsets.cpu(),
                                                           plans["F=4 snap=0"].split_begin.cpu(),
                                                           plans["F=4 snap=0"].worker_splits.cpu())))
    plans["planner copy"] = snapmla.SplitPlan(own.split_offsets.clone(), own.split_begin.clone(), workers,
                                              own.worker_splits.clone())
    splits["planner copy"] = splits["planner"]
    calls_by = {name: (lambda pl: lambda t: snapmla.decode_fp8(qq, fp8, t, seqlens, softmax_scale=scale, plan=pl))(pl)
                for name, pl in plans.items()}
    if peers is not None:
        calls_by.update(peer_kernels(torch, peers, x, s_q, h))
    graphs = capture_graphs(torch, calls_by, x.tables, x.calls)
    got = {k: round(statistics.median(v), 1) for k, v in time_interleaved(torch, graphs, x.calls, rounds).items()}
    return {"case": spec, "workers": workers, "splits": splits, "planner_equals_rule": same, "us": got}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", metavar="DIR")
    ap.add_argument("--cases", nargs="+", default=CASES)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", metavar="DIR")
    a = ap.parse_args()
    peers = load_peers(a.peers) if a.peers else None
    rows = []
    for spec in a.cases:
        r = run_case(spec, peers, a.calls, a.rounds)
        rows.append(r)
        ref = r["us"].get("flashmla_bf16")
        parts = [f"{k}[{r['splits'].get(k, '-')}] {v}" + (f" ({ref / v:.2f}x)" if ref and k in r["splits"] else "")
                 for k, v in r["us"].items()]
        print(f"{spec} w={r['workers']} same={r['planner_equals_rule']}: " + " | ".join(parts), flush=True)
        torch.cuda.empty_cache()
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "plan_probe.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
