"""The end-to-end benchmark. For each deployment (the attention heads one GPU holds), each context
length and each cache: a fresh engine over a KV pool of the same memory budget; requests whose
output lengths come from a distribution fill it; a few warm-up steps (CUDA graph capture); then a
measured window of decode steps in which requests finish, free their pages, and queued requests
are admitted and prefilled: continuous batching. The caches alternate over the repeats (fp8,
bf16, fp8, bf16, ...) on the same requests."""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from typing import Dict, List, Optional

import torch

from .. import PAGE_SIZE, cuda_device_available
from . import report
from .engine import BYTES_PER_TOKEN, Engine, Request, pages_needed
from .model import Model, ModelConfig, TensorParallel

GIB = 2 ** 30
# Bounds of a window sized by --window-s, in steps.
MIN_WINDOW_STEPS, MAX_WINDOW_STEPS = 10, 4000
SM_CLOCK_EVERY = 16  # window steps between NVML samples of the SM clock


@dataclass(frozen=True)
class LengthDist:
    """Output lengths: uniform over low..high (both included); fixed where low == high."""

    low: int
    high: int

    @staticmethod
    def parse(text: str) -> "LengthDist":
        kind, _, spec = text.partition(":")
        try:
            if kind == "fixed":
                low = high = int(spec)
            elif kind == "uniform":
                low, high = (int(x) for x in spec.split("-"))
            else:
                raise ValueError
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected fixed:N or uniform:A-B, got {text!r}") from None
        if not 1 <= low <= high:
            raise argparse.ArgumentTypeError(f"expected lengths 1 <= A <= B, got {text!r}")
        return LengthDist(low, high)

    @staticmethod
    def fixed(text: str) -> "LengthDist":
        return LengthDist.parse(f"fixed:{text}")

    def sample(self, gen: torch.Generator) -> int:
        return int(torch.randint(self.low, self.high + 1, (1,), generator=gen))

    def __str__(self) -> str:
        return f"fixed:{self.low}" if self.low == self.high else f"uniform:{self.low}-{self.high}"

    def describe(self) -> str:
        return (f"{self.low} output tokens per request" if self.low == self.high else
                f"output lengths uniform in {self.low}..{self.high} tokens")


