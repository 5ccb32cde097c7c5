"""The native API on NumPy arrays (the CPU path), against the independent NumPy formulation in
conftest.py. These run in CI, on machines without a GPU."""

import math

import numpy as np
import pytest

import snapmla
from conftest import (attention, bf16_bits, bf16_value, dequantize_rows, e4m3_bits, e4m3_value,
                      make_paged, quantize_rows, rel_l2)


def random_rows(rng, n, rope_scale=30.0):
    """MLA-like rows: latent ~ N(0, 1) with a few large channels, rope wider than the latent."""
    rows = rng.standard_normal((n, 576)).astype(np.float32)
    rows[:, :512] *= np.where(rng.random(512) < 0.02, 8.0, 1.0).astype(np.float32)
    rows[:, 512:] *= rope_scale
    return bf16_bits(rows)


def nan_cache(num_pages):
    """FP8 cache planes with NaN everywhere, so a read of an unwritten slot shows up."""
    cache = snapmla.alloc_fp8_cache(num_pages, np.zeros(1))
    cache.latent.fill(0x7F)  # e4m3 NaN
    cache.scale.fill(np.nan)
    cache.rope.fill(0x7FC0)  # bf16 NaN
    return cache


def test_info_says_what_runs():
    text = snapmla.info()
    assert "snapmla" in text
    if not snapmla.cuda_device_available():
        assert "CPU reference ops only" in text


def test_e4m3_helpers_agree_with_the_format():
    codes = np.arange(256, dtype=np.uint8)
    vals = e4m3_value(codes)
    finite = ~np.isnan(vals)
    assert np.array_equal(e4m3_bits(vals[finite].astype(np.float32)) & 0x7F, codes[finite] & 0x7F)
    assert e4m3_value(e4m3_bits(np.float32(1000.0))) == 448.0
    assert e4m3_bits(np.float32(2.0 ** -10)) == 0  # tie between 0 and 2^-9: even code


def test_append_fp8_is_the_quantization_rule_bit_for_bit(rng):
    n, pages = 150, 4
    kv = random_rows(rng, n)
    kv[3, :512] = 0  # an all-zero latent row still gets a finite scale
    slots = rng.permutation(pages * 64)[:n].astype(np.int32)
    slots[7] = -1  # padding: skipped
    cache = nan_cache(pages)
    snapmla.append(cache, kv, slots)
    latent, scale, rope = quantize_rows(kv)
    keep = slots >= 0
    s = slots[keep]
    assert np.array_equal(cache.latent.reshape(-1, 512)[s], latent[keep])
    assert np.array_equal(cache.scale.reshape(-1)[s], scale[keep])
    assert np.array_equal(cache.rope.reshape(-1, 64)[s], rope[keep])
    untouched = np.setdiff1d(np.arange(pages * 64), s)
    assert np.all(np.isnan(cache.scale.reshape(-1)[untouched]))
    # And the stored values reconstruct the rows within e4m3's half-ulp (2^-4 relative).
    back = dequantize_rows(latent, scale, rope)
    orig = bf16_value(kv).astype(np.float64)
    # (plus e4m3's subnormal spacing 2^-9 in the scaled domain for the smallest values)
    bound = 2.0 ** -4 * np.abs(orig[:, :512]) + 2.0 ** -10 * scale[:, None]
    assert np.all(np.abs(back[:, :512] - orig[:, :512]) <= bound)


def test_append_bf16_is_a_copy(rng):
    kv = random_rows(rng, 70)
    slots = rng.permutation(128).astype(np.int32)[:70]
    cache = snapmla.alloc_bf16_cache(2, kv)
    snapmla.append(cache, kv, slots)
    assert np.array_equal(cache.reshape(-1, 576)[slots], kv)


def test_quantize_query_is_the_same_rule(rng):
    q = random_rows(rng, 2 * 3 * 16).reshape(2, 3, 16, 576)
    qq = snapmla.quantize_query(q)
    latent, scale, rope = quantize_rows(q.reshape(-1, 576))
    assert qq.nope.shape == (2, 3, 16, 512) and qq.nope.dtype == np.uint8
    assert np.array_equal(qq.nope.reshape(-1, 512), latent)
    assert np.array_equal(qq.scale.reshape(-1), scale)
    assert np.array_equal(qq.rope.reshape(-1, 64), rope)


