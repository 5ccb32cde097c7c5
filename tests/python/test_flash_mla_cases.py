"""snapmla.flash_mla against the cases of FlashMLA's dense-decoding test (h_kv = 1), with its
data recipe, its reference semantics and its tolerances, written here for SnapMLA:

- q and the BF16 cache N(0, 1) / 10 clamped to [-1, 1]; every cache slot no token owns is NaN
  and the block-table entries past a sequence's pages hold 2147480000 (out of range, never read);
- varlen lengths max(N(s_k, s_k / 2), s_q); the corner cases set about half the lengths to 0;
- the reference: float64 softmax(q k^T / sqrt(576)) v, causal over the last s_q positions; a
  query that sees no key gets out = 0 and lse = +inf;
- out within 8e-4 absolute or 2.01/128 relative per element and cosine difference <= 5e-6, lse
  within 1e-6 absolute or 8.01/65536 relative, and the non-finite values in the same places;
- both metadata interfaces: get_mla_metadata() (a FlashMLASchedMeta filled at the first call)
  and get_mla_metadata(cache_seqlens, s_q * h_q, 1).

On the GPU (PyTorch, sm_90) every case runs, with both interfaces on the same data, drawn and
checked on the GPU (the float64 reference there too). The CPU reference runs, with
NumPy, the cases whose work fits a CI machine (b <= 2, s_k <= 140, every h_q, s_q, varlen and
causal: 336 cases, the two interfaces in turn); SNAPMLA_CPU_ALL_CASES=1 runs all of them there
too."""

import math
import os

import numpy as np
import pytest

import snapmla
from snapmla import flash_mla
from conftest import bf16_bits, bf16_value

HEADS = [1, 3, 9, 63, 64, 126, 128]
BAD_PAGE = 2147480000


def cases():
    out = []
    for b in [1, 2, 6, 64]:
        for s_q in [1, 2, 4]:
            for s_k in [20, 140, 4096]:
                for h_q in HEADS:
                    for varlen in [False, True]:
                        for causal in [False, True]:
                            out.append((b, s_q, s_k, h_q, varlen, causal, False))
    for h_q in HEADS:
        for causal in [False, True]:
            out.append((128, 2, 4096, h_q, True, causal, True))
    return out


def case_id(c):
    b, s_q, s_k, h_q, varlen, causal, zeros = c
    return f"b{b}-sq{s_q}-sk{s_k}-h{h_q}" + ("-varlen" if varlen else "") + ("-causal" if causal else "") + \
        ("-zeros" if zeros else "")


def cpu_sized(c):
    b, _, s_k, _, _, _, zeros = c
    return b <= 2 and s_k <= 140 and not zeros