@dataclass(frozen=True)
class Deployment:
    """How one GPU's attention is laid out: `dp` holds every head of its own sequences (one
    data-parallel attention rank), `tpN` a 1/N share of the heads of all sequences (one rank of
    N-way tensor-parallel attention; each rank still holds the whole latent cache)."""

    name: str
    model_heads: int  # the heads of the model that runs here (split further by --tp processes)

    @staticmethod
    def parse_list(text: str, heads: int) -> List["Deployment"]:
        out = []
        for item in (t.strip() for t in text.split(",") if t.strip()):
            if item == "dp":
                out.append(Deployment("dp", heads))
                continue
            ways = int(item[2:]) if item.startswith("tp") and item[2:].isdigit() else 0
            if ways < 1 or heads % ways:
                raise argparse.ArgumentTypeError(
                    f"expected dp or tpN with N dividing --heads {heads}, got {item!r}")
            out.append(Deployment(item, heads // ways))
        if not out or len({d.name for d in out}) != len(out):
            raise argparse.ArgumentTypeError(f"expected a list of distinct deployments, got {text!r}")
        return out

    def describe(self, tp: int) -> str:
        per_gpu = self.model_heads // tp
        if self.name == "dp":
            return f"dp: {per_gpu} heads per GPU (one data-parallel attention rank)"
        ways = int(self.name[2:])
        return f"{self.name}: {per_gpu} heads per GPU (one rank of {ways}-way tensor-parallel attention)"


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m snapmla.e2e", description=(
        "Decode tokens/s of a DeepSeek-V3-shaped engine (one attention rank, 61 MLA layers, "
        "random weights) with the FP8 (SnapMLA) and the BF16 KV cache at the same memory, "
        "under continuous batching."))
    a = ap.add_argument
    a("--cache", default="both", choices=["fp8", "bf16", "both"])
    a("--contexts", default="8192,16384,32768,65536", help="prompt lengths to measure, comma-separated")
    a("--output-len-dist", dest="lengths", type=LengthDist.parse, default=LengthDist(1, 2048), metavar="DIST",
      help="output lengths: uniform:A-B (default uniform:1-2048) or fixed:N; prompt + output pages are "
           "reserved at admission")
    a("--output-len", dest="lengths", type=LengthDist.fixed, metavar="N",
      help="every request makes N output tokens (fixed:N; the later of this and --output-len-dist counts)")
    a("--first-batch", default="in-flight", choices=["in-flight", "fresh"],
      help="in-flight (default): the batch that fills the pool at the start enters at uniformly drawn "
           "progress through its output (its tokens so far prefilled), so requests retire and queued ones "
           "are admitted from the first steps, as in an engine that has been serving; fresh: every request "
           "starts its output at the window (no effect with --arrival-rate: the queue starts empty)")
    a("--requests", type=int, default=0,
      help="requests per run (default: no limit; the queue never runs dry)")
    a("--arrival-rate", type=float, default=None, metavar="R",
      help="requests arrive as a Poisson process of R per second on a clock advanced by the measured "
           "step times (default: every request is queued at the start)")
    a("--repeats", type=int, default=3, help="runs per (context, cache), interleaved fp8, bf16, fp8, ...")
    a("--deployments", default=None, metavar="LIST",
      help="comma-separated: dp (one data-parallel attention rank: --heads per GPU) and tpN (one rank of "
           "N-way tensor-parallel attention: --heads / N per GPU), e.g. dp,tp8 (default: dp with --heads)")
    a("--kv-gib", type=float, default=None,
      help="KV pool memory per GPU, the same for both caches (default: free memory after the weights, "
           "--weights-gib and --margin-gib)")
    a("--weights-gib", type=float, default=0.0,
      help="memory per GPU reserved for the rank's share of the weights the model leaves out (the MoE "
           "experts), allocated on the GPU before the pool is sized; e.g. 76 for DeepSeek-V3's FP8 "
           "experts over 8 GPUs")
    a("--margin-gib", type=float, default=6.0, help="memory left for activations and CUDA graphs")
    a("--max-batch", type=int, default=1024)
    a("--window-s", type=float, default=3.0,
      help="the first repeat's window runs until its summed step time reaches this; later repeats "
           "run as many steps")
    a("--steps", type=int, default=0, help="decode steps in every window (default: from --window-s)")
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
    a("--bf16-kernel", default="auto", choices=["auto", "snapmla", "flashmla"],
      help="the BF16 cache's decode kernel: FlashMLA's dense BF16 decode (what engines run today; needs "
           "--peers and a GPU), snapmla's decode_bf16, or auto (default): FlashMLA where --peers is given "
           "on a GPU, else decode_bf16, and the output says which")
    a("--peers", default=None, metavar="DIR",
      help="a folder with peers.py (the FlashMLA BF16 loader, as python -m snapmla.bench --peers takes)")
    # Output.
    a("--out", default=None, help="write PREFIX.json, PREFIX.md and PREFIX.png (e.g. docs/results/e2e_h200)")
    a("--commit", default=None, help="the commit the results are from (default: git rev-parse)")
    a("--tokens-out", default=None, help="write the first repeat's output tokens (JSON) for comparisons")
    a("--replot", default=None, metavar="JSON", help="only rewrite the .md and .png of a results JSON")
    args = ap.parse_args(argv)
    try:
        args.contexts = [int(c) for c in args.contexts.split(",") if c]
    except ValueError:
        ap.error(f"--contexts: expected comma-separated integers, got {args.contexts!r}")
    for name in ("max_batch", "prefill_chunk", "tp", "layers", "heads", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: expected at least 1, got {getattr(args, name)}")
    if any(c < 2 for c in args.contexts) or not args.contexts:
        ap.error(f"--contexts: expected prompt lengths of at least 2 tokens, got {args.contexts}")
    if args.kv_gib is not None and args.kv_gib <= 0:
        ap.error(f"--kv-gib: expected a positive size, got {args.kv_gib}")
    if args.weights_gib < 0:
        ap.error(f"--weights-gib: expected a size of at least 0, got {args.weights_gib}")
    if args.arrival_rate is not None and not args.arrival_rate > 0:
        ap.error(f"--arrival-rate: expected a positive rate (requests per second), got {args.arrival_rate}")
    if args.deployments is not None:
        if args.tp > 1:
            ap.error("--deployments with --tp: tpN simulates one rank of N-way attention in one process; "
                     "--tp N runs N ranks. Pass one of the two")
        try:
            args.deployments = Deployment.parse_list(args.deployments, args.heads)
        except argparse.ArgumentTypeError as e:
            ap.error(f"--deployments: {e}")
    if args.moe_standin and not args.mlp_intermediate:
        args.mlp_intermediate = 9 * 2048
    if args.bf16_kernel == "flashmla" and not args.peers:
        ap.error("--bf16-kernel flashmla: expected --peers DIR, a folder with peers.py (FlashMLA's loader)")
    if args.bf16_kernel == "flashmla" and args.device == "cpu":
        ap.error("--bf16-kernel flashmla: FlashMLA's kernel runs on an sm_90 GPU, not --device cpu")
    return args


def resolve_bf16_kernel(args: argparse.Namespace) -> None:
    """--bf16-kernel auto, once the device is known (args.device cuda or cpu): FlashMLA's kernel
    where --peers names it on a GPU, else decode_bf16; an explicit choice stays."""
    if args.bf16_kernel == "auto":
        args.bf16_kernel = "flashmla" if args.peers and args.device == "cuda" else "snapmla"


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
    """n random prompts of one length and one output length (tests, comparisons)."""
    gen = torch.Generator().manual_seed(seed)
    return [Request(i, torch.randint(0, vocab, (prompt_len,), generator=gen), output_len) for i in range(n)]


class RequestSource:
    """A run's requests in order, made as the engine takes them: request i has the i-th draw of
    seeded sequences of prompts, output lengths and arrival gaps, so every cache and repeat of a
    context sees the same requests however many it uses."""

    def __init__(self, prompt_len: int, lengths: LengthDist, vocab: int, seed: int,
                 rate: Optional[float] = None, limit: Optional[int] = None):
        self.prompt_len, self.lengths, self.vocab, self.rate, self.limit = prompt_len, lengths, vocab, rate, limit
        self._prompts = torch.Generator().manual_seed(seed)
        self._lengths = torch.Generator().manual_seed(seed + 1_000_003)
        self._gaps = torch.Generator().manual_seed(seed + 2_000_029)
        self._progress = torch.Generator().manual_seed(seed + 3_000_017)
        # True while the first batch is made (Run.fill with --first-batch in-flight): each request
        # then enters part-way through its output, as in an engine that has been serving a while.
        self.in_flight = False
        self.fresh: Dict[int, Request] = {}  # request id -> itself before its in-flight progress
        self.min_pages = pages_needed(prompt_len, lengths.low)
        self.made = 0
        self.arrival: Dict[int, float] = {}  # request id -> arrival time (0 without a rate)
        self._last_arrival = 0.0
        self._pending: Optional[Request] = None  # made, its arrival still ahead of the clock

    def _make(self) -> Optional[Request]:
        if self._pending is not None:
            req, self._pending = self._pending, None
            return req
        if self.limit is not None and self.made >= self.limit:
            return None
        i = self.made
        self.made += 1
        req = Request(i, torch.randint(0, self.vocab, (self.prompt_len,), generator=self._prompts),
                      self.lengths.sample(self._lengths))
        if self.in_flight:
            # Uniform progress g in 0 .. output_len - 1: the g tokens made so far are prefilled with
            # the prompt (random tokens, as the prompt's), and g fewer remain; its pages are those
            # of the whole request, as at its admission.
            done = int(torch.randint(0, req.output_len, (1,), generator=self._progress))
            made = torch.randint(0, self.vocab, (done,), generator=self._progress)
            self.fresh[i] = req
            req = Request(i, torch.cat([req.prompt, made]), req.output_len - done)
        if self.rate is not None:  # exponential gaps: a Poisson process of `rate` per second
            self._last_arrival += -math.log1p(-float(torch.rand(1, generator=self._gaps))) / self.rate
        self.arrival[i] = self._last_arrival
        return req

    def next_arrival(self) -> Optional[float]:
        """The arrival time of the next request not yet submitted (None: there is none)."""
        if self._pending is None:
            self._pending = self._make()
        return None if self._pending is None else self.arrival[self._pending.id]

    def feed(self, eng: Engine, clock: float) -> int:
        """Submits what has arrived by `clock`, or without a rate tops the queue up: admission takes
        from the head while it fits, so a queue as long as the requests that could fit now acts as
        an unbounded one. Returns how many were submitted."""
        submitted = 0
        if self.rate is not None:
            while (t := self.next_arrival()) is not None and t <= clock:
                eng.submit(self._make())
                submitted += 1
            return submitted
        want = min(eng.max_batch - len(eng.running), eng.pool.free_pages // self.min_pages) + 1
        while len(eng.queue) < want and (req := self._make()) is not None:
            eng.submit(req)
            submitted += 1
        return submitted


class Run:
    """One run's engine, its requests and the window's bookkeeping. The clock advances by each
    decode step's measured time (live with an arrival rate: the step's events are read as it
    ends); prefill is not on it, and with nothing running it jumps to the next arrival."""

    def __init__(self, eng: Engine, source: RequestSource, nvml=None, on_step=None):
        self.eng, self.source, self.nvml, self.on_step = eng, source, nvml, on_step
        self.live_clock = source.rate is not None
        self.clock = 0.0
        self.window_start: Optional[int] = None  # the window's first step in eng.log
        self.window_clock0 = 0.0
        self.running_at_start = 0
        self.admitted = self.retired = self.arrived = 0
        self.first_token: Dict[int, int] = {}  # request id -> window step of its first / last token
        self.last_token: Dict[int, int] = {}
        self.waits: List[float] = []  # clock at admission - arrival, requests admitted in the window
        self.sm_mhz: List[int] = []
        eng.log = []

    def _admit(self) -> int:
        arrived = self.source.feed(self.eng, self.clock)
        self.eng.admit()
        if not self.eng.running and self.live_clock:
            t = self.source.next_arrival()
            if t is not None:  # idle until the next request arrives
                self.clock = max(self.clock, t)
                arrived += self.source.feed(self.eng, self.clock)
                self.eng.admit()
        return arrived

    def fill(self, in_flight: bool = False) -> None:
        """The first admission (and prefill), before any step; in_flight: its requests enter at
        uniformly drawn progress (RequestSource.in_flight)."""
        self.source.in_flight = in_flight
        try:
            self._admit()
        finally:
            self.source.in_flight = False
        # What the first admission left queued waits at the start of its output, as later requests.
        queue = self.eng.queue
        for k, req in enumerate(queue):
            queue[k] = self.source.fresh.get(req.id, req)
        self.source.fresh.clear()  # the admitted ones' prompts are not kept twice

    def advance(self) -> bool:
        """Feeds and admits, then one decode step; False when no request is left to run."""
        eng = self.eng
        before = {r.id for r in eng.running}
        arrived = self._admit()
        if not eng.running:
            return False
        running = [r.id for r in eng.running]
        if self.window_start is not None:
            k = len(eng.log) - self.window_start  # this step's index in the window
            new = [i for i in running if i not in before]
            self.admitted += len(new)
            self.arrived += arrived
            if self.live_clock:
                self.waits += [self.clock - self.source.arrival[i] for i in new]
            for i in running:
                self.first_token.setdefault(i, k)
                self.last_token[i] = k
        eng.step()
        if self.on_step is not None:
            self.on_step(eng)
        if self.window_start is not None:
            after = {r.id for r in eng.running}
            self.retired += sum(1 for i in running if i not in after)
            k = len(eng.log) - self.window_start
            if self.nvml is not None and k % SM_CLOCK_EVERY == 1:  # the GPU is on this step now
                mhz = self.nvml.sm_mhz()
                if mhz:
                    self.sm_mhz.append(mhz)
        if self.live_clock:
            self.clock += self._agreed(eng.step_seconds(len(eng.log) - 1)[0])
        return True

    def _agreed(self, seconds: float) -> float:
        """The largest of the ranks' values: tensor-parallel ranks must admit and stop alike."""
        tp = self.eng.model.tp
        if tp.size == 1:
            return seconds
        t = torch.tensor([seconds], dtype=torch.float64, device=self.eng.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=tp.group)
        return float(t.item())

    def start_window(self) -> None:
        self.eng._sync()  # the warm-up's work is done before the window's first step
        self.window_start = len(self.eng.log)
        self.window_clock0 = self.clock
        self.running_at_start = len(self.eng.running)

    def window(self, steps: Optional[int], seconds: float, progress: "Progress", tag: str) -> int:
        """Runs `steps` decode steps, or (None) until their summed time reaches `seconds`."""
        done, summed, timed = 0, 0.0, self.window_start
        while steps is None or done < steps:
            if not self.advance():
                break
            done += 1
            if steps is None and (done % 8 == 0 or self.live_clock):
                secs = self.eng.step_seconds(timed)
                timed += len(secs)
                summed += self._agreed(sum(secs))
                if (summed >= seconds and done >= MIN_WINDOW_STEPS) or done >= MAX_WINDOW_STEPS:
                    break
            progress(f"{tag} decode step {done}{f'/{steps}' if steps else ''}, batch {len(self.eng.running)}, "
                     f"admitted {self.admitted}, retired {self.retired}", force=done == 1)
        return done

    def stats(self) -> Dict:
        eng = self.eng
        log = eng.log[self.window_start:]
        secs = eng.step_seconds(self.window_start)
        ends = [0.0] * len(secs)  # the window clock at the end of each step
        total = 0.0
        for k, s in enumerate(secs):
            total += s
            ends[k] = total
        # TPOT: (clock at the last token - at the first) / (tokens - 1), requests with >= 2 tokens.
        tpot = [(ends[self.last_token[i]] - ends[k]) / (self.last_token[i] - k)
                for i, k in self.first_token.items() if self.last_token[i] > k]
        per_ms = lambda xs, q: 1e3 * _quantile(xs, q) if xs else None  # noqa: E731
        return {
            "steps": len(log), "tokens_per_s": sum(r.batch for r in log) / sum(secs),
            "batch": statistics.mean(r.batch for r in log), "batch_max": max(r.batch for r in log),
            "batch_min": min(r.batch for r in log),
            "tokens_in_cache": statistics.mean(r.cached_tokens for r in log),
            "step_ms_mean": 1e3 * statistics.mean(secs), "step_ms_p50": 1e3 * statistics.median(secs),
            "step_ms_p99": 1e3 * _quantile(secs, 0.99),
            "admitted": self.admitted, "retired": self.retired,
            "running_at_start": self.running_at_start, "running_at_end": len(eng.running),
            "arrived": self.arrived if self.live_clock else None,
            "clock_s": (self.clock - self.window_clock0) if self.live_clock else total,
            "tpot_ms_p50": per_ms(tpot, 0.5), "tpot_ms_p99": per_ms(tpot, 0.99), "tpot_requests": len(tpot),
            "queue_wait_ms_p50": per_ms(self.waits, 0.5) if self.live_clock else None,
            "queue_wait_ms_p99": per_ms(self.waits, 0.99) if self.live_clock else None,
            "sm_mhz": round(statistics.median(self.sm_mhz)) if self.sm_mhz else None,
        }


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
            tokens_out: Optional[Dict] = None, steps: Optional[int] = None, tag: str = "",
            nvml=None, on_step=None) -> Dict:
    """One run: a fresh engine of `kv_bytes`, the first admission (prefill), warm-up steps, a
    device synchronize, then the window: `steps` decode steps (None: --window-s of step time).
    on_step(engine), if given, runs after every warm-up and window step (tests: page accounting)."""
    lengths: LengthDist = args.lengths
    eng = Engine(model, cache, kv_bytes, context + lengths.high, max_batch=args.max_batch,
                 graphs=False if args.no_graphs else None, prefill_chunk=args.prefill_chunk,
                 record_tokens=tokens_out is not None)
    need = pages_needed(context, lengths.high)
    if need > eng.pool.num_pages:
        raise SystemExit(f"--kv-gib: {kv_bytes / GIB:.3g} GiB holds {eng.pool.num_pages} {cache} pages of "
                         f"{model.cfg.layers} layers; a request of {context} + {lengths.high} tokens needs {need}")
    source = RequestSource(context, lengths, model.cfg.vocab, args.seed + 1, args.arrival_rate, args.requests or None)
    run = Run(eng, source, nvml, on_step)
    progress(f"{tag} prefill", force=True)
    run.fill(in_flight=args.first_batch == "in-flight" and args.arrival_rate is None)
    progress(f"{tag} prefill of {len(eng.running)} x {context} tokens in {eng.prefill_seconds:.1f} s; warm-up",
             force=True)
    for _ in range(args.warmup_steps):
        if not run.advance():
            break
    run.start_window()
    prefill_s0 = eng.prefill_seconds
    if run.window(steps, args.window_s, progress, tag) == 0:
        raise SystemExit(f"--requests {args.requests}: every request finished before the window "
                         f"(the warm-up takes {args.warmup_steps} steps)")
    mem = torch.cuda.max_memory_allocated(model.device) / GIB if model.device.type == "cuda" else 0.0
    row = {
        "context": context, "cache": cache, "kv_bytes": kv_bytes, "kv_gib": kv_bytes / GIB,
        "pool_bytes": eng.cache_bytes, "pool_pages": eng.pool.num_pages, "pool_tokens": eng.pool.num_pages * PAGE_SIZE,
        **run.stats(),
        "prefill_tokens": eng.prefill_tokens, "prefill_s": eng.prefill_seconds,
        "prefill_window_s": eng.prefill_seconds - prefill_s0,
        "graph_capture_s": eng.capture_seconds, "memory_gib": mem,
    }
    if tokens_out is not None:  # finish what was submitted, with no more requests
        eng.log = None
        eng.run()
        tokens_out[str(context)] = {str(r.id): r.tokens for r in eng.finished}
    progress(f"{tag} {row['tokens_per_s']:.0f} tokens/s at batch {row['batch']:.1f} over {row['steps']} steps "
             f"(admitted {row['admitted']}, retired {row['retired']}), step p50 {row['step_ms_p50']:.2f} ms",
             force=True)
    del eng, run
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
    """Stops before allocating when the weights, --weights-gib (and a given --kv-gib) do not fit
    `available`, saying what would: the full DeepSeek-V3 shapes take ~25 GiB of weights per rank."""
    reserved = int(args.weights_gib * GIB)
    need = cfg.weight_bytes(args.tp) + reserved + (int(args.kv_gib * GIB) if args.kv_gib is not None else 0)
    need += int((args.margin_gib if device.type == "cuda" else 1.0) * GIB)
    if need <= available:
        return
    per_layer = max(1, (cfg.weight_bytes(args.tp) - replace(cfg, layers=0).weight_bytes(args.tp)) // max(cfg.layers, 1))
    fixed = replace(cfg, layers=0).weight_bytes(args.tp)
    budget = available - reserved - (GIB if device.type != "cuda" else int(args.margin_gib * GIB)) - GIB // 2
    layers = int((budget - fixed) // per_layer) if budget > fixed else 0
    hint = (f"pass --layers {min(layers, cfg.layers)} --kv-gib 0.5 (the same per-layer work with fewer layers)"
            if layers >= 1 else "pass a smaller model, e.g. --layers 2 --vocab 32000 --kv-gib 0.5")
    raise SystemExit(f"e2e: {need / GIB:.1f} GiB needed on {device} (weights {cfg.weight_bytes(args.tp) / GIB:.1f} "
                     f"GiB per rank{', --weights-gib ' + format(args.weights_gib, 'g') if reserved else ''}"
                     f"{', KV pool ' + format(args.kv_gib, 'g') + ' GiB' if args.kv_gib else ''}), "
                     f"{available / GIB:.1f} GiB available: {hint}, or run on an sm_90 GPU")


def kv_budget(args, device: torch.device, tp: TensorParallel) -> int:
    """The KV pool's bytes, the same for both caches: --kv-gib, or on a GPU its free memory once
    the weights and the --weights-gib placeholder are allocated, less --margin-gib; on the CPU a
    quarter GiB, at most what the host has left after --weights-gib."""
    if args.kv_gib is not None:
        kv_bytes = int(args.kv_gib * GIB)
    elif device.type == "cuda":
        kv_bytes = int(torch.cuda.mem_get_info(device)[0] - args.margin_gib * GIB)
    else:
        kv_bytes = min(GIB // 4, available_bytes(device) - int(args.weights_gib * GIB) - GIB)
    if tp.size > 1:  # every rank the same budget: the smallest
        t = torch.tensor([kv_bytes], dtype=torch.int64, device=device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
        kv_bytes = int(t.item())
    if kv_bytes <= 0:
        raise SystemExit(f"--kv-gib: nothing is left for the KV pool after the weights, --weights-gib "
                         f"{args.weights_gib:g} and --margin-gib {args.margin_gib:g}")
    return kv_bytes


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
    resolve_bf16_kernel(args)
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


def sm_clock(device: torch.device):
    """NVML's SM clock reader for `device`, or None (no GPU, or no libnvidia-ml)."""
    if device.type != "cuda":
        return None
    from ..bench import Nvml
    nvml = Nvml(device.index if device.index is not None else torch.cuda.current_device())
    return nvml if nvml.sm_mhz() else None


def _run(args, tp: TensorParallel) -> int:
    lead = tp.rank == 0
    progress = Progress(lead)
    device = torch.device(f"cuda:{torch.cuda.current_device()}") if args.device == "cuda" else torch.device("cpu")
    base = replace(ModelConfig(), layers=args.layers, hidden=args.hidden, heads=args.heads,
                   q_lora_rank=args.q_lora_rank, qk_nope_dim=args.qk_nope_dim, v_head_dim=args.v_head_dim,
                   vocab=args.vocab, rope=args.rope, mlp_intermediate=args.mlp_intermediate)
    deployments = args.deployments or [Deployment("dp" if tp.size == 1 else f"tp{tp.size}", args.heads)]
    for dep in deployments:
        if dep.model_heads % tp.size:
            raise SystemExit(f"--heads {dep.model_heads} / --tp {tp.size}: expected a head count that --tp divides")
    caches = ["fp8", "bf16"] if args.cache == "both" else [args.cache]
    largest = replace(base, heads=max(d.model_heads for d in deployments))
    check_memory(largest, args, device, available_bytes(device))
    # The rank's share of the weights the model leaves out, really allocated, so that the pool is
    # sized from the memory an engine serving the whole model would have left.
    placeholder = (torch.empty(int(args.weights_gib * GIB), dtype=torch.uint8, device=device)
                   if device.type == "cuda" and args.weights_gib > 0 else None)
    nvml = sm_clock(device)
    tokens_out: Optional[Dict] = {} if args.tokens_out else None
    runs: List[Dict] = []
    budgets: List[Dict] = []
    for dep in deployments:
        cfg = replace(base, heads=dep.model_heads)
        progress(f"e2e {dep.name}: weights ({cfg.weight_bytes(tp.size) / GIB:.1f} GiB per rank) on {device}",
                 force=True)
        t0 = time.perf_counter()
        flashmla = None
        if args.bf16_kernel == "flashmla":
            if device.type != "cuda":
                raise SystemExit("--bf16-kernel flashmla: FlashMLA's kernel needs an sm_90 GPU")
            from ..bench import load_peers
            # Its scheduler metadata is reset each step (Model.decode_step): the first layer computes
            # it on the GPU for the step's lengths, the other layers reuse it, as engines do.
            flashmla = load_peers(args.peers).FlashMLA(None, 1, cfg.heads // tp.size)
        model = Model(cfg, device, seed=args.seed, tp=tp, max_pos=max(args.contexts) + args.lengths.high,
                      flashmla=flashmla)
        weights_s = time.perf_counter() - t0
        kv_bytes = kv_budget(args, device, tp)
        budget = {"deployment": dep.name, "heads": cfg.heads // tp.size, "label": dep.describe(tp.size),
                  "weights_gib": cfg.weight_bytes(tp.size) / GIB, "reserved_gib": args.weights_gib,
                  "margin_gib": args.margin_gib if device.type == "cuda" and args.kv_gib is None else None,
                  "kv_gib": kv_bytes / GIB, "kv_from": "--kv-gib" if args.kv_gib is not None else "free memory",
                  "weights_init_s": weights_s}
        budgets.append(budget)
        progress(f"e2e {dep.name}: {report.budget_text(budget)}", force=True)
        dep_tokens: Optional[Dict] = None
        if tokens_out is not None:
            dep_tokens = tokens_out if args.deployments is None else tokens_out.setdefault(dep.name, {})
        for context in args.contexts:
            steps_of: Dict[str, int] = {}
            for rep in range(args.repeats):
                for cache in caches:  # interleaved: fp8, bf16, fp8, bf16, ...
                    tag = f"[{dep.name} {cache} {context} #{rep + 1}]"
                    sink = dep_tokens.setdefault(cache, {}) if dep_tokens is not None and rep == 0 else None
                    row = measure(model, cache, kv_bytes, context, args, progress, sink,
                                  steps=args.steps or steps_of.get(cache), tag=tag, nvml=nvml)
                    steps_of.setdefault(cache, row["steps"])
                    runs.append({"deployment": dep.name, "heads": cfg.heads // tp.size, "repeat": rep, **row})
        del model, flashmla
        if device.type == "cuda":
            torch.cuda.empty_cache()
    del placeholder
    progress.done()
    if not lead:
        return 0
    doc = summarize(args, base, device, tp, budgets, runs, caches)
    print(report.markdown(doc) if len(caches) == 2 else json.dumps(doc["runs"], indent=1))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        for path in report.write(doc, args.out):
            print(f"e2e: wrote {path}")
    if tokens_out is not None:
        with open(args.tokens_out, "w") as f:
            json.dump(tokens_out, f)
    return 0


# Per-run values whose median over the repeats a results row gives, per cache.
MEDIAN_FIELDS = ("batch", "batch_max", "batch_min", "steps", "admitted", "retired", "arrived", "step_ms_mean",
                 "step_ms_p50", "step_ms_p99", "tokens_in_cache", "tpot_ms_p50", "tpot_ms_p99", "tpot_requests",
                 "queue_wait_ms_p50", "queue_wait_ms_p99", "clock_s", "sm_mhz", "memory_gib", "pool_tokens",
                 "pool_bytes", "prefill_s", "prefill_window_s", "graph_capture_s")


def _median(values: List) -> Optional[float]:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def pair_row(fp8_runs: List[Dict], bf16_runs: List[Dict]) -> Dict:
    """One (deployment, context) row from its repeats: median tokens/s and min-max per cache,
    each repeat's value, the medians of the other fields, and the gain split into the batch ratio
    and the step ratio (speedup = batch ratio x step ratio; with one repeat the step ratio is
    BF16's mean step time over FP8's)."""
    first = fp8_runs[0]
    row = {"deployment": first["deployment"], "heads": first["heads"], "context": first["context"],
           "kv_gib": first["kv_gib"], "repeats": len(fp8_runs)}
    for cache, rs in (("fp8", fp8_runs), ("bf16", bf16_runs)):
        values = [r["tokens_per_s"] for r in rs]
        row[f"{cache}_tokens_per_s"] = statistics.median(values)
        row[f"{cache}_tokens_per_s_range"] = [min(values), max(values)]
        row[f"{cache}_tokens_per_s_repeats"] = values
        for key in MEDIAN_FIELDS:
            row[f"{cache}_{key}"] = _median([r.get(key) for r in rs])
    row["speedup"] = row["fp8_tokens_per_s"] / row["bf16_tokens_per_s"]
    row["batch_ratio"] = row["fp8_batch"] / row["bf16_batch"]
    row["step_ratio"] = row["speedup"] / row["batch_ratio"]
    return row


def summarize(args, cfg: ModelConfig, device, tp: TensorParallel, budgets: List[Dict], runs: List[Dict],
              caches: List[str]) -> Dict:
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU reference"
    bf16_kernel = ("FlashMLA's dense BF16 decode (its own split scheduler, computed once per step)"
                   if args.bf16_kernel == "flashmla" else
                   "snapmla's decode_bf16 (FlashMLA's kernel, what engines run today, was not given: pass "
                   "--peers DIR on a GPU to measure against it)")
    mlp = (f"a dense stand-in for the MoE (SwiGLU, intermediate {cfg.mlp_intermediate}, one weight set shared "
           f"by the layers)" if cfg.mlp_intermediate else "MoE / MLP left out (attention layers only)")
    heads = ", ".join(f"{b['heads']} ({b['deployment']})" for b in budgets)
    lengths: LengthDist = args.lengths
    setup = (f"{cfg.layers} MLA layers (hidden {cfg.hidden}, heads per GPU {heads}"
             f"{f' / TP {tp.size}' if tp.size > 1 else ''}, q_lora {cfg.q_lora_rank}, kv_lora {cfg.kv_lora_rank}, "
             f"qk_nope {cfg.qk_nope_dim}, qk_rope {cfg.qk_rope_dim}, v_head {cfg.v_head_dim}, vocab {cfg.vocab}), "
             f"{'YaRN (factor 40, DeepSeek-V3)' if cfg.rope == 'yarn' else 'plain'} RoPE, random bf16 weights, "
             f"{mlp}. Either cache gets the same KV pool bytes ({BYTES_PER_TOKEN['fp8']} vs "
             f"{BYTES_PER_TOKEN['bf16']} bytes per token and layer); prompts of `context` tokens, "
             f"{lengths.describe()}, prompt + output pages reserved at admission. "
             f"The BF16 cache's decode kernel: {bf16_kernel}.")
    window = (f"{args.steps} decode steps" if args.steps else
              f"the first repeat's window runs until its summed step time reaches {args.window_s:g} s, "
              f"later repeats run as many steps")
    graphs = device.type == "cuda" and not args.no_graphs
    notes = [
        "Decode tokens/s = tokens made in the window / the window's summed step times, where a step's time is "
        + ("the CUDA-event time of its decode graph replay (one graph per batch-size bucket)" if graphs else
           "the host time of the eager step")
        + "; a step is embed, per layer: projections, append, quantize_query, decode with one plan per step, "
          "output projection; lm_head, greedy. Prefill is not in tokens/s or in the step times.",
        "Continuous batching: requests that finish in the window free their pages and queued ones are admitted "
        "(their prompts prefilled, each layer's KV projection on the prompt's embeddings written with the "
        "library's append in chunks of %d tokens) and join the next step; `admitted` / `retired` count them "
        "over the window, `batch` is its mean batch. Warm-up: %d steps and a device synchronize, then the "
        "window: %s." % (args.prefill_chunk, args.warmup_steps, window),
        (f"Arrivals: a Poisson process of {args.arrival_rate:g} requests per second on a clock that advances by "
         "each step's measured time and jumps to the next arrival while nothing runs; prefill is not on this "
         "clock. Queue wait = clock at admission - arrival." if args.arrival_rate else
         "Arrivals: every request is queued at the start (the queue never runs dry)"
         + ("; the batch that first fills the pool enters at uniformly drawn progress through its output "
            "(its tokens so far prefilled with the prompt), as in an engine that has been serving, so "
            "`context` is the prompt length and the mean tokens per sequence is larger."
            if args.first_batch == "in-flight" else "; every request starts its output at the window."))
        + " TPOT of a request = (clock at its last token in the window - at its first) / (tokens - 1), over the "
          "requests with at least 2 tokens in the window; the clock is the summed step times, prefill not on it.",
        f"Repeats: {args.repeats} per (deployment, context), the caches interleaved (fp8, bf16, fp8, bf16, ...), a "
        "fresh engine each, the same requests; tokens/s is the median (min-max) over the repeats, the other "
        "columns medians. SM clock: NVML's, sampled every %d steps of the window (median)." % SM_CLOCK_EVERY,
        "Memory used: peak allocated by PyTorch in the run (weights + reserved + pool + activations).",
    ]
    idle = sum(1 for r in runs if r["retired"] == 0)
    if idle:
        notes.append(f"In {idle} of {len(runs)} runs no request finished in the window: it is short against the "
                     "output lengths (a longer --window-s or --steps, or shorter --output-len-dist, gives more).")
    results = []
    if len(caches) == 2:
        for dep in budgets:
            for context in args.contexts:
                pick = lambda c: [r for r in runs if r["deployment"] == dep["deployment"]  # noqa: E731
                                  and r["context"] == context and r["cache"] == c]
                row = pair_row(pick("fp8"), pick("bf16"))
                row["bf16_kernel"] = args.bf16_kernel
                results.append(row)
    return {"gpu": gpu, "date": datetime.date.today().isoformat(), "commit": _commit(args), "setup": setup,
            "notes": notes, "tp": tp.size, "bf16_kernel": args.bf16_kernel, "repeats": args.repeats,
            "output_len_dist": str(lengths), "arrival_rate": args.arrival_rate,
            "weights_reserved_gib": args.weights_gib, "deployments": budgets, "results": results, "runs": runs}
