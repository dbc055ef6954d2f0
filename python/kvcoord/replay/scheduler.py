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

The simulated clock advances by the step time of
:class:`~kvcoord.replay.timing.StepTimeModel` when ``SimConfig.step_model``
is set (a roofline of the model on its GPUs), else by ``step_base_s +
step_token_s * tokens``, and jumps to the next arrival when idle. Time inside
manager calls is measured with ``perf_counter`` per step.

With ``SimConfig.host_tier`` set, a request's prefix is also looked up in
the host tier (:mod:`~kvcoord.replay.tiers`) after the GPU pool: the extra
tokens found there are loaded (their transfer time is added to the step),
not recomputed.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

from kvcoord.config import KVCacheConfig
from kvcoord.hashing import HashAlgoName
from kvcoord.manager import KVCacheManager, KVCacheManagerOptions
from kvcoord.replay.bestcase import BestCase, BestCaseTracker
from kvcoord.replay.layouts import Layout
from kvcoord.replay.tiers import HostTier
from kvcoord.replay.timing import StepCost, StepTimeModel
from kvcoord.replay.workloads import Workload, WorkloadRequest
from kvcoord.residency import ResidencySnapshot
from kvcoord.scheduling import mamba_chunk_rule

_MAX_CLOCK_US = float(1 << 63)

