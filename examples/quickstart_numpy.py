import numpy as np
import snapmla                           # NumPy arrays run on the CPU reference; no PyTorch needed

print(snapmla.info())                    # says whether the CUDA kernels or only the CPU reference run
b, s_q, h, num_pages = 2, 1, 8, 4
rng = np.random.default_rng(0)
bf16 = lambda x: (np.asarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)  # bf16 bits
cache = snapmla.alloc_fp8_cache(num_pages, like=np.zeros(1))
block_table = np.array([[2, 0], [1, 3]], np.int32)
cache_seqlens = np.array([100, 30], np.int32)
for seq, n in enumerate(cache_seqlens):  # write each sequence's tokens [n, 576] through their slots
    t = np.arange(n)
    slots = (block_table[seq, t // 64] * 64 + t % 64).astype(np.int32)
    snapmla.append(cache, bf16(rng.standard_normal((n, 576))), slots)
q = bf16(rng.standard_normal((b, s_q, h, 576)))
qq = snapmla.quantize_query(q)
plan = snapmla.plan_splits(cache_seqlens, snapmla.recommended_num_workers(q, s_q, h))
out, lse = snapmla.decode_fp8(qq, cache, block_table, cache_seqlens, softmax_scale=192 ** -0.5, plan=plan)
print(out.shape, lse.shape, lse[0, 0])   # (2, 1, 8, 512) bf16 bits, (2, 8, 1) float32
