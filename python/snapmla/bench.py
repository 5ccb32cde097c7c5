"""Same-run decode benchmark: decode_fp8 and decode_bf16 beside the peer kernels engines run.

    python -m snapmla.bench [--peers DIR] [--cases grid|quick|b,h,s_q,s_k ...] [--out DIR]
    python -m snapmla.bench --peers DIR --sweep [--out DIR]

`--sweep` times the batch sweep instead (every batch an engine's queue may hold, at each head
count; see SWEEP) and writes h200_sweep.{json,md,png}: time against batch, one panel per h, and a
summary of the ratios and of the time per cached token against b = 256's.

Every kernel of a case runs in this process on the same data (randn / 10, pages permuted), each as
a CUDA graph of `--calls` decode calls (cycling over enough page sets that the caches are well past
the L2), the kernels interleaved over `--rounds` rounds in a rotating order; the table gives each
kernel's median time per call. Times on an H200 move 5-10% with its power state (it runs at its
700 W limit under this load), so only ratios measured this way are meaningful.

Peers (`--peers DIR`: a folder holding `peers.py` with the FlashMLA BF16 and FlashMLA-FP8 loaders
and their built extensions): FlashMLA's dense BF16 decode (its scheduler metadata computed once
per case, as an engine computes it once per step) and the FP8 fork of FlashMLA that vLLM ships
(per-tensor scale 1, rope in FP8). Without them only our kernels are timed, and the output says so.

Also reported per case: the SM clock NVML reports around the timed rounds (the clock the driver
set; the SMs' own can be lower), decode_fp8's cycles per 64-row tile and 64-token page (time x
clock x SMs / tile-pages: the per-page period, launch and tail included), and the floor: the
larger of the cache's bytes over the copy bandwidth and the FP8 + BF16 tensor work over the GEMM
rates (`--bw`, `--fp8-tflops`, `--bf16-tflops`, measured on the GPU once). The bandwidth follows
the GPU the bench runs on where it was measured (`COPY_TB_S`); elsewhere give `--bw`.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import importlib.util
import json
import math
import os
import statistics
import subprocess
import types
import zlib

# The cases of the results page: (batch, heads, s_q, s_k); s_k "U" = lengths uniform in 1..32768.
GRID = [
    (128, 128, 1, 8192), (128, 64, 1, 8192), (128, 32, 1, 8192), (128, 16, 1, 8192),
    (128, 128, 2, 8192), (128, 64, 2, 8192), (128, 128, 1, 32768), (128, 64, 1, 32768),
    (128, 16, 1, 32768), (32, 128, 1, 65536), (128, 128, 1, "U"), (128, 16, 1, "U"),
    (1, 128, 1, 8192), (8, 128, 1, 16384), (64, 16, 4, 4096), (128, 128, 1, 4096),
    (128, 128, 1, 1024), (1, 128, 1, 1024),
]
QUICK = [(128, 128, 1, 8192), (128, 64, 1, 8192), (128, 16, 1, 8192)]
# The batch sweep: time should follow the work at every batch (no wave steps).
SWEEP_BATCHES = [1, 2, 4, 8, 16, 20, 32, 46, 64, 82, 100, 128, 160, 200, 256]
SWEEP = ([(b, h, 1, s_k) for h in (128, 64, 16, 8) for s_k in (8192, 32768) for b in SWEEP_BATCHES]
         + [(b, 128, 2, 8192) for b in (32, 82, 128)] + [(b, 128, 1, "U") for b in (46, 128)])
UNIFORM_MAX = 32768
PAGE = 64


def parse_case(text: str):
    parts = text.split(",")
    if len(parts) != 4:
        raise SystemExit(f"--cases: expected b,h,s_q,s_k (s_k a number or U), got '{text}'")
    b, h, s_q = (int(x) for x in parts[:3])
    s_k = parts[3].strip()
    return (b, h, s_q, "U" if s_k.upper() == "U" else int(s_k))


class Nvml:
    """The SM clock through NVML (libnvidia-ml, loaded at run time; None where it is missing)."""

    def __init__(self, index: int):
        self.lib = self.dev = None
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                return
            dev = ctypes.c_void_p()
            if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(dev)) != 0:
                return
            self.lib, self.dev = lib, dev
        except OSError:
            pass

    def sm_mhz(self):
        if self.lib is None:
            return None
        mhz = ctypes.c_uint()
        ok = self.lib.nvmlDeviceGetClockInfo(self.dev, ctypes.c_int(1), ctypes.byref(mhz)) == 0  # 1: SM
        return mhz.value if ok else None


def load_peers(folder: str):
    path = os.path.join(folder, "peers.py")
    if not os.path.isfile(path):
        raise SystemExit(f"--peers: expected a folder holding peers.py, got '{folder}'")
    spec = importlib.util.spec_from_file_location("snapmla_bench_peers", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# Device-to-device copy bandwidth, bytes read and written per second (TB/s), measured with a
# PyTorch copy on each GPU the bench has run on, by the name CUDA gives it: the floor's memory
# term. The tensor rates are the same chip's on both (an H100 PCIe, a GH200: not measured).
COPY_TB_S = {"NVIDIA H200": 4.3, "NVIDIA H100 80GB HBM3": 3.0}


def copy_bandwidth(gpu_name, given=None):
    """The floor's bandwidth in TB/s and where it comes from: `given` (--bw), else the measured one
    of the GPU named, else the H200's with a note that it is not this GPU's."""
    if given is not None:
        return given, "--bw"
    if gpu_name in COPY_TB_S:
        return COPY_TB_S[gpu_name], f"measured on the {gpu_name}"
    return COPY_TB_S["NVIDIA H200"], f"the H200's: not measured on the {gpu_name} (give --bw)"


def floor_us(b, h, s_q, lens_sum, args):
    """max(bytes of the FP8 cache / bandwidth, tensor work / GEMM rates), in microseconds."""
    rows = h * s_q
    bytes_ = lens_sum * 644
    fp8_flop = 2.0 * rows * lens_sum * (512 + 512)
    bf16_flop = 2.0 * rows * lens_sum * 64
    compute = fp8_flop / (args.fp8_tflops * 1e12) + bf16_flop / (args.bf16_tflops * 1e12)
    return max(bytes_ / (args.bw * 1e12), compute) * 1e6


def capture_graphs(torch, kernels, tables, calls):
    """One CUDA graph per kernel: `calls` calls cycling over the page tables, after an eager
    warm-up over each table (peers fill their metadata on the first call) and one replay."""
    graphs = {}
    for name, call in kernels.items():
        for t in tables:
            call(t)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(calls):
                call(tables[i % len(tables)])
        g.replay()
        graphs[name] = g
    torch.cuda.synchronize()
    return graphs


def time_interleaved(torch, graphs, calls, rounds, each=None):
    """Per graph, the time of one call in each of `rounds` rounds (us), the graphs replayed in a
    rotating order; `each()` runs after every replay (the clock reading)."""
    times = {name: [] for name in graphs}
    order = list(graphs)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(rounds):
        for name in order[r % len(order):] + order[:r % len(order)]:
            start.record()
            graphs[name].replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) * 1e3 / calls)
            if each is not None:
                each()
    return times


def case_inputs(torch, snapmla, case, calls, q_gain=1.0):
    """The arrays a timed case decodes, on the GPU: lengths (uniform, or U(1..32K) seeded by the
    case), one randn / 10 cache in both formats, enough permuted page tables that one graph's
    calls read well past the L2 (256 MB of BF16 cache; at most 32, and the graph holds at least one
    call per table), the query (randn / 10 x q_gain: q_gain > 1 makes the attention peakier, scores
    spread over q_gain x ~0.1) and its quantization."""
    b, h, s_q, s_k = case
    dev = torch.device("cuda")
    gen = torch.Generator(device="cpu").manual_seed(zlib.crc32(repr(case).encode()))
    if s_k == "U":
        lens = torch.randint(1, UNIFORM_MAX + 1, (b,), generator=gen, dtype=torch.int32)
    else:
        lens = torch.full((b,), s_k, dtype=torch.int32)
    pages_per_seq = (int(lens.max()) + PAGE - 1) // PAGE
    pages = b * pages_per_seq
    sets = max(1, min(32, math.ceil(256e6 / max(1, int(lens.sum()) * 1152))))
    num_pages = pages * sets
    kv = (torch.randn(num_pages * PAGE, 576, device=dev) / 10).to(torch.bfloat16)
    fp8_cache = snapmla.alloc_fp8_cache(num_pages, kv)
    snapmla.append(fp8_cache, kv, torch.arange(num_pages * PAGE, device=dev, dtype=torch.int32))
    perm = torch.randperm(num_pages, generator=gen).to(dev, torch.int32)
    q = (torch.randn(b, s_q, h, 576, device=dev) * (q_gain / 10)).to(torch.bfloat16)
    return types.SimpleNamespace(
        lens=lens, seqlens=lens.to(dev), num_pages=num_pages, bf_cache=kv.view(num_pages, PAGE, 576),
        fp8_cache=fp8_cache, q=q, qq=snapmla.quantize_query(q), scale=1.0 / math.sqrt(192.0),
        tables=[perm[i * pages:(i + 1) * pages].view(b, pages_per_seq).contiguous() for i in range(sets)],
        calls=max(calls, sets))


def peer_kernels(torch, peers, x, s_q, h):
    """FlashMLA BF16 and PR#54 FP8 on the case's inputs `x` (case_inputs), as page-table -> call."""
    fm, f8 = peers.FlashMLA(x.seqlens, s_q, h), peers.PR54(x.seqlens, s_q, h)
    cache4 = x.bf_cache.view(x.num_pages, PAGE, 1, 576)
    q8, cache8 = x.q.to(torch.float8_e4m3fn), cache4.to(torch.float8_e4m3fn)
    return {"flashmla_bf16": lambda t: fm(x.q, cache4, t, x.seqlens, x.scale, True),
            "pr54_fp8": lambda t: f8(q8, cache8, t, x.seqlens, x.scale, True)}


