"""What a user who passes the wrong thing meets: a snapmla.SnapMLAError (both a ValueError and a
TypeError) naming the operation, the argument, what was expected and what was given, never an
AttributeError from inside the package; an empty batch decodes to empty results with NumPy and
with PyTorch alike."""

import numpy as np
import pytest

import snapmla
from test_ops_numpy import build_case


def error(fn, *parts):
    with pytest.raises(snapmla.SnapMLAError) as e:
        fn()
    assert isinstance(e.value, ValueError) and isinstance(e.value, TypeError)
    text = str(e.value)
    for p in parts:
        assert p in text, (p, text)
    return text


@pytest.fixture
def case(rng):
    seqlens = np.array([70, 3], np.int32)
    q, table, _, cache8, cache16 = build_case(rng, seqlens, 1, 4)
    return seqlens, q, table, cache8, cache16, snapmla.quantize_query(q)


def test_wrong_kinds_of_argument_are_named(case):
    seqlens, q, table, cache8, cache16, qq = case
    error(lambda: snapmla.decode_fp8(q, cache8, table, seqlens, softmax_scale=0.1),
          "snapmla::decode_fp8", "argument 'q'", "QuantizedQuery", "numpy.ndarray [2, 1, 4, 576]")
    error(lambda: snapmla.decode_fp8([1, 2], cache8, table, seqlens, softmax_scale=0.1),
          "argument 'q'", "got a list")
    error(lambda: snapmla.decode_fp8(qq, cache16, table, seqlens, softmax_scale=0.1),
          "argument 'cache'", "PagedFp8Cache", "decode_bf16")
    error(lambda: snapmla.decode_bf16(q, cache8, table, seqlens, softmax_scale=0.1),
          "snapmla::decode_bf16", "argument 'cache'", "BF16 cache", "got a PagedFp8Cache")
    error(lambda: snapmla.decode_bf16(qq, cache16, table, seqlens, softmax_scale=0.1),
          "argument 'q'", "got a QuantizedQuery")
    error(lambda: snapmla.decode_bf16(q, [1], table, seqlens, softmax_scale=0.1),
          "argument 'cache'", "DLPack array", "got a list")
    error(lambda: snapmla.decode_fp8(qq, cache8, table.tolist(), seqlens, softmax_scale=0.1),
          "argument 'block_table'", "got a list")
    error(lambda: snapmla.quantize_query(q.tolist()), "snapmla::quantize_query", "argument 'q'")
    error(lambda: snapmla.plan_splits([70, 3], 4), "snapmla::plan_splits", "argument 'cache_seqlens'")
    error(lambda: snapmla.gather_dequant(cache16, np.zeros(2, np.int32)), "snapmla::gather_dequant",
          "argument 'cache'", "PagedFp8Cache")
    # A plain (nope, rope, scale) triple is a query; its parts are checked by name.
    plain = snapmla.decode_fp8(tuple(qq), tuple(cache8), table, seqlens, softmax_scale=0.1)
    same = snapmla.decode_fp8(qq, cache8, table, seqlens, softmax_scale=0.1)
    assert np.array_equal(plain[0], same[0])
    error(lambda: snapmla.decode_fp8((qq.nope, "x", qq.scale), cache8, table, seqlens, softmax_scale=0.1),
          "argument 'q.rope'")


def test_counts_and_sizes_are_checked_up_front(case):
    seqlens, q, table, cache8, cache16, qq = case
    for alloc in (snapmla.alloc_fp8_cache, snapmla.alloc_bf16_cache):
        error(lambda: alloc(-1, q), "argument 'num_pages'", "integer >= 0", "got -1")
        error(lambda: alloc(2.5, q), "argument 'num_pages'", "got a float")
    assert snapmla.alloc_fp8_cache(np.int64(2), q).latent.shape == (2, 64, 512)


