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
F = torch.nn.functional

import snapmla  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "quality"))
import mla_lm  # noqa: E402
import quality  # noqa: E402


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("quality")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model's ops are too small to gain from threads
    try:
        results = quality.run_study(out_dir=str(out), device="cpu", log=None, **quality.TINY)
    finally:
        torch.set_num_threads(threads)
    return results, out


def test_study_end_to_end(study):
    r, out = study
    tiny = quality.TINY
    t = r["training"]
    assert t["steps"] == tiny["train_steps"] and t["retrieval_sequences_per_batch"] == 1
    assert t["short_retrieval_sequences_per_step"] == tiny["short_batch"] == 2
    assert t["short_retrieval_context"] == tiny["short_ctx"]
    # answer symbols of questions are in both kinds of retrieval sequences, and nothing is looked up yet
    for key in ("answer_loss_last10", "answer_loss_short_last10"):
        assert 2.0 < t[key] < 8.0, (key, t[key])
    assert t["loss_last10"] < t["loss_first"] - 0.5, t  # a few steps already learn byte statistics
    assert r["commit"] and r["date"] and "gpu" in r and r["seed"] == 0
    for sec in (r, r["outlier"]):
        ppls = {k: sec["ppl_" + k] for k in ("exact", "bf16", "fp8", "tensor_fp8")}
        for k, v in ppls.items():
            assert math.isfinite(v) and 1.0 < v < mla_lm.Config().vocab, (k, v)
        # The cached runs and the model's own attention compute the same model: close on a tiny model.
        assert abs(ppls["exact"] / ppls["bf16"] - 1) < 0.01, ppls
        assert abs(ppls["fp8"] / ppls["bf16"] - 1) < 0.02, ppls
        assert sec["ppl_fp8_vs_bf16"] == pytest.approx(ppls["fp8"] / ppls["bf16"] - 1)
        lo, hi = sec["ppl_fp8_rel_ci"]
        assert lo <= sec["ppl_fp8_vs_bf16"] <= hi and lo < hi
        p = sec["perplexity"]
        assert p["tokens"] == tiny["eval_windows"] * tiny["eval_len"] and p["windows"] == tiny["eval_windows"]
        ex = p["by_cache"]["exact"]
        # the exact model against itself: top-1 1, KL 0 exactly
        assert ex["top1_vs_exact"] == 1.0 and ex["kl_vs_exact"] == 0.0 and ex["kl_vs_exact_ci"] == [0.0, 0.0]
        assert p["by_cache"]["bf16"]["ppl_vs_bf16_ci"] == [0.0, 0.0]
        for k, v in p["by_cache"].items():
            assert 0.0 <= v["top1_vs_exact"] <= 1.0 and v["kl_vs_exact"] >= -1e-9, (k, v)
            for key in ("ppl_vs_bf16", "top1_vs_exact", "kl_vs_exact"):
                ci = v[key + "_ci"]
                assert ci[0] - 1e-12 <= v[key] <= ci[1] + 1e-12, (k, key, v[key], ci)
            assert all(math.isfinite(x) and x > 1 for x in v["ppl_by_position"].values()), (k, v)
            assert len(p["per_window"]["nll"][k]) == p["windows"]
        assert set(sec["retrieval"]) == set(quality.KINDS)
        for k, by_len in sec["retrieval"].items():
            assert list(by_len) == [str(L) for L in tiny["retrieval_lengths"]]
            assert all(0.0 <= a <= 1.0 for a in by_len.values())
        for L, row in sec["retrieval_detail"]["by_length"].items():
            assert row["samples"] == tiny["retrieval_samples"]
            assert all(len(v["correct"]) == row["samples"] for v in row["by_cache"].values())

    # The held-out text is evaluated from its start, and what is left out is counted.
    d = r["data"]
    assert d["heldout_tokens_evaluated"] == tiny["eval_windows"] * tiny["eval_len"]
    assert d["overlap"]["kept_max"] <= quality.OVERLAP_MAX
    # The outlier model: channels far above the median, a large-norm sink, the same function.
    o = r["outlier"]
    stats = o["cache_statistics"]["summary"]
    assert stats["channel_rms_max_over_median"]["min"] > 30 and stats["outlier_channels"]["min"] >= 4
    assert stats["sink_norm_over_median"]["median"] > 2 * r["cache_statistics"]["summary"]["sink_norm_over_median"]["median"]
    assert abs(o["ppl_exact"] / r["ppl_exact"] - 1) < 0.002, (o["ppl_exact"], r["ppl_exact"])

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
    for key in ("ppl_bf16", "ppl_fp8", "ppl_tensor_fp8", "ppl_fp8_rel_ci", "retrieval", "greedy_agreement_fp8"):
        assert on_disk[key] == r[key]
    assert on_disk["outlier"]["ppl_fp8_rel_ci"] == r["outlier"]["ppl_fp8_rel_ci"]
    md = (out / "quality.md").read_text()
    for kind in quality.KINDS:  # the emulated kinds appear only with --retrieval-diagnostics
        assert quality.KIND_LABEL[kind] in md
    assert f"{r['ppl_fp8']:.4f}" in md and f"{r['outlier']['ppl_tensor_fp8']:.4f}" in md
    table = quality.readme_table(r)
    assert f"{r['ppl_fp8']:.4f}" in table and f"{r['outlier']['ppl_fp8']:.4f}" in table
    assert len(table.splitlines()) == 2 + 2 * len(quality.KINDS)


