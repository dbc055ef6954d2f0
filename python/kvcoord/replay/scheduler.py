"""The simulated continuous-batching scheduler: the only module that touches the manager.

Everything that calls :class:`kvcoord.KVCacheManager` (building its config,
driving it step by step, counting evictions) lives here so that the rest of
``kvcoord.replay`` stays manager-independent.

The loop follows vLLM 0.33's scheduler (spec section 6.4), FCFS, without
speculative decoding or a KV connector:

1. arrivals up to the simulated clock join the waiting queue, and
   ``new_step_starts()`` is called when the manager has it;
2. running requests, in admission order, get ``min(tokens left to compute,
   budget left)`` new tokens (chunked prefill; 1 while decoding). When
   ``allocate_slots`` returns None the most recently admitted running request
   is preempted (blocks freed, ``num_computed_tokens = 0``, back to the front
   of the waiting queue) and the allocation retried;
3. when nothing was preempted, waiting requests are admitted while the
   running cap and the token budget allow: ``get_computed_blocks`` then
   ``allocate_slots`` with the hit; a None stops admission;
4. the step "runs": computed tokens advance, a request whose tokens are all
   computed samples one output token, and a request with all its output is
   freed.

The simulated clock advances by ``step_base_s + step_token_s * tokens`` per
step and jumps to the next arrival when idle. Time inside manager calls is
measured with ``perf_counter`` per step.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

from kvcoord.config import KVCacheConfig
from kvcoord.hashing import HashAlgoName
from kvcoord.manager import KVCacheManager, KVCacheManagerOptions
from kvcoord.replay.bestcase import BestCase, BestCaseTracker
from kvcoord.replay.layouts import Layout
from kvcoord.replay.workloads import Workload, WorkloadRequest

__all__ = [
    "EvictionCounter",
    "SimConfig",
    "SimResult",
    "SimulationError",
    "build_config",
    "make_manager",
    "simulate",
]


class SimulationError(RuntimeError):
    """The workload cannot be replayed with this configuration (e.g. a request never fits)."""


@dataclass
class SimConfig:
    """Scheduler and pool parameters of one replay."""

    layout: Layout
    num_blocks: int
    max_running: int = 256
    token_budget: int = 8192
    max_model_len: int | None = None
    #: Simulated step time: ``step_base_s + step_token_s * scheduled tokens``.
    step_base_s: float = 0.005
    step_token_s: float = 2e-6
    #: Multiplies arrival times (0: everything arrives at once).
    time_scale: float = 1.0
    #: Also compute the best possible hit rate (unbounded cache) from the same
    #: tokens, as each request is first scheduled (arrival order).
    track_best: bool = True


@dataclass
class SimResult:
    """Raw accounting of one replay; ``report.summarize`` turns it into metrics."""

    num_requests: int = 0
    num_finished: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    output_tokens: int = 0
    computed_tokens: int = 0
    preemptions: int = 0
    evictions: int = 0
    steps: int = 0
    sim_seconds: float = 0.0
    #: Simulated seconds with at least one request scheduled.
    busy_seconds: float = 0.0
    manager_seconds: float = 0.0
    wall_seconds: float = 0.0
    #: Wall time building prompt/output tokens, in the best-possible pass, and
    #: constructing ``kvcoord.Request`` objects (block hashing), outside manager_seconds.
    token_seconds: float = 0.0
    best_seconds: float = 0.0
    request_seconds: float = 0.0
    leaked_blocks: int = 0
    #: Best possible hits with an unbounded cache (``SimConfig.track_best``).
    best: BestCase | None = None
    num_blocks: int = 0
    #: Per step: manager seconds, pool usage, simulated time, cumulative hit rate.
    step_manager_s: array[float] = field(default_factory=lambda: array("d"))
    step_usage: array[float] = field(default_factory=lambda: array("d"))
    step_time: array[float] = field(default_factory=lambda: array("d"))
    step_hit_rate: array[float] = field(default_factory=lambda: array("d"))


# --------------------------------------------------------------------------- manager setup


#: Hash algorithm of the simulated requests: only prefix equality matters
#: here, so the fastest one.
REPLAY_HASH_ALGO: HashAlgoName = "xxh3_native"


def build_config(layout: Layout, num_blocks: int) -> KVCacheConfig:
    """The ``kvcoord.KVCacheConfig`` for ``layout`` with a pool of ``num_blocks``."""
    return KVCacheConfig(num_blocks=num_blocks, groups=layout.groups)


def make_manager(layout: Layout, num_blocks: int, max_model_len: int) -> KVCacheManager:
    """A ``KVCacheManager`` for the layout with a pool of ``num_blocks``."""
    return KVCacheManager(
        build_config(layout, num_blocks),
        max_model_len=max_model_len,
        options=KVCacheManagerOptions(enable_caching=layout.enable_caching),
    )


class EvictionCounter:
    """Counts cached blocks whose cache entry was dropped to reuse the block,
    from the pool's own counter (``BlockPool.num_evictions``; always 0 with
    prefix caching off)."""

    def __init__(self, mgr: KVCacheManager) -> None:
        self._pool = mgr.block_pool
        self._base = self._pool.num_evictions

    @property
    def count(self) -> int:
        return int(self._pool.num_evictions - self._base)


# --------------------------------------------------------------------------- the loop


class _Live:
    """Scheduler-side state of one request."""

    __slots__ = ("computed", "counted", "num_tokens", "out", "out_len", "out_pos", "req", "wr")

    def __init__(self, wr: WorkloadRequest) -> None:
        self.wr = wr
        self.req: Any = None
        self.out: list[int] = []
        self.out_pos = 0
        self.out_len = wr.output_len
        self.num_tokens = wr.prompt_len
        self.computed = 0
        self.counted = False

    def advance(self, computed: int) -> bool:
        """The step ran: ``computed`` tokens now have KV. A request whose known
        tokens are all computed samples its next output token. True when that
        was its last output token (the request is finished)."""
        self.computed = computed
        req = self.req
        req.num_computed_tokens = computed
        if computed < self.num_tokens:
            return False
        req.append_output_token_ids(self.out[self.out_pos])
        self.out_pos += 1
        self.num_tokens += 1
        return self.out_pos >= self.out_len


def simulate(
    workload: Workload,
    cfg: SimConfig,
    progress: Callable[[int], None] | None = None,
) -> SimResult:
    """Replay ``workload`` against a fresh ``KVCacheManager``; ``progress(n)`` per n finished."""
    from kvcoord import Request

    wall0 = perf_counter()
    layout = cfg.layout
    max_model_len = cfg.max_model_len or workload.max_sequence_len
    mgr = make_manager(layout, cfg.num_blocks, max_model_len)
    hash_bs = mgr.hash_block_size
    best = BestCaseTracker(layout.block_size) if cfg.track_best else None
    evictions = EvictionCounter(mgr)
    pool = mgr.block_pool

    res = SimResult(num_requests=len(workload.requests), num_blocks=cfg.num_blocks)
    pending = deque(workload.requests)
    waiting: deque[_Live] = deque()
    running: list[_Live] = []
    scale = cfg.time_scale
    max_running, token_budget = cfg.max_running, cfg.token_budget
    now = busy = 0.0
    mgr_total = 0.0
    prompt_tokens = hit_tokens = 0
    pc = perf_counter
    allocate = mgr.allocate_slots
    step_mgr, step_usage, step_time, step_hit = (
        res.step_manager_s,
        res.step_usage,
        res.step_time,
        res.step_hit_rate,
    )

    while pending or waiting or running:
        while pending and pending[0].arrival_s * scale <= now:
            waiting.append(_Live(pending.popleft()))
        if not waiting and not running:
            now = pending[0].arrival_s * scale
            continue

        budget = token_budget
        step_mgr_s = 0.0
        finished: list[_Live] = []
        preempted = False
        # 2. running requests, in admission order. A scheduled request's step
        # outcome (tokens computed, token sampled) is applied right away: later
        # requests of the step never depend on it, and frees wait for the end.
        for live in running:  # the list only loses its tail (preemption) meanwhile
            if budget <= 0:
                break
            n = live.num_tokens - live.computed
            if n > budget:
                n = budget
            req = live.req
            while True:
                t0 = pc()
                new = allocate(req, n)
                step_mgr_s += pc() - t0
                if new is not None:
                    break
                victim = running.pop()
                if not running and victim is live:
                    raise SimulationError(
                        f"request {live.wr.request_id} ({live.num_tokens} tokens) does not fit in "
                        f"a pool of {cfg.num_blocks} blocks even alone; use a larger pool"
                    )
                t0 = pc()
                mgr.free(victim.req)
                step_mgr_s += pc() - t0
                victim.req.num_computed_tokens = 0
                victim.computed = 0
                waiting.appendleft(victim)
                res.preemptions += 1
                preempted = True
                if victim is live:
                    break
            if new is None:
                break
            budget -= n
            if live.advance(live.computed + n):
                finished.append(live)

        # 3. admissions
        if not preempted:
            while waiting and len(running) < max_running and budget > 0:
                live = waiting[0]
                wr = live.wr
                req = live.req
                if req is None:
                    # first attempt: in arrival order (only preempted requests jump the queue)
                    t0 = pc()
                    toks = wr.make_prompt()
                    live.out = wr.output_tokens()
                    t1 = pc()
                    if best is not None:
                        best.add(toks, live.out, wr.cache_salt)
                    t2 = pc()
                    # The simulation only needs equal prefixes to hash equal, so it
                    # uses the fastest algorithm; hit rates do not depend on it.
                    req = live.req = Request(
                        wr.request_id,
                        toks,
                        hash_block_size=hash_bs,
                        hash_algo=REPLAY_HASH_ALGO,
                        cache_salt=wr.cache_salt,
                    )
                    res.token_seconds += t1 - t0
                    res.best_seconds += t2 - t1
                    res.request_seconds += pc() - t2
                    del toks
                t0 = pc()
                blocks, hit = mgr.get_computed_blocks(req)
                step_mgr_s += pc() - t0
                n = live.num_tokens - hit
                if n > budget:
                    n = budget
                t0 = pc()
                new = mgr.allocate_slots(
                    req, n, num_new_computed_tokens=hit, new_computed_blocks=blocks
                )
                step_mgr_s += pc() - t0
                if new is None:
                    if not running and budget == token_budget:
                        raise SimulationError(
                            f"request {wr.request_id} ({live.num_tokens} tokens) cannot be "
                            f"admitted into an empty pool of {cfg.num_blocks} blocks; "
                            "use a larger pool"
                        )
                    break
                waiting.popleft()
                if not live.counted:
                    live.counted = True
                    prompt_tokens += wr.prompt_len
                    hit_tokens += min(hit, wr.prompt_len)
                running.append(live)
                budget -= n
                if live.advance(hit + n):
                    finished.append(live)

        usage = mgr.usage

        # 4. end of step: finished requests are freed
        if finished:
            for live in finished:
                t0 = pc()
                mgr.free(live.req)
                step_mgr_s += pc() - t0
                live.req = None
                live.out_pos = -1
                res.output_tokens += live.out_len
            res.num_finished += len(finished)
            running = [r for r in running if r.out_pos >= 0]
            if progress is not None:
                progress(len(finished))

        tokens = token_budget - budget
        res.computed_tokens += tokens
        dt = cfg.step_base_s + cfg.step_token_s * tokens
        now += dt
        busy += dt
        mgr_total += step_mgr_s
        step_mgr.append(step_mgr_s)
        step_usage.append(usage)
        step_time.append(now)
        step_hit.append(hit_tokens / prompt_tokens if prompt_tokens else 0.0)

    res.steps = len(step_mgr)
    res.sim_seconds = now
    res.busy_seconds = busy
    res.prompt_tokens = prompt_tokens
    res.hit_tokens = hit_tokens
    res.manager_seconds = mgr_total
    res.evictions = evictions.count
    res.best = best.result() if best is not None else None
    res.leaked_blocks = (pool.num_blocks - 1) - pool.num_free_blocks
    res.wall_seconds = perf_counter() - wall0
    return res
