"""SnapMLA: FP8 MLA decoding with a RoPE-aware per-token FP8 KV cache (arXiv 2602.10718).

Native API (same names and argument meanings as the C++ API, include/snapmla/snapmla.hpp):
    alloc_fp8_cache, alloc_bf16_cache, append, quantize_query, gather_dequant, plan_splits,
    decode_fp8, decode_bf16, recommended_num_workers, check_page_table, check_slot_mapping
Also:
    snapmla.reference   the CPU reference of each operation, and float64 ground truth
    snapmla.torch       torch.library custom ops (torch.compile, CUDA graphs)
    snapmla.flash_mla   FlashMLA-style get_mla_metadata / flash_mla_with_kvcache (BF16 cache)
    snapmla.fluentllm   SGLang-FluentLLM-style SnapMLA calls (FP8 cache)

Arrays may be PyTorch, NumPy (CPU) or CuPy, or anything with DLPack; see _frameworks.py for the
dtypes. On a machine without an sm_90 GPU (or a build without CUDA) only CPU arrays work: the
operations run the CPU reference. `snapmla.info()` says which.
"""

from ._api import (HEAD_DIM, LATENT_DIM, PAGE_SIZE, ROPE_DIM, PagedFp8Cache, QuantizedQuery,
                   SnapMLAError, SplitPlan, alloc_bf16_cache, alloc_fp8_cache, append,
                   built_with_cuda, check_page_table, check_slot_mapping, cuda_device_available,
                   decode_bf16, decode_fp8, decode_workspace_bytes, gather_dequant, plan_splits,
                   quantize_query, recommended_num_workers, split_plan_capacity)
from . import reference

__version__ = "0.1.0"


def info() -> str:
    """What this installation can run."""
    if cuda_device_available():
        return "snapmla %s: CUDA kernels (sm_90a) and the CPU reference" % __version__
    if built_with_cuda():
        return ("snapmla %s: built with the CUDA kernels, but no sm_90 GPU is available: "
                "CPU reference ops only" % __version__)
    return "snapmla %s: built without CUDA: CPU reference ops only" % __version__


__all__ = [
    "HEAD_DIM", "LATENT_DIM", "PAGE_SIZE", "ROPE_DIM", "PagedFp8Cache", "QuantizedQuery",
    "SnapMLAError", "SplitPlan", "alloc_bf16_cache", "alloc_fp8_cache", "append",
    "built_with_cuda", "check_page_table", "check_slot_mapping", "cuda_device_available",
    "decode_bf16", "decode_fp8", "decode_workspace_bytes", "gather_dequant", "info",
    "plan_splits", "quantize_query", "recommended_num_workers", "reference", "split_plan_capacity",
]