def test_merge_combines_seeds(study, tmp_path):
    """--merge: means over the seeds, an interval around the mean, every run kept; the same
    seed twice is refused."""
    r, _ = study
    other = json.loads(json.dumps(r))
    other["seed"] = 1
    pw = other["perplexity"]["per_window"]["nll"]
    pw["fp8"] = [x + 0.01 * other["perplexity"]["context"] for x in pw["fp8"]]  # 1% higher NLL per token
    m = quality.merge_runs([r, other])
    assert m["seeds"] == [0, 1] and len(m["runs"]) == 2 and len(m["per_seed"]) == 2
    assert m["ppl_bf16"] == pytest.approx(r["ppl_bf16"])
    want = (r["ppl_fp8_vs_bf16"] + math.expm1(math.log1p(r["ppl_fp8_vs_bf16"]) + 0.01)) / 2
    assert m["ppl_fp8_vs_bf16"] == pytest.approx(want, rel=1e-9)
    lo, hi = m["ppl_fp8_rel_ci"]
    assert lo <= m["ppl_fp8_vs_bf16"] <= hi
    assert m["retrieval"]["fp8"] == r["retrieval"]["fp8"]  # the same samples twice: the same accuracy
    quality.write_results(m, str(tmp_path))
    md = (tmp_path / "quality.md").read_text()
    assert "2 training seeds" in md and md.count("# Quality on a trained MLA model") == 3
    with pytest.raises(ValueError, match="seeds"):
        quality.merge_runs([r, r])


def test_readme_quality_table_is_the_results_file():
    """Where README.md carries the quality table, it is readme_table() of docs/results/quality.json."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    readme = open(os.path.join(root, "README.md")).read()
    head = "| model / cache | ppl | vs BF16 cache [95% CI] |"
    if head not in readme:
        pytest.skip("README.md has no quality table (docs/results/quality.json predates it)")
    r = json.load(open(os.path.join(root, "docs", "results", "quality.json")))
    assert quality.readme_table(r) in readme


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


def test_emulated_cache_rows_are_the_librarys_fp8_bytes():
    """mla_lm.e4m3_rows quantizes a row as the library's append does: the same e4m3 latent, the
    same scale, and gather_dequant's rows from them (bf16 inputs put many products at e4m3
    rounding midpoints, so an ulp in the scale's reciprocal shows here)."""
    gen = torch.Generator().manual_seed(0)
    L = 64
    kv = (3 * torch.randn(1, L, 576, generator=gen)).to(torch.bfloat16)
    cache = mla_lm.PagedMLACache("fp8", 1, 1, L, "cpu", seed=3)
    cache.fill([kv], last_token=torch.zeros(1, dtype=torch.long))
    page = int(cache.block_table[0, 0])
    layer = cache.layers[0]
    latent = layer.latent.view(torch.uint8).view(-1, 64, mla_lm.LATENT)[page].view(torch.float8_e4m3fn).float()
    operand, scale = mla_lm.e4m3_rows(kv[0])
    assert torch.equal(operand[:, :mla_lm.LATENT], latent)
    assert torch.equal(scale, layer.scale.view(-1, 64)[page])
    slots = (page * 64 + torch.arange(L, dtype=torch.int32)).contiguous()
    assert torch.equal((operand * scale[:, None]).to(torch.bfloat16), snapmla.gather_dequant(layer, slots))


