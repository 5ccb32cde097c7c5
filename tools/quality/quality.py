"""The quality study: train the small MLA model of mla_lm.py on the Python standard library's
sources shipped with the interpreter (with synthetic key-value retrieval sequences mixed in),
then measure what each KV cache does to its predictions, on the trained model and on an
outlier-channel transform of it.

    python tools/quality/quality.py --out DIR [--seed N] [--train-seconds 300] [--device cuda]
    python tools/quality/quality.py --merge DIR RUN0/quality.json RUN1/quality.json ...
    python tools/quality/quality.py --summary DIR/quality.json
    python tools/quality/quality.py --readme-table DIR/quality.json

writes DIR/quality.json and DIR/quality.md. Needs PyTorch and the snapmla package; on an sm_90
GPU the caches run through the CUDA kernels, elsewhere through the CPU reference (slow: use
--tiny, as the test does). One invocation is one training seed; --merge combines seeds.

Data: every .py file under the interpreter's stdlib directory (site-packages and the generated
encodings/ codec tables excluded), in sorted order; a file is held out when crc32(its relative
path) % 16 == 0, so the split is the same on every run and machine with the same Python. A
held-out file is dropped when more than 30% of its lines of 16 or more characters (stripped)
appear verbatim in the training files (near-duplicates); the overlap of every held-out file is
in the JSON. Tokens are bytes (0..255) and BOS (256); files are joined with a blank line, and
every training and evaluation window starts with BOS.

Perplexity runs every window of the whole held-out text (consecutive, non-overlapping; the tail
shorter than a window is left out and counted) through the model four ways, identical except
for attention: the model's own causal attention (SDPA: "exact") and, in every layer, the paged
caches of mla_lm.PagedMLACache ("bf16" = decode_bf16, "fp8" = SnapMLA's decode_fp8,
"tensor_fp8" = the static scale-1.0 recipe through decode_fp8). The cached runs are teacher-
forced decoding: each layer appends the window's rows and attends every position to exactly
its prefix, so the logits are those of token-by-token decoding over that cache. Against the
exact logits: teacher-forced top-1 agreement and KL(exact || cache). Every number over windows
has a paired bootstrap 95% interval (the same resampled windows for every cache).

Retrieval: a record is one line, a key byte and a value symbol (one of 62 digits and letters);
keys are the 128 bytes 0x80-0xFF (0.03% of the stdlib text's bytes, inside non-ASCII
characters), drawn without replacement, so each occurs once before it is asked. A question is `?`
and a record's line again: answering is "find the earlier occurrence of this byte and copy the
symbol after it", the lookup an induction head does, which the model's previous-token embedding
lets one attention layer do (lab/retrieval_probe.py measures how fast small models learn it;
6-letter keys `key=value` were never learned, nor 4-digit values without that embedding).
Training mixes in sequences of records, questions about earlier records and blank lines, with
2 to 128 keys per sequence (log-uniform: few keys asked many times teach the lookup fastest)
and position jumps between lines so an 8K sequence spans up to 64K positions; every step also
trains 32 short retrieval sequences of 256 tokens, where the lookup is learned first. The test
haystack (8K, 32K, 64K tokens) holds min(128, what fits) records evenly spread over blank lines,
then the question about a record that starts in the first half. The prompt is prefilled with
the model's own attention and its rows written into each cache (as an engine's prefill writes
the cache), then the question and answer are decoded through the cache, teacher-forced; a sample
is correct when the answer symbol is the argmax, which is exactly when greedy decoding would
produce it.

Outlier model: mla_lm.outlier_transform of the trained model (a few latent channels 300-1000x
the median RMS, values well past e4m3's 448, a large-norm BOS sink, the same function),
evaluated the same way.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import sysconfig
import time
import zlib

import numpy as np
import torch
import torch.nn.functional as F

import snapmla
from mla_lm import (BOS, CACHE_KINDS, EMULATED_KINDS, LATENT, MLALM, OUTLIER_HI, OUTLIER_LO, Config, PagedMLACache,
                    make_cache, outlier_transform)

KINDS = ("exact",) + CACHE_KINDS  # "exact" is the reference for top-1 / KL, "bf16" for ppl ratios
KIND_LABEL = {
    "exact": "model's own attention (SDPA, bf16)",
    "bf16": "BF16 cache, decode_bf16",
    "fp8": "SnapMLA FP8 cache, decode_fp8",
    "tensor_fp8": "per-tensor FP8, scale 1.0, through decode_fp8",
    # --retrieval-diagnostics: attention emulated in float32 torch (mla_lm.EmulatedMLACache)
    "emu_bf16": "emulated: float32 attention over the BF16 rows",
    "emu_fp8": "emulated: FP8 QK and FP8 PV (as decode_fp8 with per-page P' scales)",
    "emu_fp8_qk": "emulated: FP8 QK only",
    "emu_fp8_pv": "emulated: FP8 PV only",
}
HELDOUT_EVERY = 16
EXCLUDED_DIRS = ("site-packages", "dist-packages", "__pycache__", "encodings")
OVERLAP_MIN_CHARS = 16  # lines shorter than this (stripped) are too generic to count
OVERLAP_MAX = 0.3  # a held-out file with more of its lines in the training files is dropped
RETRIEVAL_LENGTHS = (8192, 32768, 65536)

# --- data ----------------------------------------------------------------------------------


def corpus_files(root: str):
    """Relative paths of the .py files under root, sorted (EXCLUDED_DIRS left out)."""
    rels = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in EXCLUDED_DIRS)
        rels += [os.path.relpath(os.path.join(d, f), root) for f in files if f.endswith(".py")]
    return sorted(rels)


def is_heldout(rel: str) -> bool:
    return zlib.crc32(rel.replace(os.sep, "/").encode()) % HELDOUT_EVERY == 0


def significant_lines(data: bytes, min_chars: int = OVERLAP_MIN_CHARS):
    """The stripped lines of data with at least min_chars bytes."""
    return [s for s in (line.strip() for line in data.split(b"\n")) if len(s) >= min_chars]


def line_overlap(data: bytes, train_lines: set, min_chars: int = OVERLAP_MIN_CHARS):
    """(fraction of data's significant lines found in train_lines, number of significant lines)."""
    lines = significant_lines(data, min_chars)
    if not lines:
        return 0.0, 0
    return sum(line in train_lines for line in lines) / len(lines), len(lines)


def load_corpus(root: str | None = None, overlap_max: float = OVERLAP_MAX):
    """(train bytes, held-out bytes, description) of the corpus under root (default: stdlib)."""
    root = root or sysconfig.get_paths()["stdlib"]
    files = {True: [], False: []}
    for rel in corpus_files(root):
        with open(os.path.join(root, rel), "rb") as f:
            files[is_heldout(rel)].append((rel, f.read()))
    train_lines = set()
    for _, data in files[False]:
        train_lines.update(significant_lines(data))
    kept, dropped, overlaps = [], [], []
    for rel, data in files[True]:
        frac, n = line_overlap(data, train_lines)
        row = {"file": rel.replace(os.sep, "/"), "bytes": len(data), "lines": n, "overlap": round(frac, 4)}
        (kept if frac <= overlap_max else dropped).append((rel, data))
        overlaps.append({**row, "kept": frac <= overlap_max})
    train = b"\n\n".join(d for _, d in files[False])
    held = b"\n\n".join(d for _, d in kept)
    if not train or not held:
        raise ValueError(f"root: expected .py files for both splits under {root!r}, got "
                         f"{len(files[False])} train / {len(kept)} held-out files")
    kept_ov = [o["overlap"] for o in overlaps if o["kept"]]
    kept_lines = sum(o["lines"] for o in overlaps if o["kept"])
    info = {"source": f"Python {platform.python_version()} standard library .py files", "root": root,
            "excluded_dirs": list(EXCLUDED_DIRS),
            "train_files": len(files[False]), "heldout_files": len(kept), "dropped_heldout_files": len(dropped),
            "train_bytes": len(train), "heldout_bytes": len(held),
            "split": f"held out: crc32(relative path) % {HELDOUT_EVERY} == 0; dropped: line overlap "
                     f"> {overlap_max} (lines of >= {OVERLAP_MIN_CHARS} chars)",
            "overlap": {"min_chars": OVERLAP_MIN_CHARS, "threshold": overlap_max,
                        "kept_max": max(kept_ov), "kept_mean": sum(kept_ov) / len(kept_ov),
                        # fraction of all significant held-out lines (kept files) found in training
                        "kept_lines_in_train": sum(o["overlap"] * o["lines"] for o in overlaps if o["kept"])
                        / max(1, kept_lines),
                        "files": overlaps}}
    return train, held, info


def to_tokens(data: bytes, device):
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device=device, dtype=torch.long)