def lengths_and_table(c, rng):
    """The case's lengths (int64) and its block table (a permutation of the pages, padded to 256
    tokens per sequence), from `rng`."""
    b, s_q, s_k, _, varlen, _, zeros = c
    seqlens = np.full(b, s_k, np.int64)
    if varlen:
        seqlens = np.maximum(rng.normal(s_k, s_k / 2, b), s_q).astype(np.int64)
    if zeros:
        seqlens[rng.standard_normal(b) > 0] = 0
    pages_per = -(-int(seqlens.max()) // 256) * 256 // 64
    return seqlens, rng.permutation(b * pages_per).astype(np.int32).reshape(b, pages_per)


def make_case(c, seed):
    """(seqlens, q bits [b, s_q, h, 576], block_table, k_cache bits [pages, 64, 1, 576]) in NumPy."""
    b, s_q, s_k, h_q, varlen, _, zeros = c
    rng = np.random.default_rng(seed)
    seqlens, table = lengths_and_table(c, rng)
    pages_per = table.shape[1]
    q = np.clip(rng.standard_normal((b, s_q, h_q, 576)) / 10, -1, 1).astype(np.float32)
    kv = np.clip(rng.standard_normal((b * pages_per, 64, 1, 576)) / 10, -1, 1).astype(np.float32)
    for i in range(b):
        used = -(-int(seqlens[i]) // 64)
        kv[table[i, used:]] = np.nan
        if seqlens[i] % 64:
            kv[table[i, used - 1], seqlens[i] % 64:] = np.nan
        table[i, used:] = BAD_PAGE
    return seqlens.astype(np.int32), bf16_bits(q), table, bf16_bits(kv)


def reference(seqlens, q_bits, table, kv_bits, causal):
    """FlashMLA's semantics in float64: (out [b, s_q, h, 512], lse [b, h, s_q])."""
    q = bf16_value(q_bits).astype(np.float64)
    kv = bf16_value(kv_bits).astype(np.float64)
    b, s_q, h, _ = q.shape
    out = np.zeros((b, s_q, h, 512))
    lse = np.full((b, h, s_q), np.inf)
    for i in range(b):
        n = int(seqlens[i])
        keys = kv[table[i, :-(-n // 64)]].reshape(-1, 576)[:n]
        for j in range(s_q):
            vis = n - s_q + j + 1 if causal else n
            if vis <= 0:
                continue
            s = q[i, j] @ keys[:vis].T / math.sqrt(576)  # [h, vis]
            m = s.max(axis=1, keepdims=True)
            p = np.exp(s - m)
            lse[i, :, j] = m[:, 0] + np.log(p.sum(axis=1))
            out[i, j] = (p / p.sum(axis=1, keepdims=True)) @ keys[:vis, :512]
    return out, lse


def expect_close(name, got, want, abs_tol, rel_tol, cos_tol=None):
    """got against want (NumPy arrays, or PyTorch tensors checked where they live), in float64:
    infinities and NaN in the same places, every other element within abs_tol or rel_tol, and the
    cosine difference within cos_tol."""
    if isinstance(got, np.ndarray) or np.isscalar(got):
        got, want = np.asarray(got, np.float64).copy(), np.asarray(want, np.float64).copy()
        equal, isnan = np.array_equal, np.isnan
    else:
        got, want = got.double().clone(), want.double().clone()
        equal, isnan = torch.equal, torch.isnan
    assert got.shape == want.shape, name
    for special in (math.inf, -math.inf):
        mask_g, mask_w = got == special, want == special
        assert equal(mask_g, mask_w), f"{name}: {special} at {int(mask_g.sum())} places, expected {int(mask_w.sum())}"
        got[mask_g] = 0
        want[mask_w] = 0
    nan_g, nan_w = isnan(got), isnan(want)
    assert equal(nan_g, nan_w), f"{name}: NaN in other places"
    got[nan_g] = 0
    want[nan_w] = 0
    err = abs(got - want)
    ok = (err < abs_tol) | (err / (abs(want) + 1e-6) < rel_tol)
    assert bool(ok.all()), f"{name}: {int((~ok).sum())} of {int(np.prod(ok.shape))} elements off, worst {float(err.max()):.3e}"
    if cos_tol is not None:
        ww, gg = float((want * want).sum()), float((got * got).sum())
        cos_diff = 0.0 if ww < 1e-12 else 1 - 2 * float((got * want).sum()) / (ww + gg)
        assert abs(cos_diff) <= cos_tol, f"{name}: cosine difference {cos_diff:.3e}"


def check_case(c, to_array, to_numpy, interface, seed):
    b, s_q, s_k, h_q, varlen, causal, zeros = c
    seqlens, q_bits, table, kv_bits = make_case(c, seed)
    q, k_cache = to_array(q_bits, "bf16"), to_array(kv_bits, "bf16")
    bt, sl = to_array(table, "i32"), to_array(seqlens, "i32")
    if interface == "sched_meta":
        meta, num_splits = flash_mla.get_mla_metadata()
    else:
        meta, num_splits = flash_mla.get_mla_metadata(sl, s_q * h_q, 1)
    out, lse = flash_mla.flash_mla_with_kvcache(q, k_cache, bt, sl, 512, meta, num_splits, causal=causal)
    want_out, want_lse = reference(seqlens, q_bits, table, kv_bits, causal)
    expect_close("out", bf16_value(to_numpy(out)), want_out, 8e-4, 2.01 / 128, 5e-6)
    expect_close("lse", to_numpy(lse), want_lse, 1e-6, 8.01 / 65536)
    if interface == "sched_meta":  # the plan is reused, as FlashMLA allows for the same shapes
        out2, lse2 = flash_mla.flash_mla_with_kvcache(q, k_cache, bt, sl, 512, meta, None, causal=causal)
        assert np.array_equal(to_numpy(out2), to_numpy(out)) and np.array_equal(to_numpy(lse2), to_numpy(lse))


def _numpy_array(bits, kind):
    return np.ascontiguousarray(bits)


ALL = cases()
CPU_CASES = [c for c in ALL if cpu_sized(c) or os.environ.get("SNAPMLA_CPU_ALL_CASES") == "1"]


@pytest.mark.parametrize("k", range(len(CPU_CASES)), ids=lambda k: case_id(CPU_CASES[k]))
def test_flash_mla_case_on_cpu(k, rng):
    interface = "sched_meta" if k % 2 else "arrays"  # neighbours differ only in `causal`
    check_case(CPU_CASES[k], _numpy_array, np.asarray, interface, seed=int(rng.integers(1 << 31)))


def test_cpu_cases_cover_every_head_count():
    run = [c for c in ALL if cpu_sized(c)]
    assert {c[3] for c in run} == set(HEADS) and {c[1] for c in run} == {1, 2, 4}
    assert len(run) == 336


# --- the GPU: every case, both interfaces ---------------------------------------------------

try:
    import torch
except ImportError:  # CI: no PyTorch
    torch = None
GPU = torch is not None and snapmla.cuda_device_available() and torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not GPU, reason="no PyTorch with an sm_90 GPU: FlashMLA GPU cases skipped")


def _torch_array(bits, kind):
    t = torch.from_numpy(np.ascontiguousarray(bits))
    if kind == "bf16":
        t = t.view(torch.bfloat16)
    return t.cuda()


def make_case_gpu(c, seed, device="cuda"):
    """make_case's recipe with the large arrays drawn on the GPU (torch's generator; rounded to
    bf16 to nearest even as bf16_bits does): (seqlens, table) in NumPy and on the GPU, q and
    k_cache as CUDA bf16 tensors. The largest cases hold about 10K pages: drawn in NumPy on the
    host they took seconds each, which kept the whole file from running in one GPU session."""
    b, s_q, s_k, h_q, varlen, _, zeros = c
    rng = np.random.default_rng(seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    seqlens, table = lengths_and_table(c, rng)
    pages_per = table.shape[1]
    q = (torch.randn((b, s_q, h_q, 576), generator=gen, device=device) / 10).clamp_(-1, 1)
    kv = (torch.randn((b * pages_per, 64, 1, 576), generator=gen, device=device) / 10).clamp_(-1, 1)
    for i in range(b):
        used = -(-int(seqlens[i]) // 64)
        kv[torch.from_numpy(table[i, used:]).long().to(device)] = float("nan")
        if seqlens[i] % 64:
            kv[int(table[i, used - 1]), int(seqlens[i]) % 64:] = float("nan")
        table[i, used:] = BAD_PAGE
    return (seqlens.astype(np.int32), table, q.to(torch.bfloat16), kv.to(torch.bfloat16))


def reference_gpu(seqlens, table, q, kv, causal):
    """reference() in float64 on the GPU, all of a sequence's queries at once."""
    b, s_q, h, _ = q.shape
    out = torch.zeros((b, s_q, h, 512), dtype=torch.float64, device=q.device)
    lse = torch.full((b, h, s_q), math.inf, dtype=torch.float64, device=q.device)
    for i in range(b):
        n = int(seqlens[i])
        if n == 0:
            continue
        pages = torch.from_numpy(table[i, :-(-n // 64)]).long().to(q.device)
        keys = kv[pages].reshape(-1, 576)[:n].double()
        s = torch.einsum("jhd,td->jht", q[i].double(), keys) / math.sqrt(576)  # [s_q, h, n]
        for j in range(s_q):
            vis = n - s_q + j + 1 if causal else n
            if vis <= 0:
                continue
            sj = s[j, :, :vis]
            m = sj.amax(dim=1, keepdim=True)
            p = torch.exp(sj - m)
            total = p.sum(dim=1, keepdim=True)
            lse[i, :, j] = (m + torch.log(total))[:, 0]
            out[i, j] = (p / total) @ keys[:vis, :512]
    return out, lse


def check_case_gpu(c, seed, device="cuda"):
    """check_case's checks for both metadata interfaces on one case's data (drawn and checked on
    the GPU; the reference computed once)."""
    _, s_q, _, h_q, _, causal, _ = c
    seqlens, table, q, k_cache = make_case_gpu(c, seed, device)
    bt, sl = torch.from_numpy(table).to(device), torch.from_numpy(seqlens).to(device)
    want_out, want_lse = reference_gpu(seqlens, table, q, k_cache, causal)
    for interface in ("sched_meta", "arrays"):
        if interface == "sched_meta":
            meta, num_splits = flash_mla.get_mla_metadata()
        else:
            meta, num_splits = flash_mla.get_mla_metadata(sl, s_q * h_q, 1)
        out, lse = flash_mla.flash_mla_with_kvcache(q, k_cache, bt, sl, 512, meta, num_splits, causal=causal)
        expect_close(f"{interface}: out", out, want_out, 8e-4, 2.01 / 128, 5e-6)
        expect_close(f"{interface}: lse", lse, want_lse, 1e-6, 8.01 / 65536)
        if interface == "sched_meta":  # the plan is reused, as FlashMLA allows for the same shapes
            out2, lse2 = flash_mla.flash_mla_with_kvcache(q, k_cache, bt, sl, 512, meta, None, causal=causal)
            assert torch.equal(out2, out) and torch.equal(lse2, lse)


@needs_gpu
@pytest.mark.parametrize("c", ALL, ids=case_id)
def test_flash_mla_case_on_gpu(c, rng):
    check_case_gpu(c, seed=int(rng.integers(1 << 31)))


needs_torch = pytest.mark.skipif(torch is None, reason="no PyTorch: the GPU path's helpers not checked")


@needs_torch
@pytest.mark.parametrize("c", [(2, 2, 140, 9, True, True, False), (6, 4, 20, 3, False, False, False),
                               (2, 1, 140, 1, True, False, True)], ids=case_id)
def test_gpu_path_helpers_on_the_cpu(c):
    # The GPU test's own pieces, run with PyTorch on the CPU: its float64 reference agrees with
    # the NumPy one on the same data, and its checks pass for the drop-in (the CPU reference).
    seqlens, table, q, k_cache = make_case_gpu(c, 3, "cpu")
    causal = c[5]
    got_out, got_lse = reference_gpu(seqlens, table, q, k_cache, causal)
    want_out, want_lse = reference(seqlens, q.view(torch.uint16).numpy(), table, k_cache.view(torch.uint16).numpy(),
                                   causal)
    assert np.allclose(got_out.numpy(), want_out, rtol=1e-12, atol=1e-14)
    assert np.array_equal(np.isinf(got_lse.numpy()), np.isinf(want_lse))
    fin = np.isfinite(want_lse)
    assert np.allclose(got_lse.numpy()[fin], want_lse[fin], rtol=1e-12)
    check_case_gpu(c, 3, "cpu")


@needs_gpu
def test_sched_meta_checks_reuse_on_gpu():
    check_sched_meta_reuse(_torch_array)


def check_sched_meta_reuse(to_array):
    c = (2, 2, 140, 9, True, True, False)
    seqlens, q_bits, table, kv_bits = make_case(c, 1)
    q, k_cache = to_array(q_bits, "bf16"), to_array(kv_bits, "bf16")
    bt, sl = to_array(table, "i32"), to_array(seqlens, "i32")
    meta, none = flash_mla.get_mla_metadata()
    assert none is None and not meta.have_initialized
    flash_mla.flash_mla_with_kvcache(q, k_cache, bt, sl, 512, meta, None, causal=True)
    assert meta.have_initialized and meta.config.h_q == 9 and meta.config.s_q == 2
    with pytest.raises(ValueError, match="causal True -> False"):
        flash_mla.flash_mla_with_kvcache(q, k_cache, bt, sl, 512, meta, None, causal=False)
    with pytest.raises(ValueError, match="h_q 9 -> 3"):
        flash_mla.flash_mla_with_kvcache(q[:, :, :3].copy() if isinstance(q, np.ndarray) else
                                         q[:, :, :3].contiguous(), k_cache, bt, sl, 512, meta, None,
                                         causal=True)
    with pytest.raises(ValueError, match="num_splits"):
        flash_mla.flash_mla_with_kvcache(q, k_cache, bt, sl, 512, meta, meta.num_splits, causal=True)


def test_sched_meta_checks_reuse_on_cpu():
    check_sched_meta_reuse(_numpy_array)


def test_default_softmax_scale_and_empty_query_convention():
    """softmax_scale defaults to q.shape[-1] ** -0.5; a query with no key: out 0, lse +inf."""
    c = (2, 4, 20, 3, False, True, False)
    seqlens, q_bits, table, kv_bits = make_case(c, 7)
    seqlens[1] = 2  # causal, s_q = 4: queries 0 and 1 of sequence 1 see nothing
    meta, n = flash_mla.get_mla_metadata(seqlens, 4 * 3, 1)
    out, lse = flash_mla.flash_mla_with_kvcache(q_bits, kv_bits, table, seqlens, 512, meta, n, causal=True)
    assert np.all(lse[1, :, :2] == np.inf) and np.all(out[1, :2] == 0)
    assert np.all(np.isfinite(lse[1, :, 2:])) and np.all(np.isfinite(lse[0]))
    explicit, lse_e = flash_mla.flash_mla_with_kvcache(q_bits, kv_bits, table, seqlens, 512, meta, n,
                                                       softmax_scale=576 ** -0.5, causal=True)
    assert np.array_equal(explicit, out) and np.array_equal(lse_e, lse)
    other, _ = flash_mla.flash_mla_with_kvcache(q_bits, kv_bits, table, seqlens, 512, meta, n,
                                                softmax_scale=0.1, causal=True)
    assert not np.array_equal(other, out)