__all__ = [
    "EngineFeed",
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
    #: Roofline step time (None: the fixed ``step_base_s + step_token_s`` model).
    step_model: StepTimeModel | None = None
    #: Host-memory tier below the GPU pool (None: none).
    host_tier: HostTier | None = None
    #: Bytes of one token's KV on one GPU (host-tier transfer size).
    token_bytes_per_gpu: float = 0.0
    #: The pool's eviction policy (``KVCacheManagerOptions.eviction_policy``).
    eviction_policy: str = "lru"
    #: With the ``priority`` policy: the priority the prompt blocks of a
    #: finished request that was served a prefix hit (a follow-up turn, a
    #: shared template) get before they are freed (0: none); the pool's clock
    #: ticks once per step.
    prompt_priority: int = 0


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
    #: Per step: blocks in the prefix index (referenced or free).
    step_cached: array[float] = field(default_factory=lambda: array("d"))
    #: Sampled (time, referenced, cached-but-free, empty) block counts, exact at each sample.
    occupancy_samples: list[tuple[float, int, int, int]] = field(default_factory=list)
    #: Per request (arrival order): arrival, first scheduled, first token, finish (simulated s).
    req_arrival: array[float] = field(default_factory=lambda: array("d"))
    req_admit: array[float] = field(default_factory=lambda: array("d"))
    req_first: array[float] = field(default_factory=lambda: array("d"))
    req_finish: array[float] = field(default_factory=lambda: array("d"))
    req_output: array[int] = field(default_factory=lambda: array("q"))
    #: Per request: prompt tokens, hits served by the GPU pool and by the host tier.
    req_prompt: array[int] = field(default_factory=lambda: array("q"))
    req_gpu_hit: array[int] = field(default_factory=lambda: array("q"))
    req_host_hit: array[int] = field(default_factory=lambda: array("q"))
    host_hit_tokens: int = 0
    host_transfer_seconds: float = 0.0
    #: Block residency histograms, in simulated microseconds.
    residency: ResidencySnapshot | None = None


# --------------------------------------------------------------------------- manager setup


#: Hash algorithm of the simulated requests: only prefix equality matters
#: here, so the fastest one.
REPLAY_HASH_ALGO: HashAlgoName = "xxh3_native"


def build_config(layout: Layout, num_blocks: int) -> KVCacheConfig:
    """The ``kvcoord.KVCacheConfig`` for ``layout`` with a pool of ``num_blocks``."""
    return KVCacheConfig(num_blocks=num_blocks, groups=layout.groups)


def make_manager(
    layout: Layout,
    num_blocks: int,
    max_model_len: int,
    *,
    eviction_policy: str = "lru",
    enable_events: bool = False,
) -> KVCacheManager:
    """A ``KVCacheManager`` for the layout with a pool of ``num_blocks``."""
    return KVCacheManager(
        build_config(layout, num_blocks),
        max_model_len=max_model_len,
        options=KVCacheManagerOptions(
            enable_caching=layout.enable_caching,
            residency_metrics=True,
            eviction_policy=eviction_policy,
            enable_events=enable_events,
        ),
    )


@dataclass
class EngineFeed:
    """The requests routed to one engine: ``pending`` in arrival order, and
    whether more may still come (a cluster's router appends while the
    engines run; :func:`simulate` hands a closed feed of the whole trace)."""

    pending: deque[WorkloadRequest]
    closed: bool = True
    #: When a list: each finished request is appended (the router's count).
    finished: list[WorkloadRequest] | None = None


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

    __slots__ = (
        "computed",
        "counted",
        "host_keys",
        "idx",
        "num_tokens",
        "out",
        "out_len",
        "out_pos",
        "req",
        "wr",
    )

    def __init__(self, wr: WorkloadRequest) -> None:
        self.wr = wr
        self.req: Any = None
        self.out: list[int] = []
        self.out_pos = 0
        self.out_len = wr.output_len
        self.num_tokens = wr.prompt_len
        self.computed = 0
        self.counted = False
        self.host_keys: Any = None
        self.idx = 0  # position in arrival order (per-request result arrays)

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


def _occupancy(pool: Any) -> tuple[int, int, int]:
    """Exact (referenced, cached-but-free, empty) block counts of the pool (null block excluded)."""
    import numpy as np

    refs = np.asarray(pool.ref_counts())[1:]
    cached = np.asarray(pool.cached_mask())[1:]
    referenced = int(np.count_nonzero(refs))
    cached_free = int(np.count_nonzero(cached & (refs == 0)))
    return referenced, cached_free, refs.shape[0] - referenced - cached_free


def simulate(
    workload: Workload,
    cfg: SimConfig,
    progress: Callable[[int], None] | None = None,
) -> SimResult:
    """Replay ``workload`` against a fresh ``KVCacheManager``; ``progress(n)`` per n finished."""
    run = run_engine(workload, cfg, progress)
    while True:
        try:
            next(run)
        except StopIteration as stop:
            result: SimResult = stop.value
            return result


def run_engine(
    workload: Workload,
    cfg: SimConfig,
    progress: Callable[[int], None] | None = None,
    mgr: KVCacheManager | None = None,
    feed: EngineFeed | None = None,
) -> Generator[float | None, None, SimResult]:
    """The replay as a generator, one scheduler step per ``next()``: yields the
    simulated time after each step, or None while idle with an open feed and
    nothing pending (the driver appends to ``feed.pending`` or closes it);
    returns the :class:`SimResult`. ``workload`` gives the trace-wide facts
    (longest sequence, last arrival); ``feed`` the requests this engine gets
    (default: all of them); ``mgr`` a manager built by the caller."""
    from kvcoord import Request

    wall0 = perf_counter()
    layout = cfg.layout
    max_model_len = cfg.max_model_len or workload.max_sequence_len
    if mgr is None:
        mgr = make_manager(
            layout, cfg.num_blocks, max_model_len, eviction_policy=cfg.eviction_policy
        )
    if feed is None:
        feed = EngineFeed(deque(workload.requests))
    hash_bs = mgr.hash_block_size
    best = BestCaseTracker(layout.block_size) if cfg.track_best else None
    evictions = EvictionCounter(mgr)
    pool = mgr.block_pool
    model = cfg.step_model
    host = cfg.host_tier if layout.enable_caching else None
    hit_bs = layout.block_size
    host_bw = 1.0
    if host is not None:
        host_bw = model.gpu.host_bandwidth if model is not None else 25e9

    n_req = len(workload.requests)
    res = SimResult(num_requests=n_req, num_blocks=cfg.num_blocks)
    for name in ("req_arrival", "req_admit", "req_first", "req_finish"):
        getattr(res, name).extend([float("nan")] * n_req)
    for name in ("req_output", "req_prompt", "req_gpu_hit", "req_host_hit"):
        getattr(res, name).extend([0] * n_req)
    pending = feed.pending
    waiting: deque[_Live] = deque()
    running: list[_Live] = []
    scale = cfg.time_scale
    last_arrival = workload.requests[-1].arrival_s * scale if workload.requests else 0.0
    sample_every = last_arrival / 200 if last_arrival > 0 else 0.0
    next_sample = 0.0
    max_running, token_budget = cfg.max_running, cfg.token_budget
    now = busy = 0.0
    mgr_total = 0.0
    prompt_tokens = hit_tokens = 0
    pc = perf_counter
    allocate = mgr.allocate_slots
    # Mamba "align" layouts: prefill chunks end where a state must be cached.
    split = mamba_chunk_rule(mgr.config, mgr.hash_block_size)
    step_mgr, step_usage, step_time, step_hit, step_cached = (
        res.step_manager_s,
        res.step_usage,
        res.step_time,
        res.step_hit_rate,
        res.step_cached,
    )
    r_arrival, r_admit, r_first, r_finish = (
        res.req_arrival,
        res.req_admit,
        res.req_first,
        res.req_finish,
    )
    window = model.window if model is not None and model.window_layers else 0
    arrived = 0
    prompt_priority = cfg.prompt_priority

    while pending or waiting or running or not feed.closed:
        while pending and pending[0].arrival_s * scale <= now:
            wr = pending.popleft()
            r_arrival[arrived] = wr.arrival_s * scale
            live = _Live(wr)
            live.idx = arrived
            arrived += 1
            waiting.append(live)
        if not waiting and not running:
            if pending:
                now = pending[0].arrival_s * scale
            else:
                yield None  # idle until the feed brings more or closes
            continue

        budget = token_budget
        step_mgr_s = 0.0
        finished: list[_Live] = []
        first_token: list[_Live] = []
        # work of the step for the step-time model (StepCost's sums, inlined: hot loop)
        full_pairs = full_kv = seqs = 0
        win = StepCost(window) if window else None
        loaded_tokens = 0
        preempted = False
        mgr.new_step_starts()
        # microseconds of simulated time; the core's clock is a u64 and traces may
        # carry times up to the largest finite float (the clock then saturates)
        mgr.set_residency_clock(int(min(now * 1e6, _MAX_CLOCK_US)))
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
            if split is not None:
                n = split(
                    n,
                    start=live.computed,
                    num_tokens=live.num_tokens,
                    num_prompt_tokens=req.num_prompt_tokens,
                    shared_prefix_boundary=req.shared_prefix_boundary,
                    max_chunk_tokens=token_budget,
                )
                if n == 0:
                    continue
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
            c = live.computed
            full_pairs += n * c + n * (n + 1) // 2
            full_kv += c + n
            seqs += 1
            if win is not None:
                win.add(c, n)
            # live.advance(c + n), inlined (the hottest line of a replay)
            done = c + n
            live.computed = done
            req.num_computed_tokens = done
            if done >= live.num_tokens:
                pos = live.out_pos
                req.append_output_token_ids(live.out[pos])
                live.out_pos = pos + 1
                live.num_tokens += 1
                if pos == 0:
                    first_token.append(live)
                if pos + 1 >= live.out_len:
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
                    if host is not None:
                        live.host_keys = host.keys(toks, wr.cache_salt)
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
                extra = 0
                if host is not None and live.host_keys is not None:
                    found = host.lookup(live.host_keys)
                    cap = (wr.prompt_len - 1) // hit_bs * hit_bs
                    extra = max(0, min(found, cap) // hit_bs * hit_bs - hit)
                n = live.num_tokens - hit - extra
                if n > budget:
                    n = budget
                if split is not None:
                    n = split(
                        n,
                        start=hit,
                        num_tokens=live.num_tokens,
                        num_prompt_tokens=req.num_prompt_tokens,
                        shared_prefix_boundary=req.shared_prefix_boundary,
                        max_chunk_tokens=token_budget,
                    )
                    if n == 0:
                        break
                t0 = pc()
                new = mgr.allocate_slots(
                    req, n + extra, num_new_computed_tokens=hit, new_computed_blocks=blocks
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
                    i = live.idx
                    prompt_tokens += wr.prompt_len
                    hit_tokens += min(hit, wr.prompt_len)
                    r_admit[i] = now
                    res.req_prompt[i] = wr.prompt_len
                    res.req_gpu_hit[i] = min(hit, wr.prompt_len)
                    res.req_host_hit[i] = extra
                    res.host_hit_tokens += extra
                loaded_tokens += extra
                running.append(live)
                budget -= n
                c = hit + extra
                full_pairs += n * c + n * (n + 1) // 2
                full_kv += c + n
                seqs += 1
                if win is not None:
                    win.add(c, n)
                if live.advance(hit + extra + n):
                    finished.append(live)
                if live.out_pos == 1:
                    first_token.append(live)

        usage = mgr.usage

        # 4. end of step: finished requests are freed
        if finished:
            for live in finished:
                t0 = pc()
                if prompt_priority and res.req_gpu_hit[live.idx]:
                    mgr.set_request_priority(live.req, prompt_priority, live.wr.prompt_len)
                mgr.free(live.req)
                step_mgr_s += pc() - t0
                live.req = None
                live.out_pos = -1
                res.output_tokens += live.out_len
            res.num_finished += len(finished)
            if feed.finished is not None:
                feed.finished.extend(live.wr for live in finished)
            running = [r for r in running if r.out_pos >= 0]
            if progress is not None:
                progress(len(finished))

        tokens = token_budget - budget
        res.computed_tokens += tokens
        if model is not None:
            dt = model.step_seconds(
                tokens,
                full_pairs,
                win.window_pairs if win is not None else 0,
                full_kv,
                win.window_kv if win is not None else 0,
                seqs,
            )
        else:
            dt = cfg.step_base_s + cfg.step_token_s * tokens
        if loaded_tokens:
            transfer = loaded_tokens * cfg.token_bytes_per_gpu / host_bw
            res.host_transfer_seconds += transfer
            dt += transfer
        now += dt
        busy += dt
        for live in first_token:
            r_first[live.idx] = now
            if host is not None and live.host_keys is not None:
                host.insert(live.host_keys)
        for live in finished:
            r_finish[live.idx] = now
            res.req_output[live.idx] = live.out_len
        mgr_total += step_mgr_s
        step_mgr.append(step_mgr_s)
        step_usage.append(usage)
        step_time.append(now)
        step_hit.append(hit_tokens / prompt_tokens if prompt_tokens else 0.0)
        step_cached.append(pool.num_cached_blocks)
        if now >= next_sample:
            res.occupancy_samples.append((now, *_occupancy(pool)))
            next_sample = now + sample_every
        if prompt_priority:
            mgr.advance_eviction_clock(1)
        yield now

    if arrived < n_req:  # an engine of a cluster: only its own requests
        res.num_requests = arrived
        for name in ("req_arrival", "req_admit", "req_first", "req_finish", "req_output",
                     "req_prompt", "req_gpu_hit", "req_host_hit"):  # fmt: skip
            del getattr(res, name)[arrived:]
    res.residency = mgr.residency_snapshot()
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
