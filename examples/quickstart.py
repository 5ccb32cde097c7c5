"""SnapMLA from Python with PyTorch: write 300 tokens into an FP8 cache, quantize 16 query heads
and decode one step, on the GPU when there is an sm_90 one, else on the CPU reference.
`python examples/quickstart.py`"""
import torch

import snapmla
import snapmla.torch  # noqa: F401  (registers torch.ops.snapmla.*)

dev = "cuda" if torch.cuda.is_available() and snapmla.cuda_device_available() else "cpu"
length, heads = 300, 16
pages = (length + 63) // 64
kv = torch.randn(length, 576, device=dev).to(torch.bfloat16)  # latent 512, then rope 64
cache = snapmla.alloc_fp8_cache(pages, like=kv)
snapmla.append(cache, kv, torch.arange(length, dtype=torch.int32, device=dev))  # slot = token

q = torch.randn(1, 1, heads, 576, device=dev).to(torch.bfloat16)  # [b, s_q, h, 576]
qq = snapmla.quantize_query(q)
block_table = torch.arange(pages, dtype=torch.int32, device=dev).view(1, pages)
cache_seqlens = torch.tensor([length], dtype=torch.int32, device=dev)
plan = snapmla.plan_splits(cache_seqlens, snapmla.recommended_num_workers(q, 1, heads))
# The model's scale: 1 / sqrt(128 + 64), DeepSeek-V3's query-key head dim before the latent
# absorption (not 576, which FlashMLA's drop-in takes as its default, q.shape[-1] ** -0.5).
out, lse = snapmla.decode_fp8(qq, cache, block_table, cache_seqlens,
                              softmax_scale=192 ** -0.5, plan=plan)
print(f"on {dev}: out {tuple(out.shape)} {out.dtype}, lse {tuple(lse.shape)}, lse[0, 0] = {lse[0, 0, 0].item():.4f}")
