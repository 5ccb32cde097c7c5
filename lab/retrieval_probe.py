"""Does a small MLA model learn the quality study's key-value lookup, and under which training
sequences? A lab probe for tools/quality (docs/accuracy.md: the study's first format, 6-letter
keys `key=value`, was not learned at all, by the 133 M model on the H200 or by this probe).

Trains tools/quality's MLALM (a small config) on retrieval sequences only, with the study's own
generator (retrieval_train_sequence: one-byte keys from 0x80-0xFF, unique in a sequence, records
`Kv` and questions `?Kv`, v one of VALUE_ALPHABET's 62 symbols), and reports per setting:
  - the loss on the answer symbols of the questions: ln 62 = 4.13 while nothing is copied,
    towards 0 once the lookup works (the aggregate loss hides it: most values are records' own,
    which nothing predicts);
  - retrieval accuracy on the study's test haystacks (retrieval_example) through the model's own
    attention, at each of --eval-lengths (default: the training length and 8 x it, the study's
    ratio of its longest haystack, 64K, to its training length, 8K). Chance is 62^-VALUE_LEN.

    python lab/retrieval_probe.py [--steps 400] [--ctx 256] [--settings plain jumps]
      [--device cpu|cuda] [--d-model 128] [--layers 2] [--heads 4] [--model mla|gpt]
      [--eval-lengths 256 2048] [--threads N] [--no-prev-embedding] [--embed-std S]
      [--zero-init-out] [--diagnostics 1024 2048 [--diagnostic-samples 100]]

Settings: `plain` (positions count up by one: span = length), `jumps` (the study's: positions jump
between lines so that a sequence spans up to 8 x its length), and `copy`, a control that needs no
lookup: random letters, then the same letters again (the second half's "answer" loss falls from
ln 26 once attention copies at a fixed distance; if it does not, the model or its training is at
fault, not the task; it is positional, so it does not show that content lookups are learnable).
`--model gpt` trains a standard rope transformer of the same size instead of the MLA model, to
tell the format's difficulty from the model's: at 128 tokens it learns the lookup in about 1000
steps (plain), while the MLA model of the same size is still at an answer loss of about 1.9
after 2400 with 4-digit values (docs/accuracy.md). The MLA model has a previous-token embedding
(mla_lm.Config.prev_token_embedding), which lets one attention layer find "the position after
key K"; `--no-prev-embedding` trains it without, as the earlier runs did. `--embed-std` and
`--zero-init-out` change the MLA model's initialization (mla_lm.Config); with more than two
layers the learning rate decides whether the lookup is learned at all (docs/accuracy.md). Needs
PyTorch; not the snapmla package's compiled part (only the model's own attention runs: where snapmla cannot be imported, a
placeholder stands in for it), except for `--diagnostics`: the trained model's retrieval through the library's caches and
the emulated FP8 parts (mla_lm.EMULATED_KINDS), with the questions each gains and loses against the BF16 cache. On a 2-core CPU a step of the MLA model at 128 tokens takes about
0.5 s, of the gpt model 0.12 s.
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
try:
    import snapmla  # noqa: F401  (tools/quality imports it; the probe runs none of its ops)
except ImportError:  # a checkout whose extension is not built: a placeholder module will do
    import types
    sys.modules["snapmla"] = types.ModuleType("snapmla")
import quality as Q  # noqa: E402
from mla_lm import EMULATED_KINDS, Config, MLALM  # noqa: E402


class RopeTransformer(torch.nn.Module):
    """`--model gpt`: a standard pre-norm decoder of the same width, depth and heads (per-head
    q, k, v of d_model / heads dims, rope on all of them, GELU MLP of 2 x d_model, PyTorch's
    default initialization): whether a result is the format's or the MLA model's."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int):
        super().__init__()
        nn = torch.nn
        self.d, self.h = d, heads
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "n1": nn.RMSNorm(d), "qkv": nn.Linear(d, 3 * d, bias=False), "o": nn.Linear(d, d, bias=False),
            "n2": nn.RMSNorm(d), "up": nn.Linear(d, 2 * d, bias=False), "down": nn.Linear(2 * d, d, bias=False)})
            for _ in range(layers))
        self.norm = nn.RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens, positions=None, record=None):
        B, n = tokens.shape
        hd = self.d // self.h
        if positions is None:
            positions = torch.arange(n, device=tokens.device)
        ang = positions.float()[..., None] * 10000.0 ** (-torch.arange(0, hd, 2, device=tokens.device) / hd)
        cos, sin = ang.cos().unsqueeze(-3), ang.sin().unsqueeze(-3)  # broadcast over heads

        def rot(t):
            t1, t2 = t.chunk(2, -1)
            return torch.cat([t1 * cos - t2 * sin, t1 * sin + t2 * cos], -1)

        x = self.embed(tokens)
        for b in self.blocks:
            q, k, v = b["qkv"](b["n1"](x)).view(B, n, 3, self.h, hd).permute(2, 0, 3, 1, 4)
            o = F.scaled_dot_product_attention(rot(q), rot(k), v, is_causal=True)
            x = x + b["o"](o.transpose(1, 2).reshape(B, n, self.d))
            x = x + b["down"](F.gelu(b["up"](b["n2"](x))))
        return self.head(self.norm(x))


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
    if a.model == "gpt":
        model = RopeTransformer(Config().vocab, a.d_model, a.layers, a.heads).to(dev)
    else:
        model = MLALM(Config(d_model=a.d_model, n_layers=a.layers, n_heads=a.heads, d_ff=2 * a.d_model,
                             prev_token_embedding=not a.no_prev_embedding, embed_std=a.embed_std,
                             zero_init_out=a.zero_init_out),
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
            tok, pos, mask = (torch.from_numpy(np.stack([x[i] for x in seqs])).to(dev) for i in range(3))
        else:
            tok, pos, mask = Q.retrieval_training_batch(rng, a.batch, a.ctx, span, dev)
        per_tok = Q.token_losses(model, tok, pos[:, :-1])
        loss = per_tok.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ans = Q.masked_mean(per_tok, mask)
        curve.append(ans)
        if step % max(1, a.steps // 10) == 0 or step == 1:
            log(f"  {setting} step {step}: loss {loss.item():.3f}, answer {ans:.3f} "
                f"({time.perf_counter() - t0:.0f} s)")
    model.eval()
    erng = np.random.default_rng([a.seed, 99])
    with torch.no_grad():
        accuracy = {}
        for L in a.eval_lengths:
            got = []
            b = max(1, min(8, 16384 // L))
            while setting != "copy" and len(got) < a.eval_samples:
                got += Q.retrieval_batch(model, [Q.retrieval_example(erng, L) for _ in range(b)],
                                         kinds=("exact",))["exact"]
            accuracy[L] = sum(got) / len(got) if got else float("nan")
    if a.diagnostics and setting != "copy":
        diagnose(model, a, log)
    tail = curve[-max(1, a.steps // 10):]
    return {"setting": setting, "span": span, "answer_loss_last": sum(tail) / len(tail),
            "accuracy": accuracy, "seconds": round(time.perf_counter() - t0, 1)}


def diagnose(model, a, log=print):
    """--diagnostics: the trained model's retrieval at those lengths through the library's caches
    (the quality study's test haystacks and kinds) and through the emulated attention of
    mla_lm.EMULATED_KINDS; per kind the questions it answers that the BF16 cache misses, and the
    reverse: which part of the FP8 arithmetic changes answers, and in which direction."""
    kinds = Q.KINDS + EMULATED_KINDS
    with torch.no_grad():
        ret = Q.evaluate_retrieval(model, a.diagnostics, a.diagnostic_samples, 16384, kinds=kinds, log=None)
    for L, row in ret["by_length"].items():
        ref = row["by_cache"]["bf16"]["correct"]
        cells = []
        for k in kinds:
            got = row["by_cache"][k]["correct"]
            gained = sum(x == "0" and y == "1" for x, y in zip(ref, got))
            lost = sum(x == "1" and y == "0" for x, y in zip(ref, got))
            cells.append(f"{k} {row['by_cache'][k]['accuracy']:.3f} (+{gained} -{lost})")
        log(f"  diagnostics @ {L} ({row['samples']} samples; vs the BF16 cache): " + ", ".join(cells))


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
    ap.add_argument("--model", default="mla", choices=["mla", "gpt"],
                    help="mla: the study's MLALM (small config); gpt: a standard rope transformer of the same size")
    ap.add_argument("--no-prev-embedding", action="store_true",
                    help="the MLA model without its previous-token embedding")
    ap.add_argument("--embed-std", type=float, default=0.0,
                    help="the MLA model's initial embedding std per element (0: 1 / sqrt(d_model))")
    ap.add_argument("--zero-init-out", action="store_true",
                    help="the MLA model's residual output projections (wo, w_down) start at zero")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads (--device cpu)")
    ap.add_argument("--diagnostics", type=int, nargs="+", default=None, metavar="LENGTH",
                    help="after training, retrieval at these lengths through the caches and the emulated "
                         "FP8 parts (needs the built snapmla extension)")
    ap.add_argument("--diagnostic-samples", type=int, default=100)
    ap.add_argument("--eval-lengths", type=int, nargs="+", default=None,
                    help="test haystack lengths (default: --ctx and 8 x --ctx)")
    a = ap.parse_args(argv)
    a.eval_lengths = a.eval_lengths or [a.ctx, 8 * a.ctx]
    if a.device == "cpu":
        torch.set_num_threads(max(1, a.threads))
    rows = [run(s, a) for s in a.settings]
    print(f"{'setting':8} {'span':>6} {'answer loss':>12} "
          + " ".join(f"{'acc @ ' + str(L):>11}" for L in a.eval_lengths) + f" {'s':>6}")
    for r in rows:
        print(f"{r['setting']:8} {r['span']:6} {r['answer_loss_last']:12.3f} "
              + " ".join(f"{r['accuracy'][L]:11.3f}" for L in a.eval_lengths) + f" {r['seconds']:6}")
    return rows


if __name__ == "__main__":
    main()
