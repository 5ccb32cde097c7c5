"""The pointer path of decode_fp8 / decode_bf16 (snapmla/_fastpath.py): a call whose arrays have
the layouts of one that passed every check gives bit-identical results without DLPack, and
loses no check: another dtype, shape or stride takes the array path and its error, and what
depends on values (scale, table contents on the host, plan sizes) is checked on every call."""

import numpy as np
import pytest

import snapmla
from snapmla import _fastpath
from test_ops_numpy import build_case, error_of


def fresh(x):
    """The same values in new memory (other pointers, same layout)."""
    return x.copy()


@pytest.fixture(autouse=True)
def empty_signatures():
    _fastpath.forget()
    yield
    _fastpath.forget()


def test_pointer_path_is_bit_identical_and_follows_new_memory(rng):
    seqlens = np.array([130, 7, 64], np.int32)
    q, table, _, cache8, cache16 = build_case(rng, seqlens, 2, 9)
    qq = snapmla.quantize_query(q)
    plan = snapmla.plan_splits(seqlens, 5)
    first = snapmla.decode_fp8(qq, cache8, table, seqlens, softmax_scale=0.1, plan=plan)
    first16 = snapmla.decode_bf16(q, cache16, table, seqlens, softmax_scale=0.1, plan=plan)
    assert len(_fastpath._accepted) == 2
    again = snapmla.decode_fp8(snapmla.QuantizedQuery(*map(fresh, qq)), snapmla.PagedFp8Cache(*map(fresh, cache8)),
                               fresh(table), fresh(seqlens), softmax_scale=0.1,
                               plan=snapmla.SplitPlan(*map(fresh, plan[:2]), plan.num_workers, fresh(plan.worker_splits)))
    again16 = snapmla.decode_bf16(fresh(q), fresh(cache16), fresh(table), fresh(seqlens), softmax_scale=0.1, plan=plan)
    assert len(_fastpath._accepted) == 2  # no new signature: the pointer path ran
    for a, b in ((first, again), (first16, again16)):
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1], equal_nan=True)
    # New values in the same memory layout are read, not the old ones.
    q2 = q.copy()
    q2[0] = q[1]
    other16 = snapmla.decode_bf16(q2, cache16, table, seqlens, softmax_scale=0.1, plan=plan)
    assert not np.array_equal(other16[0][0], first16[0][0])
    assert np.array_equal(other16[0][1:], first16[0][1:])


def test_pointer_path_loses_no_check(rng):
    seqlens = np.array([100, 3], np.int32)
    q, table, _, cache8, cache16 = build_case(rng, seqlens, 1, 3)
    qq = snapmla.quantize_query(q)
    snapmla.decode_fp8(qq, cache8, table, seqlens, softmax_scale=0.1)
    snapmla.decode_bf16(q, cache16, table, seqlens, softmax_scale=0.1)
    # Other layouts: a new signature, the array path, its errors.
    assert "'block_table'" in error_of(lambda: snapmla.decode_fp8(qq, cache8, table.astype(np.int64), seqlens,
                                                                  softmax_scale=0.1))
    strided = np.zeros((2, 1, 6, 576), np.uint16)[:, :, ::2]  # the shape of q, not contiguous
    strided[...] = q
    assert "contiguous" in error_of(lambda: snapmla.decode_bf16(strided, cache16, table, seqlens, softmax_scale=0.1))
    # Values, checked on the pointer path too.
    assert "softmax_scale" in error_of(lambda: snapmla.decode_fp8(qq, cache8, table, seqlens, softmax_scale=0.0))
    long = np.array([100, table.shape[1] * 64 + 1], np.int32)
    assert "cache_seqlens[1]" in error_of(lambda: snapmla.decode_fp8(qq, cache8, table, long, softmax_scale=0.1))
    bad = table.copy()
    bad[0, 0] = 1 << 20
    assert "block_table" in error_of(lambda: snapmla.decode_bf16(q, cache16, bad, seqlens, softmax_scale=0.1))
    assert "empty_lse" in error_of(lambda: snapmla.decode_bf16(q, cache16, table, seqlens, softmax_scale=0.1,
                                                               empty_lse=1.0))


