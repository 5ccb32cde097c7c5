"""One call's kernels, ours and the FP8 fork's, on the same inputs, for Nsight Compute: decode_fp8
(with its plan and combine) and FlashMLA PR#54 FP8 each called eagerly a few times, so that ncu
can profile a late launch of each decode kernel side by side (the small-batch gap is in the
decode kernel itself: where its time goes at a few pages per split).

    ncu --clock-control none --section SpeedOfLight --section LaunchStats --section Occupancy \\
        --section WarpStateStats --section SchedulerStats \\
        --kernel-name regex:'decode_fp8_kernel|flash_fwd_splitkv_mla_kernel' --launch-skip 6 --launch-count 2 \\
        python lab/launch_profile.py --peers .peers --case 4,64,1,8192

With the package built as the profiling build (pip install . -C cmake.define.SNAPMLA_PROFILE_STAMPS=ON)
and SNAPMLA_PROFILE_CALL=N, decode_fp8's N-th launch prints its CTAs' milestones instead
(src/kernels/sm90/decode/profile_stamps.cuh); --rows-scale K plans with the split-length rule's
query_rows scaled by K (0: equal shares), to compare split lengths.

Needs PyTorch, an sm_90 GPU, the package installed and the peers' folder.
"""

import argparse

import torch

import snapmla
from snapmla.bench import case_inputs, load_peers, peer_kernels


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", metavar="DIR", required=True)
    ap.add_argument("--case", default="4,64,1,8192", help="b,h,s_q,s_k")
    ap.add_argument("--calls", type=int, default=4, help="eager calls of each (the first ones warm up)")
    ap.add_argument("--rows-scale", type=float, default=1.0, help="the plan's query_rows over s_q * h (default 1)")
    a = ap.parse_args()
    b, h, s_q, s_k = (int(v) for v in a.case.split(","))
    x = case_inputs(torch, snapmla, (b, h, s_q, s_k), 1)
    plan = snapmla.plan_splits(x.seqlens, snapmla.recommended_num_workers(x.q, s_q, h),
                               query_rows=round(a.rows_scale * s_q * h))
    ours = lambda t: snapmla.decode_fp8(x.qq, x.fp8_cache, t, x.seqlens, softmax_scale=x.scale, plan=plan)
    fork = peer_kernels(torch, load_peers(a.peers), x, s_q, h)["pr54_fp8"]
    for _ in range(a.calls):  # alternate, so each late launch runs after the other's
        ours(x.tables[0])
        fork(x.tables[0])
    torch.cuda.synchronize()
    print(f"b={b} h={h} s_q={s_q} s_k={s_k}: {a.calls} calls each, splits {int(plan.split_offsets[-1])} "
          f"(rows scale {a.rows_scale})")


if __name__ == "__main__":
    main()