def test_emulated_attention_reproduces_the_kernels_and_splits_their_error(monkeypatch):
    """EmulatedMLACache: emu_fp8 is decode_fp8's arithmetic under the per-page P' scales (each
    output row within one bf16 ulp, relative), emu_bf16 is decode_bf16 up to its bf16 P (2^-9 per weight), and the two partial
    emulations carry the FP8 error's two independent parts: FP8 QK and FP8 PV each move the
    output, and their squared errors add up to the whole's."""
    monkeypatch.setenv("SNAPMLA_FP8_P_SCALE", "per_page")  # the rule the emulation computes, whatever the suite's
    B, h, scale = 2, 16, 1 / math.sqrt(192)
    sizes = (150, 6, 3)  # more than two 64-token blocks, then chunks of s_q = 2 and 1
    for trial in range(2):
        gen = torch.Generator().manual_seed(trial)
        kv = torch.randn(B, sum(sizes), 576, generator=gen).to(torch.bfloat16)
        q = (2 * torch.randn(B, sum(sizes), h, 576, generator=gen)).to(torch.bfloat16)
        kinds = ("bf16", "fp8") + mla_lm.EMULATED_KINDS
        caches = {k: mla_lm.make_cache(k, 1, B, 200, "cpu", seed=3) for k in kinds}
        assert isinstance(caches["fp8"], mla_lm.PagedMLACache)
        assert isinstance(caches["emu_fp8"], mla_lm.EmulatedMLACache)
        start = 0
        for n in sizes:
            out = {}
            for k, c in caches.items():
                out[k] = c.attend(0, q[:, start:start + n].contiguous(), kv[:, start:start + n].contiguous(), scale)
                c.advance(n)
            start += n
            fp8, emu = out["fp8"].double(), out["emu_fp8"].double()
            # per query row, within one bf16 ulp relative: both end in a bf16 rounding of sums
            # that differ only in float32 order (elements of cancelled sums are not compared alone)
            row_err = (emu - fp8).norm(dim=-1) / fp8.norm(dim=-1)
            assert float(row_err.max()) < 2 ** -8, (trial, n, float(row_err.max()))

            def err(a, b):
                return float((out[a].double() - out[b].double()).norm() / out[b].double().norm())

            assert err("emu_bf16", "bf16") < 2 ** -8, (trial, n)
            whole, qk, pv = err("emu_fp8", "emu_bf16"), err("emu_fp8_qk", "emu_bf16"), err("emu_fp8_pv", "emu_bf16")
            assert whole > 10 * err("emu_fp8", "fp8") and qk > 0.1 * whole and pv > 0.1 * whole, (whole, qk, pv)
            assert 0.8 < (qk ** 2 + pv ** 2) / whole ** 2 < 1.25, (whole, qk, pv)
    with pytest.raises(ValueError, match="kind"):
        mla_lm.EmulatedMLACache("fp8", 1, 1, 8, "cpu")


def test_retrieval_diagnostics_run_every_emulated_kind(monkeypatch):
    """retrieval_batch through the emulated kinds beside the caches: every kind answers, the
    emulation of decode_fp8 answers as decode_fp8 does (under the per-page P' scales, the rule it
    computes), and the report has a row per kind."""
    monkeypatch.setenv("SNAPMLA_FP8_P_SCALE", "per_page")
    cfg = mla_lm.Config(d_model=64, n_layers=2, n_heads=16, d_ff=128)
    model = mla_lm.MLALM(cfg, seed=0).eval()
    kinds = quality.KINDS + mla_lm.EMULATED_KINDS
    with torch.no_grad():
        ret = quality.evaluate_retrieval(model, (64, 128), 4, 256, kinds=kinds, log=None)
    for L, row in ret["by_length"].items():
        assert set(row["by_cache"]) == set(kinds)
        assert row["by_cache"]["emu_fp8"]["correct"] == row["by_cache"]["fp8"]["correct"], L
    lines = quality._retrieval_rows(ret)
    for k in kinds:
        assert sum(quality.KIND_LABEL[k] in line for line in lines) == 1, k


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