def test_torch_tensors_take_the_pointer_path(rng):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed: torch pointer-path test skipped")
    seqlens = np.array([130, 7], np.int32)
    q, table, _, _, cache16 = build_case(rng, seqlens, 2, 9)
    devices = ["cpu"] + (["cuda"] if snapmla.cuda_device_available() and torch.cuda.is_available() else [])
    for dev in devices:
        _fastpath.forget()
        t = lambda x: torch.from_numpy(np.ascontiguousarray(x)).to(dev)
        qt = t(q).view(torch.bfloat16)
        ct, bt, st = t(cache16).view(torch.bfloat16), t(table), t(seqlens)
        plan = snapmla.plan_splits(st, 4)
        first = snapmla.decode_bf16(qt, ct, bt, st, softmax_scale=0.1, plan=plan)
        second = snapmla.decode_bf16(qt.clone(), ct.clone(), bt.clone(), st.clone(), softmax_scale=0.1, plan=plan)
        assert len(_fastpath._accepted) == 1
        assert torch.equal(first[0].view(torch.int16), second[0].view(torch.int16))
        assert torch.equal(first[1], second[1])
        strided = torch.zeros((2, 2, 18, 576), dtype=torch.bfloat16, device=dev)[:, :, ::2]
        with pytest.raises(ValueError, match="contiguous"):
            snapmla.decode_bf16(strided, ct, bt, st, softmax_scale=0.1, plan=plan)


def test_raw_entry_points_check_pointers_on_every_call(rng):
    """What the pointer path passes that no signature holds (the pointers) is checked by the
    raw entry point itself: a null or misaligned pointer is an error naming the argument."""
    seqlens = np.array([70, 3], np.int32)
    q, table, _, cache8, cache16 = build_case(rng, seqlens, 1, 4)
    qq = snapmla.quantize_query(q)
    snapmla.decode_fp8(qq, cache8, table, seqlens, softmax_scale=0.1)
    snapmla.decode_bf16(q, cache16, table, seqlens, softmax_scale=0.1)
    for op, inputs in (("decode_fp8", (*qq, *cache8, table, seqlens, None, None, None)),
                       ("decode_bf16", (q, cache16, table, seqlens, None, None, None))):
        sig, ptrs = _fastpath.prepare((op, "allocated"), inputs)
        record = _fastpath.lookup(sig)
        assert record is not None
        raw = getattr(snapmla._C, op + "_raw")
        out, lse, _, out_ptr, lse_ptr, ws_ptr = record.outputs()

        def call(ptrs):
            raw(*ptrs, out_ptr, lse_ptr, ws_ptr, record.shape, 0.1, True, -np.inf, 0)

        call(ptrs)  # as given: fine
        for i in (0, 1, len(inputs) - 5):  # the query, the cache, block_table
            bad = list(ptrs)
            bad[i] = 0
            assert "null pointer" in error_of(lambda: call(bad))
        bad = list(ptrs)
        bad[1] += 2  # the cache (fp8: q_rope) off its 16-byte alignment
        assert "aligned" in error_of(lambda: call(bad))


def test_signatures_are_bounded(rng, monkeypatch):
    monkeypatch.setattr(_fastpath, "_MAX_SIGNATURES", 2)
    seqlens = np.array([65, 2], np.int32)
    for h in (1, 2, 3, 4, 2):
        q, table, _, _, cache16 = build_case(rng, seqlens, 1, h)
        got = snapmla.decode_bf16(q, cache16, table, seqlens, softmax_scale=0.1)
        again = snapmla.decode_bf16(q, cache16, table, seqlens, softmax_scale=0.1)  # pointer path
        assert len(_fastpath._accepted) <= 2
        assert np.array_equal(got[0], again[0]) and np.array_equal(got[1], again[1], equal_nan=True)


def torch_case(torch, rng, seqlens, s_q, h):
    q, table, _, cache8, cache16 = build_case(rng, np.asarray(seqlens, np.int32), s_q, h)
    t = lambda x: torch.from_numpy(np.ascontiguousarray(x))
    qq = snapmla.quantize_query(t(q).view(torch.bfloat16))
    cache = snapmla.PagedFp8Cache(t(cache8.latent).view(torch.float8_e4m3fn), t(cache8.scale),
                                  t(cache8.rope).view(torch.bfloat16))
    return qq, cache, t(table), t(np.asarray(seqlens, np.int32))


