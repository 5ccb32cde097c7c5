"""Continuous batching over a paged KV pool: a request queue, admission while pages are free,
chunked prefill through the library's append, decode steps captured in CUDA graphs per
batch-size bucket, pages freed when a request ends.

Admission reserves a request's pages for its whole length (prompt + output) up front, so a
running request never waits for memory and nothing is preempted. One page table serves every
layer: page p of the pool is page p of each layer's cache.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional

import torch

from .. import PAGE_SIZE, alloc_bf16_cache, alloc_fp8_cache
from .model import Model

# Cache bytes per token and layer: 512 e4m3 + a float32 scale + 64 bf16 rope, or 576 bf16.
BYTES_PER_TOKEN = {"fp8": 512 + 4 + 2 * 64, "bf16": 2 * 576}


def pages_for_budget(kv_bytes: int, layers: int, cache: str) -> int:
    """Pages of `cache` that `layers` layers can hold in `kv_bytes`."""
    if cache not in BYTES_PER_TOKEN:
        raise ValueError(f"--cache: expected one of {sorted(BYTES_PER_TOKEN)}, got {cache!r}")
    return int(kv_bytes) // (layers * PAGE_SIZE * BYTES_PER_TOKEN[cache])


def pages_needed(prompt_len: int, output_len: int) -> int:
    """The prompt's first prompt_len - 1 tokens are prefilled; each decode step then appends
    the token it reads, the last prompt token first."""
    return -(-(prompt_len + output_len - 1) // PAGE_SIZE)


class PagePool:
    """Page accounting: a free list and each page's owner."""

    def __init__(self, num_pages: int):
        self.num_pages = num_pages
        self._free: List[int] = list(range(num_pages - 1, -1, -1))
        self._owner: List[Optional[int]] = [None] * num_pages

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def alloc(self, n: int, owner: int) -> List[int]:
        if n > len(self._free):
            raise RuntimeError(f"page pool: {n} pages asked, {len(self._free)} free")
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            self._owner[p] = owner
        return pages

    def release(self, pages: List[int], owner: int) -> None:
        for p in pages:
            if self._owner[p] != owner:
                raise RuntimeError(f"page pool: page {p} freed by {owner}, owned by {self._owner[p]}")
            self._owner[p] = None
            self._free.append(p)

    def check(self, owners: Dict[int, List[int]]) -> None:
        """Every page is either free or held by exactly the request that owns it."""
        held = [p for pages in owners.values() for p in pages]
        if len(set(held)) != len(held):
            raise AssertionError("page pool: a page is held twice")
        if len(set(self._free)) != len(self._free) or set(held) & set(self._free):
            raise AssertionError("page pool: a page is both free and held, or free twice")
        if len(held) + len(self._free) != self.num_pages:
            raise AssertionError("page pool: pages leaked")
        for rid, pages in owners.items():
            if any(self._owner[p] != rid for p in pages):
                raise AssertionError(f"page pool: request {rid} holds a page it does not own")


@dataclass
class Request:
    id: int
    prompt: torch.Tensor  # [prompt_len] int64, on the host
    output_len: int
    pages: List[int] = field(default_factory=list)
    steps: int = 0  # decode steps done = output tokens made
    tokens: List[int] = field(default_factory=list)  # the output, when the engine records it

    @property
    def cached_tokens(self) -> int:
        return len(self.prompt) - 1 + self.steps


@dataclass
class StepRecord:
    batch: int
    cached_tokens: int
    seconds: Optional[float] = None  # CPU steps; CUDA steps time through their events
    events: Optional[tuple] = None


def batch_buckets(max_batch: int) -> List[int]:
    """CUDA-graph batch sizes: 1, 2, 4, then every multiple of 8 (16 above 256)."""
    sizes = [b for b in (1, 2, 4) if b < max_batch] + list(range(8, min(max_batch, 256) + 1, 8))
    sizes += list(range(272, max_batch + 1, 16))
    if not sizes or sizes[-1] < max_batch:
        sizes.append(max_batch)
    return sizes


