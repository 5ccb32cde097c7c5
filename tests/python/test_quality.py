"""The quality study (tools/quality: a small MLA language model evaluated through each KV
cache) end to end on a tiny configuration through the CPU path: a few training steps,
perplexity through every cache, greedy agreement, the cache statistics, the result files; and
the paged-cache attention it relies on against float64 attention.

Skips with a message where PyTorch is not installed."""

import json
import math
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: quality study tests skipped")

import snapmla  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "quality"))
import mla_lm  # noqa: E402
import quality  # noqa: E402


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("quality")
    results = quality.run_study(out_dir=str(out), device="cpu", log=None, **quality.TINY)
    return results, out


def test_study_end_to_end(study):
    r, out = study
    tiny = quality.TINY
    t = r["training"]
    assert t["steps"] == tiny["train_steps"]
    assert t["loss_last10"] < t["loss_first"] - 0.5, t  # a few steps already learn byte statistics
    ppls = {k: r["ppl_" + k] for k in ("exact", "bf16", "fp8", "tensor_fp8")}
    for k, v in ppls.items():
        assert math.isfinite(v) and 1.0 < v < mla_lm.Config().vocab, (k, v)
    # The cached runs and the model's own attention compute the same model: close on a tiny model.
    assert abs(ppls["exact"] / ppls["bf16"] - 1) < 0.01, ppls
    assert abs(ppls["fp8"] / ppls["bf16"] - 1) < 0.02, ppls
    assert r["ppl_fp8_vs_bf16"] == pytest.approx(ppls["fp8"] / ppls["bf16"] - 1)
    p = r["perplexity"]
    assert p["tokens"] == tiny["eval_windows"] * tiny["eval_len"]
    ref = p["by_cache"]["bf16"]
    assert ref["top1_agreement_bf16"] == 1.0 and ref["kl_from_bf16"] == 0.0
    for k, v in p["by_cache"].items():
        assert 0.0 <= v["top1_agreement_bf16"] <= 1.0 and v["kl_from_bf16"] >= -1e-9, (k, v)
        assert all(math.isfinite(x) and x > 1 for x in v["ppl_by_position"].values()), (k, v)

    g = r["greedy"]["by_cache"]
    n = tiny["new_tokens"]
    assert set(g) == {"exact", "bf16", "fp8", "tensor_fp8", "bf16_rerun"}
    for k, v in g.items():
        assert 0.0 <= v["agreement"] <= 1.0 and 0.0 <= v["mean_first_divergence"] <= n, (k, v)
    # The same cache run twice gives the same tokens: agreement exactly 1, no divergence.
    assert g["bf16_rerun"] == {"agreement": 1.0, "mean_first_divergence": float(n)}
    assert r["greedy_agreement_bf16_rerun"] == 1.0
    assert r["greedy_agreement_fp8"] == g["fp8"]["agreement"]

    s = r["cache_statistics"]
    assert len(s["per_layer"]) == tiny["config"].n_layers
    for layer in s["per_layer"]:
        assert all(math.isfinite(v) for v in layer.values()), layer
        assert 0.0 < layer["sink_attention_mass"] < 1.0
        assert 1.0 <= layer["effective_tokens_last32"] <= tiny["eval_len"]

    on_disk = json.loads((out / "quality.json").read_text())
    for key in ("ppl_bf16", "ppl_fp8", "ppl_tensor_fp8", "greedy_agreement_fp8"):
        assert on_disk[key] == r[key]
    md = (out / "quality.md").read_text()
    for label in quality.KIND_LABEL.values():
        assert label in md
    assert f"{r['ppl_fp8']:.4f}" in md


def dense_attention(q, kv, prefix, scale):
    """float64 causal attention of q [B, n, h, 576] after `prefix` earlier rows: kv [B, prefix +
    n, 576] -> [B, n, h, 512]."""
    q, kv = q.double(), kv.double()
    n = q.shape[1]
    s = scale * torch.einsum("bthd,bsd->bths", q, kv)
    visible = torch.arange(kv.shape[1])[None, :] <= (prefix + torch.arange(n))[:, None]  # [n, s]
    s = s.masked_fill(~visible[None, :, None, :], float("-inf"))
    return torch.einsum("bths,bsd->bthd", s.softmax(-1), kv[..., :mla_lm.LATENT])