def _heldout_name(prefix, want_heldout=True):
    i = 0
    while quality.is_heldout(f"{prefix}{i}.py") != want_heldout:
        i += 1
    return f"{prefix}{i}.py"


def test_split_drops_near_duplicates_and_excludes_encodings(tmp_path):
    """A held-out file whose lines are mostly a training file's is dropped (its overlap reported),
    a distinct one kept; encodings/ is not read at all; on the interpreter's stdlib, every kept
    held-out file is at or under the threshold and none is under encodings/."""
    body = "".join(f"    value_{i} = compute_something({i}, name='line {i}')\n" for i in range(40)).encode()
    files = {_heldout_name("train_", False): b"def f():\n" + body,
             _heldout_name("copy_"): b"def g():\n" + body[:-200] + b"    return 'a different last line here'\n",
             _heldout_name("own_"): "".join(f"print('held-out line number {i} of its own')\n" for i in range(30)).encode(),
             "encodings/" + _heldout_name("table_"): body}
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    assert not any(r.startswith("encodings") for r in quality.corpus_files(str(tmp_path)))
    train, held, info = quality.load_corpus(str(tmp_path))
    rows = {o["file"]: o for o in info["overlap"]["files"]}
    copy = next(k for k in rows if k.startswith("copy_"))
    own = next(k for k in rows if k.startswith("own_"))
    assert rows[copy]["overlap"] > 0.8 and not rows[copy]["kept"]
    assert rows[own]["overlap"] == 0.0 and rows[own]["kept"]
    assert held == files[own] and info["dropped_heldout_files"] == 1 and info["heldout_files"] == 1
    assert info["overlap"]["kept_max"] == 0.0
    # Short lines do not count: a file of only generic short lines has no overlap to measure.
    assert quality.line_overlap(b"pass\n\nreturn x\n", {b"pass"}) == (0.0, 0)
    assert quality.line_overlap(b"x = long_enough_line(1)\ny = other_long_line(2)\n",
                                {b"x = long_enough_line(1)"}) == (0.5, 2)

    _, _, info = quality.load_corpus()
    kept = [o for o in info["overlap"]["files"] if o["kept"]]
    assert kept and all(o["overlap"] <= quality.OVERLAP_MAX for o in kept)
    assert info["overlap"]["kept_max"] <= quality.OVERLAP_MAX
    assert not any(o["file"].startswith("encodings/") for o in info["overlap"]["files"])


def test_paired_bootstrap_contains_the_estimate_and_shrinks():
    rng = np.random.default_rng(5)

    def interval(n):
        tokens = np.full(n, 1000.0)
        ref = rng.normal(1300, 60, n)  # per-window NLL sums
        other = ref + rng.normal(2.0, 3.0, n)  # a small, noisy, paired excess
        point, lo, hi = quality.paired_bootstrap({"a": other, "b": ref, "tokens": tokens},
                                                 quality.rel_ppl("a", "b"), seed=1)
        assert point == pytest.approx(math.expm1((other.sum() - ref.sum()) / tokens.sum()))
        assert lo < point < hi
        return hi - lo

    small, large = interval(16), interval(400)
    assert large < 0.4 * small, (small, large)  # ~ 1 / sqrt(25)
    same = np.arange(10.0)
    assert quality.paired_bootstrap({"a": same, "b": same, "tokens": same + 1}, quality.rel_ppl("a", "b")) == (0.0, 0.0, 0.0)
    # paired: a constant per-window offset has no spread, however noisy the windows are
    noisy = rng.normal(1000, 300, 50)
    _, lo, hi = quality.paired_bootstrap({"a": noisy + 5, "b": noisy, "tokens": np.full(50, 500.0)},
                                         quality.rel_ppl("a", "b"))
    assert lo == pytest.approx(hi) == pytest.approx(math.expm1(0.01))


def test_kl_of_a_distribution_with_itself_is_zero():
    logp = F.log_softmax(torch.randn(3, 7, 50), dim=-1)
    assert torch.equal(quality.kl_divergence(logp, logp), torch.zeros(3, 7))
    other = F.log_softmax(torch.randn(3, 7, 50), dim=-1)
    assert bool((quality.kl_divergence(logp, other) > 0).all())


