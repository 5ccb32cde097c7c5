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
    _fastpath._accepted.clear()
    yield
    _fastpath._accepted.clear()


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
                               plan=snapmla.SplitPlan(*map(fresh, plan[:2]), plan.num_workers, fresh(plan.split_order)))
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
        _fastpath._accepted.clear()
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