def test_gather_dequant_reconstructs_what_append_stored(rng):
    kv = random_rows(rng, 100)
    slots = rng.permutation(256).astype(np.int32)[:100]
    cache = nan_cache(4)
    snapmla.append(cache, kv, slots)
    fetch = np.concatenate([slots[::3], np.array([-1], np.int32)])
    rows = snapmla.gather_dequant(cache, fetch)
    latent, scale, rope = quantize_rows(kv[::3])
    expect = dequantize_rows(latent, scale, rope).astype(np.float32)
    assert np.array_equal(rows[:-1], bf16_bits(expect))
    assert np.array_equal(rows[-1], np.zeros(576, np.uint16))


def test_plan_splits_covers_every_sequence(rng):
    seqlens = np.array([0, 1, 64, 65, 4000, 129], np.int32)
    for workers in (1, 3, 16):
        plan = snapmla.plan_splits(seqlens, workers)
        off, begin = plan.split_offsets, plan.split_begin
        assert off[0] == 0 and off[-1] <= snapmla.split_plan_capacity(len(seqlens), workers)
        for i, n in enumerate(seqlens):
            b = begin[off[i]:off[i + 1]]
            assert len(b) >= 1 and b[0] == 0 and np.all(b % 64 == 0)
            assert np.all(np.diff(b) > 0) and (n == 0 or b[-1] < n)
        # The worker ranges: contiguous runs from split 0 to the last, in order, every worker
        # with at most an equal share of the cost (pages, plus the planner's fixed cost of 8 pages
        # per piece after its first).
        k = int(off[-1])
        ends = np.append(begin[1:k], 0)
        seq = np.searchsorted(off, np.arange(k), side="right") - 1
        last = np.arange(k) + 1 == off[seq + 1]
        ends[last] = seqlens[seq[last]]
        pages = (ends - begin[:k] + 63) // 64
        ws = plan.worker_splits[:workers + 1].astype(np.int64)
        assert ws[0] == 0 and ws[-1] == k and np.all(np.diff(ws) >= 0)
        assert np.all(plan.worker_splits[workers + 1:] == -1)
        piece = 8
        axis = int(((seqlens.astype(np.int64) + 63) // 64).sum()) + piece * (len(seqlens) - 1)
        share = -(-axis // workers)
        cost = [int(pages[ws[w]:ws[w + 1]].sum()) + piece * max(0, int(ws[w + 1] - ws[w]) - 1)
                for w in range(workers)]
        assert max(cost) <= share + piece, (workers, cost, share)
        assert sum(cost) >= axis - piece * workers  # nothing is left out


def test_plan_splits_query_rows_lengthens_short_splits():
    # The decode's query rows make a small total's splits no shorter than the cost model's chunk:
    # one 8K sequence for 66 workers at h = 128 is 32 splits of 4 pages instead of 64 of 2.
    seqlens = np.array([8192], np.int32)
    assert int(snapmla.plan_splits(seqlens, 66).split_offsets[-1]) == 64
    plan = snapmla.plan_splits(seqlens, 66, query_rows=128)
    assert int(plan.split_offsets[-1]) == 32 and list(plan.split_begin[:3]) == [0, 256, 512]
    assert "query_rows" in error_of(lambda: snapmla.plan_splits(seqlens, 66, query_rows=600))


def build_case(rng, seqlens, s_q, h):
    """An FP8 and a BF16 cache holding the same random tokens, with NaN in every unused slot."""
    table, slots, num_pages = make_paged(rng, seqlens)
    cache8 = nan_cache(num_pages)
    cache16 = snapmla.alloc_bf16_cache(num_pages, np.zeros(1))
    cache16.fill(0x7FC0)
    rows = []
    for s in slots:
        kv = random_rows(rng, len(s))
        rows.append(kv)
        if len(s):
            snapmla.append(cache8, kv, s)
            snapmla.append(cache16, kv, s)
    q = random_rows(rng, len(seqlens) * s_q * h, rope_scale=3.0).reshape(len(seqlens), s_q, h, 576)
    return q, table, rows, cache8, cache16


@pytest.mark.parametrize("s_q,h,causal", [(1, 16, True), (2, 32, True), (4, 16, False), (1, 1, True),
                                          (4, 3, True), (2, 8, True), (1, 9, False), (3, 24, True),
                                          (1, 63, True), (4, 126, True)])
def test_decode_fp8_against_float64(rng, s_q, h, causal):
    seqlens = np.array([0, 1, 70, 300], np.int32)
    q, table, rows, cache8, _ = build_case(rng, seqlens, s_q, h)
    scale = 1.0 / math.sqrt(192)
    qq = snapmla.quantize_query(q)
    out, lse = snapmla.decode_fp8(qq, cache8, table, seqlens, softmax_scale=scale, causal=causal)
    assert out.shape == (4, s_q, h, 512) and lse.shape == (4, h, s_q)
    # Ground truth on what the kernel is given (quantized query and cache): what is left is the
    # P quantization and the bf16 output. Each weight p_t s_t / sigma is rounded to e4m3 (unit
    # roundoff 2^-4 where normal, so the output within 2^-4 sum p|v|; a subnormal one, below
    # 2^-6 of a block max 448, within 2^-10 absolute: 2^-10 / 448 < 2^-18 of the block's largest
    # weight, per token), then the output to bf16 (2^-8 |o|); 10% slack for the fp32 sums. A bound
    # per element, from the case itself: a rel-L2 bound would not hold for rows whose softmax is
    # one or two tokens, where nothing averages out (h = 1 measured 2.2% rel-L2 there).
    qn, qs, qr = qq.nope.reshape(-1, 512), qq.scale.reshape(-1), qq.rope.reshape(-1, 64)
    qv = dequantize_rows(qn, qs, qr).reshape(q.shape)
    for i, n in enumerate(seqlens):
        kv = dequantize_rows(*quantize_rows(rows[i])) if n else np.zeros((0, 576))
        ref_out, ref_lse, ref_abs = attention(qv[i], kv, scale, causal, with_abs=True)
        got = bf16_value(out[i]).astype(np.float64)
        seen = np.isfinite(ref_lse.T)  # [s_q, h]
        assert np.all(got[~seen] == 0) and np.all(np.isneginf(lse[i].T[~seen]))
        if seen.any():
            v_max = np.max(np.abs(kv[:, :512])) if n else 0.0
            bound = 1.1 * (2.0 ** -4 * ref_abs + 2.0 ** -8 * np.abs(ref_out)) + n * 2.0 ** -18 * v_max
            assert np.all(np.abs(got - ref_out)[seen] <= bound[seen])
            assert rel_l2(got[seen], ref_out[seen]) < 1.5e-2 or h * s_q <= 3  # the average case stays tight
            # lse comes from the unquantized fp32 scores: only fp32 rounding.
            assert np.max(np.abs(lse[i].T[seen] - ref_lse.T[seen])) < 1e-4 * (1 + np.max(np.abs(ref_lse[np.isfinite(ref_lse)])))


@pytest.mark.parametrize("s_q,h", [(1, 16), (2, 48), (1, 1), (4, 3), (1, 8), (2, 9), (1, 24), (1, 63),
                                   (2, 126)])
def test_decode_bf16_against_float64(rng, s_q, h):
    seqlens = np.array([5, 64, 200], np.int32)
    q, table, rows, _, cache16 = build_case(rng, seqlens, s_q, h)
    scale = 0.1
    out, lse = snapmla.decode_bf16(q, cache16, table, seqlens, softmax_scale=scale)
    qv = bf16_value(q).astype(np.float64)
    for i in range(len(seqlens)):
        ref_out, ref_lse, ref_abs = attention(qv[i], bf16_value(rows[i]).astype(np.float64), scale,
                                              with_abs=True)
        got = bf16_value(out[i]).astype(np.float64)
        # The kernel rounds P to bf16 for the PV product (each weight within bf16's unit
        # roundoff 2^-8, so the output within 2^-8 sum p|v|) and the output to bf16 (2^-8 |o|);
        # 10% slack for the fp32 sums. Measured: up to 0.87 of the bound.
        bound = 1.1 * 2.0 ** -8 * (ref_abs + np.abs(ref_out))
        assert np.all(np.abs(got - ref_out) <= bound)
        assert np.max(np.abs(lse[i] - ref_lse)) < 1e-5 * (1 + np.max(np.abs(ref_lse)))


def test_split_plan_gives_the_same_decode(rng):
    seqlens = np.array([1000, 3, 640], np.int32)
    q, table, _, cache8, cache16 = build_case(rng, seqlens, 2, 16)
    qq = snapmla.quantize_query(q)
    plan = snapmla.plan_splits(seqlens, 7)
    assert plan.split_offsets[-1] > len(seqlens)  # the plan really splits something
    a, la = snapmla.decode_fp8(qq, cache8, table, seqlens, softmax_scale=0.1)
    b, lb = snapmla.decode_fp8(qq, cache8, table, seqlens, softmax_scale=0.1, plan=plan)
    # Splits change where the running max and sigma restart, so outputs differ by rounding
    # only (measured up to 3e-4 rel-L2 for both kernels' algorithms; bound 2e-3).
    assert rel_l2(bf16_value(b), bf16_value(a)) < 2e-3
    assert np.max(np.abs(la - lb)) < 1e-5 * np.max(np.abs(la))
    c, _ = snapmla.decode_bf16(q, cache16, table, seqlens, softmax_scale=0.1, plan=plan)
    d, _ = snapmla.decode_bf16(q, cache16, table, seqlens, softmax_scale=0.1)
    assert rel_l2(bf16_value(c), bf16_value(d)) < 2e-3


def test_reference_module_matches_native_on_cpu(rng):
    seqlens = np.array([90, 2], np.int32)
    q, table, _, cache8, _ = build_case(rng, seqlens, 1, 16)
    qq = snapmla.reference.quantize_query(q)
    out, lse = snapmla.reference.decode_fp8(qq, cache8, table, seqlens, softmax_scale=0.05)
    out2, lse2 = snapmla.decode_fp8(snapmla.quantize_query(q), cache8, table, seqlens, softmax_scale=0.05)
    assert np.array_equal(out, out2) and np.array_equal(lse, lse2)


def test_attention_f64_matches_numpy(rng):
    q = rng.standard_normal((2, 16, 576)).astype(np.float32)
    kv = rng.standard_normal((77, 576)).astype(np.float32)
    out, lse = snapmla.reference.attention_f64(q, kv, 0.05, True)
    ref_out, ref_lse = attention(q.astype(np.float64), kv.astype(np.float64), 0.05, True)
    assert np.allclose(out, ref_out, rtol=1e-12, atol=1e-14)
    assert np.allclose(lse, ref_lse, rtol=1e-12)


# --- bad input: a clear error naming the argument -----------------------------------------------

def error_of(fn):
    with pytest.raises(snapmla.SnapMLAError) as e:
        fn()
    assert isinstance(e.value, ValueError)
    return str(e.value)


def test_errors_name_the_argument(rng):
    seqlens = np.array([10], np.int32)
    q, table, _, cache8, cache16 = build_case(rng, seqlens, 1, 16)
    qq = snapmla.quantize_query(q)
    dec = lambda **kw: snapmla.decode_fp8(**{**dict(q=qq, cache=cache8, block_table=table, cache_seqlens=seqlens, softmax_scale=0.1), **kw})
    assert "'block_table'" in error_of(lambda: dec(block_table=table.astype(np.int64))) and "int64" in error_of(lambda: dec(block_table=table.astype(np.int64)))
    assert "'cache_seqlens'" in error_of(lambda: dec(cache_seqlens=seqlens.astype(np.float32)))
    assert "'q_scale'" in error_of(lambda: dec(q=snapmla.QuantizedQuery(qq.nope, qq.rope, qq.scale[:, :, :8].copy())))
    assert "softmax_scale" in error_of(lambda: dec(softmax_scale=0.0))
    assert "'latent'" in error_of(lambda: dec(cache=snapmla.PagedFp8Cache(cache8.latent[:, :63].copy(), cache8.scale, cache8.rope)))
    msg = error_of(lambda: snapmla.append(cache8, q.reshape(-1, 576)[::2], np.zeros(8, np.int32)))
    assert "'kv'" in msg and "contiguous" in msg
    assert "'slots'" in error_of(lambda: snapmla.append(cache8, q.reshape(-1, 576), np.zeros((4, 4), np.int32)))
    assert "'q'" in error_of(lambda: snapmla.quantize_query(q.reshape(16, 576)))
    assert "'q'" in error_of(lambda: snapmla.decode_bf16(q.astype(np.float32), cache16, table, seqlens, softmax_scale=0.1))
    plan = snapmla.plan_splits(seqlens, 2)
    assert "split_begin" in error_of(lambda: dec(plan=snapmla.SplitPlan(plan.split_offsets, None, 2)))
    assert "num_workers" in error_of(lambda: snapmla.plan_splits(seqlens, 0))
    # The operation named is the one called, not the reference behind it.
    msg = error_of(lambda: dec(softmax_scale=0.0))
    assert msg.startswith("snapmla::decode_fp8: ") and "ref::" not in msg
    assert "num_heads" in error_of(lambda: snapmla.recommended_num_workers(q, 1, 0))
    assert "num_heads" in error_of(lambda: snapmla.recommended_num_workers(q, 1, 129))
    assert "seqlen_q" in error_of(lambda: snapmla.recommended_num_workers(q, 5, 16))
    assert snapmla.recommended_num_workers(q, 1, 24) >= 1 and snapmla.recommended_num_workers(q, 4, 3) >= 1


def test_stream_argument_is_checked():
    q = np.zeros((1, 1, 16, 576), np.uint16)
    for bad in ("0", -1, 1.5, True):
        with pytest.raises(TypeError, match="'stream'"):
            snapmla.quantize_query(q, stream=bad)

    class OtherDeviceStream:  # shaped like torch.cuda.Stream, on a device the arrays are not on
        cuda_stream = 0
        device = type("Dev", (), {"index": 1})()

    out = snapmla.quantize_query(q, stream=OtherDeviceStream())  # CPU arrays ignore streams
    assert out.nope.shape == (1, 1, 16, 512)
    assert snapmla.quantize_query(q, stream=0).scale.shape == (1, 1, 16)


def test_table_contents_are_checked_on_the_cpu(rng):
    seqlens = np.array([100], np.int32)
    q, table, _, cache8, _ = build_case(rng, seqlens, 1, 16)
    qq = snapmla.quantize_query(q)
    bad = table.copy()
    bad[0, 1] = 10_000
    msg = error_of(lambda: snapmla.decode_fp8(qq, cache8, bad, seqlens, softmax_scale=0.1))
    assert "block_table" in msg
    long = np.array([table.shape[1] * 64 + 1], np.int32)
    msg = error_of(lambda: snapmla.decode_fp8(qq, cache8, table, long, softmax_scale=0.1))
    assert "cache_seqlens[0]" in msg and "beyond the block table row" in msg
    msg = error_of(lambda: snapmla.decode_fp8(qq, cache8, table, np.array([-4], np.int32), softmax_scale=0.1))
    assert "cache_seqlens[0] = -4 is negative" in msg
    assert "block_table" in error_of(lambda: snapmla.check_page_table(bad, seqlens, cache8.num_pages))
    assert "slot" in error_of(lambda: snapmla.check_slot_mapping(np.array([5, 1 << 20], np.int32), cache8.num_pages))


def test_host_arrays_allocate_as_usual_with_a_stream_argument(rng):
    # allocating_for only changes where device arrays are allocated; host arrays ignore stream=.
    from snapmla._frameworks import allocating_for
    import contextlib
    x = np.zeros(4, np.float32)
    assert isinstance(allocating_for(x, 7), contextlib.nullcontext)
    assert isinstance(allocating_for(x, None), contextlib.nullcontext)
    seqlens = np.array([10], np.int32)
    q, table, _, cache8, _ = build_case(rng, seqlens, 1, 16)
    a = snapmla.quantize_query(q)
    b = snapmla.quantize_query(q, stream=5)  # a stream handle: ignored for host arrays
    assert np.array_equal(a.nope, b.nope) and np.array_equal(a.scale, b.scale)


def test_plan_splits_split_blocks_is_batch_invariant(rng):
    """split_blocks: a row decoded alone and in a batch gives the same bits (its splits are cut at
    multiples of split_blocks whatever else is in the batch); a plan without room for them is
    the default plan; a negative value is an error naming it."""
    seqlens = np.array([2000, 777, 130], np.int32)
    q, table, _, cache8, _ = build_case(rng, seqlens, 1, 16)
    qq = snapmla.quantize_query(q)
    plan = snapmla.plan_splits(seqlens, 24, split_blocks=3, capacity=100)
    off = plan.split_offsets
    assert [int(off[i + 1] - off[i]) for i in range(3)] == [11, 5, 1]
    out, lse = snapmla.decode_fp8(qq, cache8, table, seqlens, softmax_scale=0.1, plan=plan)
    for i in range(3):
        one = slice(i, i + 1)
        qi = snapmla.QuantizedQuery(*(np.ascontiguousarray(x[one]) for x in qq))
        p1 = snapmla.plan_splits(seqlens[one], 5, split_blocks=3, capacity=40)
        o1, l1 = snapmla.decode_fp8(qi, cache8, np.ascontiguousarray(table[one]), seqlens[one], softmax_scale=0.1,
                                    plan=p1)
        assert np.array_equal(o1[0], out[i]) and np.array_equal(l1[0], lse[i]), i
    tight, default = snapmla.plan_splits(seqlens, 4, split_blocks=1), snapmla.plan_splits(seqlens, 4)
    assert all(np.array_equal(a, b) for a, b in zip(tight[:2], default[:2]))
    assert "split_blocks" in error_of(lambda: snapmla.plan_splits(seqlens, 4, split_blocks=-1))