def _is_key(b):
    return quality.KEY_BASE <= b < quality.KEY_BASE + quality.KEY_SYMBOLS


def _is_value(v: bytes):
    return len(v) == quality.VALUE_LEN and all(c in quality.VALUE_ALPHABET.tobytes() for c in v)


def test_value_alphabet_is_62_ascii_symbols_apart_from_keys_and_line_syntax():
    a = quality.VALUE_ALPHABET.tobytes()
    assert len(a) == len(set(a)) == 62 and a.isalnum() and max(a) < quality.KEY_BASE
    rng = np.random.default_rng(0)
    v = quality.random_values(rng, 20000)
    assert v.shape == (20000, quality.VALUE_LEN) and v.dtype == np.uint8
    counts = np.bincount(v.ravel(), minlength=256)[quality.VALUE_ALPHABET]
    assert counts.min() > 0.7 * counts.mean() and counts.sum() == v.size  # every symbol, about uniformly


def _record_lines(lines):
    """(key byte, value) of each non-blank line (after a `?` for questions); every line is a key
    byte and a value of VALUE_LEN symbols of VALUE_ALPHABET."""
    out = []
    for line in lines:
        assert len(line) == quality.KEY_LEN + quality.VALUE_LEN and _is_key(line[0]), line
        assert _is_value(line[quality.KEY_LEN:]), line
        out.append((line[0], line[quality.KEY_LEN:]))
    return out


