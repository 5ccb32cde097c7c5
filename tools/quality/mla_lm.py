"""A small MLA decoder language model for the quality study (a study, not part of the package).

Attention is MLA with the decode kernels' shapes: a 512-dim latent c_t (after its RMSNorm) and
one 64-dim rope key k_t shared by all heads are what the cache holds ([c_t, k_t] = 576 values
per token and layer); each head has a 128 + 64 query and a 128-dim value. Training and the
model's own ("exact") attention use the explicit per-head keys and values with torch's SDPA.
Decoding through a paged cache uses the absorbed form the kernels compute:

    q576[h] = [W_uk[h]^T q_nope[h], q_rope[h]]     score_t = softmax_scale * q576[h] . [c_t, k_t]
    out[h]  = W_uv[h] (sum_t p_t c_t)

so the rest of the model is the same code either way and the only difference between the
caches is the attention arithmetic. The query is projected directly from the hidden state
(no query low-rank path); everything else is the usual pre-norm decoder: RMSNorm, SwiGLU MLP,
byte-level tokens with a BOS token at position 0. The input of position t is the embedding of
its token plus a second embedding of the token before it (token t - 1; NO_PREV at the start):
with the previous token in the residual stream from the start, one attention layer can find "the
position whose previous token is K" (an induction head without the previous-token head it
otherwise has to learn first), which is what makes the study's retrieval lookup learnable in its
few minutes of training (lab/retrieval_probe.py). It changes nothing about attention or the
cache: a cached decode passes the token before its first new token (the cache keeps it).

Positions are an argument of the forward pass ([n] for the batch, or [B, n] per sequence), so
training can give a sequence gaps between its positions (the retrieval sequences of
quality.py). Each attention layer also holds a latent offset u (zero unless outlier_transform
sets it): the cache row is c + u, keys use it as is (a shift common to all keys moves every
score of a query by the same amount, which softmax ignores) and values subtract it again.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

import snapmla

LATENT, ROPE, NOPE, VDIM = 512, 64, 128, 128
BOS = 256  # token ids 0..255 are bytes
NO_PREV = 257  # the previous-token embedding's input at a sequence's first position
CACHE_KINDS = ("bf16", "fp8", "tensor_fp8")


@dataclass
class Config:
    vocab: int = 264  # 256 bytes + BOS, padded to a multiple of 8
    d_model: int = 512
    n_layers: int = 4
    n_heads: int = 16
    d_ff: int = 1408
    rope_base: float = 10000.0
    prev_token_embedding: bool = True  # x_t = E[token_t] + E_prev[token_{t-1}] (see above)
    embed_std: float = 0.0  # the embeddings' initial std per element (0: 1 / sqrt(d_model))
    zero_init_out: bool = False  # residual branches' output projections (wo, w_down) start at 0

    def to_dict(self):
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        return y.to(x.dtype)


def rope_angles(positions, base: float):
    """cos, sin [..., n, 32] (fp32) of positions [..., n] for rotary pairs (d, d + 32) of a
    64-dim rope vector."""
    inv_freq = base ** (-torch.arange(0, ROPE, 2, dtype=torch.float32, device=positions.device) / ROPE)
    ang = positions.float()[..., None] * inv_freq
    return ang.cos(), ang.sin()


def apply_rope(x, cos, sin):
    """x [..., n, (heads,) 64] with cos / sin broadcast over its leading dims."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class MLAttention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        h, d = cfg.n_heads, cfg.d_model
        self.n_heads = h
        self.rope_base = cfg.rope_base
        self.wq = nn.Linear(d, h * (NOPE + ROPE), bias=False)
        self.wkv = nn.Linear(d, LATENT + ROPE, bias=False)
        self.kv_norm = RMSNorm(LATENT)
        self.w_uk = nn.Parameter(torch.empty(h, NOPE, LATENT))
        self.w_uv = nn.Parameter(torch.empty(h, VDIM, LATENT))
        self.wo = nn.Linear(h * VDIM, d, bias=False)
        self.softmax_scale = 1.0 / math.sqrt(NOPE + ROPE)
        self.register_buffer("latent_offset", torch.zeros(LATENT))

    def project(self, x, positions):
        """x [B, n, d], positions [n] or [B, n] -> q_nope [B, n, h, 128], q_rope [B, n, h, 64]
        (rotated), c [B, n, 512] (normed, plus the latent offset), k_rope [B, n, 64] (rotated):
        the query parts and the cache row."""
        B, n, _ = x.shape
        q = self.wq(x).view(B, n, self.n_heads, NOPE + ROPE)
        kv = self.wkv(x)
        cos, sin = rope_angles(positions, self.rope_base)
        q_rope = apply_rope(q[..., NOPE:], cos[..., None, :], sin[..., None, :]).to(q.dtype)
        k_rope = apply_rope(kv[..., LATENT:], cos, sin).to(kv.dtype)
        c = self.kv_norm(kv[..., :LATENT])
        c = c + self.latent_offset.to(c.dtype)
        return q[..., :NOPE], q_rope, c, k_rope

    def absorbed_query(self, q_nope, q_rope):
        """The 576-dim query rows [B, n, h, 576] (bf16) the decode kernels take."""
        q_lat = torch.einsum("bnhd,hdc->bnhc", q_nope, self.w_uk.to(q_nope.dtype))
        return torch.cat([q_lat, q_rope.to(q_lat.dtype)], dim=-1).to(torch.bfloat16).contiguous()

    def forward(self, x, positions, cache=None, layer: int = 0, record=None):
        """record: a list that receives this layer's cache rows [B, n, 576] (bf16) of the
        model's own attention (the rows a prefill writes)."""
        B, n, _ = x.shape
        h = self.n_heads
        q_nope, q_rope, c, k_rope = self.project(x, positions)
        if cache is None:
            if record is not None:
                record.append(torch.cat([c, k_rope.to(c.dtype)], dim=-1).to(torch.bfloat16))
            k_nope = torch.einsum("bnc,hdc->bnhd", c, self.w_uk.to(c.dtype))
            v = torch.einsum("bnc,hdc->bnhd", c - self.latent_offset.to(c.dtype), self.w_uv.to(c.dtype))
            q = torch.cat([q_nope, q_rope], dim=-1).transpose(1, 2)
            k = torch.cat([k_nope, k_rope[:, :, None, :].expand(B, n, h, ROPE)], dim=-1).transpose(1, 2)
            # v padded to the q/k head size: every SDPA backend takes equal head sizes
            v = F.pad(v, (0, NOPE + ROPE - VDIM)).transpose(1, 2)
            dt = torch.bfloat16 if torch.is_autocast_enabled() else q.dtype
            o = F.scaled_dot_product_attention(q.to(dt), k.to(dt), v.to(dt), is_causal=True,
                                               scale=self.softmax_scale)
            o = o[..., :VDIM].transpose(1, 2)
        else:
            q576 = self.absorbed_query(q_nope, q_rope)
            kv576 = torch.cat([c, k_rope.to(c.dtype)], dim=-1).to(torch.bfloat16)
            o_lat = cache.attend(layer, q576, kv576, self.softmax_scale)
            # the weights sum to 1, so the offset in the attended rows is the offset itself
            o_lat = o_lat.to(x.dtype) - self.latent_offset.to(x.dtype)
            o = torch.einsum("bnhc,hdc->bnhd", o_lat, self.w_uv.to(x.dtype))
        return self.wo(o.reshape(B, n, h * VDIM))


