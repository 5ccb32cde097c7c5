"""A DeepSeek-V3-shaped model for decode benchmarking: MLA layers with seeded random bf16
weights, absorbed W_UK / W_UV on the decode path, embedding and lm_head, and optionally a dense
stand-in for the MoE with the active experts' FLOPs per token.

Tensor parallelism splits the attention heads: each rank holds its heads' columns of q_b_proj,
its heads' W_UK / W_UV and its heads' rows of o_proj, and all-reduces o_proj's partial sums.
The latent KV path (kv_a_proj, one latent row per token shared by all heads) is replicated, so
every rank keeps the whole latent cache of its sequences. Weights are generated whole from
per-tensor seeds and then sliced, so every world size computes the same model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import List, Optional

import torch
import torch.nn.functional as F

from .. import LATENT_DIM, PAGE_SIZE, ROPE_DIM, PagedFp8Cache
from .. import torch as st


@dataclass(frozen=True)
class ModelConfig:
    """DeepSeek-V3's attention shapes (config.json of the released model)."""

    layers: int = 61
    hidden: int = 7168
    heads: int = 128
    q_lora_rank: int = 1536
    qk_nope_dim: int = 128
    v_head_dim: int = 128
    vocab: int = 129280
    rms_eps: float = 1e-6
    rope: str = "yarn"  # "yarn" (DeepSeek-V3's long-context RoPE) or "plain"
    rope_theta: float = 10000.0
    yarn_factor: float = 40.0
    yarn_original_max_pos: int = 4096
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_mscale_all_dim: float = 1.0
    # Dense stand-in for the MoE: 0 = left out; DeepSeek-V3 activates 8 routed + 1 shared
    # experts of intermediate 2048 per token, the FLOPs of one SwiGLU MLP of 9 * 2048 = 18432.
    mlp_intermediate: int = 0
    kv_lora_rank: int = LATENT_DIM  # fixed by the library's cache format
    qk_rope_dim: int = ROPE_DIM

    @staticmethod
    def tiny(**overrides) -> "ModelConfig":
        """A configuration small enough for the CPU reference (tests, smoke runs)."""
        base = ModelConfig(layers=2, hidden=64, heads=16, q_lora_rank=32, qk_nope_dim=16,
                           v_head_dim=16, vocab=128)
        return replace(base, **overrides)

    @property
    def softmax_scale(self) -> float:
        scale = (self.qk_nope_dim + self.qk_rope_dim) ** -0.5
        if self.rope == "yarn":  # YaRN's attention temperature, squared (q and k each)
            m = 0.1 * self.yarn_mscale_all_dim * math.log(self.yarn_factor) + 1.0
            scale *= m * m
        return scale

    def weight_bytes(self, tp: int = 1) -> int:
        """bf16 bytes of one rank's weights."""
        h = self.heads // tp
        per_layer = (self.hidden * self.q_lora_rank + self.q_lora_rank * h * (self.qk_nope_dim + self.qk_rope_dim)
                     + self.hidden * (self.kv_lora_rank + self.qk_rope_dim)
                     + h * self.qk_nope_dim * self.kv_lora_rank + h * self.kv_lora_rank * self.v_head_dim
                     + h * self.v_head_dim * self.hidden + 2 * self.hidden + self.q_lora_rank + self.kv_lora_rank)
        mlp = 3 * self.hidden * (self.mlp_intermediate // tp)
        return 2 * (self.layers * per_layer + mlp + 2 * self.vocab * self.hidden + self.hidden)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies of the 32 rotation pairs (float64). YaRN keeps the fast rotations
    (more than beta_fast turns over the original context) as they are, divides the slow ones
    (fewer than beta_slow turns) by the scaling factor, and blends linearly in between."""
    d = cfg.qk_rope_dim
    pair = torch.arange(0, d, 2, dtype=torch.float64) / d
    base = 1.0 / cfg.rope_theta ** pair
    if cfg.rope == "plain":
        return base
    if cfg.rope != "yarn":
        raise ValueError(f"rope: expected 'yarn' or 'plain', got {cfg.rope!r}")

    def pair_of(turns: float) -> float:  # the pair index that turns `turns` times over the context
        return d * math.log(cfg.yarn_original_max_pos / (turns * 2 * math.pi)) / (2 * math.log(cfg.rope_theta))

    lo = max(math.floor(pair_of(cfg.yarn_beta_fast)), 0)
    hi = min(math.ceil(pair_of(cfg.yarn_beta_slow)), d - 1)
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - lo) / max(hi - lo, 1e-3)).clamp(0, 1)
    return base / cfg.yarn_factor * ramp + base * (1 - ramp)


def rope_tables(cfg: ModelConfig, max_pos: int, device) -> torch.Tensor:
    """cos and sin [2, max_pos, 64] (float32) for rotate-half pairing (dims i and i + 32)."""
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * rope_inv_freq(cfg)[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return torch.stack([angles.cos(), angles.sin()]).to(torch.float32).to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., 64] bf16, cos / sin broadcastable to it (float32)."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos + rotated * sin).to(torch.bfloat16)


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) in float32, before the norm's weight."""
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return (rms_normalize(x, eps) * weight.float()).to(torch.bfloat16)


def matmul_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b of bf16 matrices with a float32 result (fp32 accumulation, no rounding to bf16):
    tensor-parallel partial sums then add up to what one rank computes, to float32 rounding."""
    if a.is_cuda:
        return torch.mm(a, b, out_dtype=torch.float32)
    return a.float() @ b.float()


class TensorParallel:
    """This rank's place in the tensor-parallel group (world size 1: no communication)."""

    def __init__(self, rank: int = 0, size: int = 1, group=None):
        self.rank, self.size, self.group = rank, size, group

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            torch.distributed.all_reduce(x, group=self.group)
        return x


class _Init:
    """Seeded random weights: each tensor from its own seed, generated whole on `device`."""

    def __init__(self, seed: int, device):
        self.seed, self.device, self.count = seed, torch.device(device), 0

    def normal(self, *shape: int, std: float) -> torch.Tensor:
        self.count += 1
        gen = torch.Generator(device=self.device).manual_seed(self.seed * 1_000_003 + self.count)
        return (torch.randn(shape, generator=gen, device=self.device) * std).to(torch.bfloat16)


class MLALayer:
    """One MLA layer's weights (this rank's heads)."""

    def __init__(self, cfg: ModelConfig, init: _Init, tp: TensorParallel):
        h, hl = cfg.heads, cfg.heads // tp.size
        lo, hi = tp.rank * hl, (tp.rank + 1) * hl
        dq = cfg.qk_nope_dim + cfg.qk_rope_dim
        ones = lambda n: torch.ones(n, dtype=torch.bfloat16, device=init.device)  # noqa: E731
        self.input_norm, self.q_a_norm, self.kv_a_norm = ones(cfg.hidden), ones(cfg.q_lora_rank), ones(cfg.kv_lora_rank)
        self.w_q_a = init.normal(cfg.hidden, cfg.q_lora_rank, std=cfg.hidden ** -0.5)
        w_q_b = init.normal(cfg.q_lora_rank, h, dq, std=cfg.q_lora_rank ** -0.5)
        self.w_q_b = w_q_b[:, lo:hi].reshape(cfg.q_lora_rank, hl * dq).contiguous()
        self.w_kv_a = init.normal(cfg.hidden, cfg.kv_lora_rank + cfg.qk_rope_dim, std=cfg.hidden ** -0.5)
        # kv_b_proj's two halves, absorbed: W_UK maps q_nope into latent space, W_UV the
        # attention output (latent) to the value heads.
        self.w_uk = init.normal(h, cfg.qk_nope_dim, cfg.kv_lora_rank, std=cfg.qk_nope_dim ** -0.5)[lo:hi].contiguous()
        self.w_uv = init.normal(h, cfg.kv_lora_rank, cfg.v_head_dim, std=cfg.kv_lora_rank ** -0.5)[lo:hi].contiguous()
        w_o = init.normal(h, cfg.v_head_dim, cfg.hidden, std=(h * cfg.v_head_dim) ** -0.5)
        self.w_o = w_o[lo:hi].reshape(hl * cfg.v_head_dim, cfg.hidden).contiguous()
        self.post_norm = ones(cfg.hidden)


class DenseMLP:
    """The MoE stand-in: a SwiGLU MLP, its intermediate split across ranks."""

    def __init__(self, cfg: ModelConfig, init: _Init, tp: TensorParallel):
        n = cfg.mlp_intermediate
        lo, hi = tp.rank * n // tp.size, (tp.rank + 1) * n // tp.size
        self.w_gate_up = torch.cat([init.normal(cfg.hidden, n, std=cfg.hidden ** -0.5)[:, lo:hi],
                                    init.normal(cfg.hidden, n, std=cfg.hidden ** -0.5)[:, lo:hi]], dim=1).contiguous()
        self.w_down = init.normal(n, cfg.hidden, std=n ** -0.5)[lo:hi].contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = (x @ self.w_gate_up).chunk(2, dim=-1)
        return matmul_f32(F.silu(gate) * up, self.w_down)


class Model:
    """The weights and the two passes an engine runs: the prompt's latent KV rows (prefill)
    and one decode step for a batch."""

    def __init__(self, cfg: ModelConfig, device, seed: int = 0, tp: Optional[TensorParallel] = None,
                 max_pos: int = 1 << 17, flashmla=None):
        self.cfg, self.device, self.tp = cfg, torch.device(device), tp or TensorParallel()
        if cfg.heads % self.tp.size:
            raise ValueError(f"--tp: {self.tp.size} does not divide the {cfg.heads} heads")
        if cfg.mlp_intermediate % self.tp.size:
            raise ValueError(f"--mlp-intermediate: {cfg.mlp_intermediate} is not a multiple of --tp {self.tp.size}")
        self.local_heads = cfg.heads // self.tp.size
        init = _Init(seed, self.device)
        self.embed = init.normal(cfg.vocab, cfg.hidden, std=1.0)
        self.layers: List[MLALayer] = [MLALayer(cfg, init, self.tp) for _ in range(cfg.layers)]
        # One stand-in shared by every layer: it costs the FLOPs of 61 layers' active experts
        # without holding 61 copies of its weights.
        self.mlp = DenseMLP(cfg, init, self.tp) if cfg.mlp_intermediate else None
        self.final_norm = torch.ones(cfg.hidden, dtype=torch.bfloat16, device=self.device)
        self.lm_head = init.normal(cfg.hidden, cfg.vocab, std=cfg.hidden ** -0.5)
        self.rope = rope_tables(cfg, max_pos, self.device)
        self.num_workers = st.recommended_num_workers(self.embed, 1, self.local_heads)
        # FlashMLA's BF16 decode for the BF16 cache instead of decode_bf16 (a peers.py FlashMLA
        # object: called as (q, cache [P, 64, 1, 576], block_table, seqlens, scale, causal), its
        # scheduler metadata in .meta / .splits), or None.
        self.flashmla = flashmla
        self.keep_logits = False  # tests: keep the last eager step's logits in last_logits
        self.last_logits: Optional[torch.Tensor] = None

    # -- prefill ----------------------------------------------------------------------------

    def latent_rows(self, layer: MLALayer, normalized: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The cache rows [n, 576] of n tokens from their rms-normalized input (float32): the
        input norm's weight, the KV projection, the RMSNorm'd latent, then the rotated rope key."""
        kv = (normalized * layer.input_norm.float()).to(torch.bfloat16) @ layer.w_kv_a
        latent = rms_norm(kv[:, :self.cfg.kv_lora_rank], layer.kv_a_norm, self.cfg.rms_eps)
        cos, sin = self.rope[0][positions], self.rope[1][positions]
        return torch.cat([latent, apply_rope(kv[:, self.cfg.kv_lora_rank:], cos, sin)], dim=-1)

    def prefill(self, caches, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> None:
        """Writes the prompt tokens' rows to every layer's cache through the library's append.
        Each layer's KV projection runs on the prompt's embeddings (a benchmark's prefill: the
        cache gets realistic rows at the cost of one GEMM per layer, without prompt attention).
        Every layer reads the same embeddings, so their rms normalization is computed once (the
        rows are the bits rms_norm gives: the same float32 operations in the same order)."""
        normalized = rms_normalize(F.embedding(tokens, self.embed), self.cfg.rms_eps)
        for layer, cache in zip(self.layers, caches):
            st.append(cache, self.latent_rows(layer, normalized, positions), slots)

    # -- dense recomputation (tests) ----------------------------------------------------------

    def dense_forward(self, tokens: torch.Tensor, prompt_len: int) -> torch.Tensor:
        """The logits (float32, [len(tokens) - prompt_len + 1, vocab]) the decode steps of one
        sequence compute at positions prompt_len - 1 .. len(tokens) - 1, recomputed without a
        cache: every weight in float32, attention as plain causal softmax over the whole sequence
        with the per-head keys and values (latent @ W_UK^T, latent @ W_UV) instead of the absorbed
        query. It is the same function as prefill + decode_step: the first prompt_len - 1
        positions' KV rows come from the embeddings in every layer (the benchmark's prefill), the
        later ones from each layer's own input. One rank only."""
        if self.tp.size != 1:
            raise ValueError("dense_forward: one rank only (--tp 1)")
        cfg, hl = self.cfg, self.local_heads
        f32 = lambda w: w.float().cpu()  # noqa: E731
        norm = lambda x, w: rms_normalize(x, cfg.rms_eps) * f32(w)  # noqa: E731
        tokens = tokens.cpu().long()
        n, prefilled = len(tokens), prompt_len - 1
        if not 0 <= prefilled < n:
            raise ValueError(f"dense_forward: prompt_len {prompt_len} for {n} tokens")
        cos, sin = (self.rope[i][:n].float().cpu() for i in (0, 1))
        emb = f32(self.embed)[tokens]
        x = emb[prefilled:]  # the decoded positions' hidden states
        causal = torch.arange(n)[None, :] <= torch.arange(prefilled, n)[:, None]  # [m, n]

        def rotate(v, c, s):  # rotate-half RoPE, float32
            half = v.shape[-1] // 2
            return v * c + torch.cat([-v[..., half:], v[..., :half]], dim=-1) * s

        for layer in self.layers:
            kv = norm(torch.cat([emb[:prefilled], x]), layer.input_norm) @ f32(layer.w_kv_a)
            latent = norm(kv[:, :cfg.kv_lora_rank], layer.kv_a_norm)  # [n, 512]
            k_rope = rotate(kv[:, cfg.kv_lora_rank:], cos, sin)  # [n, 64]
            q = norm(norm(x, layer.input_norm) @ f32(layer.w_q_a), layer.q_a_norm) @ f32(layer.w_q_b)
            q = q.view(len(x), hl, cfg.qk_nope_dim + cfg.qk_rope_dim)
            q_nope = q[..., :cfg.qk_nope_dim]
            q_rope = rotate(q[..., cfg.qk_nope_dim:], cos[prefilled:, None], sin[prefilled:, None])
            k_nope = torch.einsum("tc,hdc->thd", latent, f32(layer.w_uk))  # [n, hl, qk_nope]
            value = torch.einsum("tc,hcd->thd", latent, f32(layer.w_uv))  # [n, hl, v_head]
            scores = (torch.einsum("ihd,thd->hit", q_nope, k_nope)
                      + torch.einsum("ihd,td->hit", q_rope, k_rope)) * cfg.softmax_scale
            p = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
            out = torch.einsum("hit,thd->ihd", p, value).reshape(len(x), hl * cfg.v_head_dim)
            x = x + out @ f32(layer.w_o)
            if self.mlp is not None:
                gate, up = (norm(x, layer.post_norm) @ f32(self.mlp.w_gate_up)).chunk(2, dim=-1)
                x = x + (F.silu(gate) * up) @ f32(self.mlp.w_down)
        return norm(x, self.final_norm) @ f32(self.lm_head)

    # -- decode -----------------------------------------------------------------------------

    def attention(self, layer: MLALayer, cache, x: torch.Tensor, cos, sin, slots, block_table,
                  seqlens, plan) -> torch.Tensor:
        cfg, b, hl = self.cfg, x.shape[0], self.local_heads
        xn = rms_norm(x, layer.input_norm, cfg.rms_eps)
        q = rms_norm(xn @ layer.w_q_a, layer.q_a_norm, cfg.rms_eps) @ layer.w_q_b
        q = q.view(b, hl, cfg.qk_nope_dim + cfg.qk_rope_dim)
        q_latent = torch.bmm(q[..., :cfg.qk_nope_dim].transpose(0, 1), layer.w_uk).transpose(0, 1)
        q_rope = apply_rope(q[..., cfg.qk_nope_dim:], cos[:, None], sin[:, None])
        q_full = torch.cat([q_latent, q_rope], dim=-1).unsqueeze(1)  # [b, 1, hl, 576]
        kv = xn @ layer.w_kv_a
        latent = rms_norm(kv[:, :cfg.kv_lora_rank], layer.kv_a_norm, cfg.rms_eps)
        st.append(cache, torch.cat([latent, apply_rope(kv[:, cfg.kv_lora_rank:], cos, sin)], dim=-1), slots)
        if isinstance(cache, PagedFp8Cache):
            out, _ = st.decode_fp8(st.quantize_query(q_full), cache, block_table, seqlens,
                                   softmax_scale=cfg.softmax_scale, plan=plan)
        elif self.flashmla is not None:
            out, _ = self.flashmla(q_full, cache.view(cache.shape[0], PAGE_SIZE, 1, cache.shape[-1]), block_table,
                                   seqlens, cfg.softmax_scale, False)
        else:
            out, _ = st.decode_bf16(q_full, cache, block_table, seqlens,
                                    softmax_scale=cfg.softmax_scale, plan=plan)
        v = torch.bmm(out[:, 0].transpose(0, 1), layer.w_uv).transpose(0, 1).reshape(b, hl * cfg.v_head_dim)
        return self.tp.all_reduce(matmul_f32(v, layer.w_o))

    def decode_step(self, caches, tokens: torch.Tensor, positions: torch.Tensor,
                    block_table: torch.Tensor) -> None:
        """One decode step in place: rows with positions >= 0 take token `tokens[i]` at
        `positions[i]`; afterwards tokens holds each row's greedy next token and the active
        rows' positions have advanced. No host synchronization (CUDA-graph capturable)."""
        active = positions >= 0
        pos = positions.clamp_min(0).long()
        page = block_table.gather(1, (pos // PAGE_SIZE)[:, None])[:, 0].long()
        slots = torch.where(active, page * PAGE_SIZE + pos % PAGE_SIZE, -1).int()
        seqlens = torch.where(active, pos + 1, 0).int()
        if self.flashmla is not None and not isinstance(caches[0], PagedFp8Cache):
            # FlashMLA plans for itself: made by the first layer's call, then shared.
            self.flashmla.meta = self.flashmla.splits = None
            plan = None
        else:
            plan = st.plan_splits(seqlens, self.num_workers, query_rows=self.local_heads)  # one plan, every layer
        cos, sin = self.rope[0][pos], self.rope[1][pos]
        x = F.embedding(tokens, self.embed)
        for layer, cache in zip(self.layers, caches):
            # The residual adds in float32: the all-reduced partial sums are float32.
            x = (x + self.attention(layer, cache, x, cos, sin, slots, block_table, seqlens, plan)).to(torch.bfloat16)
            if self.mlp is not None:
                x = (x + self.tp.all_reduce(self.mlp(rms_norm(x, layer.post_norm, self.cfg.rms_eps)))).to(torch.bfloat16)
        logits = rms_norm(x, self.final_norm, self.cfg.rms_eps) @ self.lm_head
        if self.keep_logits:
            self.last_logits = logits.float()
        tokens.copy_(logits.argmax(dim=-1))
        positions.add_(active.int())
