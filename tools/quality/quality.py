"""The quality study: train the small MLA model of mla_lm.py on the Python standard library's
sources shipped with the interpreter, then measure what each KV cache does to its predictions.

    python tools/quality/quality.py --out DIR [--train-seconds 210] [--device cuda]

writes DIR/quality.json and DIR/quality.md. Needs PyTorch and the snapmla package; on an sm_90
GPU the caches run through the CUDA kernels, elsewhere through the CPU reference (slow: use
the tiny settings, as the test does).

Data: every .py file under the interpreter's stdlib directory (site-packages excluded), in
sorted order; a file is held out when crc32(its relative path) % 16 == 0, so the split is the
same on every run and machine with the same Python. Tokens are bytes (0..255) and BOS (256);
files are joined with a blank line, and every training and evaluation window starts with BOS.

Perplexity runs each held-out window through the model five ways, identical except for
attention: the model's own causal attention (SDPA, bf16: "exact") and, in every layer, the
paged caches of mla_lm.PagedMLACache ("bf16" = decode_bf16, "fp8" = SnapMLA's decode_fp8,
"tensor_fp8" = the static scale-1.0 recipe through decode_fp8). The cached runs are teacher-
forced decoding: each layer appends the window's rows and attends every position to exactly
its prefix, so the logits are those of token-by-token decoding over that cache. Greedy
generation decodes from held-out prompts with each cache and compares the tokens with the
bf16 cache's run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import sysconfig
import time
import zlib

import torch
import torch.nn.functional as F

import snapmla
from mla_lm import BOS, CACHE_KINDS, LATENT, MLALM, Config, PagedMLACache

KINDS = ("exact",) + CACHE_KINDS  # ppl / greedy rows; "bf16" is the reference for comparisons
KIND_LABEL = {
    "exact": "model's own attention (SDPA, bf16)",
    "bf16": "BF16 cache, decode_bf16",
    "fp8": "SnapMLA FP8 cache, decode_fp8",
    "tensor_fp8": "per-tensor FP8, scale 1.0, through decode_fp8",
}
HELDOUT_EVERY = 16

# --- data ----------------------------------------------------------------------------------


def corpus_files(root: str):
    """Relative paths of the .py files under root, sorted (site-packages excluded)."""
    rels = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in ("site-packages", "dist-packages", "__pycache__"))
        rels += [os.path.relpath(os.path.join(d, f), root) for f in files if f.endswith(".py")]
    return sorted(rels)


def is_heldout(rel: str) -> bool:
    return zlib.crc32(rel.replace(os.sep, "/").encode()) % HELDOUT_EVERY == 0


def load_corpus(root: str | None = None):
    """(train bytes, held-out bytes, description) of the corpus under root (default: stdlib)."""
    root = root or sysconfig.get_paths()["stdlib"]
    parts = {True: [], False: []}
    for rel in corpus_files(root):
        with open(os.path.join(root, rel), "rb") as f:
            parts[is_heldout(rel)].append(f.read())
    train, held = b"\n\n".join(parts[False]), b"\n\n".join(parts[True])
    if not train or not held:
        raise ValueError(f"root: expected .py files for both splits under {root!r}, got "
                         f"{len(parts[False])} train / {len(parts[True])} held-out files")
    info = {"source": f"Python {platform.python_version()} standard library .py files", "root": root,
            "train_files": len(parts[False]), "heldout_files": len(parts[True]),
            "train_bytes": len(train), "heldout_bytes": len(held),
            "split": f"held out: crc32(relative path) % {HELDOUT_EVERY} == 0"}
    return train, held, info


def to_tokens(data: bytes, device):
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device=device, dtype=torch.long)


def make_windows(stream, offsets, length: int):
    """[len(offsets), length + 1]: BOS then stream[o : o + length] per offset."""
    idx = offsets[:, None] + torch.arange(length, device=stream.device)[None, :]
    bos = torch.full((len(offsets), 1), BOS, dtype=torch.long, device=stream.device)
    return torch.cat([bos, stream[idx]], dim=1)


def heldout_windows(stream, length: int, count: int):
    """Up to `count` consecutive, non-overlapping windows from the start of the held-out text."""
    count = min(count, (len(stream) - 1) // length)
    if count < 1:
        raise ValueError(f"length: the held-out text ({len(stream)} tokens) is shorter than one window of {length}")
    return make_windows(stream, torch.arange(count, device=stream.device) * length, length)


# --- training ------------------------------------------------------------------------------


def autocast(device):
    return torch.autocast(device.type, dtype=torch.bfloat16)


def train(model, stream, *, ctx: int, batch: int, seconds: float, max_steps: int, lr: float,
          seed: int, log=print):
    """AdamW with warmup and cosine decay over whichever of `seconds` / `max_steps` ends first
    (0 = no limit of that kind); returns the run's numbers."""
    device = stream.device
    groups = {True: [], False: []}  # weight decay on the matrices, not on norms or embeddings
    for n, p in model.named_parameters():
        groups[p.dim() >= 2 and not n.startswith("embed")].append(p)
    opt = torch.optim.AdamW([{"params": groups[True], "weight_decay": 0.1},
                             {"params": groups[False], "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), fused=device.type == "cuda")
    gen = torch.Generator(device=device).manual_seed(seed)
    warmup = min(40, max(1, max_steps // 4)) if max_steps else 40
    losses, step, t0 = [], 0, time.perf_counter()
    while True:
        elapsed = time.perf_counter() - t0
        progress = max(step / max_steps if max_steps else 0.0, elapsed / seconds if seconds else 0.0)
        if progress >= 1.0 or (not max_steps and not seconds):
            break
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))
        offsets = torch.randint(0, len(stream) - ctx, (batch,), device=device, generator=gen)
        w = make_windows(stream, offsets, ctx)
        with autocast(device):
            logits = model(w[:, :-1])
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), w[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())  # synchronizes: the time check sees finished steps
        step += 1
        if log and (step % 50 == 0 or step == 1):
            log(f"train step {step}: loss {losses[-1]:.3f} ({time.perf_counter() - t0:.0f} s)")
    seconds_used = time.perf_counter() - t0
    tail = losses[-10:] or [float("nan")]
    return {"steps": step, "tokens": step * batch * ctx, "seconds": round(seconds_used, 1),
            "batch": batch, "context": ctx, "peak_lr": lr,
            "loss_first": losses[0] if losses else float("nan"),
            "loss_last10": sum(tail) / len(tail),
            "loss_curve": [round(x, 4) for x in losses[:: max(1, len(losses) // 50)]]}


# --- perplexity ----------------------------------------------------------------------------


def run_logits(model, x, kind: str):
    """Logits [B, n, vocab] of tokens x through `kind`'s attention."""
    device = x.device
    with autocast(device):
        if kind == "exact":
            return model(x)
        cache = PagedMLACache(kind, model.cfg.n_layers, x.shape[0], x.shape[1], device)
        return model(x, cache)


def bucket_edges(n: int):
    """Position ranges of predicted tokens: [0, n/8), [n/8, n/4), [n/4, n/2), [n/2, n)."""
    return [0, n // 8, n // 4, n // 2, n]


@torch.no_grad()
def evaluate_perplexity(model, windows, batch: int, kinds=KINDS, log=print):
    """Per kind: ppl over all predicted tokens and per position bucket; against the bf16
    cache's logits: top-1 agreement and mean KL(bf16 || kind)."""
    n = windows.shape[1] - 1
    edges = bucket_edges(n)
    acc = {k: {"nll": torch.zeros(len(edges) - 1, dtype=torch.float64), "top1": 0.0, "kl": 0.0} for k in kinds}
    count = 0
    for i in range(0, len(windows), batch):
        w = windows[i:i + batch]
        x, y = w[:, :-1], w[:, 1:]
        logp = {k: F.log_softmax(run_logits(model, x, k), dim=-1) for k in kinds}
        ref = logp["bf16"]
        for k in kinds:
            nll = -logp[k].gather(-1, y[..., None])[..., 0].double()  # [B, n]
            for j in range(len(edges) - 1):
                acc[k]["nll"][j] += nll[:, edges[j]:edges[j + 1]].sum().cpu()
            acc[k]["top1"] += float((logp[k].argmax(-1) == ref.argmax(-1)).double().sum())
            acc[k]["kl"] += float((ref.exp() * (ref - logp[k])).sum(-1).double().sum())
        count += y.numel()
        if log:
            log(f"ppl windows {i + len(w)}/{len(windows)}")
    sizes = torch.tensor([edges[j + 1] - edges[j] for j in range(len(edges) - 1)], dtype=torch.float64) * len(windows)
    out = {}
    for k in kinds:
        nll = acc[k]["nll"]
        out[k] = {"ppl": math.exp(float(nll.sum()) / count),
                  "bits_per_byte": float(nll.sum()) / count / math.log(2),
                  "ppl_by_position": {f"{edges[j]}-{edges[j + 1]}": math.exp(float(nll[j] / sizes[j]))
                                      for j in range(len(edges) - 1)},
                  "top1_agreement_bf16": acc[k]["top1"] / count,
                  "kl_from_bf16": acc[k]["kl"] / count}
    for k in kinds:
        out[k]["ppl_vs_bf16"] = out[k]["ppl"] / out["bf16"]["ppl"] - 1
    return {"windows": len(windows), "context": n, "tokens": count, "by_cache": out}


# --- greedy generation ---------------------------------------------------------------------


@torch.no_grad()
def greedy(model, prompts, n_new: int, kind: str):
    """n_new greedy tokens [B, n_new] after each prompt [B, P], decoding through `kind`."""
    device = prompts.device
    out = []
    with autocast(device):
        if kind == "exact":  # no cache: the whole sequence again for every token
            seq = prompts
            for _ in range(n_new):
                nxt = model(seq)[:, -1].argmax(-1)
                out.append(nxt)
                seq = torch.cat([seq, nxt[:, None]], dim=1)
        else:
            cache = PagedMLACache(kind, model.cfg.n_layers, prompts.shape[0], prompts.shape[1] + n_new, device)
            logits = model(prompts, cache)[:, -1]
            for i in range(n_new):
                nxt = logits.argmax(-1)
                out.append(nxt)
                if i + 1 < n_new:
                    logits = model(nxt[:, None], cache)[:, -1]
    return torch.stack(out, dim=1)


def agreement(tokens, ref):
    """(fraction of positions equal, mean first position that differs; n if none does)."""
    eq = tokens == ref
    n = eq.shape[1]
    first = torch.where(eq.all(1), torch.full_like(eq[:, 0], n, dtype=torch.long), (~eq).long().argmax(1))
    return float(eq.double().mean()), float(first.double().mean())


def evaluate_greedy(model, prompts, n_new: int, log=print):
    runs = {}
    for kind in KINDS:
        t0 = time.perf_counter()
        runs[kind] = greedy(model, prompts, n_new, kind)
        if log:
            log(f"greedy {kind}: {time.perf_counter() - t0:.1f} s")
    runs["bf16_rerun"] = greedy(model, prompts, n_new, "bf16")  # determinism: must equal bf16's
    res = {}
    for kind, toks in runs.items():
        frac, first = agreement(toks, runs["bf16"])
        res[kind] = {"agreement": frac, "mean_first_divergence": first}
    return {"prompts": prompts.shape[0], "prompt_len": prompts.shape[1], "new_tokens": n_new,
            "reference": "bf16", "by_cache": res}


# --- cache statistics ----------------------------------------------------------------------

SYNTHETIC = {  # the assumptions of the synthetic "mla" data (docs/accuracy.md)
    "channel_gain_log_std": "0.5 (gains exp(0.5 N))",
    "outlier_channels": "6 channels x15",
    "channel_rms_max_over_median": "~15 and more (the outliers)",
    "token_norm_log_std": "0.25",
    "sink_norm_over_median": "4",
    "latent_amax": "~200",
    "rope_pair_magnitude_median": "1..20 (10^U(0, 1.3))",
    "rope_pair_max_over_median": "4 pairs at 300..1000",
    "rope_amax_over_latent_amax": "~5",
    "sink_attention_mass": "logit lift on the sink (4.8 sd)",
    "effective_tokens_last32": "23 at 1K, 222 at 32K",
    "cache_frac_over_448": "rope outliers (300..1000)",
    "cache_frac_below_2^-6": "-",
    "query_frac_over_448": "-",
    "query_frac_below_2^-6": "-",
}
STAT_LABEL = {
    "channel_gain_log_std": "latent per-channel RMS: std of log",
    "outlier_channels": "latent outlier channels (RMS > 5x median)",
    "channel_rms_max_over_median": "latent channel RMS: max / median",
    "token_norm_log_std": "latent per-token norm: std of log",
    "sink_norm_over_median": "sink (token 0) latent norm / median",
    "latent_amax": "latent max abs(c)",
    "rope_pair_magnitude_median": "rope key pair magnitude: median",
    "rope_pair_max_over_median": "rope key pair magnitude: max / median",
    "rope_amax_over_latent_amax": "rope max abs(k) / latent max abs(c)",
    "sink_attention_mass": "attention on the sink (mean over heads, t >= 64)",
    "effective_tokens_last32": "effective attended tokens, last 32 queries (exp entropy)",
    "cache_frac_over_448": "cache values > 448 (saturate at scale 1.0)",
    "cache_frac_below_2^-6": "cache values 0 < abs(x) < 2^-6 (e4m3 subnormal at scale 1.0)",
    "query_frac_over_448": "query (576) values > 448",
    "query_frac_below_2^-6": "query values 0 < abs(x) < 2^-6",
}


@torch.no_grad()
def layer_statistics(q, kv, lse, softmax_scale: float):
    """One layer's cache / query statistics from q [n, h, 576], kv [n, 576], lse [n, h]."""
    q, kv, lse = q.float(), kv.float(), lse.float()
    n = kv.shape[0]
    c, k = kv[:, :LATENT], kv[:, LATENT:]
    rest = slice(1, None)  # token 0 (BOS) is the sink: its own row
    ch_rms = c[rest].pow(2).mean(0).sqrt()
    med = ch_rms.median()
    tok_norm = c.norm(dim=1)
    pair = (k[:, :32].pow(2) + k[:, 32:].pow(2)).sqrt().mean(0)
    score0 = softmax_scale * (q @ kv[0])  # [n, h]
    p0 = (score0 - lse).exp()[min(64, n - 1):]
    last = min(32, n)
    s = softmax_scale * torch.einsum("thd,sd->ths", q[-last:], kv)
    t_idx = torch.arange(n - last, n, device=kv.device)[:, None, None]
    s = s.masked_fill(torch.arange(n, device=kv.device)[None, None, :] > t_idx, float("-inf"))
    p = s.softmax(-1)
    entropy = -(p * p.clamp_min(1e-30).log()).sum(-1)
    tiny = 2.0 ** -6
    return {
        "channel_gain_log_std": float(ch_rms.clamp_min(1e-30).log().std()),
        "outlier_channels": int((ch_rms > 5 * med).sum()),
        "channel_rms_max_over_median": float(ch_rms.max() / med),
        "token_norm_log_std": float(tok_norm[rest].clamp_min(1e-30).log().std()),
        "sink_norm_over_median": float(tok_norm[0] / tok_norm[rest].median()),
        "latent_amax": float(c.abs().max()),
        "rope_pair_magnitude_median": float(pair.median()),
        "rope_pair_max_over_median": float(pair.max() / pair.median()),
        "rope_amax_over_latent_amax": float(k.abs().max() / c.abs().max()),
        "sink_attention_mass": float(p0.mean()),
        "effective_tokens_last32": float(entropy.exp().mean()),
        "cache_frac_over_448": float((kv.abs() > 448).double().mean()),
        "cache_frac_below_2^-6": float(((kv.abs() < tiny) & (kv != 0)).double().mean()),
        "query_frac_over_448": float((q.abs() > 448).double().mean()),
        "query_frac_below_2^-6": float(((q.abs() < tiny) & (q != 0)).double().mean()),
        "query_latent_amax": float(q[..., :LATENT].abs().max()),
        "query_rope_amax": float(q[..., LATENT:].abs().max()),
        "sink_attention_mass_max_head": float(p0.mean(0).max()),
    }


@torch.no_grad()
def cache_statistics(model, window):
    """Per-layer statistics of the bf16 cache rows and queries of one held-out window."""
    x = window[None, :-1]
    cache = PagedMLACache("bf16", model.cfg.n_layers, 1, x.shape[1], x.device)
    cache.record = True
    with autocast(x.device):
        model(x, cache)
    scale = model.blocks[0].attn.softmax_scale
    layers = [layer_statistics(q[0], kv[0], lse[0], scale) for q, kv, lse in
              (cache.recorded[i] for i in range(model.cfg.n_layers))]
    summary = {}
    for key in layers[0]:
        vals = sorted(s[key] for s in layers)
        summary[key] = {"median": vals[len(vals) // 2], "min": vals[0], "max": vals[-1]}
    return {"context": x.shape[1], "per_layer": layers, "summary": summary}


# --- the study -----------------------------------------------------------------------------


def run_study(*, out_dir: str, device: str = "cuda", config: Config | None = None,
              train_seconds: float = 210, train_steps: int = 0, train_ctx: int = 8192,
              train_batch: int = 8, lr: float = 1.5e-3, eval_len: int = 8192, eval_windows: int = 32,
              eval_batch: int = 4, prompts: int = 32, prompt_len: int = 2048, new_tokens: int = 256,
              corpus_root: str | None = None, seed: int = 0, log=print):
    """Train, evaluate, write out_dir/quality.{json,md}; returns the results dict."""
    t_start = time.perf_counter()
    log = log or (lambda *_: None)
    dev = torch.device(device)
    torch.manual_seed(seed)
    cfg = config or Config()
    train_bytes, held_bytes, data_info = load_corpus(corpus_root)
    train_stream, held = to_tokens(train_bytes, dev), to_tokens(held_bytes, dev)
    model = MLALM(cfg).to(dev)
    log(f"model: {model.num_parameters() / 1e6:.1f} M parameters; data: {data_info}")
    # Every evaluation path once on a short window before training, so a failure costs seconds.
    smoke = heldout_windows(held, min(256, eval_len), 1)
    evaluate_perplexity(model, smoke, 1, log=None)
    evaluate_greedy(model, smoke[:, :16], 2, log=None)

    training = train(model, train_stream, ctx=train_ctx, batch=train_batch, seconds=train_seconds,
                     max_steps=train_steps, lr=lr, seed=seed, log=log)
    log(f"training: {training['steps']} steps, {training['seconds']} s, loss {training['loss_last10']:.3f}")
    model.eval()

    t0 = time.perf_counter()
    windows = heldout_windows(held, eval_len, eval_windows)
    ppl = evaluate_perplexity(model, windows, eval_batch, log=log)
    ppl["seconds"] = round(time.perf_counter() - t0, 1)

    t0 = time.perf_counter()
    # Prompts from evenly spaced offsets of the held-out text (after the perplexity windows' start).
    span = len(held) - prompt_len
    offsets = (torch.arange(prompts, device=dev) * (span // max(prompts, 1))).clamp_max(span - 1)
    prompt_tokens = make_windows(held, offsets, prompt_len - 1)
    gen = evaluate_greedy(model, prompt_tokens, new_tokens, log=log)
    gen["seconds"] = round(time.perf_counter() - t0, 1)

    t0 = time.perf_counter()
    stats = cache_statistics(model, windows[0])
    stats["seconds"] = round(time.perf_counter() - t0, 1)

    by = ppl["by_cache"]
    g = gen["by_cache"]
    results = {
        "ppl_exact": by["exact"]["ppl"], "ppl_bf16": by["bf16"]["ppl"], "ppl_fp8": by["fp8"]["ppl"],
        "ppl_tensor_fp8": by["tensor_fp8"]["ppl"],
        "ppl_fp8_vs_bf16": by["fp8"]["ppl_vs_bf16"], "ppl_tensor_fp8_vs_bf16": by["tensor_fp8"]["ppl_vs_bf16"],
        "greedy_agreement_exact": g["exact"]["agreement"], "greedy_agreement_fp8": g["fp8"]["agreement"],
        "greedy_agreement_tensor_fp8": g["tensor_fp8"]["agreement"],
        "greedy_agreement_bf16_rerun": g["bf16_rerun"]["agreement"],
        "model": {**cfg.to_dict(), "parameters": model.num_parameters(), "kv_lora_rank": LATENT,
                  "qk_rope_dim": 64, "qk_nope_dim": 128, "v_dim": 128, "tokenizer": "bytes + BOS"},
        "data": data_info,
        "training": training,
        "perplexity": ppl,
        "greedy": gen,
        "cache_statistics": stats,
        "environment": {"torch": torch.__version__, "snapmla": snapmla.info(), "device": device,
                        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
                        "python": platform.python_version()},
        "total_seconds": round(time.perf_counter() - t_start, 1),
    }
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "quality.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(out_dir, "quality.md"), "w") as f:
        f.write(render_markdown(results))
    log(f"wrote {out_dir}/quality.json and quality.md ({results['total_seconds']} s in all)")
    return results


def _fmt(x):
    if isinstance(x, int):
        return str(x)
    return f"{x:.3g}" if abs(x) < 1e-2 or abs(x) >= 1e4 else f"{x:.4g}"


def render_markdown(r) -> str:
    m, d, t, p, g, s = (r[k] for k in ("model", "data", "training", "perplexity", "greedy", "cache_statistics"))
    lines = [
        "# Quality on a trained MLA model",
        "",
        f"Made by `tools/quality/quality.py` ({r['environment']['gpu'] or r['environment']['device']}, "
        f"torch {r['environment']['torch']}; {r['total_seconds']} s in all).",
        "",
        f"**Model**: {m['parameters'] / 1e6:.1f} M parameters, {m['n_layers']} layers, d_model {m['d_model']}, "
        f"{m['n_heads']} heads, MLA with kv_lora_rank {m['kv_lora_rank']}, rope {m['qk_rope_dim']}, q nope "
        f"{m['qk_nope_dim']} + rope {m['qk_rope_dim']}, v {m['v_dim']}; RMSNorm, SwiGLU (d_ff {m['d_ff']}); "
        f"{m['tokenizer']}.",
        f"**Data**: {d['source']}: {d['train_files']} files / {d['train_bytes'] / 1e6:.1f} MB for training, "
        f"{d['heldout_files']} files / {d['heldout_bytes'] / 1e6:.2f} MB held out ({d['split']}).",
        f"**Training**: {t['steps']} steps of {t['batch']} x {t['context']} tokens ({t['tokens'] / 1e6:.1f} M "
        f"tokens) in {t['seconds']} s, AdamW, peak lr {t['peak_lr']}; loss {t['loss_first']:.3f} -> "
        f"{t['loss_last10']:.3f} nats/byte (last 10 steps).",
        "",
        f"## Perplexity: {p['windows']} held-out windows of {p['context']} tokens ({p['tokens']} predictions)",
        "",
        "Every cache is read by teacher-forced decoding in every layer: each position attends to exactly "
        "its prefix, as token-by-token decoding over that cache would.",
        "",
    ]
    buckets = list(p["by_cache"]["bf16"]["ppl_by_position"])
    lines.append("| attention / cache | ppl | vs decode_bf16 | bits/byte | top-1 = bf16's | KL from bf16 | "
                 + " | ".join(f"ppl @ {b}" for b in buckets) + " |")
    lines.append("| --- " * (6 + len(buckets)) + "|")
    for k, v in p["by_cache"].items():
        lines.append(f"| {KIND_LABEL[k]} | {v['ppl']:.4f} | {v['ppl_vs_bf16']:+.3%} | {v['bits_per_byte']:.4f} | "
                     f"{v['top1_agreement_bf16']:.4%} | {v['kl_from_bf16']:.2e} | "
                     + " | ".join(f"{v['ppl_by_position'][b]:.4f}" for b in buckets) + " |")
    lines += [
        "",
        f"## Greedy generation: {g['prompts']} held-out prompts of {g['prompt_len']} tokens, "
        f"{g['new_tokens']} new tokens",
        "",
        "Agreement: the fraction of generated tokens equal to the BF16 cache run's, position by position; "
        "first divergence: the mean position of the first differing token (the length when none differs). "
        "\"BF16 cache again\" runs the BF16 cache a second time (determinism).",
        "",
        "| attention / cache | agreement | mean first divergence |",
        "| --- | --- | --- |",
    ]
    for k, v in g["by_cache"].items():
        label = "BF16 cache again" if k == "bf16_rerun" else KIND_LABEL[k]
        lines.append(f"| {label} | {v['agreement']:.4f} | {v['mean_first_divergence']:.1f} |")
    lines += [
        "",
        f"## Cache statistics (the BF16 cache of one held-out window of {s['context']} tokens)",
        "",
        "| quantity | synthetic mla data | trained model: median over layers | min | max |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key, label in STAT_LABEL.items():
        v = s["summary"][key]
        lines.append(f"| {label} | {SYNTHETIC[key]} | {_fmt(v['median'])} | {_fmt(v['min'])} | {_fmt(v['max'])} |")
    lines += [
        "",
        "Per layer: quality.json, cache_statistics.per_layer. The per-tensor FP8 recipe is the project's "
        "ablation recipe B (scale 1.0, all 576 dims e4m3, saturating), not emulated: its e4m3 values are "
        "written into the FP8 cache planes with scale 1.0 and the query is given as e4m3 with scale 1.0, "
        "so it runs through the library's decode_fp8 (the CUDA kernel on the GPU, the CPU reference "
        "elsewhere) with SnapMLA's attention arithmetic.",
        "",
    ]
    return "\n".join(lines)


TINY = dict(config=Config(d_model=64, n_layers=2, n_heads=16, d_ff=128), train_seconds=0, train_steps=8,
            train_ctx=64, train_batch=4, lr=3e-3, eval_len=64, eval_windows=2, eval_batch=2, prompts=4,
            prompt_len=16, new_tokens=8)


def summary(r) -> str:
    """The headline numbers of a results dict, a few lines."""
    p, g = r["perplexity"]["by_cache"], r["greedy"]["by_cache"]
    lines = [f"model {r['model']['parameters'] / 1e6:.1f} M, trained {r['training']['seconds']} s "
             f"({r['training']['tokens'] / 1e6:.1f} M tokens), loss {r['training']['loss_last10']:.3f}; "
             f"{r['total_seconds']} s in all"]
    for k in KINDS:
        lines.append(f"{k:11} ppl {p[k]['ppl']:.4f} ({p[k]['ppl_vs_bf16']:+.3%} vs bf16)  top-1 "
                     f"{p[k]['top1_agreement_bf16']:.4f}  greedy agreement {g[k]['agreement']:.4f}, "
                     f"first divergence {g[k]['mean_first_divergence']:.1f}")
    lines.append(f"bf16 rerun greedy agreement {g['bf16_rerun']['agreement']:.4f}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--summary", metavar="JSON", help="print the headline numbers of a quality.json and exit")
    ap.add_argument("--out", help="directory for quality.json and quality.md")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="the CPU test's settings (minutes on a CPU)")
    ap.add_argument("--train-seconds", type=float, default=210)
    ap.add_argument("--train-steps", type=int, default=0, help="0: limited by --train-seconds only")
    ap.add_argument("--eval-windows", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--corpus-root", default=None, help="directory of .py files (default: the stdlib)")
    a = ap.parse_args(argv)
    if a.summary:
        with open(a.summary) as f:
            print(summary(json.load(f)))
        return
    if not a.out:
        ap.error("--out is required")
    if a.device == "cuda" and not snapmla.cuda_device_available():
        sys.exit("--device cuda: snapmla has no CUDA kernels or no sm_90 GPU here (snapmla.info(): "
                 f"{snapmla.info()}); use --device cpu --tiny")
    kw = dict(TINY) if a.tiny else dict(train_seconds=a.train_seconds, train_steps=a.train_steps,
                                         eval_windows=a.eval_windows, prompts=a.prompts, new_tokens=a.new_tokens)
    run_study(out_dir=a.out, device=a.device, corpus_root=a.corpus_root, **kw)


if __name__ == "__main__":
    main()
