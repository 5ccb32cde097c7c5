"""Does a small MLA model learn the quality study's key-value lookup, and under which training
sequences? A lab probe for tools/quality (docs/accuracy.md: the study's 133 M model copied
nothing in 418 steps of retrieval-only training on the H200).

Trains tools/quality's MLALM (a small config) on retrieval sequences only, with the study's own
generator (retrieval_train_sequence), and reports per setting:
  - the loss on the answer digits of `?key=value` lines: ln 10 = 2.30 while nothing is copied,
    towards 0 once the lookup works (the aggregate loss hides it: the format's own entropy is
    2.38 nats per byte);
  - retrieval accuracy on the study's test haystacks (retrieval_example) at the training length,
    through the model's own attention.

    python lab/retrieval_probe.py [--steps 400] [--ctx 256] [--settings plain jumps]
      [--device cpu|cuda] [--d-model 128] [--layers 2] [--key-len 6]

Settings: `plain` (positions count up by one: span = length), `jumps` (the study's: positions jump
between lines so that a sequence spans up to 8 x its length), and `copy`, a control that needs no
lookup: random letters, then the same letters again (the second half's "answer" loss falls from
ln 26 once attention copies at a fixed distance; if it does not, the model or its training is at
fault, not the task). Needs PyTorch; runs on a CPU in minutes at the defaults.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "quality"))
import quality as Q  # noqa: E402
from mla_lm import Config, MLALM  # noqa: E402


def answer_mask(tokens: np.ndarray) -> np.ndarray:
    """True at the targets that are answer digits of `?key=value` lines (tokens[1:] positions of
    the inputs tokens[:-1]): the 6 bytes after `?` + key + `=`."""
    mask = np.zeros(len(tokens) - 1, dtype=bool)
    for i in np.flatnonzero(tokens == ord("?")):
        lo = i + 1 + Q.KEY_LEN + 1
        hi = min(lo + Q.VALUE_LEN, len(tokens))
        mask[max(lo - 1, 0):max(hi - 1, 0)] = True  # target t is predicted at input t - 1
    return mask


def copy_sequence(rng, length: int):
    """BOS, then `length` letters whose second half repeats the first; positions consecutive; the
    mask marks the targets of the second half."""
    half = length // 2
    first = rng.integers(ord("a"), ord("z") + 1, size=half)
    body = np.concatenate([first, first, rng.integers(ord("a"), ord("z") + 1, size=length - 2 * half)])
    tokens = np.concatenate([[Q.BOS], body]).astype(np.int64)
    mask = np.zeros(length, dtype=bool)
    mask[half:2 * half] = True  # target t + 1 (inputs t): the repeated letters
    return tokens, np.arange(length + 1), mask


def run(setting: str, a, log=print):
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    model = MLALM(Config(d_model=a.d_model, n_layers=a.layers, n_heads=a.heads, d_ff=2 * a.d_model),
                  seed=a.seed).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    rng = np.random.default_rng([a.seed, 7])
    span = 8 * a.ctx if setting == "jumps" else a.ctx
    t0, curve = time.perf_counter(), []
    for step in range(1, a.steps + 1):
        for g in opt.param_groups:
            g["lr"] = a.lr * min(1.0, step / 20)
        if setting == "copy":
            seqs = [copy_sequence(rng, a.ctx) for _ in range(a.batch)]
        else:
            seqs = [(t, p, answer_mask(t)) for t, p in (Q.retrieval_train_sequence(rng, a.ctx, span)
                                                         for _ in range(a.batch))]
        tok = torch.from_numpy(np.stack([t for t, _, _ in seqs])).to(dev)
        pos = torch.from_numpy(np.stack([p for _, p, _ in seqs])).to(dev)[:, :-1]
        mask = torch.from_numpy(np.stack([m for _, _, m in seqs])).to(dev)
        logits = model(tok[:, :-1], positions=pos)
        per_tok = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tok[:, 1:].reshape(-1),
                                  reduction="none").view(tok.shape[0], -1)
        loss = per_tok.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ans = float(per_tok.detach()[mask].mean()) if mask.any() else float("nan")
        curve.append(ans)
        if step % max(1, a.steps // 10) == 0 or step == 1:
            log(f"  {setting} step {step}: loss {loss.item():.3f}, answer digits {ans:.3f} "
                f"({time.perf_counter() - t0:.0f} s)")
    model.eval()
    erng = np.random.default_rng([a.seed, 99])
    with torch.no_grad():
        got = []
        for _ in range(a.eval_samples // 8 if setting != "copy" else 0):
            got += Q.retrieval_batch(model, [Q.retrieval_example(erng, a.ctx) for _ in range(8)],
                                     kinds=("exact",))["exact"]
    tail = curve[-max(1, a.steps // 10):]
    return {"setting": setting, "span": span, "answer_loss_last": sum(tail) / len(tail),
            "accuracy": sum(got) / len(got) if got else float("nan"), "seconds": round(time.perf_counter() - t0, 1)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--eval-samples", type=int, default=64)
    ap.add_argument("--settings", nargs="+", default=["plain", "jumps"], choices=["plain", "jumps", "copy"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--key-len", type=int, default=Q.KEY_LEN,
                    help=f"letters per key (the study's: {Q.KEY_LEN}); the study's generators are run with it")
    a = ap.parse_args(argv)
    Q.KEY_LEN = a.key_len  # the generators read these module constants
    Q.RECORD_LEN = Q.KEY_LEN + Q.VALUE_LEN + 2
    Q.QUESTION_LEN = Q.RECORD_LEN + 1
    if a.device == "cpu":
        torch.set_num_threads(max(1, os.cpu_count() or 1))
    rows = [run(s, a) for s in a.settings]
    print(f"{'setting':8} {'span':>6} {'answer loss':>12} {'accuracy':>9} {'s':>6}")
    for r in rows:
        print(f"{r['setting']:8} {r['span']:6} {r['answer_loss_last']:12.3f} {r['accuracy']:9.3f} {r['seconds']:6}")
    return rows


if __name__ == "__main__":
    main()