def make_windows(stream, offsets, length: int):
    """[len(offsets), length + 1]: BOS then stream[o : o + length] per offset."""
    idx = offsets[:, None] + torch.arange(length, device=stream.device)[None, :]
    bos = torch.full((len(offsets), 1), BOS, dtype=torch.long, device=stream.device)
    return torch.cat([bos, stream[idx]], dim=1)


def heldout_windows(stream, length: int, count: int = 0):
    """Consecutive, non-overlapping windows from the start of the held-out text: all of them
    (count 0) or the first `count`."""
    avail = len(stream) // length
    count = avail if count <= 0 else min(count, avail)
    if count < 1:
        raise ValueError(f"length: the held-out text ({len(stream)} tokens) is shorter than one window of {length}")
    return make_windows(stream, torch.arange(count, device=stream.device) * length, length)


# --- retrieval sequences -------------------------------------------------------------------
#
# A record is one line: a key byte, a value of VALUE_LEN symbols (digits and ASCII letters),
# "\n". A question is "?" then a record's line again. Keys are single bytes from 0x80-0xFF, drawn
# without replacement, so a key occurs once in a sequence before it is asked (0.03% of the stdlib
# text's bytes are in that range, inside non-ASCII characters; a retrieval sequence holds no
# text): answering is "find the earlier occurrence of this byte and copy the symbol after it",
# what an induction head does. One value symbol of 62 (chance 1.6%): a lookup the model learns in
# its minutes of training (lab/retrieval_probe.py; further value symbols each need a second,
# positional copy that the small model learns far more slowly, and would measure that skill,
# not what a cache does to reading one record far back).

KEY_BASE, KEY_SYMBOLS = 0x80, 128  # key bytes: KEY_BASE .. KEY_BASE + KEY_SYMBOLS - 1
VALUE_ALPHABET = np.frombuffer(b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", dtype=np.uint8)
KEY_LEN, VALUE_LEN = 1, 1
NUM_KEYS = KEY_SYMBOLS ** KEY_LEN
RECORD_LEN = KEY_LEN + VALUE_LEN + 1  # key, value, "\n"
QUESTION_LEN = RECORD_LEN + 1  # "?", key, value, "\n"
QUESTION = ord("?")


def random_keys(rng, n: int):
    """n distinct keys [n, KEY_LEN] (uint8) of key bytes, drawn without replacement."""
    if not 0 <= n <= NUM_KEYS:
        raise ValueError(f"n: expected at most {NUM_KEYS} distinct keys, got {n}")
    got = rng.permutation(NUM_KEYS)[:n]
    digits = (got[:, None] // (KEY_SYMBOLS ** np.arange(KEY_LEN - 1, -1, -1))[None, :]) % KEY_SYMBOLS
    return (KEY_BASE + digits).astype(np.uint8)


def random_values(rng, n: int):
    """n values [n, VALUE_LEN] (uint8) of symbols drawn uniformly from VALUE_ALPHABET."""
    return VALUE_ALPHABET[rng.integers(0, len(VALUE_ALPHABET), size=(n, VALUE_LEN))]


def record_bytes(key, value, question: bool = False):
    return (b"?" if question else b"") + key.tobytes() + value.tobytes() + b"\n"


def retrieval_example(rng, length: int, depth=(0.0, 0.5)):
    """A retrieval sample of `length` input tokens: BOS, a haystack of min(NUM_KEYS, what fits)
    records evenly spread over blank lines, then the question: "?", the key of a record that
    starts at a relative depth in [depth) of the haystack, its value, "\n". Returns tokens
    [length + 1] (int64: inputs are tokens[:-1]), the index of "?" (the prompt is
    tokens[:question]), the indices of the answer symbols and of the target record."""
    hay = length - QUESTION_LEN
    n = min(NUM_KEYS, hay // RECORD_LEN)
    if n < 2:
        raise ValueError(f"length: expected room for 2 records and the question, got {length}")
    keys, values = random_keys(rng, n), random_values(rng, n)
    blank = hay - n * RECORD_LEN
    # record i starts after floor((i + 1) blank / n) blank lines: the records spread evenly and
    # the last one ends where the question starts
    starts = (np.arange(1, n + 1) * blank) // n + np.arange(n) * RECORD_LEN
    within = np.flatnonzero((starts >= depth[0] * hay) & (starts < depth[1] * hay))
    if not len(within):
        raise ValueError(f"depth: no record starts in {depth} of a {hay}-token haystack")
    target = int(within[rng.integers(0, len(within))])
    body = np.full(hay, ord("\n"), dtype=np.uint8)
    rec = np.concatenate([keys, values, np.full((n, 1), ord("\n"), dtype=np.uint8)], axis=1)
    body[starts[:, None] + np.arange(RECORD_LEN)[None, :]] = rec
    ask = np.frombuffer(record_bytes(keys[target], values[target], question=True), dtype=np.uint8)
    tokens = np.concatenate([[BOS], body, ask]).astype(np.int64)
    question = 1 + hay
    answer = np.arange(question + 1 + KEY_LEN, question + 1 + KEY_LEN + VALUE_LEN)
    return {"tokens": tokens, "question": question, "answer": answer, "record": 1 + int(starts[target])}


def retrieval_train_sequence(rng, length: int, max_span: int, query_prob: float = 0.35,
                             blank_prob: float = 0.1, min_keys: int = 2):
    """A training sequence of length + 1 tokens (BOS first) and its positions: lines that are
    new records (while the sequence's keys last), questions about a uniformly chosen earlier
    record (each question repeats that record's line after "?"), or blank. The number of keys
    is log-uniform in [min_keys, NUM_KEYS]: sequences with few keys ask each many times, which
    speeds up learning the lookup (lab/retrieval_probe.py); those with many keys are the test
    haystacks' case. Positions count up by one inside a line and jump between lines, so
    that the sequence spans a uniform number of positions in [length, max_span]: attention
    learns the far relative distances of long contexts at this length."""
    n_keys = int(np.exp(rng.uniform(np.log(min_keys), np.log(NUM_KEYS + 1))))
    n_keys = min(NUM_KEYS, max(min_keys, n_keys))
    keys, values = random_keys(rng, n_keys), random_values(rng, n_keys)
    parts, starts, size, made = [], [], 0, 0
    while size < length:
        starts.append(1 + size)
        u = rng.random()
        if u < blank_prob:
            line = b"\n"
        elif made and (made == n_keys or u < blank_prob + query_prob):
            j = int(rng.integers(0, made))
            line = record_bytes(keys[j], values[j], question=True)
        else:
            line = record_bytes(keys[made], values[made])
            made += 1
        parts.append(line)
        size += len(line)
    tokens = np.concatenate([[BOS], np.frombuffer(b"".join(parts), dtype=np.uint8)[:length]]).astype(np.int64)
    steps = np.ones(length + 1, dtype=np.int64)
    steps[0] = 0
    span = int(rng.integers(length, max(length, max_span) + 1))
    starts = np.array([s for s in starts if s <= length])
    if span > length and len(starts):
        steps[starts] += rng.multinomial(span - length, np.full(len(starts), 1.0 / len(starts)))
    return tokens, np.cumsum(steps)


def answer_mask(tokens: np.ndarray) -> np.ndarray:
    """[len(tokens) - 1] bool, True at the predictions (inputs tokens[:-1], targets tokens[1:])
    whose target is an answer symbol of a question: the VALUE_LEN bytes after `?` and a key
    byte. The loss there is ln 62 per symbol while nothing is looked up, towards 0 once it is."""
    mask = np.zeros(len(tokens) - 1, dtype=bool)
    for i in np.flatnonzero(tokens[:-1] == QUESTION):
        if not KEY_BASE <= tokens[i + 1] < KEY_BASE + KEY_SYMBOLS:
            continue
        lo = i + 1 + KEY_LEN  # the first answer symbol's index
        mask[lo - 1:min(lo + VALUE_LEN, len(tokens)) - 1] = True
    return mask


def retrieval_training_batch(rng, n: int, length: int, max_span: int, device):
    """n retrieval_train_sequence()s stacked: tokens [n, length + 1] and positions [n, length + 1]
    (int64), and answer_mask() of each [n, length] (bool), on device."""
    seqs = [retrieval_train_sequence(rng, length, max_span) for _ in range(n)]
    tokens = np.stack([t for t, _ in seqs])
    return (torch.from_numpy(tokens).to(device), torch.from_numpy(np.stack([p for _, p in seqs])).to(device),
            torch.from_numpy(np.stack([answer_mask(t) for t in tokens])).to(device))


def token_losses(model, tokens, positions=None):
    """Per-prediction cross entropy [B, n] of tokens[:, 1:] from the inputs tokens[:, :-1]
    (positions: those of the inputs, or None)."""
    logits = model(tokens[:, :-1], positions=positions)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1),
                           reduction="none").view(tokens.shape[0], -1)


def masked_mean(losses, mask) -> float:
    """The mean of losses where mask is set (nan where it is nowhere set)."""
    return losses.detach()[mask].mean().item() if mask.any() else float("nan")


# --- statistics ----------------------------------------------------------------------------


def paired_bootstrap(per_unit: dict, stat, n_boot: int = 2000, seed: int = 0, level: float = 0.95):
    """(point, lo, hi): stat(sums) of per-unit arrays (windows or samples), and its percentile
    interval over n_boot resamplings of the units with replacement, the same resampled units
    for every array (paired). stat takes a dict of sums (floats, or arrays over resamplings)."""
    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in per_unit.items()}
    n = len(next(iter(arrays.values())))
    point = float(stat({k: a.sum() for k, a in arrays.items()}))
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    boot = np.asarray(stat({k: a[idx].sum(1) for k, a in arrays.items()}), dtype=np.float64)
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    return point, float(lo), float(hi)


