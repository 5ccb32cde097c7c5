"""The end-to-end benchmark: for each context length and each cache, a fresh pool of the same
memory budget, as many requests as it holds (plus a queue), prefill, a few warm-up steps (CUDA
graph capture), then a steady window of decode steps."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from typing import Dict, List, Optional

import torch

from .. import cuda_device_available
from . import report
from .engine import BYTES_PER_TOKEN, Engine, Request, pages_for_budget, pages_needed
from .model import Model, ModelConfig, TensorParallel

GIB = 2 ** 30


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m snapmla.e2e", description=(
        "Decode tokens/s of a DeepSeek-V3-shaped engine (one attention rank, 61 MLA layers, "
        "random weights) with the FP8 (SnapMLA) and the BF16 KV cache at the same memory."))
    a = ap.add_argument
    a("--cache", default="both", choices=["fp8", "bf16", "both"])
    a("--contexts", default="8192,16384,32768,65536", help="prompt lengths to measure, comma-separated")
    a("--output-len", type=int, default=1024, help="output tokens per request (reserved at admission)")
    a("--requests", type=int, default=0, help="requests per run (default: what the pool holds, plus a queue of 1/8)")
    a("--kv-gib", type=float, default=None,
      help="KV pool memory per GPU, the same for both caches (default: free memory after the weights minus --margin-gib)")
    a("--margin-gib", type=float, default=6.0, help="memory left for activations and CUDA graphs")
    a("--max-batch", type=int, default=1024)
    a("--window-s", type=float, default=3.0, help="length of the measured steady window")
    a("--steps", type=int, default=0, help="decode steps in the window (default: from --window-s)")
    a("--warmup-steps", type=int, default=3)
    a("--prefill-chunk", type=int, default=16384, help="tokens per prefill chunk")
    a("--no-graphs", action="store_true", help="eager decode steps instead of CUDA graphs")
    a("--device", default="auto", choices=["auto", "cuda", "cpu"])
    a("--tp", type=int, default=1, help="tensor-parallel ranks (run under torchrun with as many processes)")
    a("--seed", type=int, default=0)
    # The model: DeepSeek-V3's shapes unless changed.
    a("--layers", type=int, default=ModelConfig.layers)
    a("--hidden", type=int, default=ModelConfig.hidden)
    a("--heads", type=int, default=ModelConfig.heads)
    a("--q-lora-rank", type=int, default=ModelConfig.q_lora_rank)
    a("--qk-nope-dim", type=int, default=ModelConfig.qk_nope_dim)
    a("--v-head-dim", type=int, default=ModelConfig.v_head_dim)
    a("--vocab", type=int, default=ModelConfig.vocab)
    a("--rope", default="yarn", choices=["yarn", "plain"])
    a("--moe-standin", action="store_true",
      help="add a dense SwiGLU per layer with the FLOPs of DeepSeek-V3's 9 active experts (intermediate 18432)")
    a("--mlp-intermediate", type=int, default=0, help="the stand-in's intermediate size (implies --moe-standin)")
    a("--bf16-kernel", default="snapmla", choices=["snapmla", "flashmla"],
      help="the BF16 cache's decode kernel: snapmla's decode_bf16, or FlashMLA's dense BF16 decode (what "
           "engines run today; needs --peers)")
    a("--peers", default=None, metavar="DIR",
      help="a folder with peers.py (the FlashMLA BF16 loader, as python -m snapmla.bench --peers takes)")
    # Output.
    a("--out", default=None, help="write PREFIX.json, PREFIX.md and PREFIX.png (e.g. docs/results/e2e_h200)")
    a("--commit", default=None, help="the commit the results are from (default: git rev-parse)")
    a("--tokens-out", default=None, help="write every request's output tokens (JSON) for comparisons")
    a("--replot", default=None, metavar="JSON", help="only rewrite the .md and .png of a results JSON")
    args = ap.parse_args(argv)
    try:
        args.contexts = [int(c) for c in args.contexts.split(",") if c]
    except ValueError:
        ap.error(f"--contexts: expected comma-separated integers, got {args.contexts!r}")
    for name in ("output_len", "max_batch", "prefill_chunk", "tp", "layers", "heads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: expected at least 1, got {getattr(args, name)}")
    if any(c < 2 for c in args.contexts) or not args.contexts:
        ap.error(f"--contexts: expected prompt lengths of at least 2 tokens, got {args.contexts}")
    if args.kv_gib is not None and args.kv_gib <= 0:
        ap.error(f"--kv-gib: expected a positive size, got {args.kv_gib}")
    if args.moe_standin and not args.mlp_intermediate:
        args.mlp_intermediate = 9 * 2048
    if args.bf16_kernel == "flashmla" and not args.peers:
        ap.error("--bf16-kernel flashmla: expected --peers DIR, a folder with peers.py (FlashMLA's loader)")
    if args.bf16_kernel == "flashmla" and args.device == "cpu":
        ap.error("--bf16-kernel flashmla: FlashMLA's kernel runs on an sm_90 GPU, not --device cpu")
    return args


class Progress:
    """One status line on stderr, rewritten in place on a terminal, at most twice a second."""

    def __init__(self, enabled: bool):
        self.enabled, self.tty, self.last = enabled, sys.stderr.isatty(), 0.0

    def __call__(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self.last < 0.5):
            return
        self.last = now
        if self.tty:
            sys.stderr.write("\r\033[K" + text)
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def done(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\n")


def make_requests(n: int, prompt_len: int, output_len: int, vocab: int, seed: int) -> List[Request]:
    """Random prompts, the same for both caches and every world size."""
    gen = torch.Generator().manual_seed(seed)
    return [Request(i, torch.randint(0, vocab, (prompt_len,), generator=gen), output_len) for i in range(n)]


def init_distributed(args) -> TensorParallel:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.tp != world:
        raise SystemExit(f"--tp {args.tp}: expected as many processes as ranks (torchrun --nproc-per-node "
                         f"{args.tp} -m snapmla.e2e --tp {args.tp}); WORLD_SIZE is {world}")
    if world == 1:
        return TensorParallel()
    import torch.distributed as dist
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    return TensorParallel(dist.get_rank(), world, dist.group.WORLD)


def _commit(args) -> str:
    if args.commit:
        return args.commit
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def measure(model: Model, cache: str, kv_bytes: int, context: int, args, progress: Progress,
            tokens_out: Optional[Dict]) -> Dict:
    """One (context, cache) run: prefill, warm-up, steady window."""
    max_len = context + args.output_len
    eng = Engine(model, cache, kv_bytes, max_len, max_batch=args.max_batch, graphs=False if args.no_graphs else None,
                 prefill_chunk=args.prefill_chunk, record_tokens=tokens_out is not None)
    holds = min(args.max_batch, eng.pool.num_pages // pages_needed(context, args.output_len))
    if holds < 1:
        raise SystemExit(f"--kv-gib: {kv_bytes / GIB:.2f} GiB holds no {cache} request of {context} + "
                         f"{args.output_len} tokens in {model.cfg.layers} layers")
    n = args.requests or holds + max(1, holds // 8)
    for req in make_requests(n, context, args.output_len, model.cfg.vocab, args.seed + 1):
        eng.submit(req)
    tag = f"[{cache} {context}]"
    progress(f"{tag} prefill of {min(n, holds)} x {context} tokens", force=True)
    eng.admit()
    progress(f"{tag} prefill {eng.prefill_tokens} tokens in {eng.prefill_seconds:.1f} s; warm-up", force=True)
    for _ in range(args.warmup_steps):
        if eng.running:
            eng.step()
    eng.log = []
    steps = args.steps
    if not steps:  # a short timed probe sets the window's length
        t0 = time.perf_counter()
        for _ in range(3):
            eng.admit()
            if eng.running:
                eng.step()
        eng._sync()
        per_step = (time.perf_counter() - t0) / 3
        steps = max(10, min(2000, int(args.window_s / per_step)))
        eng.log = []
    for i in range(steps):
        eng.admit()
        if not eng.running:
            break
        eng.step()
        progress(f"{tag} decode step {i + 1}/{steps}, batch {len(eng.running)}", force=i == 0)
    secs = eng.step_seconds()
    log = eng.log
    if not log:
        raise SystemExit(f"--output-len {args.output_len}: every request finished before the window "
                         f"(the warm-up takes {args.warmup_steps} steps)")
    made = sum(r.batch for r in log)
    mem = torch.cuda.max_memory_allocated(model.device) / GIB if model.device.type == "cuda" else 0.0
    row = {
        "context": context, "cache": cache, "kv_gib": kv_bytes / GIB, "pool_bytes": eng.cache_bytes,
        "pool_pages": eng.pool.num_pages, "pool_tokens": eng.pool.num_pages * 64,
        "batch": statistics.mean(r.batch for r in log), "batch_max": max(r.batch for r in log),
        "tokens_in_cache": statistics.mean(r.cached_tokens for r in log),
        "steps": len(log), "tokens_per_s": made / sum(secs),
        "step_ms_p50": 1e3 * statistics.median(secs), "step_ms_p99": 1e3 * _quantile(secs, 0.99),
        "prefill_tokens": eng.prefill_tokens, "prefill_s": eng.prefill_seconds,
        "graph_capture_s": eng.capture_seconds, "memory_gib": mem,
    }
    if tokens_out is not None:
        eng.log = None
        eng.run()
        tokens_out.setdefault(cache, {})[str(context)] = {str(r.id): r.tokens for r in eng.finished}
    progress(f"{tag} {row['tokens_per_s']:.0f} tokens/s at batch {row['batch']:.0f}, "
             f"step p50 {row['step_ms_p50']:.2f} ms", force=True)
    del eng
    if model.device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(model.device)
    return row


def _quantile(xs: List[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def available_bytes(device: torch.device) -> int:
    """Memory the run may take on `device`: the GPU's free memory, or the host's MemAvailable."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_memory(cfg: ModelConfig, args, device: torch.device, available: int) -> None:
    """Stops before allocating when the weights (and a given --kv-gib) do not fit `available`,
    saying what would: the full DeepSeek-V3 shapes take ~25 GiB of weights per rank."""
    need = cfg.weight_bytes(args.tp) + (int(args.kv_gib * GIB) if args.kv_gib is not None else 0)
    need += int((args.margin_gib if device.type == "cuda" else 1.0) * GIB)
    if need <= available:
        return
    per_layer = max(1, (cfg.weight_bytes(args.tp) - replace(cfg, layers=0).weight_bytes(args.tp)) // max(cfg.layers, 1))
    fixed = replace(cfg, layers=0).weight_bytes(args.tp)
    budget = available - (GIB if device.type != "cuda" else int(args.margin_gib * GIB)) - GIB // 2
    layers = int((budget - fixed) // per_layer) if budget > fixed else 0
    hint = (f"pass --layers {min(layers, cfg.layers)} --kv-gib 0.5 (the same per-layer work with fewer layers)"
            if layers >= 1 else "pass a smaller model, e.g. --layers 2 --vocab 32000 --kv-gib 0.5")
    raise SystemExit(f"e2e: {need / GIB:.1f} GiB needed on {device} (weights {cfg.weight_bytes(args.tp) / GIB:.1f} "
                     f"GiB per rank{', KV pool ' + format(args.kv_gib, 'g') + ' GiB' if args.kv_gib else ''}), "
                     f"{available / GIB:.1f} GiB available: {hint}, or run on an sm_90 GPU")


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.replot:
        for path in report.replot(args.replot):
            print(path)
        return 0
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() and cuda_device_available() else "cpu"
    if args.device == "cuda" and not cuda_device_available():
        raise SystemExit("--device cuda: this snapmla build has no CUDA kernels or there is no sm_90 GPU "
                         "(snapmla.info() says which)")
    tp = init_distributed(args)
    if tp.size == 1:
        return _run(args, tp)
    import torch.distributed as dist
    try:
        rc = _run(args, tp)
        # Every rank leaves the group together: a rank that exits while another still tears down
        # its gloo threads can abort it ("terminate called without an active exception").
        dist.barrier()
        return rc
    finally:
        dist.destroy_process_group()


def _run(args, tp: TensorParallel) -> int:
    lead = tp.rank == 0
    progress = Progress(lead)
    device = torch.device(f"cuda:{torch.cuda.current_device()}") if args.device == "cuda" else torch.device("cpu")
    cfg = replace(ModelConfig(), layers=args.layers, hidden=args.hidden, heads=args.heads,
                  q_lora_rank=args.q_lora_rank, qk_nope_dim=args.qk_nope_dim, v_head_dim=args.v_head_dim,
                  vocab=args.vocab, rope=args.rope, mlp_intermediate=args.mlp_intermediate)
    if cfg.heads % args.tp:
        raise SystemExit(f"--heads {cfg.heads} / --tp {args.tp}: expected a head count that --tp divides")
    caches = ["fp8", "bf16"] if args.cache == "both" else [args.cache]
    check_memory(cfg, args, device, available_bytes(device))
    progress(f"e2e: weights ({cfg.weight_bytes(args.tp) / GIB:.1f} GiB per rank) on {device}", force=True)
    t0 = time.perf_counter()
    flashmla = None
    if args.bf16_kernel == "flashmla":
        if device.type != "cuda":
            raise SystemExit("--bf16-kernel flashmla: FlashMLA's kernel needs an sm_90 GPU")
        from ..bench import load_peers
        # Its scheduler metadata is reset each step (Model.decode_step): the first layer computes
        # it on the GPU for the step's lengths, the other layers reuse it, as engines do.
        flashmla = load_peers(args.peers).FlashMLA(None, 1, cfg.heads // args.tp)
    model = Model(cfg, device, seed=args.seed, tp=tp, max_pos=max(args.contexts) + args.output_len,
                  flashmla=flashmla)
    weights_s = time.perf_counter() - t0
    if args.kv_gib is not None:
        kv_bytes = int(args.kv_gib * GIB)
    elif device.type == "cuda":
        kv_bytes = int(torch.cuda.mem_get_info(device)[0] - args.margin_gib * GIB)
    else:
        kv_bytes = GIB // 4
    if tp.size > 1:  # every rank the same budget: the smallest
        t = torch.tensor([kv_bytes], dtype=torch.int64, device=device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
        kv_bytes = int(t.item())
    if kv_bytes <= 0:
        raise SystemExit(f"--kv-gib: nothing is left for the KV pool after the weights (--margin-gib {args.margin_gib})")
    tokens_out: Optional[Dict] = {} if args.tokens_out else None
    runs: Dict[tuple, Dict] = {}
    for context in args.contexts:
        for cache in caches:
            runs[(context, cache)] = measure(model, cache, kv_bytes, context, args, progress, tokens_out)
    progress.done()
    if not lead:
        return 0
    doc = summarize(args, cfg, device, tp, kv_bytes, weights_s, runs, caches)
    print(report.markdown(doc) if len(caches) == 2 else json.dumps(doc["runs"], indent=1))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        for path in report.write(doc, args.out):
            print(f"e2e: wrote {path}")
    if tokens_out is not None:
        with open(args.tokens_out, "w") as f:
            json.dump(tokens_out, f)
    return 0


def summarize(args, cfg: ModelConfig, device, tp: TensorParallel, kv_bytes: int, weights_s: float,
              runs: Dict[tuple, Dict], caches: List[str]) -> Dict:
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU reference"
    bf16_kernel = ("FlashMLA's dense BF16 decode (its own split scheduler, computed once per step)"
                   if args.bf16_kernel == "flashmla" else "snapmla's decode_bf16")
    mlp = (f"a dense stand-in for the MoE (SwiGLU, intermediate {cfg.mlp_intermediate}, one weight set shared "
           f"by the layers)" if cfg.mlp_intermediate else "MoE / MLP left out (attention layers only)")
    setup = (f"{cfg.layers} MLA layers (hidden {cfg.hidden}, {cfg.heads} heads"
             f"{f' / TP {tp.size}' if tp.size > 1 else ''}, q_lora {cfg.q_lora_rank}, kv_lora {cfg.kv_lora_rank}, "
             f"qk_nope {cfg.qk_nope_dim}, qk_rope {cfg.qk_rope_dim}, v_head {cfg.v_head_dim}, vocab {cfg.vocab}), "
             f"{'YaRN (factor 40, DeepSeek-V3)' if cfg.rope == 'yarn' else 'plain'} RoPE, random bf16 weights "
             f"({cfg.weight_bytes(tp.size) / GIB:.1f} GiB per rank), {mlp}. KV pool {kv_bytes / GIB:.1f} GiB per "
             f"GPU for either cache ({BYTES_PER_TOKEN['fp8']} vs {BYTES_PER_TOKEN['bf16']} bytes per token and "
             f"layer); prompts of `context` tokens, {args.output_len} output tokens reserved per request. "
             f"The BF16 cache's decode kernel: {bf16_kernel}.")
    notes = [
        "Prefill runs each layer's KV projection on the prompt's embeddings and writes the rows with the "
        "library's append (chunks of %d tokens); it is not timed in tokens/s." % args.prefill_chunk,
        "Decode tokens/s = tokens made in the steady window / the window's summed step times; each step "
        "(embed, per layer: projections, append, quantize_query, decode with one plan per step, output "
        "projection; lm_head, greedy) is %s." % ("one CUDA graph replay per batch-size bucket"
                                                  if device.type == "cuda" and not args.no_graphs else "eager"),
        "Memory used: peak allocated by PyTorch in the run (weights + pool + activations).",
    ]
    results = []
    if len(caches) == 2:
        for context in args.contexts:
            f, b = runs[(context, "fp8")], runs[(context, "bf16")]
            row = {"context": context, "fp8_tokens_per_s": f["tokens_per_s"], "bf16_tokens_per_s": b["tokens_per_s"],
                   "fp8_batch": f["batch"], "bf16_batch": b["batch"],
                   "speedup": f["tokens_per_s"] / b["tokens_per_s"], "batch_ratio": f["batch"] / b["batch"],
                   "step_ratio": b["step_ms_p50"] / f["step_ms_p50"]}
            for k in ("step_ms_p50", "step_ms_p99", "tokens_in_cache", "memory_gib", "pool_tokens", "steps",
                      "prefill_s", "graph_capture_s"):
                row["fp8_" + k], row["bf16_" + k] = f[k], b[k]
            results.append(row)
    return {"gpu": gpu, "date": datetime.date.today().isoformat(), "commit": _commit(args), "setup": setup,
            "notes": notes, "tp": tp.size, "bf16_kernel": args.bf16_kernel, "kv_gib": kv_bytes / GIB, "weights_init_s": weights_s,
            "results": results, "runs": list(runs.values())}
