"""Whether a decode launch's CTAs end together, and if not, whether their pages or their SMs say why:
reads the profiling build's per-CTA dump (SNAPMLA_PROFILE_DUMP=PATH, one CSV row per CTA of each
reported launch; src/kernels/sm90/decode/profile_stamps.cuh) and prints, per launch:
- the CTAs' ends (their last split's `stored`, us after the grid's first start): p0 / p10 / p50 /
  p90 / max, and the same for their pages;
- each CTA's rate (pages per us from its first score to its loop's end), its spread, and how much
  of the ends' spread the pages explain (the correlation of end with pages);
- the bound on balancing by rate: with every CTA's pages in proportion to its measured rate the
  launch would end at total pages / sum of rates (plus the median CTA's time before its first
  score) instead of at the last CTA's end;
and, where the same case ran in two launches (LABEL column, e.g. two processes), whether an SM's
rate in one launch predicts it in the other (the correlation by SM id): a slow SM that stays slow
is a property of the chip, one that does not is the launch's traffic.

    python3 lab/sm_balance.py dump.csv
    python3 lab/sm_balance.py dump.csv --fast-sms 1.12   # the SMs faster than 1.12x the median,
                                                          # as SNAPMLA_FAST_SMS takes them

The dump's rows carry `op` and `launch`; lab/h200_sm_balance.sh adds `case` and `run` columns.
"""

import argparse
import csv
import statistics
from collections import defaultdict


def pct(v, f):
    s = sorted(v)
    return s[int(f * (len(s) - 1))] if s else float("nan")


def corr(x, y):
    try:
        return statistics.correlation(x, y)
    except statistics.StatisticsError:  # fewer than two points, or a constant side
        return float("nan")


def cta_rate(r):
    """A CTA's pages per us from its first score to its loop's end (None without pages)."""
    p, s0, l = int(r["pages"]), float(r["first score"]), float(r["loop done"])
    return p / (l - s0) if p > 0 and l > s0 else None


def rates_by_sm(rows):
    """Each SM's mean rate over the rows' CTAs on it."""
    d = defaultdict(list)
    for r in rows:
        if (v := cta_rate(r)) is not None:
            d[int(r["sm"])].append(v)
    return {k: statistics.fmean(v) for k, v in d.items()}


def summarize(rows):
    ends = [float(r["stored"]) for r in rows]
    pages = [int(r["pages"]) for r in rows]
    starts = [float(r["first score"]) for r in rows]
    loop = [float(r["loop done"]) for r in rows]
    rates = [v for v in map(cta_rate, rows) if v is not None]
    before = statistics.median(s - float(r["start"]) for s, r in zip(starts, rows))
    t_bal = sum(pages) / sum(rates) + before + statistics.median(e - l for e, l in zip(ends, loop))
    return {
        "ctas": len(rows),
        "ends": [pct(ends, f) for f in (0, 0.1, 0.5, 0.9, 1)],
        "pages": [pct(pages, f) for f in (0, 0.1, 0.5, 0.9, 1)],
        "rate": [pct(rates, f) for f in (0, 0.1, 0.5, 0.9, 1)],
        "end_vs_pages": corr(pages, ends),
        "balanced_end": t_bal,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dump")
    ap.add_argument("--fast-sms", type=float, metavar="RATIO",
                    help="print only the SMs whose rate (pages per us, mean over the dump's launches) is above "
                         "RATIO x the median SM's, '+' between them")
    a = ap.parse_args()
    with open(a.dump) as f:
        rows = [r for r in csv.DictReader(f) if float(r["stored"]) > 0]
    if a.fast_sms:
        mean = rates_by_sm(rows)
        median = statistics.median(mean.values())
        print("+".join(str(k) for k in sorted(mean) if mean[k] > a.fast_sms * median))
        return
    by_launch = defaultdict(list)
    for r in rows:
        by_launch[(r.get("case", ""), r["op"], r["launch"], r.get("run", ""))].append(r)
    by_case = defaultdict(list)
    for key, rs in sorted(by_launch.items()):
        s = summarize(rs)
        case, op, launch, run = key
        by_case[(case, op)].append(rs)
        print(f"{case} {op} launch {launch} {run}: {s['ctas']} CTAs with work")
        print("  end (us) p0/p10/p50/p90/max:   " + " ".join(f"{v:8.1f}" for v in s["ends"]))
        print("  pages     p0/p10/p50/p90/max:   " + " ".join(f"{v:8d}" for v in s["pages"]))
        print("  pages/us  p0/p10/p50/p90/max:   " + " ".join(f"{v:8.4f}" for v in s["rate"]))
        print(f"  corr(end, pages) {s['end_vs_pages']:.2f}; ends at {s['ends'][-1]:.1f} us, "
              f"balanced by rate {s['balanced_end']:.1f} us ({s['balanced_end'] / s['ends'][-1]:.3f}x)")
    for (case, op), launches in by_case.items():
        if len(launches) < 2:
            continue
        per_sm = [rates_by_sm(rs) for rs in launches[:2]]
        common = sorted(set(per_sm[0]) & set(per_sm[1]))
        c = corr([per_sm[0][k] for k in common], [per_sm[1][k] for k in common])
        slow = sorted(common, key=lambda k: per_sm[0][k] + per_sm[1][k])[:12]
        print(f"{case} {op}: an SM's rate in one launch against the other's, correlation {c:.2f} over "
              f"{len(common)} SMs; the slowest SMs in both: {slow}")


if __name__ == "__main__":
    main()