@pytest.mark.parametrize("length", [64, 256, 8192, 65536])
def test_retrieval_example_puts_the_answer_far_back(length):
    rng = np.random.default_rng(length)
    e = quality.retrieval_example(rng, length)
    t = e["tokens"]
    assert len(t) == length + 1 and t[0] == mla_lm.BOS and (t[1:] < 256).all()
    text = bytes(t[1:].astype(np.uint8))
    q = e["question"]
    assert t[q] == quality.QUESTION and text.endswith(b"\n") and q == length + 1 - quality.QUESTION_LEN
    key = int(t[q + 1])
    assert _is_key(key) and quality.KEY_LEN == 1
    assert np.array_equal(e["answer"], np.arange(q + 2, q + 2 + quality.VALUE_LEN))
    value = bytes(t[e["answer"]].astype(np.uint8))
    assert _is_value(value) and t[-1] == ord("\n")
    # the haystack: records (key byte, value) and blank lines only, every key once
    hay = text[:q - 1]
    lines = hay.split(b"\n")
    assert lines[-1] == b""  # ends with a line break
    records = _record_lines([x for x in lines[:-1] if x])
    keys = [k for k, _ in records]
    assert len(keys) == len(set(keys)) == min(quality.NUM_KEYS, len(hay) // quality.RECORD_LEN)
    assert sum(map(_is_key, hay)) == len(keys)  # no key byte anywhere but at a record's start
    # the question's key is the target record's, whose value is the answer; nowhere else
    rec = e["record"]
    assert t[rec] == key and bytes(t[rec:rec + quality.RECORD_LEN].astype(np.uint8)) == bytes([key]) + value + b"\n"
    assert text.count(bytes([key])) == 2 and dict(records)[key] == value
    # far back: the record starts in the first half of the haystack
    assert rec - 1 < len(hay) / 2
    # spread: the blank runs before the records differ by at most one line
    starts = np.flatnonzero(np.frombuffer(hay, np.uint8) >= quality.KEY_BASE)
    gaps = np.diff(np.concatenate([[0], starts])) - np.r_[0, np.full(len(starts) - 1, quality.RECORD_LEN)]
    assert gaps.max() - gaps.min() <= 1, gaps
    if length >= 8192:
        assert len(keys) == quality.NUM_KEYS and gaps.min() >= 50  # a long haystack is mostly blank lines
    with pytest.raises(ValueError, match="length"):
        quality.retrieval_example(rng, 2 * quality.RECORD_LEN + quality.QUESTION_LEN - 1)


def test_retrieval_examples_ask_every_depth_in_range():
    """Over many samples the target's depth covers [0, 0.5) of the haystack, nothing past it."""
    rng = np.random.default_rng(5)
    depths = []
    for _ in range(200):
        e = quality.retrieval_example(rng, 2048)
        depths.append((e["record"] - 1) / (e["question"] - 1))
    assert 0 <= min(depths) < 0.05 and 0.45 < max(depths) < 0.5
    late = quality.retrieval_example(rng, 2048, depth=(0.5, 1.0))
    assert (late["record"] - 1) / (late["question"] - 1) >= 0.5


def test_retrieval_training_sequences_span_far_positions():
    rng = np.random.default_rng(3)
    spans, answered, n_keys = [], 0, []
    for i in range(30):
        length = 8192 if i < 2 else 1024
        t, pos = quality.retrieval_train_sequence(rng, length, 65536)
        assert len(t) == len(pos) == length + 1 and t[0] == mla_lm.BOS and pos[0] == 0
        steps = np.diff(pos)
        assert (steps >= 1).all() and pos[-1] <= 65536
        text = bytes(t[1:].astype(np.uint8))
        lines = text.split(b"\n")[:-1]  # the last may be cut
        # inside a line positions step by one; between lines they may jump
        nl = np.flatnonzero(t[1:] == ord("\n")) + 1
        inside = np.ones(len(steps), bool)
        inside[0] = False  # BOS -> the first line
        inside[nl[nl < len(steps)]] = False
        assert (steps[inside] == 1).all()
        records, asked = {}, 0
        for line in lines:
            if not line:
                continue
            if line[0] == quality.QUESTION:
                (k, v), = _record_lines([line[1:]])
                assert records[k] == v  # a question about an earlier record has its value
                asked += 1
            else:
                (k, v), = _record_lines([line])
                assert k not in records  # every key once
                records[k] = v
        assert 1 <= len(records) <= quality.NUM_KEYS
        if len(records) <= 4:  # few keys: each asked many times
            assert asked >= 10 * len(records), (len(records), asked)
        answered += asked
        n_keys.append(len(records))
        spans.append(pos[-1])
    assert answered > 500 and min(spans) >= 1024 and max(spans) > 32768
    # the number of keys varies from a few to many (log-uniform)
    assert min(n_keys) <= 4 and max(n_keys) >= 64, n_keys


def test_answer_mask_marks_exactly_the_answers_of_questions():
    rng = np.random.default_rng(11)
    for length in (32, 256, 4096):
        t, _ = quality.retrieval_train_sequence(rng, length, 8 * length)
        m = quality.answer_mask(t)
        assert m.shape == (length,) and m.dtype == bool
        targets = np.flatnonzero(m) + 1  # prediction i's target is t[i + 1]
        for j in targets:  # a value symbol right after "?" and a key byte
            assert t[j] in quality.VALUE_ALPHABET and _is_key(t[j - 1]) and t[j - 2] == quality.QUESTION
        # and every such symbol is marked
        want = [j for j in range(3, length + 1) if t[j - 2] == quality.QUESTION and _is_key(t[j - 1])]
        assert list(targets) == want
        if length >= 256:
            assert len(want) > 0
    # stacked for training: the same sequences, positions and masks, as tensors
    tok, pos, mask = quality.retrieval_training_batch(np.random.default_rng(5), 3, 64, 512, "cpu")
    again = np.random.default_rng(5)
    for i in range(3):
        t, p = quality.retrieval_train_sequence(again, 64, 512)
        assert np.array_equal(tok[i].numpy(), t) and np.array_equal(pos[i].numpy(), p)
        assert np.array_equal(mask[i].numpy(), quality.answer_mask(t))


def test_outlier_transform_keeps_the_model_and_makes_outliers():
    cfg = mla_lm.Config(d_model=64, n_layers=2, n_heads=16, d_ff=128)
    model = mla_lm.MLALM(cfg, seed=4)
    gen = torch.Generator().manual_seed(2)
    calib = torch.randint(0, 256, (2, 96), generator=gen)
    calib[:, 0] = mla_lm.BOS
    test = torch.randint(0, 256, (2, 80), generator=gen)
    test[:, 0] = mla_lm.BOS
    om, info = mla_lm.outlier_transform(model, calib, channels=6)  # the defaults: 1000 down to 300x
    with torch.no_grad():
        want, got = model(test), om(test)
    assert float((got - want).abs().max()) < 1e-4 * float(want.abs().max()), float((got - want).abs().max())
    # the original is untouched
    assert all(float(b.attn.latent_offset.abs().max()) == 0 for b in model.blocks)
    targets = mla_lm.outlier_targets(6, mla_lm.OUTLIER_LO, mla_lm.OUTLIER_HI)
    assert targets[0] == pytest.approx(1000) and targets[-1] == pytest.approx(300)
    assert info["target_lo"] == 300 and info["target_hi"] == 1000
    before, after = mla_lm.latent_rows(model, calib), mla_lm.latent_rows(om, calib)
    for layer, (rb, ra) in enumerate(zip(before, after)):
        ch = torch.tensor(info["per_layer"][layer]["channels"])
        c = ra[..., :mla_lm.LATENT]
        rms = c[:, 1:].reshape(-1, mla_lm.LATENT).double().pow(2).mean(0).sqrt()
        others = torch.ones(mla_lm.LATENT, dtype=torch.bool)
        others[ch] = False
        ratio = rms[ch] / rms[others].median()
        assert torch.allclose(ratio, targets, rtol=1e-3), (ratio, targets)
        # past e4m3's 448 (what saturates at scale 1.0), where the untransformed latent is ~5
        assert float(c.abs().max()) > 4 * 448 and float(rb[..., :mla_lm.LATENT].abs().max()) < 10
        # rope keys unchanged: exactly in the first layer, to rounding (bf16 rows) after it
        rope_a, rope_b = ra[..., mla_lm.LATENT:], rb[..., mla_lm.LATENT:]
        assert torch.equal(rope_a, rope_b) if layer == 0 else float((rope_a - rope_b).norm() / rope_b.norm()) < 1e-2
        norms = c.norm(dim=-1)  # [B, n]
        sink_before = float(rb[:, 0, :mla_lm.LATENT].norm(dim=-1).mean() / rb[:, 1:, :mla_lm.LATENT].norm(dim=-1).median())
        sink_after = float(norms[:, 0].mean() / norms[:, 1:].median())
        assert sink_after > 2 * sink_before, (sink_before, sink_after)
    with pytest.raises(ValueError, match="already transformed"):
        mla_lm.outlier_transform(om, calib)


def test_prefill_then_decode_matches_teacher_forced_decoding():
    """cache.fill(rows of the model's own attention) then decoding the rest through the BF16 cache
    gives the logits of the whole sequence through the model (a tiny model; bf16 rounding)."""
    cfg = mla_lm.Config(d_model=64, n_layers=2, n_heads=16, d_ff=128)
    model = mla_lm.MLALM(cfg, seed=1)
    e = quality.retrieval_example(np.random.default_rng(0), 128)
    x = torch.from_numpy(e["tokens"][None, :-1])
    q = e["question"]
    rows = []
    with torch.no_grad():
        want = model(x, record=rows)[:, q:]
        cache = mla_lm.PagedMLACache("bf16", cfg.n_layers, 1, x.shape[1], "cpu")
        cache.fill([r[:, :q] for r in rows], last_token=x[:, q - 1])
        assert cache.length == q
        got = model(x[:, q:], cache)
        # without the prompt's last token the next token's previous-token embedding is unknown
        blind = mla_lm.PagedMLACache("bf16", cfg.n_layers, 1, x.shape[1], "cpu")
        blind.fill([r[:, :q] for r in rows])
        with pytest.raises(ValueError, match="last_token"):
            model(x[:, q:], blind)
    err = float((got - want).norm() / want.norm())
    assert err < 0.01, err
    got_ok = quality.retrieval_batch(model, [e, e])
    assert set(got_ok) == set(quality.KINDS) and all(len(v) == 2 for v in got_ok.values())
    with pytest.raises(ValueError, match="max_len"):
        cache.fill([r for r in rows])


def test_previous_token_embedding_follows_the_cache_across_decode_calls():
    """The input of position t adds an embedding of token t - 1: decoding a sequence through the
    cache in pieces (a prompt, then one token at a time, as greedy generation does) gives the
    logits of the whole sequence through the model, and they depend on that embedding."""
    cfg = mla_lm.Config(d_model=64, n_layers=2, n_heads=16, d_ff=128)
    model = mla_lm.MLALM(cfg, seed=3)
    assert cfg.prev_token_embedding and model.prev_embed is not None
    gen = torch.Generator().manual_seed(4)
    x = torch.randint(0, 256, (2, 40), generator=gen)
    x[:, 0] = mla_lm.BOS
    with torch.no_grad():
        want = model(x)
        cache = mla_lm.PagedMLACache("bf16", cfg.n_layers, 2, x.shape[1], "cpu")
        pieces = [model(x[:, :33], cache)] + [model(x[:, t:t + 1], cache) for t in range(33, 40)]
        got = torch.cat(pieces, dim=1)
        assert torch.equal(cache.last_token, x[:, -1])
        # the previous token matters: the same tokens after a different one give other logits
        other = model(x[:, 1:], prev=torch.full((2,), ord("a")))
        flat = mla_lm.MLALM(mla_lm.Config(d_model=64, n_layers=2, n_heads=16, d_ff=128,
                                          prev_token_embedding=False), seed=3)
        assert flat.prev_embed is None and flat(x).shape == want.shape
    err = float((got - want).norm() / want.norm())
    assert err < 0.01, err
    assert float((other[:, 0] - want[:, 1]).abs().max()) > 1e-3


def test_study_options_set_the_model_size_and_training_from_the_command_line():
    a = quality.parser().parse_args(["--out", "x", "--d-model", "256", "--layers", "2", "--heads", "4",
                                     "--lr", "3e-3", "--short-batch", "48", "--short-ctx", "512",
                                     "--embed-std", "1.0", "--zero-init-out"])
    kw = quality.study_options(a)
    cfg = kw["config"]
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.d_ff, cfg.embed_std) == (256, 2, 4, 704, 1.0)
    assert cfg.zero_init_out
    assert kw["lr"] == 3e-3 and kw["short_batch"] == 48 and kw["short_ctx"] == 512
    # the defaults are the study's model and training
    d = quality.study_options(quality.parser().parse_args(["--out", "x"]))
    assert d["config"] == mla_lm.Config() and d["lr"] == quality.LR and d["short_batch"] == 32
    assert quality.study_options(quality.parser().parse_args(["--out", "x", "--tiny"])) == quality.TINY


