#!/usr/bin/env python3
"""Warp-stall samples of one kernel summed by code region, from Nsight Compute's source page.

Input: the CSV of `ncu -i REPORT --page source --csv --print-source sass` (lab/h200_round.sh
ncu writes it). Regions are runs of SASS instructions given by their row numbers in that CSV (the
first data row is 0): `--cuts 0,651,654,1038 --names pre,qkwait,scores` gives three regions. Find
the cuts by listing the instructions (`--list`, with samples and the main stall reasons) and
picking the landmarks (WARPGROUP.DEPBAR, BAR.SYNC, HGMMA/QGMMA, SYNCS.PHASECHK...).

Prints, per region: its share of all samples, the instructions executed and the top stall
reasons (percent of all samples).
"""
import argparse
import csv


def num(x):
    try:
        return float(x)
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--cuts", help="comma-separated row numbers, increasing")
    ap.add_argument("--names", help="comma-separated region names (one fewer than cuts)")
    ap.add_argument("--list", action="store_true", help="list instructions with at least --min %% of samples")
    ap.add_argument("--min", type=float, default=0.3, help="threshold for --list, percent of all samples")
    a = ap.parse_args()

    rows = list(csv.reader(open(a.csv)))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    hdr, data = rows[head], rows[head + 1:]
    ix = {h: i for i, h in enumerate(hdr)}
    samples = ix["Warp Stall Sampling (All Samples)"]
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(num(r[samples]) for r in data) or 1.0

    def top(rs, k):
        sums = sorted(((sum(num(r[ix[h]]) for r in rs), h[6:]) for h in reasons), reverse=True)[:k]
        return " ".join(f"{h}:{v / total * 100:.1f}" for v, h in sums if v > 0)

    print(f"{int(total)} samples, {len(data)} instructions")
    if a.list:
        for n, r in enumerate(data):
            s = num(r[samples])
            if s / total * 100 >= a.min:
                print(f"{n:5d} {s / total * 100:5.2f}% {r[ix['Source']][:64]:64s} {top([r], 3)}")
    if a.cuts:
        cuts = [int(c) for c in a.cuts.split(",")]
        names = a.names.split(",") if a.names else [f"r{i}" for i in range(len(cuts) - 1)]
        for (lo, hi), name in zip(zip(cuts[:-1], cuts[1:]), names):
            rs = data[lo:hi]
            s = sum(num(r[samples]) for r in rs)
            ex = sum(num(r[ix["Instructions Executed"]]) for r in rs)
            print(f"{name:14s} [{lo:5d},{hi:5d}) {s / total * 100:5.1f}%  inst {ex / 1e6:7.2f}M  {top(rs, 4)}")


if __name__ == "__main__":
    main()
