"""The benchmark's results files: JSON (the data), a Markdown table per deployment and a PNG plot
with a panel per deployment (matplotlib, optional: `pip install .[plot]`). Results files of
earlier versions (one deployment, one repeat) are read too, for --replot."""

from __future__ import annotations

import json
import sys
from typing import Dict, List, Optional


def _k(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def _num(value, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def _pair(r: Dict, key: str, spec: str = ".0f") -> str:
    return f"{_num(r.get('fp8_' + key), spec)} / {_num(r.get('bf16_' + key), spec)}"


def _tokens(r: Dict, cache: str) -> str:
    text = _num(r[f"{cache}_tokens_per_s"])
    lo_hi = r.get(f"{cache}_tokens_per_s_range")
    if lo_hi and r.get("repeats", 1) > 1:
        text += f" ({lo_hi[0]:.0f}-{lo_hi[1]:.0f})"
    return text


def budget_text(b: Dict) -> str:
    """The memory budget of a deployment, in words."""
    parts = [f"weights {b['weights_gib']:.3g} GiB (this model's, bf16)"]
    if b.get("reserved_gib"):
        parts.append(f"reserved {b['reserved_gib']:g} GiB (--weights-gib: the rank's share of the weights left out)")
    if b.get("margin_gib") is not None:
        parts.append(f"margin {b['margin_gib']:g} GiB")
    return (f"{', '.join(parts)}; KV pool {b['kv_gib']:.3g} GiB per GPU for either cache "
            f"({'given by --kv-gib' if b.get('kv_from') == '--kv-gib' else 'from the free memory'})")


def sections(doc: Dict) -> List[tuple]:
    """(title, budget or None, rows) per deployment, in the order they ran."""
    rows: List[Dict] = doc["results"]
    budgets = doc.get("deployments")
    if not budgets:  # one deployment, from a results file without the list
        return [(None, None, rows)]
    return [(b.get("label", b["deployment"]), b, [r for r in rows if r.get("deployment") == b["deployment"]])
            for b in budgets]


def markdown(doc: Dict) -> str:
    lines = [f"# End-to-end decode: FP8 vs BF16 KV cache at the same memory ({doc['gpu']})", "",
             f"{doc['date']}, commit {doc['commit']}. {doc['setup']}", ""]
    lines += [f"- {note}" for note in doc.get("notes", [])] + [""]
    waits = doc.get("arrival_rate") is not None
    head = ("| context | FP8 tokens/s | BF16 tokens/s | FP8 / BF16 | batch FP8 / BF16 | batch ratio "
            "| step ratio | step p50 / p99 FP8 (ms) | step p50 / p99 BF16 (ms) | admitted / retired FP8 "
            "| admitted / retired BF16 | TPOT p50 / p99 FP8 (ms) | TPOT p50 / p99 BF16 (ms) "
            + ("| queue wait p50 FP8 / BF16 (ms) " if waits else "")
            + "| steps FP8 / BF16 | memory used FP8 / BF16 (GiB) | SM MHz FP8 / BF16 |")
    for title, budget, rows in sections(doc):
        if title:
            lines += [f"## {title}", ""]
        if budget:
            lines += [f"Budget: {budget_text(budget)}.", ""]
        lines += [head, "|" + " --- |" * head.count(" | ") + " --- |"]
        for r in rows:
            cells = [_k(r["context"]), _tokens(r, "fp8"), _tokens(r, "bf16"), f"{r['speedup']:.2f}x",
                     _pair(r, "batch", ".1f"), f"{r['batch_ratio']:.2f}", f"{r['step_ratio']:.2f}",
                     f"{_num(r.get('fp8_step_ms_p50'), '.2f')} / {_num(r.get('fp8_step_ms_p99'), '.2f')}",
                     f"{_num(r.get('bf16_step_ms_p50'), '.2f')} / {_num(r.get('bf16_step_ms_p99'), '.2f')}",
                     f"{_num(r.get('fp8_admitted'))} / {_num(r.get('fp8_retired'))}",
                     f"{_num(r.get('bf16_admitted'))} / {_num(r.get('bf16_retired'))}",
                     f"{_num(r.get('fp8_tpot_ms_p50'), '.2f')} / {_num(r.get('fp8_tpot_ms_p99'), '.2f')}",
                     f"{_num(r.get('bf16_tpot_ms_p50'), '.2f')} / {_num(r.get('bf16_tpot_ms_p99'), '.2f')}"]
            if waits:
                cells.append(_pair(r, "queue_wait_ms_p50", ".1f"))
            cells += [_pair(r, "steps"), _pair(r, "memory_gib", ".1f"), _pair(r, "sm_mhz")]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["FP8 / BF16 = batch ratio x step ratio: the batch ratio is the larger mean batch the FP8 cache "
              "holds in the same memory, the step ratio how much longer (< 1) or shorter (> 1) a BF16 step "
              "takes than an FP8 step at their own batches (kernel time, and the GEMMs' cost of the larger "
              "batch)."]
    return "\n".join(lines) + "\n"


def plot(doc: Dict, path: str) -> bool:
    """Writes the PNG; False (with a message) where matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"e2e: matplotlib is not installed (pip install .[plot]): {path} not written; "
              f"`python -m snapmla.e2e --replot <json>` writes it later", file=sys.stderr)
        return False
    panels = sections(doc)
    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 4.2), dpi=120, squeeze=False)
    for ax, (title, _, rows) in zip(axes[0], panels):
        ctx = [r["context"] for r in rows]
        bf16_label = ("BF16 cache (FlashMLA's kernel)" if doc.get("bf16_kernel") == "flashmla"
                      else "BF16 cache (decode_bf16)")
        for cache, label, style in (("fp8", "FP8 cache (SnapMLA)", "o-"), ("bf16", bf16_label, "s--")):
            mid = [r[f"{cache}_tokens_per_s"] for r in rows]
            ranges: List[Optional[list]] = [r.get(f"{cache}_tokens_per_s_range") for r in rows]
            if all(ranges):
                err = [[m - lo for m, (lo, _) in zip(mid, ranges)], [hi - m for m, (_, hi) in zip(mid, ranges)]]
                ax.errorbar(ctx, mid, yerr=err, fmt=style, capsize=3, label=label)
            else:
                ax.plot(ctx, mid, style, label=label)
        for r in rows:
            ax.annotate(f"{r['speedup']:.2f}x", (r["context"], r["fp8_tokens_per_s"]),
                        textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ctx, [_k(c) for c in ctx])
        ax.set_xlabel("context (tokens per sequence)")
        ax.set_ylabel("decode tokens/s")
        ax.set_title(title or "decode throughput", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(f"Decode throughput at the same KV memory ({doc['gpu']}; median, min-max of the repeats)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def write(doc: Dict, prefix: str) -> List[str]:
    """prefix.json, prefix.md and (with matplotlib) prefix.png; returns the paths written."""
    with open(prefix + ".json", "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    with open(prefix + ".md", "w") as f:
        f.write(markdown(doc))
    written = [prefix + ".json", prefix + ".md"]
    if plot(doc, prefix + ".png"):
        written.append(prefix + ".png")
    return written


def replot(json_path: str) -> List[str]:
    if not json_path.endswith(".json"):
        raise ValueError(f"--replot: expected a .json file, got {json_path!r}")
    with open(json_path) as f:
        doc = json.load(f)
    return write(doc, json_path[:-len(".json")])
