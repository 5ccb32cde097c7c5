"""The pointer path of decode_fp8 / decode_bf16: an eager call whose arrays have the dtypes,
shapes, strides and device of a call that the array path (DLPack, every check) already accepted
passes data pointers and the sizes derived then, instead of one DLPack capsule per array. Those
properties decide every check the array path makes on the arrays themselves; what depends on
the pointers and values (null, alignment, head counts, plan and workspace sizes, the tables'
contents on the host) the C++ entry point checks on every call, as for any caller.

PyTorch tensors (exactly torch.Tensor, no subclass) and NumPy arrays take it; anything else
(CuPy, JAX, tensor subclasses) always takes the array path.
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Sequence, Tuple

from . import _C

_MAX_SIGNATURES = 256
_accepted: dict = {}  # signature -> _C.RawShape


def _torch_tensor_type():
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None) if torch is not None else None


def _numpy_type():
    np = sys.modules.get("numpy")
    return getattr(np, "ndarray", None) if np is not None else None


def prepare(op: str, arrays: Sequence[Any]) -> Tuple[Optional[tuple], list]:
    """(the call's signature, the arrays' data pointers), in one pass over the arrays; the
    signature is None where some array has no pointer path. A signature holds, per array, what
    the array path's checks of it depend on: dtype, shape, strides and (PyTorch) device."""
    tensor_t, ndarray_t = _torch_tensor_type(), _numpy_type()
    keys, ptrs = [op], []
    for x in arrays:
        if x is None:
            keys.append(None)
            ptrs.append(0)
            continue
        t = type(x)
        if t is tensor_t:
            keys.append((x.dtype, x.shape, x.stride(), x.get_device()))
            ptrs.append(x.data_ptr())
        elif t is ndarray_t:
            keys.append((x.dtype, x.shape, x.strides, x.flags.writeable))
            ptrs.append(x.ctypes.data)
        else:
            return None, ptrs
    return tuple(keys), ptrs


def lookup(sig: Optional[tuple]):
    return _accepted.get(sig) if sig is not None else None


def accept(sig: Optional[tuple], like: Any, b: int, s_q: int, h: int, num_pages: int, max_pages: int,
           plan_capacity: int, workspace_bytes: int) -> None:
    """Records a signature the array path has just accepted, with the sizes it derived."""
    if sig is None:
        return
    if len(_accepted) >= _MAX_SIGNATURES:
        _accepted.clear()
    tensor_t = _torch_tensor_type()
    index = like.get_device() if type(like) is tensor_t else -1
    _accepted[sig] = _C.RawShape(b, s_q, h, num_pages, max_pages, plan_capacity, workspace_bytes,
                                 2 if index >= 0 else 1, max(index, 0))