def test_embedding_init_std_is_a_config_choice():
    """Config.embed_std sets the initial std of both embeddings (0: 1 / sqrt(d_model)); the other
    matrices keep theirs."""
    base = mla_lm.MLALM(mla_lm.Config(d_model=128, n_layers=2, n_heads=4, d_ff=256), seed=0)
    unit = mla_lm.MLALM(mla_lm.Config(d_model=128, n_layers=2, n_heads=4, d_ff=256, embed_std=1.0), seed=0)
    for m, want in ((base, 128 ** -0.5), (unit, 1.0)):
        for e in (m.embed.weight, m.prev_embed.weight):
            assert float(e.detach().std()) == pytest.approx(want, rel=0.05)
    assert torch.equal(base.blocks[0].attn.wq.weight, unit.blocks[0].attn.wq.weight)


def test_zero_init_out_starts_every_residual_branch_at_zero():
    """Config.zero_init_out: wo and w_down start at zero, so at initialization the logits are the
    head of the normed input embeddings alone, whatever the depth."""
    cfg = mla_lm.Config(d_model=64, n_layers=3, n_heads=4, d_ff=128, zero_init_out=True)
    m = mla_lm.MLALM(cfg, seed=2)
    for b in m.blocks:
        assert not b.attn.wo.weight.any() and not b.mlp.w_down.weight.any()
        assert b.attn.wq.weight.any()
    x = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    x[:, 0] = mla_lm.BOS
    with torch.no_grad():
        prev = torch.cat([torch.full_like(x[:, :1], mla_lm.NO_PREV), x[:, :-1]], dim=1)
        want = F.linear(m.norm(m.embed(x) + m.prev_embed(prev)).float(), m.head.weight.float())
        assert torch.allclose(m(x), want, atol=1e-6)
    # a step of training moves them off zero
    loss = F.cross_entropy(m(x[:, :-1]).reshape(-1, cfg.vocab), x[:, 1:].reshape(-1))
    loss.backward()
    assert m.blocks[0].attn.wo.weight.grad.abs().sum() > 0