class SwiGLU(nn.Module):
    def __init__(self, d: int, d_ff: int):
        super().__init__()
        self.w_gate = nn.Linear(d, d_ff, bias=False)
        self.w_up = nn.Linear(d, d_ff, bias=False)
        self.w_down = nn.Linear(d_ff, d, bias=False)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model)
        self.attn = MLAttention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model)
        self.mlp = SwiGLU(cfg.d_model, cfg.d_ff)

    def forward(self, x, positions, cache, layer, record=None):
        x = x + self.attn(self.attn_norm(x), positions, cache, layer, record)
        return x + self.mlp(self.mlp_norm(x))


class MLALM(nn.Module):
    def __init__(self, cfg: Config, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.seed = seed
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.prev_embed = nn.Embedding(cfg.vocab, cfg.d_model) if cfg.prev_token_embedding else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self.reset_parameters()

    def reset_parameters(self):
        g = torch.Generator().manual_seed(self.seed)
        depth_scale = 1.0 / math.sqrt(2 * self.cfg.n_layers)  # residual branches
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            fan_in = p.shape[-1]
            std = 1.0 / math.sqrt(fan_in)
            if name in ("embed.weight", "prev_embed.weight") and self.cfg.embed_std:
                std = self.cfg.embed_std
            if name.endswith(("wo.weight", "w_down.weight")):
                std = 0.0 if self.cfg.zero_init_out else std * depth_scale
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * std)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, tokens, cache=None, positions=None, record=None, prev=None):
        """tokens [B, n] -> logits [B, n, vocab] (fp32). Without a cache: the whole sequence with
        the model's own causal attention. With a cache: the n tokens after the cache's current
        length (the same for every sequence), attended through the cache's decode kernel.
        positions: [n] or [B, n] (default: consecutive from 0, or from the cache's length);
        record: a list that receives every layer's cache rows (without a cache); prev: [B], the
        token before tokens[:, 0] (default: the cache's last token, or NO_PREV at the start)."""
        if positions is None:
            start = cache.length if cache is not None else 0
            positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        x = self.embed(tokens)
        if self.prev_embed is not None:
            if prev is None and cache is not None and cache.length:
                prev = cache.last_token
                if prev is None:
                    raise ValueError("cache: filled without last_token, which the previous-token "
                                     "embedding of the next token needs")
            first = (torch.full_like(tokens[:, :1], NO_PREV) if prev is None
                     else prev.to(tokens.device, tokens.dtype).view(-1, 1).expand(tokens.shape[0], 1))
            x = x + self.prev_embed(torch.cat([first, tokens[:, :-1]], dim=1))
        for i, block in enumerate(self.blocks):
            x = block(x, positions, cache, i, record)
        if cache is not None:
            cache.advance(tokens.shape[1], tokens[:, -1])
        with torch.autocast(tokens.device.type, enabled=False):
            return F.linear(self.norm(x).float(), self.head.weight.float())


