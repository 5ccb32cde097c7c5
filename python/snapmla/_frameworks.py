"""Arrays of the caller's framework: allocation, raw views and streams.

snapmla's functions take any DLPack array (PyTorch, NumPy, CuPy, JAX...) and return results in
the framework of their first array argument. Element types by meaning:

    kind   PyTorch               NumPy / CuPy (no such dtypes there)
    bf16   torch.bfloat16        uint16 holding the bf16 bits (ml_dtypes.bfloat16 accepted)
    e4m3   torch.float8_e4m3fn   uint8 holding the e4m3 bits (ml_dtypes.float8_e4m3fn accepted)
    f32    torch.float32         float32
    i32    torch.int32           int32
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Optional, Sequence


def framework_of(x: Any) -> str:
    mod = type(x).__module__
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith("cupy"):
        return "cupy"
    if mod.startswith("numpy"):
        return "numpy"
    if hasattr(x, "__dlpack__"):
        return "dlpack"
    raise TypeError(f"expected a PyTorch, NumPy or CuPy array (or any DLPack array), got {type(x)!r}")


def _torch_dtype(kind: str):
    import torch

    return {"bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn, "f32": torch.float32,
            "i32": torch.int32, "u8": torch.uint8}[kind]


_NP_KIND = {"bf16": "uint16", "e4m3": "uint8", "f32": "float32", "i32": "int32", "u8": "uint8"}


def empty(like: Any, shape: Sequence[int], kind: str):
    """An uninitialized array of `kind` on the device of `like`, in its framework."""
    fw = framework_of(like)
    shape = tuple(int(s) for s in shape)
    if fw == "torch":
        import torch

        return torch.empty(shape, dtype=_torch_dtype(kind), device=like.device)
    if fw == "cupy":
        import cupy

        with cupy.cuda.Device(like.device.id):
            return cupy.empty(shape, dtype=_NP_KIND[kind])
    import numpy as np

    if fw == "dlpack" and _dlpack_device(like)[0] != 1:
        raise TypeError(f"cannot allocate outputs for a device array of type {type(like)!r}: "
                        "pass out= arrays, or use PyTorch or CuPy")
    return np.empty(shape, dtype=_NP_KIND[kind])


def bits_view(x: Any) -> Any:
    """`x` with float8 and ml_dtypes bfloat16 seen as same-width integers (what the extension
    and every framework's fill/zero accept)."""
    fw = framework_of(x)
    if fw == "torch":
        import torch

        if x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz):
            if x.dtype != torch.float8_e4m3fn:
                raise TypeError(f"expected torch.float8_e4m3fn, got {x.dtype}")
            return x.view(torch.uint8)
        return x
    if fw in ("numpy", "cupy"):
        name = str(x.dtype)
        if name == "bfloat16":
            return x.view("uint16")
        if name.startswith("float8"):
            if name != "float8_e4m3fn":
                raise TypeError(f"expected float8_e4m3fn, got {name}")
            return x.view("uint8")
    return x


def raw(x: Any) -> Any:
    """What the extension is given for an array: its bits_view, and for a PyTorch tensor a DLPack
    capsule made in C++ (torch.utils.dlpack), which costs a fifth of Tensor.__dlpack__ (3 vs
    13 us per tensor, measured on this project's CI machine) and touches no stream."""
    if x is None:
        return None
    x = bits_view(x)
    if framework_of(x) == "torch":
        from torch.utils.dlpack import to_dlpack

        return to_dlpack(x)
    return x


def _dlpack_device(x: Any):
    try:
        return tuple(x.__dlpack_device__())
    except AttributeError:
        return (1, 0)


def is_cuda(x: Any) -> bool:
    fw = framework_of(x)
    if fw == "torch":
        return x.is_cuda
    if fw == "cupy":
        return True
    if fw == "numpy":
        return False
    return _dlpack_device(x)[0] == 2


def device_index(x: Any) -> int:
    fw = framework_of(x)
    if fw == "torch":
        return (x.device.index or 0) if x.is_cuda else 0
    if fw == "cupy":
        return int(x.device.id)
    return int(_dlpack_device(x)[1])