def rel_ppl(key: str, ref: str):
    """The stat ppl(key) / ppl(ref) - 1 from per-window NLL sums and token counts."""
    return lambda s: np.expm1((s[key] - s[ref]) / s["tokens"])


def _boot_seed(seed: int, *names) -> int:
    return zlib.crc32(" ".join(map(str, (seed,) + names)).encode())


# --- training ------------------------------------------------------------------------------


# the study's training defaults (run_study and the command line)
LR = 1e-3  # peak learning rate (the lookup is not learned in the budget at 1.5e-3: docs/accuracy.md)
RETRIEVAL_FRAC = 0.25  # share of each batch's ctx-token sequences that are retrieval sequences
SHORT_BATCH, SHORT_CTX = 32, 256  # short retrieval sequences per step, and their length


def autocast(device):
    return torch.autocast(device.type, dtype=torch.bfloat16)


def train(model, stream, *, ctx: int, batch: int, seconds: float, max_steps: int, lr: float,
          seed: int, retrieval_frac: float, retrieval_span: int, short_batch: int, short_ctx: int,
          log=print):
    """AdamW with warmup and cosine decay over whichever of `seconds` / `max_steps` ends first
    (0 = no limit of that kind); round(batch * retrieval_frac) of every batch's sequences are
    retrieval sequences of ctx tokens, and every step adds short_batch retrieval sequences of
    short_ctx tokens (spanning up to 8 x short_ctx positions) in a second pass: the loss is the
    mean over all tokens of both. The short ones are where the lookup is learned: in an 8K
    sequence the matching record is one of thousands of tokens an untrained head attends to, so
    its gradient is thousands of times weaker (the study's first runs learned no lookup from the
    long ones alone in 500 steps); the long ones keep the far distances and many-key haystacks in
    training. Returns the run's numbers, with the mean loss on answer symbols of both kinds."""
    device = stream.device
    groups = {True: [], False: []}  # weight decay on the matrices, not on norms or embeddings
    for n, p in model.named_parameters():
        groups[p.dim() >= 2 and not n.startswith(("embed", "prev_embed"))].append(p)
    opt = torch.optim.AdamW([{"params": groups[True], "weight_decay": 0.1},
                             {"params": groups[False], "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), fused=device.type == "cuda")
    gen = torch.Generator(device=device).manual_seed(seed)
    rng = np.random.default_rng([seed, 1])
    n_ret = int(round(batch * retrieval_frac))
    warmup = min(40, max(1, max_steps // 4)) if max_steps else 40
    losses, ret_losses, answer_long, answer_short, step, t0 = [], [], [], [], 0, time.perf_counter()
    text_pos = torch.arange(ctx + 1, device=device)
    while True:
        elapsed = time.perf_counter() - t0
        progress = max(step / max_steps if max_steps else 0.0, elapsed / seconds if seconds else 0.0)
        if progress >= 1.0 or (not max_steps and not seconds):
            break
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))
        offsets = torch.randint(0, len(stream) - ctx, (batch - n_ret,), device=device, generator=gen)
        w = make_windows(stream, offsets, ctx)
        positions = None
        if n_ret:
            rt, rp, long_mask = retrieval_training_batch(rng, n_ret, ctx, retrieval_span, device)
            w = torch.cat([w, rt])
            positions = torch.cat([text_pos.expand(batch - n_ret, -1), rp])[:, :-1]
        opt.zero_grad(set_to_none=True)
        total = batch * ctx + short_batch * short_ctx
        with autocast(device):
            tok_loss = token_losses(model, w, positions)
        loss = tok_loss.mean()
        (tok_loss.sum() / total).backward()
        if short_batch:
            st, sp, smask = retrieval_training_batch(rng, short_batch, short_ctx, 8 * short_ctx, device)
            with autocast(device):
                s_loss = token_losses(model, st, sp[:, :-1])
            (s_loss.sum() / total).backward()
            answer_short.append(masked_mean(s_loss, smask))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())  # synchronizes: the time check sees finished steps
        if n_ret:
            ret_losses.append(tok_loss[batch - n_ret:].mean().item())
            answer_long.append(masked_mean(tok_loss[batch - n_ret:], long_mask))
        step += 1
        if log and (step % 50 == 0 or step == 1):
            log(f"train step {step}: loss {losses[-1]:.3f}, answer loss long "
                f"{answer_long[-1] if answer_long else float('nan'):.3f} short "
                f"{answer_short[-1] if answer_short else float('nan'):.3f} ({time.perf_counter() - t0:.0f} s)")
    seconds_used = time.perf_counter() - t0
    tail = losses[-10:] or [float("nan")]
    rtail = ret_losses[-10:] or [float("nan")]

    def last10(xs):
        xs = [x for x in xs[-10:] if math.isfinite(x)]
        return sum(xs) / len(xs) if xs else float("nan")

    return {"steps": step, "tokens": step * batch * ctx, "seconds": round(seconds_used, 1),
            "batch": batch, "context": ctx, "peak_lr": lr, "seed": seed,
            "retrieval_sequences_per_batch": n_ret, "retrieval_position_span": retrieval_span,
            "short_retrieval_sequences_per_step": short_batch, "short_retrieval_context": short_ctx,
            "answer_loss_last10": last10(answer_long), "answer_loss_short_last10": last10(answer_short),
            "answer_loss_curve": [round(x, 3) for x in answer_long[:: max(1, len(answer_long) // 25)]],
            "answer_loss_short_curve": [round(x, 3) for x in answer_short[:: max(1, len(answer_short) // 25)]],
            "loss_first": losses[0] if losses else float("nan"),
            "loss_last10": sum(tail) / len(tail),
            "retrieval_loss_last10": sum(rtail) / len(rtail),
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


def kl_divergence(logp_ref, logp):
    """KL(ref || other) per position, from log-probabilities [..., vocab]."""
    return (logp_ref.exp() * (logp_ref - logp)).sum(-1)


@torch.no_grad()
def evaluate_perplexity(model, windows, batch: int, kinds=KINDS, seed: int = 0, log=print):
    """Per kind: ppl over all predicted tokens and per position bucket; per window: the NLL sum,
    top-1 agreement with the exact logits and KL(exact || kind); paired bootstrap intervals."""
    n = windows.shape[1] - 1
    edges = bucket_edges(n)
    nb = len(edges) - 1
    per = {k: {"nll": [], "top1": [], "kl": []} for k in kinds}
    buckets = {k: torch.zeros(nb, dtype=torch.float64) for k in kinds}
    for i in range(0, len(windows), batch):
        w = windows[i:i + batch]
        x, y = w[:, :-1], w[:, 1:]
        logp = {k: F.log_softmax(run_logits(model, x, k), dim=-1) for k in kinds}
        ref = logp["exact"]
        ref_top = ref.argmax(-1)
        for k in kinds:
            nll = -logp[k].gather(-1, y[..., None])[..., 0].double()  # [B, n]
            for j in range(nb):
                buckets[k][j] += nll[:, edges[j]:edges[j + 1]].sum().cpu()
            per[k]["nll"] += nll.sum(1).tolist()
            per[k]["top1"] += (logp[k].argmax(-1) == ref_top).double().sum(1).tolist()
            per[k]["kl"] += kl_divergence(ref, logp[k]).double().sum(1).tolist()
        if log:
            log(f"ppl windows {i + len(w)}/{len(windows)}")
    tokens = [float(n)] * len(windows)
    out = {}
    for k in kinds:
        d = {"tokens": tokens, "a": per[k]["nll"], "bf16": per["bf16"]["nll"], "exact": per["exact"]["nll"],
             "top1": per[k]["top1"], "kl": per[k]["kl"]}
        total = sum(per[k]["nll"])
        count = n * len(windows)
        _, vb_lo, vb_hi = paired_bootstrap(d, rel_ppl("a", "bf16"), seed=_boot_seed(seed, "ppl"))
        _, ve_lo, ve_hi = paired_bootstrap(d, rel_ppl("a", "exact"), seed=_boot_seed(seed, "ppl"))
        t1, t1_lo, t1_hi = paired_bootstrap(d, lambda s: s["top1"] / s["tokens"], seed=_boot_seed(seed, "ppl"))
        kl, kl_lo, kl_hi = paired_bootstrap(d, lambda s: s["kl"] / s["tokens"], seed=_boot_seed(seed, "ppl"))
        size = lambda j: (edges[j + 1] - edges[j]) * len(windows)  # noqa: E731
        out[k] = {"ppl": math.exp(total / count), "bits_per_byte": total / count / math.log(2),
                  "ppl_by_position": {f"{edges[j]}-{edges[j + 1]}": math.exp(float(buckets[k][j]) / size(j))
                                      for j in range(nb)},
                  "ppl_vs_bf16": math.expm1((total - sum(per["bf16"]["nll"])) / count),
                  "ppl_vs_bf16_ci": [vb_lo, vb_hi],
                  "ppl_vs_exact": math.expm1((total - sum(per["exact"]["nll"])) / count),
                  "ppl_vs_exact_ci": [ve_lo, ve_hi],
                  "top1_vs_exact": t1, "top1_vs_exact_ci": [t1_lo, t1_hi],
                  "kl_vs_exact": kl, "kl_vs_exact_ci": [kl_lo, kl_hi]}
    return {"windows": len(windows), "context": n, "tokens": n * len(windows), "by_cache": out,
            "per_window": {"tokens_each": n, "nll": {k: per[k]["nll"] for k in kinds},
                           "top1": {k: per[k]["top1"] for k in kinds}, "kl": {k: per[k]["kl"] for k in kinds}}}


# --- retrieval -----------------------------------------------------------------------------


@torch.no_grad()
def retrieval_batch(model, examples, kinds=KINDS):
    """{kind: [bool per example]}: every answer symbol is the argmax. exact: the whole sequence
    through the model's own attention; caches: the prompt's rows from that same pass written
    into the cache (a prefill), then question and answer decoded through it, teacher-forced."""
    device = next(model.parameters()).device
    full = torch.from_numpy(np.stack([e["tokens"] for e in examples])).to(device)
    q, ans = examples[0]["question"], torch.from_numpy(examples[0]["answer"]).to(device)
    x, want = full[:, :-1], full[:, ans]
    rows = []
    out = {}
    with autocast(device):
        logits = model(x, record=rows)
        out["exact"] = (logits[:, ans - 1].argmax(-1) == want).all(-1).tolist()
        del logits
        prefix = [r[:, :q].contiguous() for r in rows]
        del rows
        for kind in kinds:
            if kind == "exact":
                continue
            cache = make_cache(kind, model.cfg.n_layers, x.shape[0], x.shape[1], device)
            cache.fill(prefix, last_token=x[:, q - 1])
            lg = model(x[:, q:], cache)
            out[kind] = (lg[:, ans - 1 - q].argmax(-1) == want).all(-1).tolist()
    return {k: out[k] for k in kinds}


def evaluate_retrieval(model, lengths, samples: int, batch_tokens: int, kinds=KINDS, data_seed: int = 1234,
                       seed: int = 0, deadline: float | None = None, log=print):
    """Accuracy per kind and length over `samples` examples per length (the same examples for
    every kind and every training seed), with paired bootstrap intervals of each kind's
    difference to the bf16 cache; stops adding batches past `deadline` (perf_counter time),
    recording how many samples each length got."""
    res = {"lengths": list(lengths), "samples_requested": samples, "depth": [0.0, 0.5], "by_length": {}}
    for L in lengths:
        rng = np.random.default_rng([data_seed, L])
        b = max(1, batch_tokens // L)
        ok = {k: [] for k in kinds}
        t0 = time.perf_counter()
        while len(ok[kinds[0]]) < samples:
            if deadline is not None and time.perf_counter() > deadline and ok[kinds[0]]:
                break
            m = min(b, samples - len(ok[kinds[0]]))
            got = retrieval_batch(model, [retrieval_example(rng, L) for _ in range(m)], kinds)
            for k in kinds:
                ok[k] += got[k]
        row = {"samples": len(ok[kinds[0]]), "seconds": round(time.perf_counter() - t0, 1), "by_cache": {}}
        for k in kinds:
            d = {"a": [float(v) for v in ok[k]], "bf16": [float(v) for v in ok["bf16"]]}
            n = len(ok[k])
            _, lo, hi = paired_bootstrap(d, lambda s: (s["a"] - s["bf16"]) / n, seed=_boot_seed(seed, "ret", L))
            row["by_cache"][k] = {"accuracy": sum(ok[k]) / n, "vs_bf16_ci": [lo, hi],
                                  "correct": "".join("1" if v else "0" for v in ok[k])}
        res["by_length"][str(L)] = row
        if log:
            log(f"retrieval {L}: {row['samples']} samples, {row['seconds']} s, "
                + ", ".join(f"{k} {v['accuracy']:.3f}" for k, v in row["by_cache"].items()))
    return res


def retrieval_table(ret):
    """{kind: {str(length): accuracy}}."""
    kinds = next(iter(ret["by_length"].values()))["by_cache"].keys()
    return {k: {L: row["by_cache"][k]["accuracy"] for L, row in ret["by_length"].items()} for k in kinds}


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


def commit_of_tree(repo: str) -> str:
    """SNAPMLA_COMMIT, else `git rev-parse --short HEAD` in repo, else "unknown"."""
    env = os.environ.get("SNAPMLA_COMMIT")
    if env:
        return env
    try:
        return subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def headline(ppl, ret):
    """The top-level numbers of one model's evaluation."""
    by = ppl["by_cache"]
    return {"ppl_exact": by["exact"]["ppl"], "ppl_bf16": by["bf16"]["ppl"], "ppl_fp8": by["fp8"]["ppl"],
            "ppl_tensor_fp8": by["tensor_fp8"]["ppl"],
            "ppl_fp8_vs_bf16": by["fp8"]["ppl_vs_bf16"], "ppl_tensor_fp8_vs_bf16": by["tensor_fp8"]["ppl_vs_bf16"],
            "ppl_fp8_rel_ci": by["fp8"]["ppl_vs_bf16_ci"], "ppl_tensor_fp8_rel_ci": by["tensor_fp8"]["ppl_vs_bf16_ci"],
            "top1_vs_exact": {k: v["top1_vs_exact"] for k, v in by.items()},
            "kl_vs_exact": {k: v["kl_vs_exact"] for k, v in by.items()},
            "retrieval": retrieval_table(ret)}


def evaluate_model(model, windows, *, eval_batch, retrieval_lengths, retrieval_samples, retrieval_batch_tokens,
                   seed, deadline, log, retrieval_kinds=KINDS):
    """Perplexity, retrieval and cache statistics of one model; the headline keys on top."""
    t0 = time.perf_counter()
    ppl = evaluate_perplexity(model, windows, eval_batch, seed=seed, log=log)
    ppl["seconds"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    ret = evaluate_retrieval(model, retrieval_lengths, retrieval_samples, retrieval_batch_tokens,
                             kinds=retrieval_kinds, seed=seed, deadline=deadline, log=log)
    ret["seconds"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    stats = cache_statistics(model, windows[0])
    stats["seconds"] = round(time.perf_counter() - t0, 1)
    return {**headline(ppl, ret), "perplexity": ppl, "retrieval_detail": ret, "cache_statistics": stats}


def run_study(*, out_dir: str, device: str = "cuda", config: Config | None = None,
              train_seconds: float = 300, train_steps: int = 0, train_ctx: int = 8192,
              train_batch: int = 8, lr: float = LR, retrieval_frac: float = RETRIEVAL_FRAC,
              retrieval_span: int = 65536, short_batch: int = SHORT_BATCH, short_ctx: int = SHORT_CTX,
              eval_len: int = 8192, eval_windows: int = 0, eval_batch: int = 4,
              retrieval_lengths=RETRIEVAL_LENGTHS, retrieval_samples: int = 100,
              retrieval_batch_tokens: int = 262144, outlier_channels: int = 8, outlier_lo: float = OUTLIER_LO,
              outlier_hi: float = OUTLIER_HI, prompts: int = 16, prompt_len: int = 2048, new_tokens: int = 128,
              budget_seconds: float = 0, corpus_root: str | None = None, seed: int = 0, commit: str | None = None,
              retrieval_diagnostics: bool = False, log=print):
    """Train, evaluate, write out_dir/quality.{json,md}; returns the results dict. budget_seconds
    (0: none): retrieval stops adding samples, and greedy generation is left out, where the
    study would run past it (what ran is recorded). retrieval_diagnostics: retrieval also through
    mla_lm.EMULATED_KINDS (which part of the FP8 arithmetic changes an answer)."""
    t_start = time.perf_counter()
    deadline = t_start + budget_seconds if budget_seconds else None
    log = log or (lambda *_: None)
    dev = torch.device(device)
    torch.manual_seed(seed)
    cfg = config or Config()
    train_bytes, held_bytes, data_info = load_corpus(corpus_root)
    train_stream, held = to_tokens(train_bytes, dev), to_tokens(held_bytes, dev)
    model = MLALM(cfg, seed=seed).to(dev)
    log(f"model: {model.num_parameters() / 1e6:.1f} M parameters; data: "
        + ", ".join(f"{k} {v}" for k, v in data_info.items() if k != "overlap"))
    # Every evaluation path once on short inputs before training, so a failure costs seconds.
    smoke = heldout_windows(held, min(256, eval_len), 1)
    evaluate_perplexity(model, smoke, 1, log=None)
    retrieval_batch(model, [retrieval_example(np.random.default_rng(0), min(256, eval_len))])
    evaluate_greedy(model, smoke[:, :16], 2, log=None)
    outlier_transform(model, smoke, outlier_channels, outlier_lo, outlier_hi)

    training = train(model, train_stream, ctx=train_ctx, batch=train_batch, seconds=train_seconds,
                     max_steps=train_steps, lr=lr, seed=seed, retrieval_frac=retrieval_frac,
                     retrieval_span=retrieval_span, short_batch=short_batch, short_ctx=short_ctx, log=log)
    log(f"training: {training['steps']} steps, {training['seconds']} s, loss {training['loss_last10']:.3f} "
        f"(retrieval sequences {training['retrieval_loss_last10']:.3f}; answer symbols: long "
        f"{training['answer_loss_last10']:.3f}, short {training['answer_loss_short_last10']:.3f}, "
        f"ln {len(VALUE_ALPHABET)} = {math.log(len(VALUE_ALPHABET)):.2f} without a lookup)")
    model.eval()

    windows = heldout_windows(held, eval_len, eval_windows)
    used = windows.shape[0] * eval_len
    data_info["heldout_tokens_evaluated"] = used
    data_info["heldout_fraction_evaluated"] = used / len(held)
    kw = dict(eval_batch=eval_batch, retrieval_lengths=retrieval_lengths, retrieval_samples=retrieval_samples,
              retrieval_batch_tokens=retrieval_batch_tokens, seed=seed, log=log,
              retrieval_kinds=KINDS + (EMULATED_KINDS if retrieval_diagnostics else ()))

    def share(frac):  # a deadline `frac` of the way from now to the study's deadline
        return None if deadline is None else time.perf_counter() + frac * max(0.0, deadline - time.perf_counter())

    base = evaluate_model(model, windows, deadline=share(0.45), **kw)
    # The outlier transform, calibrated on training text (not the held-out windows).
    calib = make_windows(train_stream, torch.tensor([0, len(train_stream) // 2], device=dev), eval_len)
    t0 = time.perf_counter()
    omodel, transform = outlier_transform(model, calib, outlier_channels, outlier_lo, outlier_hi)
    transform["seconds"] = round(time.perf_counter() - t0, 1)
    outlier = evaluate_model(omodel, windows, deadline=share(0.8), **kw)
    outlier["transform"] = transform
    del omodel

    t0 = time.perf_counter()
    if deadline is None or time.perf_counter() < deadline:
        # Prompts from evenly spaced offsets of the held-out text.
        span = len(held) - prompt_len
        offsets = (torch.arange(prompts, device=dev) * (span // max(prompts, 1))).clamp_max(span - 1)
        gen = evaluate_greedy(model, make_windows(held, offsets, prompt_len - 1), new_tokens, log=log)
    else:
        gen = {"skipped": "past the study's time budget", "by_cache": {}}
    gen["seconds"] = round(time.perf_counter() - t0, 1)

    g = gen["by_cache"]
    results = {
        "commit": commit or commit_of_tree(os.path.dirname(os.path.abspath(__file__))),
        "date": datetime.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
        "seed": seed,
        **{k: v for k, v in base.items() if k not in ("perplexity", "retrieval_detail", "cache_statistics")},
        **{f"greedy_agreement_{k}": g[k]["agreement"] for k in ("exact", "fp8", "tensor_fp8", "bf16_rerun") if k in g},
        "outlier": outlier,
        "model": {**cfg.to_dict(), "parameters": model.num_parameters(), "kv_lora_rank": LATENT,
                  "qk_rope_dim": 64, "qk_nope_dim": 128, "v_dim": 128, "tokenizer": "bytes + BOS"},
        "data": data_info,
        "training": training,
        "perplexity": base["perplexity"],
        "retrieval_detail": base["retrieval_detail"],
        "greedy": gen,
        "cache_statistics": base["cache_statistics"],
        "environment": {"torch": torch.__version__, "snapmla": snapmla.info(), "device": device,
                        "python": platform.python_version()},
        "budget_seconds": budget_seconds,
        "total_seconds": round(time.perf_counter() - t_start, 1),
    }
    write_results(results, out_dir)
    log(f"wrote {out_dir}/quality.json and quality.md ({results['total_seconds']} s in all)")
    return results


def write_results(results, out_dir: str):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "quality.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(out_dir, "quality.md"), "w") as f:
        f.write(render_markdown(results))


# --- merging seeds -------------------------------------------------------------------------


def merged_rel_ci(runs, section, key: str, ref: str = "bf16", n_boot: int = 2000, level: float = 0.95):
    """(mean over runs of ppl(key) / ppl(ref) - 1, lo, hi): the interval of the mean over the
    runs (training seeds), each run's windows resampled independently (a stratified bootstrap)."""
    rng = np.random.default_rng(_boot_seed(0, "merge", key))
    points, boots = [], []
    for r in runs:
        pw = section(r)["perplexity"]["per_window"]
        a, b = np.asarray(pw["nll"][key]), np.asarray(pw["nll"][ref])
        tokens = pw["tokens_each"] * len(a)
        points.append(math.expm1((a.sum() - b.sum()) / tokens))
        idx = rng.integers(0, len(a), size=(n_boot, len(a)))
        boots.append(np.expm1((a[idx].sum(1) - b[idx].sum(1)) / tokens))
    lo, hi = np.quantile(np.mean(boots, axis=0), [(1 - level) / 2, (1 + level) / 2])
    return float(np.mean(points)), float(lo), float(hi)


def _merge_section(runs, section):
    """The headline keys of section(run) for every run, averaged (retrieval: pooled accuracy)."""
    first = section(runs[0])
    out = {}
    for k in ("ppl_exact", "ppl_bf16", "ppl_fp8", "ppl_tensor_fp8"):
        out[k] = float(np.mean([section(r)[k] for r in runs]))
    for kind in ("fp8", "tensor_fp8"):
        p, lo, hi = merged_rel_ci(runs, section, kind)
        out[f"ppl_{kind}_vs_bf16"], out[f"ppl_{kind}_rel_ci"] = p, [lo, hi]
    for k in ("top1_vs_exact", "kl_vs_exact"):
        out[k] = {kind: float(np.mean([section(r)[k][kind] for r in runs])) for kind in first[k]}
    ret = {}
    for kind, by_len in first["retrieval"].items():
        ret[kind] = {}
        for L in by_len:
            rows = [section(r)["retrieval_detail"]["by_length"][L]["by_cache"][kind]["correct"] for r in runs
                    if L in section(r)["retrieval_detail"]["by_length"]]
            ret[kind][L] = sum(s.count("1") for s in rows) / max(1, sum(len(s) for s in rows))
    out["retrieval"] = ret
    return out


def merge_runs(runs):
    """One results dict from the per-seed results of the same study."""
    if len({r["seed"] for r in runs}) != len(runs):
        raise ValueError(f"runs: expected distinct seeds, got {[r['seed'] for r in runs]}")
    base = _merge_section(runs, lambda r: r)
    outlier = _merge_section(runs, lambda r: r["outlier"])
    per_seed = []
    for r in runs:
        per_seed.append({"seed": r["seed"], "commit": r["commit"], "date": r["date"],
                         **{k: r[k] for k in ("ppl_exact", "ppl_bf16", "ppl_fp8", "ppl_tensor_fp8", "ppl_fp8_vs_bf16",
                                               "ppl_fp8_rel_ci", "ppl_tensor_fp8_vs_bf16", "ppl_tensor_fp8_rel_ci",
                                               "top1_vs_exact", "kl_vs_exact", "retrieval")},
                         "outlier": {k: r["outlier"][k] for k in ("ppl_bf16", "ppl_fp8", "ppl_tensor_fp8",
                                                                   "ppl_fp8_vs_bf16", "ppl_fp8_rel_ci",
                                                                   "ppl_tensor_fp8_vs_bf16", "ppl_tensor_fp8_rel_ci",
                                                                   "retrieval")},
                         "training": {k: r["training"].get(k) for k in ("steps", "seconds", "loss_last10",
                                                                         "retrieval_loss_last10", "answer_loss_last10",
                                                                         "answer_loss_short_last10")},
                         "total_seconds": r["total_seconds"]})
    first = runs[0]
    return {"commit": ",".join(sorted({r["commit"] for r in runs})), "date": max(r["date"] for r in runs),
            "gpu": first["gpu"], "seeds": [r["seed"] for r in runs], **base, "outlier": {**outlier},
            "per_seed": per_seed, "model": first["model"], "data": first["data"],
            "environment": first["environment"], "runs": runs}


# --- reports -------------------------------------------------------------------------------


def _fmt(x):
    if isinstance(x, int):
        return str(x)
    return f"{x:.3g}" if abs(x) < 1e-2 or abs(x) >= 1e4 else f"{x:.4g}"


def _pct(x, ci=None, digits=3):
    s = f"{x:+.{digits}%}"
    return s + (f" [{ci[0]:+.{digits}%}, {ci[1]:+.{digits}%}]" if ci else "")


def length_label(L) -> str:
    L = int(L)
    return f"{L // 1024}K" if L >= 1024 and L % 1024 == 0 else str(L)


def readme_table(r) -> str:
    """The README's quality table from a results dict (one seed or merged)."""
    lens = list(r["retrieval"]["bf16"])
    head = ("| model / cache | ppl | vs BF16 cache [95% CI] | top-1 = exact | "
            + " | ".join(f"retrieval @ {length_label(L)}" for L in lens) + " |")
    lines = [head, "| --- " * (4 + len(lens)) + "|"]
    for name, sec in (("trained", r), ("outlier", r["outlier"])):
        for kind in KINDS:
            rel = "0 (reference)" if kind == "bf16" else (
                _pct(sec[f"ppl_{kind}_vs_bf16"], sec.get(f"ppl_{kind}_rel_ci")) if kind != "exact"
                else _pct(sec["ppl_exact"] / sec["ppl_bf16"] - 1))
            lines.append(f"| {name}, {KIND_LABEL[kind]} | {sec[f'ppl_{kind}']:.4f} | {rel} | "
                         f"{sec['top1_vs_exact'][kind]:.4f} | "
                         + " | ".join(f"{sec['retrieval'][kind][L]:.3f}" for L in lens) + " |")
    return "\n".join(lines)


def _ppl_rows(p):
    buckets = list(p["by_cache"]["bf16"]["ppl_by_position"])
    lines = ["| attention / cache | ppl | vs decode_bf16 [95% CI] | top-1 = exact [95% CI] | "
             "KL(exact \\|\\| cache) [95% CI] | " + " | ".join(f"ppl @ {b}" for b in buckets) + " |",
             "| --- " * (5 + len(buckets)) + "|"]
    for k, v in p["by_cache"].items():
        lines.append(f"| {KIND_LABEL[k]} | {v['ppl']:.4f} | {_pct(v['ppl_vs_bf16'], v['ppl_vs_bf16_ci'])} | "
                     f"{v['top1_vs_exact']:.4%} [{v['top1_vs_exact_ci'][0]:.4%}, {v['top1_vs_exact_ci'][1]:.4%}] | "
                     f"{v['kl_vs_exact']:.2e} [{v['kl_vs_exact_ci'][0]:.2e}, {v['kl_vs_exact_ci'][1]:.2e}] | "
                     + " | ".join(f"{v['ppl_by_position'][b]:.4f}" for b in buckets) + " |")
    return lines


def _retrieval_rows(ret):
    lens = list(ret["by_length"])
    lines = ["| attention / cache | " + " | ".join(
        f"{length_label(L)}: accuracy (vs BF16 cache, 95% CI)" for L in lens) + " |",
        "| --- " * (1 + len(lens)) + "|"]
    for k in next(iter(ret["by_length"].values()))["by_cache"]:
        cells = []
        for L in lens:
            v = ret["by_length"][L]["by_cache"][k]
            cells.append(f"{v['accuracy']:.3f} ({_pct(v['accuracy'] - ret['by_length'][L]['by_cache']['bf16']['accuracy'], v['vs_bf16_ci'], 1)})")
        lines.append(f"| {KIND_LABEL[k]} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Samples per length: " + ", ".join(
        f"{length_label(L)} {ret['by_length'][L]['samples']} ({ret['by_length'][L]['seconds']} s)" for L in lens)
        + f" of {ret['samples_requested']} requested.")
    return lines


STATS_SHORT = ("outlier_channels", "channel_rms_max_over_median", "sink_norm_over_median", "latent_amax",
               "cache_frac_over_448", "cache_frac_below_2^-6", "query_frac_below_2^-6")


def _single_markdown(r):
    m, d, t, p, g, s = (r[k] for k in ("model", "data", "training", "perplexity", "greedy", "cache_statistics"))
    o = r["outlier"]
    ov = d["overlap"]
    lines = [
        "# Quality on a trained MLA model",
        "",
        f"Made by `tools/quality/quality.py` (commit {r['commit']}, {r['date']}, "
        f"{r['gpu'] or r['environment']['device']}, torch {r['environment']['torch']}; training seed {r['seed']}; "
        f"{r['total_seconds']} s in all).",
        "",
        f"**Model**: {m['parameters'] / 1e6:.1f} M parameters, {m['n_layers']} layers, d_model {m['d_model']}, "
        f"{m['n_heads']} heads, MLA with kv_lora_rank {m['kv_lora_rank']}, rope {m['qk_rope_dim']}, q nope "
        f"{m['qk_nope_dim']} + rope {m['qk_rope_dim']}, v {m['v_dim']}; RMSNorm, SwiGLU (d_ff {m['d_ff']}); "
        f"{m['tokenizer']}.",
        f"**Data**: {d['source']} (excluded folders: {', '.join(d['excluded_dirs'])}): {d['train_files']} files / "
        f"{d['train_bytes'] / 1e6:.1f} MB for training, {d['heldout_files']} files / {d['heldout_bytes'] / 1e6:.2f} MB "
        f"held out ({d['split']}; {d['dropped_heldout_files']} held-out files dropped). Line overlap of the kept "
        f"held-out files with the training files: max {ov['kept_max']:.1%}, mean {ov['kept_mean']:.1%}, "
        f"{ov['kept_lines_in_train']:.1%} of all their lines of >= {ov['min_chars']} characters. Evaluated: "
        f"{p['windows']} windows, {d['heldout_tokens_evaluated']} tokens, {d['heldout_fraction_evaluated']:.1%} of "
        "the held-out text (windows from its start; the tail shorter than a window is left out).",
        f"**Training**: {t['steps']} steps of {t['batch']} x {t['context']} tokens ({t['tokens'] / 1e6:.1f} M "
        f"tokens, {t['retrieval_sequences_per_batch']} retrieval sequences per batch spanning up to "
        f"{t['retrieval_position_span']} positions) in {t['seconds']} s, AdamW, peak lr {t['peak_lr']}; loss "
        f"{t['loss_first']:.3f} -> {t['loss_last10']:.3f} nats/byte (last 10 steps; retrieval sequences "
        f"{t['retrieval_loss_last10']:.3f}). Every step also trains {t.get('short_retrieval_sequences_per_step', 0)} "
        f"short retrieval sequences of {t.get('short_retrieval_context', 0)} tokens. Loss on the questions' answer "
        f"symbols (ln {len(VALUE_ALPHABET)} = {math.log(len(VALUE_ALPHABET)):.2f} without a lookup), last 10 "
        f"steps: {t.get('answer_loss_last10', float('nan')):.3f} in the long sequences, "
        f"{t.get('answer_loss_short_last10', float('nan')):.3f} in the short ones.",
        "",
        f"## Perplexity: {p['windows']} held-out windows of {p['context']} tokens ({p['tokens']} predictions)",
        "",
        "Every cache is read by teacher-forced decoding in every layer: each position attends to exactly its "
        "prefix, as token-by-token decoding over that cache would. Intervals: paired bootstrap over windows "
        "(2000 resamplings, the same for every cache).",
        "",
        *_ppl_rows(p),
        "",
        "## Retrieval through the caches",
        "",
        f"A haystack of up to {NUM_KEYS} records (a key byte from 0x{KEY_BASE:X}-0x{KEY_BASE + KEY_SYMBOLS - 1:X}, "
        f"each once, and {VALUE_LEN} value symbol(s) of {len(VALUE_ALPHABET)}) evenly spread over blank lines "
        "fills the context; the final "
        "`?` and key ask for a record in the first half. The prompt is prefilled with the model's own attention "
        "and its rows written into each cache; question and answer are then decoded through the cache. "
        f"Correct: the answer's {VALUE_LEN} symbol(s) are the argmax (what greedy decoding produces). Intervals: paired "
        "bootstrap over samples of the difference to the BF16 cache.",
        "",
        *_retrieval_rows(r["retrieval_detail"]),
        "",
        "## Outlier model",
        "",
        f"`mla_lm.outlier_transform` of the trained model: per layer the {o['transform']['channels']} latent "
        "channels where the BOS row is furthest from the other tokens are centred and scaled to "
        f"{o['transform']['target_hi']:g}..{o['transform']['target_lo']:g}x the median channel RMS, the "
        "scales undone in W_uk and W_uv and the centring in the values; the same function in exact arithmetic "
        f"(model's own attention: ppl {o['ppl_exact']:.4f}, trained model {r['ppl_exact']:.4f}).",
        "",
        "| cache statistic | trained: median over layers | outlier: median | outlier: min | outlier: max |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key in STATS_SHORT:
        v = o["cache_statistics"]["summary"][key]
        lines.append(f"| {STAT_LABEL[key]} | {_fmt(s['summary'][key]['median'])} | {_fmt(v['median'])} | "
                     f"{_fmt(v['min'])} | {_fmt(v['max'])} |")
    lines += ["", *_ppl_rows(o["perplexity"]), "", *_retrieval_rows(o["retrieval_detail"]), ""]
    if g.get("skipped"):
        lines += ["## Greedy generation", "", f"Left out: {g['skipped']}.", ""]
    else:
        lines += [
            f"## Greedy generation: {g['prompts']} held-out prompts of {g['prompt_len']} tokens, "
            f"{g['new_tokens']} new tokens",
            "",
            "Agreement: the fraction of generated tokens equal to the BF16 cache run's, position by position; "
            "first divergence: the mean position of the first differing token (the length when none differs). "
            "The model's own attention diverges from the BF16 cache too: greedy agreement measures how "
            "chaotic free-running decoding is as much as a cache's error, so read it beside that row. "
            "\"BF16 cache again\" runs the BF16 cache a second time (determinism).",
            "",
            "| attention / cache | agreement | mean first divergence |",
            "| --- | --- | --- |",
        ]
        for k, v in g["by_cache"].items():
            label = "BF16 cache again" if k == "bf16_rerun" else KIND_LABEL[k]
            lines.append(f"| {label} | {v['agreement']:.4f} | {v['mean_first_divergence']:.1f} |")
        lines.append("")
    lines += [
        f"## Cache statistics (the BF16 cache of one held-out window of {s['context']} tokens, trained model)",
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
    return lines


def render_markdown(r) -> str:
    if "runs" not in r:
        return "\n".join(_single_markdown(r))
    lines = [
        "# Quality on a trained MLA model",
        "",
        f"Made by `tools/quality/quality.py --merge` from {len(r['seeds'])} training seeds ({r['seeds']}; commit "
        f"{r['commit']}, {r['date']}, {r['gpu']}). Means over the seeds; intervals: the 95% bootstrap interval "
        "of the mean over seeds, each seed's windows resampled. Each seed's full report follows.",
        "",
        readme_table(r),
        "",
        "| seed | ppl BF16 cache | decode_fp8 vs BF16 [95% CI] | per-tensor FP8 vs BF16 [95% CI] | outlier: "
        "decode_fp8 vs BF16 | outlier: per-tensor FP8 vs BF16 | training steps, loss |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in r["per_seed"]:
        lines.append(f"| {s['seed']} | {s['ppl_bf16']:.4f} | {_pct(s['ppl_fp8_vs_bf16'], s['ppl_fp8_rel_ci'])} | "
                     f"{_pct(s['ppl_tensor_fp8_vs_bf16'], s['ppl_tensor_fp8_rel_ci'])} | "
                     f"{_pct(s['outlier']['ppl_fp8_vs_bf16'], s['outlier']['ppl_fp8_rel_ci'])} | "
                     f"{_pct(s['outlier']['ppl_tensor_fp8_vs_bf16'], s['outlier']['ppl_tensor_fp8_rel_ci'])} | "
                     f"{s['training']['steps']}, {s['training']['loss_last10']:.3f} |")
    lines.append("")
    for run in r["runs"]:
        lines += ["", "---", ""] + ["#" + x if x.startswith("#") else x for x in _single_markdown(run)]
    return "\n".join(lines)


TINY = dict(config=Config(d_model=64, n_layers=2, n_heads=16, d_ff=128), train_seconds=0, train_steps=8,
            train_ctx=64, train_batch=4, lr=3e-3, retrieval_span=256, short_batch=2, short_ctx=32, eval_len=64, eval_windows=3, eval_batch=2,
            retrieval_lengths=(64, 128), retrieval_samples=4, retrieval_batch_tokens=256, prompts=4,
            prompt_len=16, new_tokens=8)


def summary(r) -> str:
    """The headline numbers of a results dict, a few lines."""
    lines = [f"commit {r['commit']}, {r['date']}, {r['gpu']}, seed(s) {r.get('seeds', r.get('seed'))}"]
    for name, sec in (("trained", r), ("outlier", r["outlier"])):
        lines.append(f"{name}: ppl exact {sec['ppl_exact']:.4f} bf16 {sec['ppl_bf16']:.4f}; fp8 "
                     f"{_pct(sec['ppl_fp8_vs_bf16'], sec['ppl_fp8_rel_ci'])}, tensor_fp8 "
                     f"{_pct(sec['ppl_tensor_fp8_vs_bf16'], sec['ppl_tensor_fp8_rel_ci'])}")
        for k in KINDS:
            lines.append(f"  {k:11} top-1 = exact {sec['top1_vs_exact'][k]:.4f}, KL {sec['kl_vs_exact'][k]:.2e}, "
                         "retrieval " + ", ".join(f"{L}: {a:.3f}" for L, a in sec["retrieval"][k].items()))
    if "greedy_agreement_fp8" in r:
        lines.append("greedy agreement with the BF16 cache: " + ", ".join(
            f"{k} {r['greedy_agreement_' + k]:.4f}" for k in ("exact", "fp8", "tensor_fp8", "bf16_rerun")))
    return "\n".join(lines)


def study_options(a) -> dict:
    """run_study's keyword arguments from main()'s parsed options (--tiny: the CPU test's)."""
    if a.tiny:
        return dict(TINY)
    cfg = Config(d_model=a.d_model, n_layers=a.layers, n_heads=a.heads,
                 d_ff=a.d_ff or int(round(2.75 * a.d_model / 64)) * 64, embed_std=a.embed_std,
                 zero_init_out=a.zero_init_out)
    return dict(config=cfg, lr=a.lr, train_seconds=a.train_seconds, train_steps=a.train_steps,
                eval_windows=a.eval_windows, retrieval_samples=a.retrieval_samples,
                retrieval_lengths=tuple(a.retrieval_lengths), retrieval_frac=a.retrieval_frac,
                short_batch=a.short_batch, short_ctx=a.short_ctx, outlier_channels=a.outlier_channels,
                outlier_lo=a.outlier_lo, outlier_hi=a.outlier_hi, prompts=a.prompts,
                new_tokens=a.new_tokens, budget_seconds=a.budget_seconds,
                retrieval_diagnostics=a.retrieval_diagnostics)


def parser():
    """main()'s argument parser."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--summary", metavar="JSON", help="print the headline numbers of a quality.json and exit")
    ap.add_argument("--readme-table", metavar="JSON", help="print the README's quality table of a quality.json")
    ap.add_argument("--merge", nargs="+", metavar=("DIR", "JSON"),
                    help="write DIR/quality.{json,md} from the quality.json of several seeds")
    ap.add_argument("--out", help="directory for quality.json and quality.md")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="the CPU test's settings (a minute on a CPU)")
    ap.add_argument("--seed", type=int, default=0, help="training seed: initialization and data order")
    ap.add_argument("--train-seconds", type=float, default=300)
    ap.add_argument("--train-steps", type=int, default=0, help="0: limited by --train-seconds only")
    ap.add_argument("--eval-windows", type=int, default=0, help="held-out windows (0: all of them)")
    ap.add_argument("--retrieval-samples", type=int, default=100, help="retrieval samples per length")
    ap.add_argument("--retrieval-lengths", type=int, nargs="+", default=list(RETRIEVAL_LENGTHS))
    ap.add_argument("--retrieval-diagnostics", action="store_true",
                    help="retrieval also through attention emulated in float32 with FP8 QK and / or FP8 PV "
                         "(mla_lm.EMULATED_KINDS): which part changes an answer")
    ap.add_argument("--retrieval-frac", type=float, default=RETRIEVAL_FRAC,
                    help="share of retrieval sequences in training")
    ap.add_argument("--d-model", type=int, default=Config.d_model, help="the model's width")
    ap.add_argument("--layers", type=int, default=Config.n_layers, help="the model's depth")
    ap.add_argument("--heads", type=int, default=Config.n_heads, help="attention heads")
    ap.add_argument("--d-ff", type=int, default=0, help="the MLP's width (0: 2.75 x --d-model)")
    ap.add_argument("--lr", type=float, default=LR, help="peak learning rate")
    ap.add_argument("--embed-std", type=float, default=0.0,
                    help="the embeddings' initial std per element (0: 1 / sqrt(--d-model))")
    ap.add_argument("--zero-init-out", action="store_true",
                    help="the residual branches' output projections (wo, w_down) start at zero")
    ap.add_argument("--short-batch", type=int, default=SHORT_BATCH,
                    help="short retrieval sequences per training step (a second pass; 0: none)")
    ap.add_argument("--short-ctx", type=int, default=SHORT_CTX, help="their length in tokens")
    ap.add_argument("--outlier-channels", type=int, default=8)
    ap.add_argument("--outlier-lo", type=float, default=OUTLIER_LO,
                    help="the outlier channels' RMS / median channel RMS: the smallest (log-spaced to --outlier-hi)")
    ap.add_argument("--outlier-hi", type=float, default=OUTLIER_HI, help="... and the largest")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--budget-seconds", type=float, default=0,
                    help="the study's time budget (0: none): retrieval samples, then greedy, give way")
    ap.add_argument("--commit", default=None, help="the commit of the results (default: SNAPMLA_COMMIT, git)")
    ap.add_argument("--corpus-root", default=None, help="directory of .py files (default: the stdlib)")
    return ap


def main(argv=None):
    ap = parser()
    a = ap.parse_args(argv)
    if a.summary or a.readme_table:
        with open(a.summary or a.readme_table) as f:
            r = json.load(f)
        print(summary(r) if a.summary else readme_table(r))
        return
    if a.merge:
        if len(a.merge) < 3:
            ap.error("--merge DIR JSON JSON ...: expected a directory and at least two results files")
        runs = []
        for path in a.merge[1:]:
            with open(path) as f:
                runs.append(json.load(f))
        write_results(merge_runs(runs), a.merge[0])
        print(summary(json.load(open(os.path.join(a.merge[0], "quality.json")))))
        return
    if not a.out:
        ap.error("--out is required")
    if a.device == "cuda" and not snapmla.cuda_device_available():
        sys.exit("--device cuda: snapmla has no CUDA kernels or no sm_90 GPU here (snapmla.info(): "
                 f"{snapmla.info()}); use --device cpu --tiny")
    if a.tiny and a.device == "cpu":
        torch.set_num_threads(1)  # the tiny model's ops are too small to gain from threads
    kw = study_options(a)
    run_study(out_dir=a.out, device=a.device, corpus_root=a.corpus_root, seed=a.seed, commit=a.commit, **kw)


if __name__ == "__main__":
    main()