class Engine:
    def __init__(self, model: Model, cache: str, kv_bytes: int, max_len: int, *,
                 max_batch: int = 256, graphs: Optional[bool] = None, prefill_chunk: int = 16384,
                 record_tokens: bool = False):
        self.model, self.cache_kind = model, cache
        self.device = model.device
        num_pages = pages_for_budget(kv_bytes, model.cfg.layers, cache)
        if num_pages < 1:
            raise ValueError(f"--kv-gib: {kv_bytes / 2**30:.3g} GiB holds no {cache} page of "
                             f"{model.cfg.layers} layers ({model.cfg.layers * PAGE_SIZE * BYTES_PER_TOKEN[cache]} bytes)")
        self.pool = PagePool(num_pages)
        alloc = alloc_fp8_cache if cache == "fp8" else alloc_bf16_cache
        self.caches = [alloc(num_pages, model.embed) for _ in range(model.cfg.layers)]
        self.cache_bytes = sum(t.numel() * t.element_size()
                               for c in self.caches for t in (c if isinstance(c, tuple) else (c,)))
        self.max_len, self.max_batch, self.prefill_chunk = max_len, max_batch, prefill_chunk
        self.record_tokens = record_tokens
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        self.max_pages = -(-max_len // PAGE_SIZE)
        dev = self.device
        # The decode state, one row per running request (rows [0, running) are live).
        self.tokens = torch.zeros(max_batch, dtype=torch.long, device=dev)
        self.positions = torch.full((max_batch,), -1, dtype=torch.int32, device=dev)
        self.block_table = torch.zeros(max_batch, self.max_pages, dtype=torch.int32, device=dev)
        self.running: List[Request] = []
        self.queue: Deque[Request] = deque()
        self.finished: List[Request] = []
        self.buckets = batch_buckets(max_batch)
        self._graphs: Dict[int, "torch.cuda.CUDAGraph"] = {}
        self._graph_pool = torch.cuda.graph_pool_handle() if self.graphs else None
        self.capture_seconds = 0.0
        self.prefill_seconds = 0.0
        self.prefill_tokens = 0
        self.admitted = 0  # requests admitted so far (finished ones are in self.finished)
        self.log: Optional[List[StepRecord]] = None  # set to a list to record steps

    # -- requests -----------------------------------------------------------------------------

    def submit(self, req: Request) -> None:
        length = len(req.prompt) + req.output_len
        if len(req.prompt) < 1 or req.output_len < 1:
            raise ValueError(f"request {req.id}: needs a prompt and an output of at least one token")
        if length > self.max_len:
            raise ValueError(f"request {req.id}: {length} tokens, more than the engine's max_len {self.max_len}")
        if pages_needed(len(req.prompt), req.output_len) > self.pool.num_pages:
            raise ValueError(f"--kv-gib: request {req.id} needs {pages_needed(len(req.prompt), req.output_len)} "
                             f"pages, the {self.cache_kind} pool has {self.pool.num_pages}")
        self.queue.append(req)

    def owners(self) -> Dict[int, List[int]]:
        return {r.id: r.pages for r in self.running}

    def admit(self) -> int:
        """Moves queued requests into the batch while pages and rows are free, prefilling their
        prompts; returns how many were admitted."""
        new: List[Request] = []
        while (self.queue and len(self.running) + len(new) < self.max_batch
               and pages_needed(len(self.queue[0].prompt), self.queue[0].output_len) <= self.pool.free_pages):
            req = self.queue.popleft()
            req.pages = self.pool.alloc(pages_needed(len(req.prompt), req.output_len), req.id)
            new.append(req)
        if new:
            self.admitted += len(new)
            self._prefill(new)
            for req in new:
                row = len(self.running)
                self.running.append(req)
                table = torch.zeros(self.max_pages, dtype=torch.int32)
                table[:len(req.pages)] = torch.tensor(req.pages, dtype=torch.int32)
                self.block_table[row].copy_(table)
                self.tokens[row] = int(req.prompt[-1])
                self.positions[row] = len(req.prompt) - 1
        return len(new)

    def _prefill(self, reqs: List[Request]) -> None:
        """All prompt tokens but the last, in chunks of at most prefill_chunk tokens."""
        t0 = time.perf_counter()
        pieces = []  # (tokens, positions, slots) per request
        for req in reqs:
            n = len(req.prompt) - 1
            pos = torch.arange(n)
            pages = torch.tensor(req.pages, dtype=torch.long)
            pieces.append((req.prompt[:n], pos, (pages[pos // PAGE_SIZE] * PAGE_SIZE + pos % PAGE_SIZE).int()))
        tokens, positions, slots = (torch.cat(parts) for parts in zip(*pieces))
        for lo in range(0, len(tokens), self.prefill_chunk):
            hi = lo + self.prefill_chunk
            self.model.prefill(self.caches, tokens[lo:hi].to(self.device), positions[lo:hi].to(self.device),
                               slots[lo:hi].to(self.device))
        self._sync()
        self.prefill_tokens += len(tokens)
        self.prefill_seconds += time.perf_counter() - t0

    # -- decode -------------------------------------------------------------------------------

    def bucket(self, n: int) -> int:
        return next(b for b in self.buckets if b >= n)

    def _graph(self, b: int):
        graph = self._graphs.get(b)
        if graph is None:
            t0 = time.perf_counter()
            # Warm-up (cuBLAS handles, the allocator) on inactive scratch rows: nothing is
            # written to the cache. Capture records without running.
            scratch = (torch.zeros_like(self.tokens[:b]), torch.full_like(self.positions[:b], -1),
                       torch.zeros_like(self.block_table[:b]))
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    self.model.decode_step(self.caches, *scratch)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._graph_pool):
                self.model.decode_step(self.caches, self.tokens[:b], self.positions[:b], self.block_table[:b])
            self._sync()
            self._graphs[b] = graph
            self.capture_seconds += time.perf_counter() - t0
        return graph

    def step(self) -> None:
        """One decode step of the running batch, then bookkeeping: finished requests free their
        pages and the last rows move into their places."""
        n = len(self.running)
        if n == 0:
            raise RuntimeError("engine: step() with no running request")
        rec = StepRecord(n, sum(r.cached_tokens for r in self.running) + n) if self.log is not None else None
        if self.graphs:
            graph = self._graph(self.bucket(n))
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            if rec is not None:
                rec.events = (start, end)
        else:
            t0 = time.perf_counter()
            self.model.decode_step(self.caches, self.tokens[:n], self.positions[:n], self.block_table[:n])
            self._sync()
            if rec is not None:
                rec.seconds = time.perf_counter() - t0
        if rec is not None:
            self.log.append(rec)
        out = self.tokens[:n].tolist() if self.record_tokens else None
        done = []
        for row, req in enumerate(self.running):
            req.steps += 1
            if out is not None:
                req.tokens.append(out[row])
            if req.steps == req.output_len:
                done.append(row)
        for row in reversed(done):
            self._retire(row)

    def _retire(self, row: int) -> None:
        req = self.running[row]
        last = len(self.running) - 1
        if row != last:  # device-side copies: no host synchronization
            self.tokens[row] = self.tokens[last]
            self.positions[row] = self.positions[last]
            self.block_table[row] = self.block_table[last]
            self.running[row] = self.running[last]
        self.positions[last] = -1
        self.running.pop()
        self.pool.release(req.pages, req.id)
        req.pages = []
        self.finished.append(req)

    def run(self, check_pages: bool = False) -> None:
        """Admits and decodes until every submitted request has finished."""
        while self.queue or self.running:
            self.admit()
            if check_pages:
                self.pool.check(self.owners())
            self.step()
        if check_pages:
            self.pool.check(self.owners())

    def step_seconds(self, first: int = 0) -> List[float]:
        """The durations of the logged steps from log[first] on (synchronizes)."""
        self._sync()
        return [r.seconds if r.events is None else r.events[0].elapsed_time(r.events[1]) / 1e3
                for r in (self.log or [])[first:]]

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