def current_stream(x: Any, stream: Any) -> int:
    """The CUDA stream an operation on `x` runs on, as an integer cudaStream_t: `stream` if
    given (an integer handle, a torch.cuda.Stream or a cupy Stream), else the caller's current
    stream for `x`'s device (PyTorch's or CuPy's; 0, the legacy stream, otherwise). A stream
    object on another device than `x` is an error; CPU arrays ignore the stream."""
    if stream is not None:
        handle = getattr(stream, "cuda_stream", None)  # torch.cuda.Stream
        if handle is None:
            handle = getattr(stream, "ptr", None)  # cupy.cuda.Stream
        dev = getattr(stream, "device", None)
        if handle is None:
            if isinstance(stream, bool) or not isinstance(stream, int) or stream < 0:
                raise TypeError("snapmla: argument 'stream': expected a cudaStream_t as a "
                                f"non-negative int, a torch.cuda.Stream or a cupy Stream, got {stream!r}")
            return int(stream)
        if dev is not None and is_cuda(x):
            index = getattr(dev, "index", getattr(dev, "id", None))
            if index is not None and int(index) != device_index(x):
                raise ValueError(f"snapmla: argument 'stream': on CUDA device {index}, but the "
                                 f"arrays are on CUDA device {device_index(x)}")
        return int(handle)
    if not is_cuda(x):
        return 0
    fw = framework_of(x)
    if fw == "torch":
        import torch

        # The raw handle without a Stream object (a tenth of the cost; PyTorch's own compiled
        # code calls it), where this PyTorch has it.
        getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if getter is not None:
            return int(getter(x.get_device()))
        return int(torch.cuda.current_stream(x.device).cuda_stream)
    if fw == "cupy":
        import cupy

        return int(cupy.cuda.get_current_stream().ptr)
    return 0


def stream_getter(x: Any) -> Optional[Callable[[], int]]:
    """What current_stream(x, None) computes, as a function to call per operation: None for
    host memory (stream 0), else a function of no arguments returning the caller's current
    stream for x's device as an integer. For PyTorch this is the raw-handle getter bound to the
    device index once, which leaves nothing else to look up on a call. Holds no reference to x."""
    if not is_cuda(x):
        return None
    if framework_of(x) == "torch":
        import torch

        getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if getter is not None:
            return functools.partial(getter, x.get_device())
        device = x.device
        return lambda: int(torch.cuda.current_stream(device).cuda_stream)
    if framework_of(x) == "cupy":
        import cupy

        return lambda: int(cupy.cuda.get_current_stream().ptr)
    return lambda: 0


def allocating_for(x: Any, stream: Any):
    """A context in which `empty` allocates arrays for work on `stream` (an operation's `stream=`
    argument) rather than on the caller's current stream. PyTorch's and CuPy's caching allocators
    give a freed block to the next allocation in the order of the stream it belongs to; an array
    that an operation allocates, launches on another stream and then drops (decode's workspace),
    or hands back to a caller who drops it early, must belong to the stream that uses it, or the
    memory could be reused while that stream's kernel still reads or writes it. A no-op for host
    arrays, for stream=None and for the current stream itself."""
    if stream is None or not is_cuda(x):
        return contextlib.nullcontext()
    handle = current_stream(x, stream)
    if handle == current_stream(x, None):
        return contextlib.nullcontext()
    fw = framework_of(x)
    if fw == "torch":
        import torch

        s = stream if isinstance(stream, torch.cuda.Stream) else torch.cuda.ExternalStream(handle, device=x.device)
        return torch.cuda.stream(s)
    if fw == "cupy":
        import cupy

        return cupy.cuda.ExternalStream(handle)
    return contextlib.nullcontext()


def to_host(x: Any) -> Any:
    """A CPU copy of `x` in the same framework where it has a CPU form (CuPy goes to NumPy)."""
    fw = framework_of(x)
    if fw == "torch":
        return x.detach().cpu()
    if fw == "cupy":
        import cupy

        return cupy.asnumpy(x)
    return x
