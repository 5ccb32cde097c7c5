"""How often the carried P' scales (Fp8PScale::kCarried, docs/reference.md) keep a page's sigma,
and how often a page leaves every running max of a warp where it was (decode_bf16's
SNAPMLA_BF16_RESCALE=changed), on the data of the bench, of the e2e engine, and of sharper
attention, without a GPU.

The carried rule saves the 64-row tile's output rescale only on the pages where every row of a
warp (16 consecutive query rows: heads, for s_q = 1) kept its sigma, and it costs one more
barrier on every page. This probe replays the rule on one decode query's scores in float64, in a
fixed frame (P = exp(s - max over the sequence)): a page's own sigma_b = max_b(P x s_t) / 448;
the carried sigma is kept while sigma_b <= carried <= kCarryFall x sigma_b, else the page takes
kCarryHeadroom x sigma_b. That is the reference's rule, whose running-max frame only rescales
both sides of each comparison. It prints per data kind the fraction of (row, page) pairs that
kept their sigma and of (warp, page) pairs that skip the rescale.

decode_bf16 rescales its output by exp(m - m_new) after each page; under SNAPMLA_BF16_RESCALE=changed
a warp skips that where the page raised none of its 16 rows' running max (every factor exactly 1).
A split starts its maxima afresh, so its first page always rescales: the probe prints the (warp,
page) pairs that skip for a sequence decoded as one split and cut into splits of --split-pages.

Data kinds:
  bench      the bench's inputs: query and cache rows randn / 10 (python -m snapmla.bench);
  e2e        the e2e engine's layer at random weights (snapmla.e2e.model: DeepSeek-V3 shapes,
             YaRN RoPE, random token embeddings, the absorbed query of the last position);
  bench_gG   the bench's query times G (--q-gains; the bench's --q-gain: peakier attention).

  python lab/carried_keep_rate.py [--tokens 8192] [--heads 128] [--seed 0] [--split-pages 16]
                                  [--windows 32:4 256:16]

--windows FALL:HEADROOM ... replays the rule with other windows too (the library's is 32:4): a
wider window keeps more pages at the price of precision at the small end of P'.

Needs PyTorch (CPU) and the snapmla package (its e2e model code; no extension call).
"""

import argparse
import math

import torch

E4M3_MAX = 448.0
CARRY_FALL = 32.0  # include/snapmla/formats.hpp: kCarryFall
CARRY_HEADROOM = 4.0  # kCarryHeadroom
PAGE = 64
WARP_ROWS = 16


def keep_mask(scores: torch.Tensor, token_scale: torch.Tensor, fall: float = CARRY_FALL,
              headroom: float = CARRY_HEADROOM) -> torch.Tensor:
    """scores [rows, n] (float64, softmax_scale applied), token_scale [n] -> kept [rows, pages]
    (bool; a row's first page never keeps)."""
    rows, n = scores.shape
    pages = (n + PAGE - 1) // PAGE
    w = torch.exp(scores - scores.amax(dim=1, keepdim=True)) * token_scale[None, :]
    w = torch.nn.functional.pad(w, (0, pages * PAGE - n)).view(rows, pages, PAGE)
    sigma_page = w.amax(dim=2) / E4M3_MAX  # [rows, pages]
    kept = torch.zeros(rows, pages, dtype=torch.bool)
    carried = torch.zeros(rows, dtype=torch.float64)
    for b in range(pages):
        sb = sigma_page[:, b]
        keep = (sb <= carried) & (fall * sb >= carried) & (sb > 0)
        kept[:, b] = keep
        carried = torch.where(keep, carried, headroom * sb)
    return kept


def summarize(name: str, kept: torch.Tensor) -> str:
    rows, pages = kept.shape
    later = kept[:, 1:]  # the first page never keeps
    warps = rows // WARP_ROWS
    skip = later[: warps * WARP_ROWS].view(warps, WARP_ROWS, pages - 1).all(dim=1)
    return (f"{name:>10}: rows kept {later.double().mean():6.1%} of (row, page); warps skipping the rescale "
            f"{skip.double().mean():6.1%} of (warp, page); pages {pages}")


def max_kept_mask(scores: torch.Tensor, split_pages: int = 0) -> torch.Tensor:
    """scores [rows, n] -> kept [rows, pages]: the page left the row's running max where it was
    (no score above it), the running max restarting at each split of split_pages pages (0: one
    split); a split's first page never keeps (the max before it is -inf)."""
    rows, n = scores.shape
    pages = (n + PAGE - 1) // PAGE
    s = torch.nn.functional.pad(scores, (0, pages * PAGE - n), value=-math.inf).view(rows, pages, PAGE)
    page_max = s.amax(dim=2)
    kept = torch.zeros(rows, pages, dtype=torch.bool)
    running = torch.full((rows,), -math.inf, dtype=torch.float64)
    for b in range(pages):
        if split_pages > 0 and b % split_pages == 0:
            running = torch.full((rows,), -math.inf, dtype=torch.float64)
        kept[:, b] = (page_max[:, b] <= running) & (running > -math.inf)
        running = torch.maximum(running, page_max[:, b])
    return kept


