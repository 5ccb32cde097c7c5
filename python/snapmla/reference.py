"""The CPU reference of every operation: the oracle GPU results are tested against.

Each function has the signature of the native one (snapmla.append, ...) and runs the C++
reference (snapmla::ref, the same code the CPU path runs) on host copies of its inputs. Inputs
may live anywhere; results are host arrays of the inputs' framework (PyTorch CPU tensors for
PyTorch inputs, NumPy arrays for NumPy or CuPy inputs). Caches are updated in place only when
they are already on the host; `append` returns the (host) cache it wrote.

attention_f64 is the float64 ground truth on unquantized inputs (reference.hpp).
"""

from __future__ import annotations

from typing import Any, Optional

from . import _api, _C
from ._api import PagedFp8Cache, QuantizedQuery, SplitPlan
from ._frameworks import framework_of, to_host


def _host(x: Any) -> Any:
    return None if x is None else to_host(x)


def _host_tuple(t: Any) -> Any:
    return type(t)(*(_host(x) if not isinstance(x, int) else x for x in t))


def append(cache: Any, kv: Any, slots: Any):
    cache = _host_tuple(cache) if isinstance(cache, PagedFp8Cache) else _host(cache)
    _api.append(cache, _host(kv), _host(slots))
    return cache


def quantize_query(q: Any) -> QuantizedQuery:
    return _api.quantize_query(_host(q))


def gather_dequant(cache: PagedFp8Cache, slots: Any):
    return _api.gather_dequant(_host_tuple(cache), _host(slots))


def plan_splits(cache_seqlens: Any, num_workers: int, query_rows: int = 0) -> SplitPlan:
    return _api.plan_splits(_host(cache_seqlens), num_workers, query_rows=query_rows)


def decode_fp8(q: QuantizedQuery, cache: PagedFp8Cache, block_table: Any, cache_seqlens: Any, *,
               softmax_scale: float, causal: bool = True, plan: Optional[SplitPlan] = None):
    return _api.decode_fp8(_host_tuple(q), _host_tuple(cache), _host(block_table),
                           _host(cache_seqlens), softmax_scale=softmax_scale, causal=causal,
                           plan=_host_tuple(plan) if plan is not None else None)


def decode_bf16(q: Any, cache: Any, block_table: Any, cache_seqlens: Any, *,
                softmax_scale: float, causal: bool = True, plan: Optional[SplitPlan] = None):
    return _api.decode_bf16(_host(q), _host(cache), _host(block_table), _host(cache_seqlens),
                            softmax_scale=softmax_scale, causal=causal,
                            plan=_host_tuple(plan) if plan is not None else None)


def attention_f64(q: Any, kv: Any, softmax_scale: float, causal: bool = True):
    """Exact attention for one sequence in float64: q [s_q, h, 576] and kv [s_k, 576] as float32
    arrays (unquantized). Returns NumPy (out [s_q, h, 512], lse [h, s_q]) in float64."""
    q, kv = _host(q), _host(kv)
    if framework_of(q) == "torch":
        q = q.float().contiguous().numpy()
    if framework_of(kv) == "torch":
        kv = kv.float().contiguous().numpy()
    return _C.reference.attention_f64(q, kv, float(softmax_scale), bool(causal))