def test_allocating_calls_key_on_inputs_and_keep_no_arrays(rng):
    """An eager torch call that lets snapmla allocate its outputs records its inputs' signature;
    a later call gets new outputs of the same layouts, and the record holds none of the first
    call's tensors (so they are freed)."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed: torch pointer-path test skipped")
    import gc
    import weakref

    qq, cache, table, seqlens = torch_case(torch, rng, [130, 7], 2, 9)
    plan = snapmla.plan_splits(seqlens, 4)
    first = snapmla.decode_fp8(qq, cache, table, seqlens, softmax_scale=0.1, plan=plan)
    assert [k[0] for k in _fastpath._accepted] == [("decode_fp8", "allocated")]
    fresh_q = snapmla.QuantizedQuery(*(x.clone() for x in qq))
    second = snapmla.decode_fp8(fresh_q, cache, table.clone(), seqlens.clone(), softmax_scale=0.1, plan=plan)
    assert len(_fastpath._accepted) == 1  # the pointer path ran
    for a, b in zip(first, second):
        assert a.data_ptr() != b.data_ptr() and a.shape == b.shape and a.dtype == b.dtype
        assert a.stride() == b.stride() and a.device == b.device
    assert torch.equal(first[0].view(torch.int16), second[0].view(torch.int16))
    assert torch.equal(first[1], second[1])
    gone = [weakref.ref(x) for x in (*first, *fresh_q)]
    del first, second, fresh_q, a, b
    gc.collect()
    assert all(r() is None for r in gone)


def test_allocating_calls_lose_no_check(rng):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed: torch pointer-path test skipped")
    qq, cache, table, seqlens = torch_case(torch, rng, [100, 3], 1, 16)
    snapmla.decode_fp8(qq, cache, table, seqlens, softmax_scale=0.1)
    assert len(_fastpath._accepted) == 1
    # Another head count: a new signature, the array path (which accepts it, then records it).
    qq8, *_ = torch_case(torch, rng, [100, 3], 1, 8)
    snapmla.decode_fp8(qq8, cache, table, seqlens, softmax_scale=0.1)
    assert len(_fastpath._accepted) == 2
    # Layouts the array path rejects are never recorded, so they fail on every call.
    wide = snapmla.QuantizedQuery(qq.nope, qq.rope[..., :32].contiguous(), qq.scale)
    strided = snapmla.QuantizedQuery(qq.nope, torch.empty(2, 1, 32, 64, dtype=torch.bfloat16)[:, :, ::2], qq.scale)
    for _ in range(2):
        assert "'q_rope'" in error_of(lambda: snapmla.decode_fp8(wide, cache, table, seqlens, softmax_scale=0.1))
        assert "contiguous" in error_of(lambda: snapmla.decode_fp8(strided, cache, table, seqlens, softmax_scale=0.1))
        assert "'block_table'" in error_of(lambda: snapmla.decode_fp8(qq, cache, table.long(), seqlens,
                                                                      softmax_scale=0.1))
    assert len(_fastpath._accepted) == 2
    # Values, on the pointer path.
    assert "softmax_scale" in error_of(lambda: snapmla.decode_fp8(qq, cache, table, seqlens, softmax_scale=-1.0))
    bad = table.clone()
    bad[1, 0] = -5
    assert "block_table" in error_of(lambda: snapmla.decode_fp8(qq, cache, bad, seqlens, softmax_scale=0.1))
    # A tensor subclass takes the array path: no signature of it is recorded.
    class Marked(torch.Tensor):
        pass

    out = snapmla.decode_fp8(qq, cache, table.as_subclass(Marked), seqlens, softmax_scale=0.1)
    ref = snapmla.decode_fp8(qq, cache, table, seqlens, softmax_scale=0.1)
    assert len(_fastpath._accepted) == 2
    assert torch.equal(torch.as_tensor(out[1]), ref[1])


def test_each_call_takes_one_signature(rng, monkeypatch):
    """A decode call fingerprints its arrays once, first call (array path) or later (pointer
    path), through the native API and snapmla.torch's wrappers alike."""
    taken = []
    real = _fastpath.prepare
    monkeypatch.setattr(_fastpath, "prepare", lambda key, arrays: taken.append(key) or real(key, arrays))
    seqlens = np.array([70, 3], np.int32)
    q, table, _, cache8, cache16 = build_case(rng, seqlens, 1, 4)
    qq = snapmla.quantize_query(q)
    calls = [lambda: snapmla.decode_fp8(qq, cache8, table, seqlens, softmax_scale=0.1),
             lambda: snapmla.decode_bf16(q, cache16, table, seqlens, softmax_scale=0.1)]
    try:
        import torch
        import snapmla.torch as st
    except ImportError:
        torch = None
    if torch is not None:
        t = lambda x: torch.from_numpy(np.ascontiguousarray(x))
        qt, ct, bt, stl = t(q).view(torch.bfloat16), t(cache16).view(torch.bfloat16), t(table), t(seqlens)
        calls.append(lambda: st.decode_bf16(qt, ct, bt, stl, softmax_scale=0.1))
    for call in calls:
        for _ in range(2):  # the array path, then the pointer path
            del taken[:]
            call()
            assert len(taken) == 1