def e4m3_saturate(x):
    """x -> float8_e4m3fn, round to nearest even, saturating at +-448 (NaN stays NaN): the
    conversion of a static scale-1.0 FP8 cache and query."""
    return x.float().clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


class CacheState:
    """What every cache of the study keeps besides its rows: the tokens written so far (the same
    for every sequence), the last of them (the next decode's previous-token embedding), the
    capacity, and the per-layer record of the last attend call (PagedMLACache, when set)."""

    def __init__(self, kind: str, max_len: int):
        self.kind = kind
        self.length = 0
        self.last_token = None  # [B]: the token at position length - 1 (the model's next prev)
        self.max_len = max_len
        self.record = False
        self.recorded = {}

    def advance(self, n: int, last_token=None) -> None:
        self.length += n
        self.last_token = None if last_token is None else last_token.detach().clone()

    def check_room(self, arg: str, n: int) -> None:
        if self.length + n > self.max_len:
            raise ValueError(f"{arg}: {self.length} + {n} tokens exceed the cache's max_len {self.max_len}")


class PagedMLACache(CacheState):
    """One paged cache per layer for a batch of sequences of equal length, in shuffled pages,
    read through the library's decode kernels:

      bf16        BF16 cache, decode_bf16
      fp8         SnapMLA: append (per-token latent scale, rope bf16 pre-scaled), quantize_query,
                  decode_fp8
      tensor_fp8  the static per-tensor recipe: scale 1.0, all 576 cache and query values e4m3
                  (saturating; rope values e4m3-rounded, then held in the bf16 rope plane, which
                  represents them exactly), written into the FP8 cache planes directly and run
                  through the same decode_fp8 (FP8 QK, P' in e4m3 per 64-token block, FP8 PV)

    attend() appends the rows of n new tokens and computes all n queries in one decode call: a
    sequence's chunk j of s_q queries (s_q = 4, 2 or 1, whichever divides n) is a batch entry
    sharing the sequence's block table with cache_seqlens = length + (j + 1) s_q, so every
    query sees exactly its prefix (the kernel's causal rule within the chunk)."""

    def __init__(self, kind: str, n_layers: int, batch: int, max_len: int, device, seed: int = 0):
        if kind not in CACHE_KINDS:
            raise ValueError(f"kind: expected one of {CACHE_KINDS}, got {kind!r}")
        super().__init__(kind, max_len)
        page = snapmla.PAGE_SIZE
        pages_per_seq = (max_len + page - 1) // page
        num_pages = batch * pages_per_seq
        perm = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed))
        self.block_table = perm.view(batch, pages_per_seq).to(torch.int32).to(device)
        like = torch.empty(1, dtype=torch.bfloat16, device=device)
        alloc = snapmla.alloc_bf16_cache if kind == "bf16" else snapmla.alloc_fp8_cache
        self.layers = [alloc(num_pages, like) for _ in range(n_layers)]
        # record / recorded: layer -> (q [B, n, h, 576], kv [B, n, 576], lse [B, n, h]) of the
        # last attend call, kept when record is set (the cache statistics)

    def _slots(self, n: int, device):
        pos = torch.arange(self.length, self.length + n, device=device)
        page = snapmla.PAGE_SIZE
        return self.block_table[:, pos // page] * page + (pos % page).to(torch.int32)

    def fill(self, rows, last_token=None) -> None:
        """Writes a prefill: rows[layer] [B, n, 576] (bf16), every layer's rows of the next n
        tokens, in this cache's format (quantized as its appends would), then advances by n;
        last_token [B] is the last of those n tokens (what the next decode's previous-token
        embedding takes)."""
        B, n, _ = rows[0].shape
        self.check_room("rows", n)
        slots = self._slots(n, rows[0].device).reshape(-1).contiguous()
        for layer, r in enumerate(rows):
            self._write(layer, r.reshape(B * n, LATENT + ROPE).contiguous(), slots)
        self.advance(n, last_token)

    def _write(self, layer: int, rows, slots):
        cache = self.layers[layer]
        if self.kind != "tensor_fp8":
            snapmla.append(cache, rows, slots)
            return
        idx = slots.long()
        cache.latent.view(torch.uint8).view(-1, LATENT)[idx] = e4m3_saturate(rows[:, :LATENT]).view(torch.uint8)
        cache.scale.view(-1)[idx] = 1.0
        cache.rope.view(-1, ROPE)[idx] = e4m3_saturate(rows[:, LATENT:]).to(torch.bfloat16)

    def attend(self, layer: int, q, kv, softmax_scale: float):
        """q [B, n, h, 576], kv [B, n, 576] (bf16) -> out [B, n, h, 512] (bf16)."""
        B, n, h, _ = q.shape
        self.check_room("n", n)
        dev = q.device
        slots = self._slots(n, dev)
        self._write(layer, kv.reshape(B * n, LATENT + ROPE).contiguous(), slots.reshape(-1).contiguous())

        s_q = next(s for s in (4, 2, 1) if n % s == 0)
        chunks = n // s_q
        qe = q.reshape(B * chunks, s_q, h, LATENT + ROPE).contiguous()
        table = self.block_table.repeat_interleave(chunks, dim=0).contiguous()
        ends = self.length + s_q * torch.arange(1, chunks + 1, device=dev, dtype=torch.int32)
        seqlens = ends.repeat(B).contiguous()
        workers = snapmla.recommended_num_workers(qe, s_q, h)
        # Splits only where the batch does not fill the device anyway (a plan's workspace grows
        # with the batch).
        plan = snapmla.plan_splits(seqlens, workers) if B * chunks < workers else None
        cache = self.layers[layer]
        if self.kind == "bf16":
            out, lse = snapmla.decode_bf16(qe, cache, table, seqlens, softmax_scale=softmax_scale, plan=plan)
        else:
            if self.kind == "fp8":
                qq = snapmla.quantize_query(qe)
            else:
                qq = snapmla.QuantizedQuery(
                    e4m3_saturate(qe[..., :LATENT]).contiguous(),
                    e4m3_saturate(qe[..., LATENT:]).to(torch.bfloat16).contiguous(),
                    torch.ones(qe.shape[:3], dtype=torch.float32, device=dev))
            out, lse = snapmla.decode_fp8(qq, cache, table, seqlens, softmax_scale=softmax_scale, plan=plan)
        if self.record:  # lse [B * chunks, h, s_q] -> [B, n, h]
            lse = lse.view(B, chunks, h, s_q).permute(0, 1, 3, 2).reshape(B, n, h)
            self.recorded[layer] = (q, kv, lse)
        return out.view(B, n, h, LATENT)


# Attention emulated in torch (float32) over the BF16 rows, with SnapMLA's FP8 arithmetic
# switched on per part: a diagnostic that tells which part of decode_fp8 changes an answer.
#   emu_bf16    neither part: float32 attention over the BF16 rows
#   emu_fp8     both parts: should answer as decode_fp8 does with its default per-page P' scales
#               (as below; SNAPMLA_FP8_P_SCALE=carried or carried_wide puts some pages' P' on
#               another e4m3 grid)
#   emu_fp8_qk  FP8 scores only: per-row e4m3 query and cache operands (scale amax / 448, rope
#               bf16 divided by the same scale), P and V as emu_bf16
#   emu_fp8_pv  FP8 PV only: exact scores; P' = e4m3(P x s_t / sigma) per row and 64-token
#               block (sigma = the block's max P x s_t / 448), V the e4m3 latent, l from P
EMULATED_KINDS = ("emu_bf16", "emu_fp8", "emu_fp8_qk", "emu_fp8_pv")


def correctly_rounded_ratio(num: float, den):
    """num / den in float32, rounded once as the library's C++ division is (torch takes a scalar
    over a tensor as the scalar times the rounded reciprocal, an ulp off in a quarter of cases,
    which moves e4m3 roundings at their midpoints)."""
    return torch.full_like(den, num) / den


def e4m3_rows(rows):
    """rows [..., 576] (bf16) -> (operand [..., 576] float32, scale [...]): the latent as e4m3
    values and the rope as bf16, both multiplied by 448 / amax(latent), and the row's scale
    amax / 448. That is the library's per-token quantization, which append and quantize_query
    share, so it is quantize_query's, each row taken as a one-query, one-head batch entry."""
    qq = snapmla.quantize_query(rows.to(torch.bfloat16).reshape(-1, 1, 1, LATENT + ROPE).contiguous())
    operand = torch.cat([qq.nope.float(), qq.rope.float()], dim=-1)
    return operand.reshape(rows.shape), qq.scale.reshape(rows.shape[:-1])


def fp8_pv_product(p, values, scale):
    """sum_t P'_t sigma_b V8_t over the tokens of p [..., L] (unnormalized, exact) with values
    [B, L, 512] (e4m3 as float32) and their scales [B, L]: P' = e4m3(P s_t 448 / max_b(P s_t))
    per row and page b of tokens (snapmla.PAGE_SIZE, from position 0), sigma_b = max_b(P s_t) / 448."""
    e4m3_max, min_amax = snapmla._C.E4M3_MAX, snapmla._C.MIN_AMAX
    B, L = scale.shape
    w = p * scale[:, None, None, :]  # [B, n, h, L]
    pad = (-L) % snapmla.PAGE_SIZE
    wb = F.pad(w, (0, pad)).unflatten(-1, (-1, snapmla.PAGE_SIZE))  # [B, n, h, pages, PAGE_SIZE]
    bmax = wb.amax(-1, keepdim=True).clamp_min(min_amax)
    q = (wb * correctly_rounded_ratio(e4m3_max, bmax)).to(torch.float8_e4m3fn).float() * (bmax / e4m3_max)
    return torch.einsum("bnhl,bld->bnhd", q.flatten(-2)[..., :L], values)


class EmulatedMLACache(CacheState):
    """PagedMLACache's interface (fill, attend, advance) over dense BF16 rows, attention in
    float32 torch with the FP8 parts of EMULATED_KINDS: for the retrieval diagnostics only."""

    def __init__(self, kind: str, n_layers: int, batch: int, max_len: int, device, seed: int = 0):
        if kind not in EMULATED_KINDS:
            raise ValueError(f"kind: expected one of {EMULATED_KINDS}, got {kind!r}")
        super().__init__(kind, max_len)
        self.rows = [torch.zeros(batch, max_len, LATENT + ROPE, dtype=torch.bfloat16, device=device)
                     for _ in range(n_layers)]

    def fill(self, rows, last_token=None) -> None:
        n = rows[0].shape[1]
        self.check_room("rows", n)
        for layer, r in enumerate(rows):
            self.rows[layer][:, self.length:self.length + n] = r
        self.advance(n, last_token)

    def attend(self, layer: int, q, kv, softmax_scale: float):
        """q [B, n, h, 576], kv [B, n, 576] (bf16) -> out [B, n, h, 512] (bf16)."""
        n = q.shape[1]
        self.check_room("n", n)
        end = self.length + n
        self.rows[layer][:, self.length:end] = kv
        rows = self.rows[layer][:, :end]
        fp8_qk = self.kind in ("emu_fp8", "emu_fp8_qk")
        fp8_pv = self.kind in ("emu_fp8", "emu_fp8_pv")
        if fp8_qk or fp8_pv:
            operand, ks = e4m3_rows(rows)  # the rows as the FP8 cache holds them, for QK and PV
        if fp8_qk:
            qv, qs = e4m3_rows(q)
            s = torch.einsum("bnhd,bld->bnhl", qv, operand) * (qs[..., None] * ks[:, None, None, :] * softmax_scale)
        else:
            s = torch.einsum("bnhd,bld->bnhl", q.float(), rows.float()) * softmax_scale
        visible = torch.arange(end, device=q.device)[None, :] < (self.length + 1 + torch.arange(n, device=q.device))[:, None]
        s = s.masked_fill(~visible[None, :, None, :], float("-inf"))
        p = torch.exp(s - s.amax(-1, keepdim=True))
        l = p.sum(-1, keepdim=True)
        if fp8_pv:
            o = fp8_pv_product(p, operand[..., :LATENT], ks)
        else:
            o = torch.einsum("bnhl,bld->bnhd", p, rows[..., :LATENT].float())
        return (o / l).to(torch.bfloat16)


def make_cache(kind: str, n_layers: int, batch: int, max_len: int, device, seed: int = 0):
    """A PagedMLACache (CACHE_KINDS: the library's kernels) or an EmulatedMLACache."""
    cls = EmulatedMLACache if kind in EMULATED_KINDS else PagedMLACache
    return cls(kind, n_layers, batch, max_len, device, seed)


@torch.no_grad()
def latent_rows(model, tokens):
    """Every layer's cache rows [B, n, 576] (float32) of tokens [B, n] under the model's own
    attention, computed in float32."""
    rows = []
    with torch.autocast(tokens.device.type, enabled=False):
        model(tokens, record=rows)
    return [r.float() for r in rows]


def outlier_targets(channels: int, lo: float, hi: float):
    """The channel RMS / median ratios outlier_transform sets: log-spaced from hi down to lo."""
    if channels < 1 or not 1.0 < lo <= hi:
        raise ValueError(f"channels, lo, hi: expected channels >= 1 and 1 < lo <= hi, got {channels}, {lo}, {hi}")
    if channels == 1:
        return torch.tensor([hi], dtype=torch.float64)
    return torch.logspace(math.log10(hi), math.log10(lo), channels, dtype=torch.float64)


OUTLIER_LO, OUTLIER_HI = 300.0, 1000.0  # outlier channel RMS / median RMS, as real MLA caches have


@torch.no_grad()
def outlier_transform(model, calib_tokens, channels: int = 8, lo: float = OUTLIER_LO, hi: float = OUTLIER_HI):
    """(copy of model, description): the same function, with cache latents that have a few
    high-magnitude channels and a large-norm sink row, as real MLA caches have.

    Per layer, on the calibration tokens [B, n] (each row BOS first): the `channels` latent
    channels j where the BOS row is furthest from the other tokens, |c_0j - mean_j| / std_j,
    are centred and scaled, c'_j = s_j (c_j - mean_j), with s_j such that the channel's RMS over
    the non-BOS tokens is target_j times the median RMS of the other channels (targets
    log-spaced from hi to lo; the defaults, 1000 down to 300, are the range of real MLA caches'
    outlier channels and put their largest values well past e4m3's 448). The scale goes into
    the latent RMSNorm's weight, -s_j mean_j into the latent offset, and 1 / s_j into column j
    of W_uk and W_uv. Scores q_lat . c change by the same amount for every key of a query (the
    offset), which softmax ignores, and values subtract the offset again, so the model's output
    is unchanged in exact arithmetic, whatever the targets (in floating point the rounding of a
    scaled channel scales with it: the relative error is that of the original model). The BOS
    row, far from the mean in exactly these channels, becomes a large-norm sink."""
    if any(float(b.attn.latent_offset.abs().max()) != 0 for b in model.blocks):
        raise ValueError("model: expected a model without a latent offset (not already transformed)")
    targets = outlier_targets(channels, lo, hi)
    out = copy.deepcopy(model)
    rows = latent_rows(model, calib_tokens)
    layers = []
    for block, r in zip(out.blocks, rows):
        c = r[..., :LATENT].double()
        bos, rest = c[:, 0].mean(0), c[:, 1:].reshape(-1, LATENT)
        mean, std = rest.mean(0), rest.std(0, correction=0).clamp_min(1e-12)
        rms = rest.pow(2).mean(0).sqrt()
        z = (bos - mean).abs() / std
        chosen = z.topk(channels).indices
        others = torch.ones(LATENT, dtype=torch.bool, device=c.device)
        others[chosen] = False
        median = rms[others].median()
        gain = targets.to(c.device) * median / std[chosen]
        a = block.attn
        dt = a.kv_norm.weight.dtype
        a.kv_norm.weight[chosen] *= gain.to(dt)
        a.latent_offset[chosen] = (-gain * mean[chosen]).to(a.latent_offset.dtype)
        a.w_uk[:, :, chosen] /= gain.to(dt)
        a.w_uv[:, :, chosen] /= gain.to(dt)
        layers.append({"channels": chosen.tolist(), "bos_z": [round(float(x), 3) for x in z[chosen]],
                       "gain": [float(x) for x in gain], "target_rms_over_median": [float(x) for x in targets]})
    return out, {"channels": channels, "target_lo": lo, "target_hi": hi, "calibration_tokens": list(calib_tokens.shape),
                 "per_layer": layers}