def summarize_max(name: str, scores: torch.Tensor, split_pages: int) -> str:
    parts = []
    for sp in (0, split_pages):
        kept = max_kept_mask(scores, sp)
        rows, pages = kept.shape
        warps = rows // WARP_ROWS
        skip = kept[: warps * WARP_ROWS].view(warps, WARP_ROWS, pages).all(dim=1)
        parts.append(f"{skip.double().mean():6.1%} ({'one split' if sp == 0 else f'splits of {sp} pages'})")
    return f"{name:>10}: warps keeping every running max " + ", ".join(parts) + " of (warp, page)"


def token_scales(latent: torch.Tensor) -> torch.Tensor:
    """The cache's per-token scale amax(latent) / 448 (the library's append)."""
    return latent.abs().amax(dim=1).clamp_min(1e-30) / E4M3_MAX


def bench_data(n: int, heads: int, gain: float, gen: torch.Generator):
    q = torch.randn(heads, 576, generator=gen, dtype=torch.float64) / 10 * gain
    kv = torch.randn(n, 576, generator=gen, dtype=torch.float64) / 10
    return q @ kv.T / math.sqrt(576), token_scales(kv[:, :512])


def e2e_data(n: int, heads: int, seed: int):
    from snapmla.e2e.model import ModelConfig, MLALayer, TensorParallel, _Init, rms_norm, rms_normalize, \
        rope_tables, apply_rope
    cfg = ModelConfig(layers=1, heads=heads)
    init = _Init(seed, "cpu")
    layer = MLALayer(cfg, init, TensorParallel())
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n + 1, cfg.hidden, generator=gen).to(torch.bfloat16)  # token embeddings: N(0, 1)
    xn = rms_normalize(x, cfg.rms_eps)
    cos, sin = rope_tables(cfg, n + 1, "cpu")
    kv = (xn * layer.input_norm.float()).to(torch.bfloat16) @ layer.w_kv_a
    latent = rms_norm(kv[:, :cfg.kv_lora_rank], layer.kv_a_norm, cfg.rms_eps)
    k_rope = apply_rope(kv[:, cfg.kv_lora_rank:], cos, sin)
    last = rms_norm(x[n:], layer.input_norm, cfg.rms_eps)  # the decoded position n
    q = rms_norm(last @ layer.w_q_a, layer.q_a_norm, cfg.rms_eps) @ layer.w_q_b
    q = q.view(heads, cfg.qk_nope_dim + cfg.qk_rope_dim)
    q_latent = torch.einsum("hd,hdc->hc", q[:, :cfg.qk_nope_dim].float(), layer.w_uk.float())
    q_rope = apply_rope(q[:, cfg.qk_nope_dim:], cos[n:], sin[n:]).double()
    keys = torch.cat([latent, k_rope], dim=1)[: n + 1].double()
    scores = torch.cat([q_latent.double(), q_rope], dim=1) @ keys.T * cfg.softmax_scale
    return scores, token_scales(latent.double())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--q-gains", type=float, nargs="*", default=[10.0, 30.0])
    ap.add_argument("--no-e2e", action="store_true", help="leave out the e2e layer (its weights take ~1 GB)")
    ap.add_argument("--split-pages", type=int, default=16,
                    help="the split length for the running-max line (pages of 64 tokens)")
    ap.add_argument("--windows", nargs="*", default=[], metavar="FALL:HEADROOM",
                    help="other (kCarryFall, kCarryHeadroom) windows to replay on the e2e data")
    a = ap.parse_args(argv)
    windows = [tuple(float(v) for v in w.split(":")) for w in a.windows]
    gen = torch.Generator().manual_seed(a.seed)
    print(f"carried P' scales: fall {CARRY_FALL:g}, headroom {CARRY_HEADROOM:g}; {a.tokens} tokens, "
          f"{a.heads} query rows (s_q = 1), seed {a.seed}")
    for gain in [1.0] + list(a.q_gains):
        scores, scale = bench_data(a.tokens, a.heads, gain, gen)
        name = "bench" if gain == 1.0 else f"bench_g{gain:g}"
        print(summarize(name, keep_mask(scores, scale)))
        print(summarize_max(name, scores, a.split_pages))
    if not a.no_e2e:
        scores, scale = e2e_data(a.tokens, a.heads, a.seed)
        print(summarize("e2e", keep_mask(scores, scale)))
        print(summarize_max("e2e", scores, a.split_pages))
        for fall, headroom in windows:
            print(summarize(f"{fall:g}:{headroom:g}", keep_mask(scores, scale, fall, headroom)))
        spread = scores.std(dim=1)
        print(f"{'':>10}  (e2e scores: std per row {spread.median():.2f} median, "
              f"{spread.min():.2f}-{spread.max():.2f})")


if __name__ == "__main__":
    main()
