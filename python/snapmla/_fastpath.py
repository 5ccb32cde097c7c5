"""The pointer path of decode_fp8 / decode_bf16: an eager call whose arrays have the dtypes,
shapes, strides and device of a call that the array path (DLPack, every check) already accepted
passes data pointers and the sizes derived then, instead of one DLPack capsule per array. Those
properties decide every check the array path makes on the arrays themselves; what depends on
the pointers and values (null, alignment, head counts, plan and workspace sizes, the tables'
contents on the host) the C++ entry point checks on every call, as for any caller.

A signature is one of two kinds:
- a call into outputs the caller gave, or on a stream it gave: every array of the call, inputs
  and outputs (the record keeps the sizes only);
- a call that lets snapmla allocate the outputs on the current stream (the eager engine's
  call, and every call of the torch ops): the inputs only. Its outputs are allocated as the
  accepted call allocated them (the same allocation function, shapes, dtypes and device), so
  their layouts are the accepted ones by construction; the record keeps those, and a later
  call derives nothing, not even the batch size.

PyTorch tensors (exactly torch.Tensor, no subclass) and NumPy arrays take it; anything else
(CuPy, JAX, tensor subclasses such as FakeTensor) always takes the array path. At most
_MAX_SIGNATURES signatures are kept (then all are forgotten and re-learned by the array path),
so a process that sees ever new shapes holds bounded memory.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional, Sequence, Tuple

from . import _C

_MAX_SIGNATURES = 256
_accepted: dict = {}  # signature -> Accepted
# The last allocating call's (signature, record): an engine makes the same call layer after
# layer, and comparing with one signature costs half of a dict look-up (which hashes it and
# then compares it all the same). One tuple, replaced whole, so a reader sees a matching pair.
_last_allocated: tuple = (None, None)


class Accepted:
    """What the array path derived for an accepted signature: the sizes passed with the pointers
    (shape, a _C.RawShape), and for a call that allocates its outputs how to allocate them
    (outputs() -> (out, lse, workspace, out_ptr, lse_ptr, workspace_ptr)) and the stream
    (stream() -> cudaStream_t as an int, or None for 0: host memory)."""

    __slots__ = ("shape", "outputs", "stream")

    def __init__(self, shape, outputs: Optional[Callable] = None, stream: Optional[Callable] = None):
        self.shape, self.outputs, self.stream = shape, outputs, stream


def _torch_tensor_type():
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None) if torch is not None else None


def _numpy_type():
    np = sys.modules.get("numpy")
    return getattr(np, "ndarray", None) if np is not None else None


def prepare(key: Any, arrays: Sequence[Any]) -> Tuple[Optional[tuple], list]:
    """(the call's signature, the arrays' data pointers), in one pass over the arrays; the
    signature is None where some array has no pointer path. A signature holds `key` (the
    operation and the kind of call) and, per array, what the array path's checks of it depend
    on: dtype, shape, strides and (PyTorch) device; None for an absent optional array."""
    tensor_t, ndarray_t = _torch_tensor_type(), _numpy_type()
    keys, ptrs = [key], []
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


def lookup(sig: Optional[tuple]) -> Optional[Accepted]:
    return _accepted.get(sig) if sig is not None else None


def raw_shape(like: Any, b: int, s_q: int, h: int, num_pages: int, max_pages: int, plan_capacity: int,
              workspace_bytes: int):
    """The _C.RawShape of a call whose query is `like`: the sizes and the device."""
    index = like.get_device() if type(like) is _torch_tensor_type() else -1
    return _C.RawShape(b, s_q, h, num_pages, max_pages, plan_capacity, workspace_bytes,
                       2 if index >= 0 else 1, max(index, 0))


def accept(sig: Optional[tuple], record: Accepted) -> None:
    """Records a signature the array path has just accepted."""
    if sig is None:
        return
    if len(_accepted) >= _MAX_SIGNATURES:
        forget()
    _accepted[sig] = record


def forget() -> None:
    """Forgets every accepted signature: the next call of each kind takes the array path."""
    global _last_allocated
    _accepted.clear()
    _last_allocated = (None, None)


def allocator(out: Any, lse: Any, workspace: Any) -> Optional[Callable]:
    """outputs() for a record: new arrays as `out`, `lse` and `workspace` (None: none) were
    allocated (by _frameworks.empty: torch.empty or numpy.empty, C-contiguous), with their
    pointers. torch.empty takes the sizes as separate ints, its cheapest form (a tuple costs
    a third more per call)."""
    tensor_t, ndarray_t = _torch_tensor_type(), _numpy_type()
    if type(out) is tensor_t and type(lse) is tensor_t and (workspace is None or type(workspace) is tensor_t):
        import torch

        empty, device = torch.empty, out.device
        out_dims, out_type, lse_dims, lse_type = tuple(out.shape), out.dtype, tuple(lse.shape), lse.dtype
        if workspace is None:
            def outputs():
                o = empty(*out_dims, dtype=out_type, device=device)
                s = empty(*lse_dims, dtype=lse_type, device=device)
                return o, s, None, o.data_ptr(), s.data_ptr(), 0
            return outputs
        ws_dims, ws_type = tuple(workspace.shape), workspace.dtype

        def outputs_with_workspace():
            o = empty(*out_dims, dtype=out_type, device=device)
            s = empty(*lse_dims, dtype=lse_type, device=device)
            w = empty(*ws_dims, dtype=ws_type, device=device)
            return o, s, w, o.data_ptr(), s.data_ptr(), w.data_ptr()
        return outputs_with_workspace
    if type(out) is ndarray_t and type(lse) is ndarray_t and workspace is None:
        import numpy as np

        out_dims, out_type, lse_dims, lse_type = out.shape, out.dtype, lse.shape, lse.dtype

        def numpy_outputs():
            o, s = np.empty(out_dims, out_type), np.empty(lse_dims, lse_type)
            return o, s, None, o.ctypes.data, s.ctypes.data, 0
        return numpy_outputs
    return None


def decode_allocated(raw_name: str, sig: Optional[tuple], ptrs: list, softmax_scale: float, causal: bool,
                     empty_lse: float) -> Optional[tuple]:
    """The pointer path of a call that allocates its outputs on the current stream, given its
    inputs' signature and pointers (prepare): (out, lse), or None where the signature was not
    accepted yet (the caller takes the array path, which records it). The raw entry point
    (_C.<raw_name>) is looked up at each call (a test stubs it)."""
    global _last_allocated
    if sig is None:
        return None
    last_sig, record = _last_allocated
    if sig != last_sig:
        record = _accepted.get(sig)
        if record is None:
            return None
        _last_allocated = (sig, record)
    out, lse, workspace, out_ptr, lse_ptr, workspace_ptr = record.outputs()
    stream = record.stream() if record.stream is not None else 0
    getattr(_C, raw_name)(*ptrs, out_ptr, lse_ptr, workspace_ptr, record.shape, float(softmax_scale), bool(causal),
                          float(empty_lse), stream)
    del workspace  # held to here: the launch above is ordered before any reuse of its memory
    return out, lse