def test_mismatches_name_the_users_arguments(case):
    seqlens, q, table, cache8, cache16, qq = case
    error(lambda: snapmla.decode_fp8(qq, cache8, table[:1], seqlens, softmax_scale=0.1),
          "argument 'block_table'", "one row per sequence", "cache_seqlens has 2 entries", "[1, 2]")
    error(lambda: snapmla.decode_fp8(qq, cache8, table[:1], seqlens[:1], softmax_scale=0.1),
          "argument 'cache_seqlens'", "one entry per sequence of q_nope (batch 2)", "got 1")
    error(lambda: snapmla.decode_bf16(q, cache16, table[:1], seqlens[:1], softmax_scale=0.1),
          "argument 'cache_seqlens'", "of q (batch 2)")
    kv = np.zeros((10, 576), np.uint16)
    error(lambda: snapmla.append(cache8, kv, np.arange(9, dtype=np.int32)),
          "snapmla::append", "argument 'kv'", "one row per entry of slots (9 slots)", "got 10 rows")


def empty_batch(xp_from_numpy, q, table, seqlens, cache8):
    qq = snapmla.quantize_query(xp_from_numpy(q[:0]))
    fp8 = snapmla.PagedFp8Cache(*(xp_from_numpy(x) for x in cache8))
    return snapmla.decode_fp8(qq, fp8, xp_from_numpy(table[:0]), xp_from_numpy(seqlens[:0]), softmax_scale=0.1)


def test_an_empty_batch_gives_empty_results_in_every_framework(case):
    seqlens, q, table, cache8, cache16, qq = case
    out, lse = empty_batch(lambda x: x, q, table, seqlens, cache8)
    assert out.shape == (0, 1, 4, 512) and lse.shape == (0, 4, 1)
    # An empty array with zero strides (what PyTorch's DLPack export of one has given) is still
    # contiguous: there is nothing to lay out.
    zero_strided = np.lib.stride_tricks.as_strided(q[:0], shape=(0, 1, 4, 576), strides=(0, 0, 0, 0))
    assert snapmla.quantize_query(zero_strided).nope.shape == (0, 1, 4, 512)
    out16, lse16 = snapmla.decode_bf16(q[:0], cache16, table[:0], seqlens[:0], softmax_scale=0.1)
    assert out16.shape == (0, 1, 4, 512) and lse16.shape == (0, 4, 1)
    torch = pytest.importorskip("torch", reason="PyTorch not installed: the PyTorch half skipped")

    def to_torch(x):
        t = torch.from_numpy(np.ascontiguousarray(x))
        if x.dtype == np.uint8:
            return t.view(torch.float8_e4m3fn)
        return t.view(torch.bfloat16) if x.dtype == np.uint16 else t

    tout, tlse = empty_batch(to_torch, q, table, seqlens, cache8)
    assert tuple(tout.shape) == (0, 1, 4, 512) and tuple(tlse.shape) == (0, 4, 1)
    tout16, _ = snapmla.decode_bf16(to_torch(q[:0]), to_torch(cache16), to_torch(table[:0]), to_torch(seqlens[:0]),
                                    softmax_scale=0.1)
    assert tuple(tout16.shape) == (0, 1, 4, 512)


def test_limits_come_from_the_library():
    """The limits the Python layer uses are the C++ ones (snapmla._C), and the C++ checks
    enforce them: a head count one past MAX_HEADS is refused by name, as is a FlashMLA row count
    that no s_q within MAX_QUERIES_PER_SEQ can split."""
    from snapmla import _C, flash_mla

    assert (_C.MIN_HEADS, _C.MAX_HEADS, _C.MAX_QUERIES_PER_SEQ, _C.TILE_ROWS) == (1, 128, 4, 64)
    h = _C.MAX_HEADS + 1
    q = np.zeros((1, 1, h, snapmla.HEAD_DIM), np.uint16)
    with pytest.raises(snapmla.SnapMLAError, match=f"'q.num_heads': expected 1..{_C.MAX_HEADS}, got {h}"):
        snapmla.decode_bf16(q, snapmla.alloc_bf16_cache(1, q), np.zeros((1, 1), np.int32),
                            np.zeros(1, np.int32), softmax_scale=0.1)
    rows = (_C.MAX_HEADS + 1) * 7  # prime factor 7 > MAX_QUERIES_PER_SEQ: no (s_q, h) fits
    with pytest.raises(ValueError, match=f"s_q in 1..{_C.MAX_QUERIES_PER_SEQ} and h_q in 1..{_C.MAX_HEADS}"):
        flash_mla.get_mla_metadata(np.zeros(1, np.int32), rows, 1)