@pytest.mark.parametrize("kind,bound", [("bf16", 0.02), ("fp8", 0.1), ("tensor_fp8", 0.1)])
def test_paged_cache_attends_each_query_to_its_prefix(kind, bound):
    """Three attend calls (n = 8, 6, 3: chunks of s_q = 4, 2, 1) after one another: every query
    sees exactly the rows before it and its own, through the decode kernel."""
    gen = torch.Generator().manual_seed(1)
    B, h, scale = 2, 16, 1 / math.sqrt(192)
    sizes = (8, 6, 3)
    kv = torch.randn(B, sum(sizes), 576, generator=gen)
    q = 2 * torch.randn(B, sum(sizes), h, 576, generator=gen)  # peaked: a wrong prefix shows
    kv, q = kv.to(torch.bfloat16), q.to(torch.bfloat16)
    cache = mla_lm.PagedMLACache(kind, n_layers=1, batch=B, max_len=100, device="cpu", seed=3)
    start = 0
    for n in sizes:
        got = cache.attend(0, q[:, start:start + n].contiguous(), kv[:, start:start + n].contiguous(), scale)
        cache.advance(n)
        want = dense_attention(q[:, start:start + n], kv[:, :start + n], start, scale)
        err = float((got.double() - want).norm() / want.norm())
        assert err < bound, (kind, n, err)
        start += n
    with pytest.raises(ValueError, match="max_len"):
        cache.attend(0, torch.zeros(B, 100, h, 576, dtype=torch.bfloat16),
                     torch.zeros(B, 100, 576, dtype=torch.bfloat16), scale)


def test_tensor_fp8_cache_holds_saturated_e4m3_at_scale_one():
    """The per-tensor recipe's planes: e4m3(x) with scale 1.0, values past 448 saturated (rope
    too); SnapMLA's per-token scale keeps the same large values."""
    x = torch.randn(1, 2, 576) * 3
    x[0, 0, 5] = 1000.0
    x[0, 1, 520] = -700.0
    x[0, 1, 7] = 1e-4
    x = x.to(torch.bfloat16)
    caches = {}
    for kind in ("tensor_fp8", "fp8"):
        c = mla_lm.PagedMLACache(kind, n_layers=1, batch=1, max_len=64, device="cpu")
        c.attend(0, torch.zeros(1, 2, 16, 576, dtype=torch.bfloat16), x, 0.1)
        slots = (c.block_table[0, 0] * 64 + torch.arange(2, dtype=torch.int32)).contiguous()
        caches[kind] = (c, snapmla.gather_dequant(c.layers[0], slots).float())
    c, rows = caches["tensor_fp8"]
    assert torch.equal(c.layers[0].scale.view(-1)[c.block_table[0, 0] * 64 + torch.arange(2)], torch.ones(2))
    want = x[0].float().clamp(-448, 448).to(torch.float8_e4m3fn).float()
    assert torch.equal(rows, want)
    assert rows[0, 5] == 448 and rows[1, 520] == -448 and rows[1, 7] == 0
    _, rows = caches["fp8"]
    assert abs(float(rows[0, 5]) / 1000 - 1) < 0.07 and abs(float(rows[1, 520]) / -700 - 1) < 0.01


def test_agreement_counts_equal_tokens_and_first_divergence():
    ref = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    assert quality.agreement(ref.clone(), ref) == (1.0, 4.0)
    other = ref.clone()
    other[0, 1] = 0  # row 0 diverges at 1, row 1 never
    other[1, 3] = 0  # ... row 1 at 3
    frac, first = quality.agreement(other, ref)
    assert frac == 6 / 8 and first == (1 + 3) / 2


def test_heldout_split_is_by_file_and_stable(tmp_path):
    names = [f"m{i}.py" for i in range(120)] + ["pkg/sub.py", "site-packages/skip.py"]
    for i, name in enumerate(names):
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(f"# file {i}\n".encode())
    rels = quality.corpus_files(str(tmp_path))
    assert "site-packages/skip.py" not in rels and rels == sorted(rels) and len(rels) == 121
    train, held, info = quality.load_corpus(str(tmp_path))
    want_held = [r for r in rels if quality.is_heldout(r)]
    assert 0 < len(want_held) < len(rels) and info["heldout_files"] == len(want_held)
    assert held == b"\n\n".join((tmp_path / r).read_bytes() for r in want_held)
    assert train == b"\n\n".join((tmp_path / r).read_bytes() for r in rels if r not in want_held)
    assert quality.load_corpus(str(tmp_path))[:2] == (train, held)
    (tmp_path / "only").mkdir()
    (tmp_path / "only" / "a.py").write_bytes(b"x = 1\n")
    with pytest.raises(ValueError, match="root"):
        quality.load_corpus(str(tmp_path / "only"))


def test_windows_start_with_bos():
    stream = torch.arange(100) % 256
    w = quality.heldout_windows(stream, 16, 10)
    assert w.shape == (6, 17) and bool((w[:, 0] == mla_lm.BOS).all())
    assert torch.equal(w[1, 1:], stream[16:32])
    with pytest.raises(ValueError, match="length"):
        quality.heldout_windows(stream, 200, 1)
    assert np.array_equal(quality.bucket_edges(8192), [0, 1024, 2048, 4096, 8192])