@contextlib.contextmanager
def env_setting(name, value):
    """The environment's `name` = value inside the block, as it was after it."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def with_env(call, name, value):
    """`call` with the environment's `name` = value around it (SNAPMLA_FP8_TILE: decode_fp8's
    64-row tile under kAuto; SNAPMLA_FP8_P_SCALE: its P' scale rule under kAuto; both read per
    call, so a graph captured inside keeps them)."""
    def run(t):
        with env_setting(name, value):
            return call(t)
    return run


def parse_settings(text):
    """NAME=VALUE, or several joined by commas -> ((name, value), ...)."""
    out = []
    for setting in text.split(","):
        name, eq, value = setting.partition("=")
        if not (eq and name):
            raise SystemExit(f"expected NAME=VALUE[,NAME=VALUE...], got '{text}'")
        out.append((name, value))
    return tuple(out)


@contextlib.contextmanager
def env_settings(settings):
    """Every (name, value) of `settings` in the environment inside the block, as it was after it."""
    with contextlib.ExitStack() as stack:
        for name, value in settings:
            stack.enter_context(env_setting(name, value))
        yield


def with_env_settings(call, settings):
    """`call` under several settings of the environment at once: settings is NAME=VALUE, or
    several joined by commas (e.g. SNAPMLA_COMBINE_FUSED=1,SNAPMLA_PARTIALS=staged), or their
    parsed form ((name, value), ...)."""
    for name, value in parse_settings(settings) if isinstance(settings, str) else settings:
        call = with_env(call, name, value)
    return call


def fixed_split_plan(snapmla, lens, seqlens, workers, query_rows, split_blocks):
    """The batch-invariant plan (plan_splits' split_blocks) for lengths `lens` (host) with room for
    its splits: every sequence cut at multiples of split_blocks blocks."""
    blocks = (lens + PAGE - 1) // PAGE
    need = int(((blocks + split_blocks - 1) // split_blocks).clamp(min=1).sum())
    return snapmla.plan_splits(seqlens, workers, query_rows=query_rows, split_blocks=split_blocks,
                               capacity=need + workers)


def parse_env_variant(text: str):
    """--env LABEL:NAME=VALUE[,NAME=VALUE...] -> (label, ((name, value), ...))."""
    label, sep, settings = text.partition(":")
    if not (sep and label.isidentifier()):
        raise SystemExit(f"--env: expected LABEL:NAME=VALUE[,NAME=VALUE...] (LABEL a Python identifier), got '{text}'")
    try:
        return (label, parse_settings(settings))
    except SystemExit:
        raise SystemExit(f"--env: expected LABEL:NAME=VALUE[,NAME=VALUE...] (LABEL a Python identifier), "
                         f"got '{text}'") from None


def env_variants(args):
    """The lab variants of decode_fp8 timed beside the default, each as (label, its settings of
    the environment): --vregs, --carried, --carried-wide, --plan-fill and every --env."""
    out = []
    if getattr(args, "vregs", False):
        out.append(("vregs", (("SNAPMLA_FP8_TILE", "vregs"),)))
    if getattr(args, "carried", False):
        out.append(("carried", (("SNAPMLA_FP8_P_SCALE", "carried"),)))
    if getattr(args, "carried_wide", False):
        out.append(("carried_wide", (("SNAPMLA_FP8_P_SCALE", "carried_wide"),)))
    if getattr(args, "plan_fill", False):
        out.append(("fill", (("SNAPMLA_PLAN_FILL", "1"),)))
    out += [parse_env_variant(t) for t in (getattr(args, "env", None) or [])]
    return out


def variants(args):
    """The labels of the lab variants (env_variants)."""
    return [label for label, _ in env_variants(args)]


def bf16_env_variants(args):
    """The lab variants of decode_bf16 timed beside its default, as (label, settings): every --env
    under --env-bf16, then every --bf16-env (decode_bf16's alone: decode_fp8 is not timed there)."""
    texts = list(getattr(args, "env", None) or []) if getattr(args, "env_bf16", False) else []
    out = [parse_env_variant(t) for t in texts + list(getattr(args, "bf16_env", None) or [])]
    labels = [label for label, _ in out]
    if len(set(labels)) != len(labels):
        raise SystemExit(f"--bf16-env: a label given twice among the decode_bf16 variants {labels}")
    return out


def bf16_variants(args):
    """The labels of the lab variants timed on decode_bf16 (bf16_env_variants)."""
    return [label for label, _ in bf16_env_variants(args)]


def same_plan(torch, a, b):
    """Whether two split plans are the same, entry for entry (the unused capacity too)."""
    fields = ("split_offsets", "split_begin", "worker_splits")
    return all((getattr(a, f) is None and getattr(b, f) is None) or
               (getattr(a, f) is not None and getattr(b, f) is not None and
                torch.equal(getattr(a, f), getattr(b, f))) for f in fields)


def plan_split_line(rows, key, changed_key):
    """A variant's time ratio (rows[i][key]) split by whether its plan differs from the default's
    (rows[i][changed_key]): a planner variant's effect is in the changed cases, and the unchanged
    ones (the same plan, run twice) show the run's noise. None where the rows do not say."""
    if not rows or any(changed_key not in r for r in rows):
        return None
    parts = []
    for what, sel in (("changed plans", True), ("unchanged", False)):
        over = [r[key] for r in rows if r[changed_key] == sel]
        parts.append(f"{what} {len(over)}: " + (f"median {statistics.median(over):.3f} "
                                                  f"({min(over):.3f}-{max(over):.3f})" if over else "none"))
    return "; ".join(parts)


def run_case(case, args, peers, torch, snapmla, nvml, sms):
    b, h, s_q, s_k = case
    x = case_inputs(torch, snapmla, case, args.calls, getattr(args, "q_gain", 1.0))
    lens, seqlens, tables, calls, scale = x.lens, x.seqlens, x.tables, x.calls, x.scale
    q, qq, fp8_cache, bf_cache = x.q, x.qq, x.fp8_cache, x.bf_cache
    workers = snapmla.recommended_num_workers(q, s_q, h)
    plan = snapmla.plan_splits(seqlens, workers, query_rows=s_q * h)

    kernels = {
        "fp8": lambda t: snapmla.decode_fp8(qq, fp8_cache, t, seqlens, softmax_scale=scale, plan=plan),
        "bf16": lambda t: snapmla.decode_bf16(q, bf_cache, t, seqlens, softmax_scale=scale, plan=plan),
    }
    def variant_plan(settings):  # the variant's own plan (SNAPMLA_PLAN_FILL changes it)
        with env_settings(settings):
            return snapmla.plan_splits(seqlens, workers, query_rows=s_q * h)

    plan_changed = {}  # per variant kernel: whether its plan differs from the default's
    for label, settings in env_variants(args):
        own = variant_plan(settings)
        plan_changed[f"fp8_{label}"] = not same_plan(torch, own, plan)
        kernels[f"fp8_{label}"] = with_env_settings(
            lambda t, p=own: snapmla.decode_fp8(qq, fp8_cache, t, seqlens, softmax_scale=scale, plan=p), settings)
    for label, settings in bf16_env_variants(args):
        own = variant_plan(settings)
        plan_changed[f"bf16_{label}"] = not same_plan(torch, own, plan)
        kernels[f"bf16_{label}"] = with_env_settings(
            lambda t, p=own: snapmla.decode_bf16(q, bf_cache, t, seqlens, softmax_scale=scale, plan=p), settings)
    if args.split_blocks:
        fixed = fixed_split_plan(snapmla, lens, seqlens, workers, s_q * h, args.split_blocks)
        kernels["fp8_fixed"] = lambda t: snapmla.decode_fp8(qq, fp8_cache, t, seqlens, softmax_scale=scale, plan=fixed)
    if peers is not None:
        kernels.update(peer_kernels(torch, peers, x, s_q, h))

    graphs = capture_graphs(torch, kernels, tables, calls)
    clocks = []

    def read_clock():
        mhz = nvml.sm_mhz()
        if mhz:
            clocks.append(mhz)

    times = time_interleaved(torch, graphs, calls, args.rounds, read_clock)
    row = {"b": b, "h": h, "s_q": s_q, "s_k": s_k}
    for name, ts in times.items():
        row[f"{name}_us"] = round(statistics.median(ts), 2)
        row[f"{name}_us_range"] = [round(min(ts), 2), round(max(ts), 2)]
    for name, changed in plan_changed.items():
        row[f"{name}_plan_changed"] = changed
    row["sm_mhz"] = round(statistics.mean(clocks)) if clocks else None
    rows = h * s_q
    tiles = math.ceil(rows / snapmla._C.TILE_ROWS) if rows > 16 else 1  # (the narrow tile: 16 rows at most)
    tile_pages = tiles * int(((lens + PAGE - 1) // PAGE).sum())
    if row["sm_mhz"]:
        row["fp8_cycles_per_tile_page"] = round(row["fp8_us"] * row["sm_mhz"] * sms / tile_pages)
        for v in variants(args):
            row[f"fp8_{v}_cycles_per_tile_page"] = round(row[f"fp8_{v}_us"] * row["sm_mhz"] * sms / tile_pages)
    if args.split_blocks:
        row["split_blocks"] = args.split_blocks
        row["fp8_fixed_over_default"] = round(row["fp8_fixed_us"] / row["fp8_us"], 3)
    row["floor_us"] = round(floor_us(b, h, s_q, int(lens.sum()), args), 1)
    row["fp8_over_floor"] = round(row["fp8_us"] / row["floor_us"], 3)
    if peers is not None:
        row["fp8_speedup_vs_flashmla_bf16"] = round(row["flashmla_bf16_us"] / row["fp8_us"], 3)
        row["fp8_speedup_vs_pr54_fp8"] = round(row["pr54_fp8_us"] / row["fp8_us"], 3)
        row["bf16_over_flashmla_bf16"] = round(row["bf16_us"] / row["flashmla_bf16_us"], 3)
        for v in variants(args):
            row[f"fp8_{v}_speedup_vs_flashmla_bf16"] = round(row["flashmla_bf16_us"] / row[f"fp8_{v}_us"], 3)
            row[f"fp8_{v}_speedup_vs_pr54_fp8"] = round(row["pr54_fp8_us"] / row[f"fp8_{v}_us"], 3)
    for v in variants(args):
        row[f"fp8_{v}_over_fp8"] = round(row[f"fp8_{v}_us"] / row["fp8_us"], 3)
    for v in bf16_variants(args):
        row[f"bf16_{v}_over_bf16"] = round(row[f"bf16_{v}_us"] / row["bf16_us"], 3)
        if peers is not None:
            row[f"bf16_{v}_over_flashmla_bf16"] = round(row[f"bf16_{v}_us"] / row["flashmla_bf16_us"], 3)
    del graphs
    torch.cuda.empty_cache()
    return row


def floor_note(floor):
    """The floor's rates as the results page states them."""
    if not floor:
        return "not recorded"
    note = f"{floor['bw_tb_s']} TB/s"
    if floor.get("bw_source"):
        note += f" ({floor['bw_source']})"
    return note + f", {floor['fp8_tflops']} FP8 and {floor['bf16_tflops']} BF16 TFLOP/s"


def markdown(meta, rows, peers):
    lines = [f"# decode, same run: {meta['gpu']}, {meta['date']}, commit {meta['commit']}", ""]
    lines.append(f"CUDA graphs of {meta['calls']} calls, {meta['rounds']} interleaved rounds, medians "
                 "(us per call); random data (randn / 10), pages permuted. SM MHz: NVML's set clock "
                 "over the rounds; cycles: decode_fp8's per 64-row tile and 64-token page. Floor: "
                 + floor_note(meta.get("floor", {})) + ".")
    lines.append("")
    if peers:
        lines.append("| b | h | s_q | s_k | decode_fp8 | decode_bf16 | FlashMLA BF16 | FlashMLA FP8 (vLLM) "
                     "| fp8 vs FlashMLA | fp8 vs FP8 peer | bf16 / FlashMLA | floor | fp8 / floor | MHz | cycles/page |")
        lines.append("| --- " * 15 + "|")
        for r in rows:
            lines.append(f"| {r['b']} | {r['h']} | {r['s_q']} | {r['s_k']} | {r['fp8_us']} | {r['bf16_us']} | "
                         f"{r['flashmla_bf16_us']} | {r['pr54_fp8_us']} | {r['fp8_speedup_vs_flashmla_bf16']}x | "
                         f"{r['fp8_speedup_vs_pr54_fp8']}x | {r['bf16_over_flashmla_bf16']} | {r['floor_us']} | "
                         f"{r['fp8_over_floor']} | {r['sm_mhz']} | {r.get('fp8_cycles_per_tile_page')} |")
    else:
        lines.append("No peers given (--peers): our kernels only.")
        lines.append("")
        lines.append("| b | h | s_q | s_k | decode_fp8 | decode_bf16 | floor | fp8 / floor | MHz | cycles/page |")
        lines.append("| --- " * 10 + "|")
        for r in rows:
            lines.append(f"| {r['b']} | {r['h']} | {r['s_q']} | {r['s_k']} | {r['fp8_us']} | {r['bf16_us']} | "
                         f"{r['floor_us']} | {r['fp8_over_floor']} | {r['sm_mhz']} | "
                         f"{r.get('fp8_cycles_per_tile_page')} |")
    return "\n".join(lines) + "\n"


def sweep_summary(rows, peers, labels=(), bf16_labels=()):
    """The sweep's checks as lines: the worst ratios against the peers, and per (h, s_k) the
    largest deviation of decode_fp8's time per cached token at b >= 16 from its b = 256 value;
    for each lab variant, the same ratios and its time against the default's (and decode_bf16's
    under the variants in bf16_labels), split by whether the variant's plan differs from the
    default's where the rows say (plan_split_line)."""
    lines = []
    for v in bf16_labels:
        over = [r[f"bf16_{v}_over_bf16"] for r in rows]
        line = (f"- variant {v} on decode_bf16: time / decode_bf16's median {statistics.median(over):.3f} "
                f"(range {min(over):.3f}-{max(over):.3f})")
        split = plan_split_line(rows, f"bf16_{v}_over_bf16", f"bf16_{v}_plan_changed")
        if split:
            line += f" [{split}]"
        if peers:
            line += (f"; / FlashMLA BF16 worst {max(r[f'bf16_{v}_over_flashmla_bf16'] for r in rows)}, "
                     f"{sum(r[f'bf16_{v}_over_flashmla_bf16'] > 1.1 for r in rows)} of {len(rows)} above 1.1")
        lines.append(line)
    for v in labels:
        over = [r[f"fp8_{v}_over_fp8"] for r in rows]
        line = (f"- variant {v}: time / decode_fp8's median {statistics.median(over):.3f} "
                f"(range {min(over):.3f}-{max(over):.3f})")
        split = plan_split_line(rows, f"fp8_{v}_over_fp8", f"fp8_{v}_plan_changed")
        if split:
            line += f" [{split}]"
        if peers:
            worst = min(rows, key=lambda r: r[f"fp8_{v}_speedup_vs_flashmla_bf16"])
            line += (f"; vs FlashMLA BF16 worst {worst[f'fp8_{v}_speedup_vs_flashmla_bf16']}x "
                     f"(b={worst['b']} h={worst['h']} s_q={worst['s_q']} s_k={worst['s_k']}), "
                     f"{sum(r[f'fp8_{v}_speedup_vs_flashmla_bf16'] < 1 for r in rows)} of {len(rows)} below 1.0x; "
                     f"vs PR#54 {sum(r[f'fp8_{v}_speedup_vs_pr54_fp8'] < 1 for r in rows)} below 1.0x")
        lines.append(line)
    if peers:
        worst = min(rows, key=lambda r: r["fp8_speedup_vs_flashmla_bf16"])
        worst8 = min(rows, key=lambda r: r["fp8_speedup_vs_pr54_fp8"])
        worst16 = max(rows, key=lambda r: r["bf16_over_flashmla_bf16"])
        lines.append(f"- decode_fp8 vs FlashMLA BF16: worst {worst['fp8_speedup_vs_flashmla_bf16']}x "
                     f"(b={worst['b']} h={worst['h']} s_q={worst['s_q']} s_k={worst['s_k']}); "
                     f"{sum(r['fp8_speedup_vs_flashmla_bf16'] < 1 for r in rows)} of {len(rows)} cases below 1.0x")
        lines.append(f"- decode_fp8 vs FlashMLA FP8 (PR#54): worst {worst8['fp8_speedup_vs_pr54_fp8']}x "
                     f"(b={worst8['b']} h={worst8['h']} s_q={worst8['s_q']} s_k={worst8['s_k']}); "
                     f"{sum(r['fp8_speedup_vs_pr54_fp8'] < 1 for r in rows)} of {len(rows)} cases below 1.0x")
        lines.append(f"- decode_bf16 / FlashMLA BF16: worst {worst16['bf16_over_flashmla_bf16']} "
                     f"(b={worst16['b']} h={worst16['h']} s_q={worst16['s_q']} s_k={worst16['s_k']}); "
                     f"{sum(r['bf16_over_flashmla_bf16'] > 1.1 for r in rows)} of {len(rows)} cases above 1.1")
    for (h, s_k) in sorted({(r["h"], r["s_k"]) for r in rows if r["s_q"] == 1 and r["s_k"] != "U"}):
        by_b = {r["b"]: r for r in rows if r["h"] == h and r["s_k"] == s_k and r["s_q"] == 1}
        if 256 not in by_b:
            continue
        ref = by_b[256]["fp8_us"] / 256
        dev = max((((by_b[b]["fp8_us"] / b) / ref - 1, b) for b in by_b if b >= 16), key=lambda x: abs(x[0]))
        lines.append(f"- h={h}, s_k={s_k}: decode_fp8 time per cached token at b >= 16 within "
                     f"{dev[0] * 100:+.1f}% of b = 256's (worst b = {dev[1]})")
    return lines


def plot_sweep(rows, path, peers):
    """Time against batch, one panel per h: solid 8K, dashed 32K, one colour per kernel."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)", flush=True)
        return
    heads = sorted({r["h"] for r in rows}, reverse=True)
    fig, axes = plt.subplots(1, len(heads), figsize=(4.5 * len(heads), 4), squeeze=False)
    kernels = [("fp8", "decode_fp8", "C0"), ("bf16", "decode_bf16", "C1")]
    if peers:
        kernels += [("flashmla_bf16", "FlashMLA BF16", "C2"), ("pr54_fp8", "FlashMLA FP8 (PR#54)", "C3")]
    for ax, h in zip(axes[0], heads):
        for s_k, style in ((8192, "-"), (32768, "--")):
            sel = sorted((r for r in rows if r["h"] == h and r["s_k"] == s_k and r["s_q"] == 1), key=lambda r: r["b"])
            if not sel:
                continue
            for key, label, colour in kernels:
                ax.plot([r["b"] for r in sel], [r[f"{key}_us"] for r in sel], style, color=colour, marker=".",
                        label=f"{label}, {s_k // 1024}K")
        ax.set_title(f"h = {h}, s_q = 1")
        ax.set_xlabel("batch")
        ax.set_ylabel("us per decode call")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def commit_of_tree() -> str:
    env = os.environ.get("SNAPMLA_COMMIT")
    if env:
        return env
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_json(out, filename, meta, rows):
    """The run's metadata and its rows as out/filename (the file bench --out writes)."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, filename), "w") as f:
        json.dump({**meta, "results": rows}, f, indent=1)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m snapmla.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--peers", metavar="DIR", help="folder with peers.py (FlashMLA BF16 and FP8 loaders)")
    ap.add_argument("--cases", nargs="+", default=["grid"],
                    help="'grid' (the results page), 'quick' (b=128, 8K, h=128/64/16) or b,h,s_q,s_k ...")
    ap.add_argument("--sweep", action="store_true",
                    help="the batch sweep (SWEEP) instead of --cases; writes h200_sweep.{json,md,png}")
    ap.add_argument("--vregs", action="store_true",
                    help="also time decode_fp8's V^T-register 64-row tile (fp8_vregs_us; not yet the default)")
    ap.add_argument("--carried", action="store_true",
                    help="also time decode_fp8 with the carried P' scales on every call, the narrow tile's "
                         "included (SNAPMLA_FP8_P_SCALE=carried: fp8_carried_us; an option)")
    ap.add_argument("--carried-wide", action="store_true",
                    help="also time decode_fp8 with the carried P' scales on the calls that run the "
                         "transposing 64-row tile (SNAPMLA_FP8_P_SCALE=carried_wide: fp8_carried_wide_us)")
    ap.add_argument("--plan-fill", action="store_true",
                    help="also time decode_fp8 on the plan made with SNAPMLA_PLAN_FILL=1 (every worker gets a "
                         "share where the chunk is the equal share: fp8_fill_us; a lab option)")
    ap.add_argument("--env", action="append", metavar="LABEL:NAME=VALUE[,NAME=VALUE...]",
                    help="also time decode_fp8 with the environment's NAME = VALUE (a lab option read per "
                         "call, e.g. wave:SNAPMLA_COMBINE_WAVE=workers: fp8_wave_us; several settings at once "
                         "joined by commas); repeatable")
    ap.add_argument("--env-bf16", action="store_true",
                    help="time decode_bf16 under every --env variant too (bf16_LABEL_us, bf16_LABEL_over_bf16)")
    ap.add_argument("--bf16-env", action="append", metavar="LABEL:NAME=VALUE[,NAME=VALUE...]",
                    help="also time decode_bf16 (alone) with the environment's NAME = VALUE: a lab option of "
                         "decode_bf16's only, so decode_fp8 is not timed under it; repeatable")
    ap.add_argument("--q-gain", type=float, default=1.0, metavar="G",
                    help="the query is randn / 10 x G (default 1; larger: peakier attention, scores spread "
                         "G x ~0.1; the carried P' scales' gain depends on it)")
    ap.add_argument("--split-blocks", type=int, default=0, metavar="L",
                    help="also time decode_fp8 on the batch-invariant plan of L-block splits (fp8_fixed_us, "
                         "fp8_fixed_over_default: the option's cost)")
    ap.add_argument("--calls", type=int, default=10, help="decode calls per CUDA graph (default 10)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per case (default 5)")
    ap.add_argument("--out", metavar="DIR", help="write h200.json and h200.md (h200_sweep.*) there")
    ap.add_argument("--bw", type=float, default=None,
                    help="copy bandwidth for the floor, TB/s (default: the GPU's measured one, COPY_TB_S)")
    ap.add_argument("--fp8-tflops", type=float, default=1240.0, help="FP8 GEMM rate for the floor (1240)")
    ap.add_argument("--bf16-tflops", type=float, default=685.0, help="BF16 GEMM rate for the floor (685)")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        raise SystemExit("snapmla.bench needs PyTorch with CUDA (pip install torch)")
    import snapmla
    if not (torch.cuda.is_available() and snapmla.cuda_device_available()):
        raise SystemExit("snapmla.bench needs an sm_90 GPU and a CUDA build of snapmla: " + snapmla.info())
    cases = []
    for c in args.cases:
        cases += GRID if c == "grid" else QUICK if c == "quick" else [parse_case(c)]
    if args.sweep:
        cases = SWEEP
    peers = load_peers(args.peers) if args.peers else None
    if peers is None:
        print("no --peers given: timing decode_fp8 and decode_bf16 only", flush=True)
    props = torch.cuda.get_device_properties(0)
    args.bw, bw_source = copy_bandwidth(props.name, args.bw)
    print(f"floor: {args.bw} TB/s ({bw_source})", flush=True)
    nvml = Nvml(torch.cuda.current_device())
    meta = {"gpu": props.name, "sms": props.multi_processor_count,
            "date": datetime.date.today().isoformat(), "commit": commit_of_tree(),
            "calls": args.calls, "rounds": args.rounds, "peers": peers is not None,
            "floor": {"bw_tb_s": args.bw, "bw_source": bw_source, "fp8_tflops": args.fp8_tflops, "bf16_tflops": args.bf16_tflops}}
    rows = []
    name = "h200_sweep" if args.sweep else "h200"
    for case in cases:
        row = run_case(case, args, peers, torch, snapmla, nvml, props.multi_processor_count)
        rows.append(row)
        if args.out:  # the cases so far, so that a run cut short by a time limit leaves its results
            write_json(args.out, name + ".partial.json", meta, rows)
        msg = f"b={row['b']} h={row['h']} s_q={row['s_q']} s_k={row['s_k']}: fp8 {row['fp8_us']} us, " \
              f"bf16 {row['bf16_us']}"
        if peers is not None:
            msg += f", FlashMLA {row['flashmla_bf16_us']}, FP8 peer {row['pr54_fp8_us']} -> " \
                   f"{row['fp8_speedup_vs_flashmla_bf16']}x / {row['fp8_speedup_vs_pr54_fp8']}x"
            for v in variants(args):
                msg += f"; {v} {row[f'fp8_{v}_us']} us -> {row[f'fp8_{v}_speedup_vs_flashmla_bf16']}x / " \
                       f"{row[f'fp8_{v}_speedup_vs_pr54_fp8']}x ({row[f'fp8_{v}_over_fp8']}x fp8's time)"
            for v in bf16_variants(args):
                msg += f"; bf16 {v} {row[f'bf16_{v}_us']} us ({row[f'bf16_{v}_over_bf16']}x bf16's time)"
        if args.split_blocks:
            msg += f"; batch-invariant (L={args.split_blocks}) {row['fp8_fixed_us']} us, " \
                   f"{row['fp8_fixed_over_default']}x the default plan's time"
        print(msg + f" (floor {row['floor_us']}, {row['sm_mhz']} MHz)", flush=True)
    md = markdown(meta, rows, peers is not None)
    if args.sweep:
        summary = sweep_summary(rows, peers is not None, variants(args), bf16_variants(args))
        md += "\n## Summary\n\n" + "\n".join(summary) + "\n\n![time against batch](h200_sweep.png)\n"
    print(md)
    if args.out:
        write_json(args.out, name + ".json", meta, rows)
        partial = os.path.join(args.out, name + ".partial.json")
        if os.path.exists(partial):
            os.remove(partial)
        with open(os.path.join(args.out, name + ".md"), "w") as f:
            f.write(md)
        if args.sweep:
            plot_sweep(rows, os.path.join(args.out, name + ".png"), peers is not None)
    return rows


if __name__ == "__main__":
    main()
