"""The benchmark's results files: JSON (the data), a Markdown table and a PNG plot (matplotlib,
optional: `pip install .[plot]`)."""

from __future__ import annotations

import json
import sys
from typing import Dict, List


def _k(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def markdown(doc: Dict) -> str:
    lines = [f"# End-to-end decode: FP8 vs BF16 KV cache at the same memory ({doc['gpu']})", "",
             f"{doc['date']}, commit {doc['commit']}. {doc['setup']}", ""]
    lines += [f"- {note}" for note in doc.get("notes", [])] + [""]
    lines += ["| context | FP8 tokens/s | BF16 tokens/s | FP8 / BF16 | batch FP8 / BF16 | batch ratio "
              "| step ratio (BF16 / FP8 step) | step p50 / p99 FP8 (ms) | step p50 / p99 BF16 (ms) "
              "| tokens in cache FP8 / BF16 | memory used FP8 / BF16 (GiB) |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in doc["results"]:
        lines.append(
            f"| {_k(r['context'])} | {r['fp8_tokens_per_s']:.0f} | {r['bf16_tokens_per_s']:.0f} "
            f"| {r['speedup']:.2f}x | {r['fp8_batch']:.0f} / {r['bf16_batch']:.0f} | {r['batch_ratio']:.2f} "
            f"| {r['step_ratio']:.2f} | {r['fp8_step_ms_p50']:.2f} / {r['fp8_step_ms_p99']:.2f} "
            f"| {r['bf16_step_ms_p50']:.2f} / {r['bf16_step_ms_p99']:.2f} "
            f"| {r['fp8_tokens_in_cache']:.0f} / {r['bf16_tokens_in_cache']:.0f} "
            f"| {r['fp8_memory_gib']:.1f} / {r['bf16_memory_gib']:.1f} |")
    lines += ["", "FP8 / BF16 = batch ratio x step ratio: the batch ratio is the larger batch the FP8 "
              "cache holds in the same memory, the step ratio how much longer (< 1) or shorter (> 1) "
              "a BF16 step takes than an FP8 step at their own batches (kernel time, and the GEMMs' "
              "cost of the larger batch)."]
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
    rows: List[Dict] = doc["results"]
    ctx = [r["context"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for key, label, style in (("fp8_tokens_per_s", "FP8 cache (SnapMLA)", "o-"),
                              ("bf16_tokens_per_s", "BF16 cache", "s--")):
        ax.plot(ctx, [r[key] for r in rows], style, label=label)
    for r in rows:
        ax.annotate(f"{r['speedup']:.2f}x", (r["context"], r["fp8_tokens_per_s"]),
                    textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ctx, [_k(c) for c in ctx])
    ax.set_xlabel("context (tokens per sequence)")
    ax.set_ylabel("decode tokens/s")
    ax.set_title(f"Decode throughput at the same KV memory ({doc['gpu']})", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
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
    with open(json_path) as f:
        doc = json.load(f)
    if not json_path.endswith(".json"):
        raise ValueError(f"--replot: expected a .json file, got {json_path!r}")
    return write(doc, json_path[:-len(".json")])
