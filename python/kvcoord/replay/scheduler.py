"""The simulated continuous-batching scheduler.

With :mod:`kvcoord.replay.pool` (building the manager, reading its pool) the
only module that calls :class:`kvcoord.KVCacheManager`, so that the rest of
``kvcoord.replay`` stays manager-independent. The running requests' per-step
bookkeeping is done in arrays by :mod:`kvcoord.replay.running`.

The loop follows vLLM 0.33's scheduler (spec section 6.4), FCFS, without
speculative decoding or a KV connector:

1. arrivals up to the simulated clock join the waiting queue (with
   ``SimConfig.max_concurrency``, only while fewer than that many requests
   are in flight: a request held back is sent when one finishes, at the end
   of that step, so a closed loop's arrivals come from its completions), and
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
is set (a roofline of the model on its GPUs, and the CPU's work between
steps), else by ``step_base_s + step_token_s * tokens``, and jumps to the
next arrival when idle. Time inside manager calls is measured with
``perf_counter`` per step.

The API server in front of the engine is one process that does one thing at
a time (with a step-time model whose ``frontend_request_s`` or
``frontend_output_s`` is set): each request sent costs it
``frontend_request_s`` (tokenization, request set-up) before the engine sees
it, and each step's output costs it ``frontend_output_s`` per scheduled
request (detokenizing, streaming) before the client sees it. Its jobs are
served first come, first served, and it hands the requests it set up to the
engine when it has set up every request sent to it so far (its event loop
takes each waiting request a stage further in turn, so a backlog advances
together): a burst of ``N`` requests reaches the engine together,
``N x frontend_request_s`` after it was sent, one request sent to an idle
server ``frontend_request_s`` after, and the tokens of a step wait behind the
requests sent before it ended. A request's first token
and finish reach the client ``StepTimeModel.request_latency_s`` (the
latency outside the engine and the API server's queue: HTTP, inter-process
hops) after the API server streamed them.

Two shortcuts keep a replay fast and change nothing it computes:

* with a layout whose groups keep every block of a running request
  (:func:`~kvcoord.replay.pool.steady_block_size`), a request scheduled for
  one token that neither needs a new block nor fills one is not passed to
  ``allocate_slots`` (the call would not change the pool);
* the head of the waiting queue, refused for lack of blocks, is looked up in
  the prefix cache again only when the cache changed (a block cached or
  evicted) since its last lookup; layouts with Mamba "align" groups, whose
  hits also change at step boundaries, look up every time.

With ``SimConfig.host_tier`` set, a request's prefix is also looked up in
the host tier (:mod:`~kvcoord.replay.tiers`) after the GPU pool: the extra
tokens found there are loaded (their transfer time is added to the step),
not recomputed. ``SimConfig.disk_tier`` is a second such tier below the host
tier, looked up after it (its tokens load at ``SimConfig.disk_bandwidth``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from time import perf_counter
from typing import Any

from kvcoord.manager import KVCacheManager
from kvcoord.replay.bestcase import BestCaseTracker
from kvcoord.replay.pool import (
    REPLAY_HASH_ALGO,
    EvictionCounter,
    build_config,
    make_manager,
    occupancy,
    steady_block_size,
)
from kvcoord.replay.running import Live, RunningBatch
from kvcoord.replay.sim import EngineFeed, SimConfig, SimResult, SimulationError
from kvcoord.replay.timing import attention_pairs
from kvcoord.replay.workloads import Workload
from kvcoord.scheduling import mamba_chunk_rule

_MAX_CLOCK_US = float(1 << 63)
#: Reuse the blocked head's lookup while the prefix cache is unchanged (tests
#: turn it off to check that it changes nothing).
_REUSE_LOOKUPS = True

__all__ = [
    "REPLAY_HASH_ALGO",
    "EngineFeed",
    "EvictionCounter",
    "SimConfig",
    "SimResult",
    "SimulationError",
    "build_config",
    "make_manager",
    "run_engine",
    "simulate",
]


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
    result: SimResult | None = None,
) -> Generator[float | None, None, SimResult]:
    """The replay as a generator, one scheduler step per ``next()``: yields the
    simulated time after each step, or None while idle with an open feed and
    nothing pending (the driver appends to ``feed.pending`` or closes it);
    returns the :class:`SimResult`. ``workload`` gives the trace-wide facts
    (longest sequence, last arrival); ``feed`` the requests this engine gets
    (default: all of them); ``mgr`` a manager built by the caller; ``result``
    an empty :class:`SimResult` to fill in, for a caller that watches the
    per-request arrays while the replay runs (``kvcoord plan`` stops a replay
    once its targets are missed)."""
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
    disk = cfg.disk_tier if layout.enable_caching else None
    key_tier = host if host is not None else disk  # both use the same chunk keys
    host_bw = 1.0
    if host is not None:
        host_bw = model.gpu.host_bandwidth if model is not None else 25e9

    n_req = len(workload.requests)
    res = SimResult() if result is None else result
    res.num_requests, res.num_blocks = n_req, cfg.num_blocks
    for name in ("req_arrival", "req_offered", "req_admit", "req_first", "req_finish"):
        getattr(res, name).extend([float("nan")] * n_req)
    for name in ("req_output", "req_prompt", "req_gpu_hit", "req_host_hit", "req_disk_hit"):
        getattr(res, name).extend([0] * n_req)
    pending = feed.pending
    waiting: deque[Live] = deque()
    running = RunningBatch(cfg.max_running)
    scale = cfg.time_scale
    last_arrival = workload.requests[-1].arrival_s * scale if workload.requests else 0.0
    sample_every = last_arrival / 200 if last_arrival > 0 else 0.0
    # no arrival span to divide (everything at t=0, a closed loop): start at one
    # step and double the spacing, dropping every other sample, at 400 samples
    adaptive_samples = sample_every == 0.0
    next_sample = 0.0
    max_running, token_budget = cfg.max_running, cfg.token_budget
    now = busy = 0.0
    mgr_total = 0.0
    prompt_tokens = hit_tokens = 0
    pc = perf_counter
    allocate = mgr.allocate_slots
    # Mamba "align" layouts: prefill chunks end where a state must be cached.
    split = mamba_chunk_rule(mgr.config, mgr.hash_block_size)
    steady_bs = steady_block_size(mgr, layout)
    # a lookup stays valid while no block was cached or evicted (not with a
    # chunk rule, i.e. Mamba "align" groups: their states become hits at step
    # boundaries)
    reuse_lookups = split is None and _REUSE_LOOKUPS
    looked_up: tuple[Live, int, int, Any, int] | None = None
    step_itl, step_later = res.step_itl, res.step_later_tokens
    last_shown = 0.0
    step_mgr, step_usage, step_time, step_hit, step_cached = (
        res.step_manager_s,
        res.step_usage,
        res.step_time,
        res.step_hit_rate,
        res.step_cached,
    )
    r_arrival, r_offered, r_admit, r_first, r_finish = (
        res.req_arrival,
        res.req_offered,
        res.req_admit,
        res.req_first,
        res.req_finish,
    )
    window = model.window if model is not None and model.window_layers else 0
    # the API server's time per request outside the steps: the client sees each
    # request's first token and its end this much later than the engine makes them
    latency = model.request_latency_s if model is not None else 0.0
    # the API server: its cost per request sent and per scheduled request's
    # output; ``api_free`` is when it has done every job given it so far
    fe_request = model.frontend_request_s if model is not None else 0.0
    fe_output = model.frontend_output_s if model is not None else 0.0
    frontend = fe_request > 0 or fe_output > 0
    api_free = 0.0
    # requests sent, not yet through the API server: (when the engine gets it, request)
    intake: deque[tuple[float, Live]] = deque()
    arrived = 0
    prompt_priority = cfg.prompt_priority
    cap = cfg.max_concurrency
    # the clock and finished count at the last intake: a request offered since
    # was sent at its own time if a slot was free before that step's finishes
    last_intake, fin_at_intake = -1.0, 0
    sat_open, sat_dt = False, 0.0

    while pending or waiting or running or intake or not feed.closed:
        held = False
        sent_from = arrived
        if cap is None:
            while pending and pending[0].arrival_s * scale <= now:
                wr = pending.popleft()
                r_arrival[arrived] = r_offered[arrived] = wr.arrival_s * scale
                waiting.append(Live(wr, arrived))
                arrived += 1
        else:
            while pending:
                t = pending[0].arrival_s * scale
                if t > now:
                    break
                if t > last_intake and arrived - fin_at_intake < cap:
                    sent = t
                elif arrived - res.num_finished < cap:
                    sent = now  # a slot freed at the end of the last step
                else:
                    held = True
                    break
                wr = pending.popleft()
                r_offered[arrived] = t
                r_arrival[arrived] = sent
                waiting.append(Live(wr, arrived))
                arrived += 1
            last_intake, fin_at_intake = now, res.num_finished
        if frontend:
            # the requests just sent queue at the API server, in the order sent
            just_sent = [waiting.pop() for _ in range(arrived - sent_from)]
            for live in reversed(just_sent):
                api_free = max(api_free, r_arrival[live.idx]) + fe_request
                intake.append((api_free, live))
            # it hands them to the engine when it has set up all it was given
            if intake and intake[-1][0] <= now:
                waiting.extend(live for _, live in intake)
                intake.clear()
        if not waiting and not running:
            if intake:
                now = intake[-1][0]
                continue
            if pending:
                now = pending[0].arrival_s * scale
            else:
                yield None  # idle until the feed brings more or closes
            continue

        loaded_tokens = disk_tokens = 0
        preempted = False
        # Every step calls the manager here, so every step's manager time is a
        # measurement (a decode step away from block edges makes no other call).
        t0 = pc()
        mgr.new_step_starts()
        # microseconds of simulated time; the core's clock is a u64 and traces may
        # carry times up to the largest finite float (the clock then saturates)
        mgr.set_residency_clock(int(min(now * 1e6, _MAX_CLOCK_US)))
        step_mgr_s = pc() - t0
        # 2. running requests, in admission order: tokens per request first, then
        # the allocations that can change the pool, one by one (preempting from
        # the tail when the pool is full), then every request's progress at once
        plan = running.plan(token_budget, steady_bs, split, token_budget)
        n = plan.n
        lives = running.lives
        for i in plan.events:
            if i >= len(lives):  # preempted by an earlier request of this step
                break
            live = lives[i]
            req = live.req
            ni = int(n[i])
            while True:
                t0 = pc()
                new = allocate(req, ni)
                step_mgr_s += pc() - t0
                if new is not None:
                    break
                victim = running.pop()
                if not lives and victim is live:
                    raise SimulationError(
                        f"request {live.wr.request_id} ({victim.num_tokens} tokens) does not "
                        f"fit in a pool of {cfg.num_blocks} blocks even alone; use a larger pool"
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
        count = min(plan.count, len(lives))
        (tokens, full_pairs, window_pairs, full_kv, window_kv, seqs, first_token, finished,
         done_idx) = running.run_step(n, count, window)  # fmt: skip
        later_tokens = running.later_tokens
        budget = token_budget - tokens

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
                    live.out_base = running.store_output(live.out)
                    t1 = pc()
                    if best is not None:
                        best.add(toks, live.out, wr.cache_salt)
                    if key_tier is not None:
                        live.host_keys = key_tier.keys(toks, wr.cache_salt)
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
                version = (pool.num_evictions, pool.num_cached_blocks) if reuse_lookups else None
                if (
                    looked_up is not None
                    and looked_up[0] is live
                    and version is not None
                    and looked_up[1:3] == version
                ):
                    blocks, hit = looked_up[3], looked_up[4]
                else:
                    blocks, hit = mgr.get_computed_blocks(req)
                    if version is not None:
                        looked_up = (live, version[0], version[1], blocks, hit)
                step_mgr_s += pc() - t0
                extra = from_disk = 0
                if live.host_keys is not None:
                    cap = (wr.prompt_len - 1) // hit_bs * hit_bs
                    if host is not None:
                        found = host.lookup(live.host_keys)
                        extra = max(0, min(found, cap) // hit_bs * hit_bs - hit)
                    if disk is not None:
                        found = disk.lookup(live.host_keys)
                        from_disk = max(0, min(found, cap) // hit_bs * hit_bs - hit - extra)
                        extra += from_disk
                ni = live.num_tokens - hit - extra
                if ni > budget:
                    ni = budget
                if split is not None:
                    ni = split(
                        ni,
                        start=hit,
                        num_tokens=live.num_tokens,
                        num_prompt_tokens=req.num_prompt_tokens,
                        shared_prefix_boundary=req.shared_prefix_boundary,
                        max_chunk_tokens=token_budget,
                    )
                    if ni == 0:
                        break
                t0 = pc()
                new = mgr.allocate_slots(
                    req, ni + extra, num_new_computed_tokens=hit, new_computed_blocks=blocks
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
                looked_up = None
                waiting.popleft()
                if not live.counted:
                    live.counted = True
                    i = live.idx
                    prompt_tokens += wr.prompt_len
                    hit_tokens += min(hit, wr.prompt_len)
                    r_admit[i] = now
                    res.req_prompt[i] = wr.prompt_len
                    res.req_gpu_hit[i] = min(hit, wr.prompt_len)
                    res.req_host_hit[i] = extra - from_disk
                    res.host_hit_tokens += extra - from_disk
                    res.req_disk_hit[i] = from_disk
                    res.disk_hit_tokens += from_disk
                loaded_tokens += extra - from_disk
                disk_tokens += from_disk
                budget -= ni
                c = hit + extra
                tokens += ni
                full_pairs += ni * c + ni * (ni + 1) // 2
                full_kv += c + ni
                seqs += 1
                if window:
                    window_pairs += attention_pairs(c, ni, window)
                    window_kv += min(c + ni, window)
                done = live.advance(c + ni)
                if done:
                    finished.append(live)
                    done_idx.append(len(running))
                if live.out_pos == 1:
                    first_token.append(live)
                running.append(live)

        usage = mgr.usage
        # the step ran at a limit: requests left waiting, or clients held back
        saturated = held or bool(waiting)

        # 4. end of step: finished requests are freed
        if finished:
            for live in finished:
                t0 = pc()
                if prompt_priority and res.req_gpu_hit[live.idx]:
                    mgr.set_request_priority(live.req, prompt_priority, live.wr.prompt_len)
                mgr.free(live.req)
                step_mgr_s += pc() - t0
                live.req = None
                res.output_tokens += live.out_len
            res.num_finished += len(finished)
            if feed.finished is not None:
                feed.finished.extend(live.wr for live in finished)
            running.remove(done_idx)
            if progress is not None:
                progress(len(finished))

        res.computed_tokens += tokens
        if model is not None:
            dt = model.step_seconds(tokens, full_pairs, window_pairs, full_kv, window_kv, seqs)
        else:
            dt = cfg.step_base_s + cfg.step_token_s * tokens
        if loaded_tokens:
            transfer = loaded_tokens * cfg.token_bytes_per_gpu / host_bw
            res.host_transfer_seconds += transfer
            dt += transfer
        if disk_tokens:
            transfer = disk_tokens * cfg.token_bytes_per_gpu / cfg.disk_bandwidth
            res.disk_transfer_seconds += transfer
            dt += transfer
        now += dt
        busy += dt
        if saturated:
            # the service rate at the limit: from the first saturated step that
            # finished requests to the last (the batch filling before and
            # draining after are no measure of it)
            if sat_open:
                sat_dt += dt
                if finished:
                    res.saturated_seconds += sat_dt
                    res.saturated_finished += len(finished)
                    sat_dt = 0.0
            elif finished:
                sat_open = True
        shown = now
        if frontend:  # the API server streams this step's output after its earlier jobs
            api_free = max(api_free, now) + fe_output * seqs
            shown = api_free
        # inter-token latency: the requests that sampled a later token saw it
        # this long after the step before's tokens
        step_itl.append(shown - last_shown)
        step_later.append(later_tokens)
        last_shown = shown
        for live in first_token:
            r_first[live.idx] = shown + latency
            if live.host_keys is not None:
                if host is not None:
                    host.insert(live.host_keys)
                if disk is not None:
                    disk.insert(live.host_keys)
        for live in finished:
            r_finish[live.idx] = shown + latency
            res.req_output[live.idx] = live.out_len
        mgr_total += step_mgr_s
        step_mgr.append(step_mgr_s)
        step_usage.append(usage)
        step_time.append(now)
        step_hit.append(hit_tokens / prompt_tokens if prompt_tokens else 0.0)
        step_cached.append(pool.num_cached_blocks)
        if now >= next_sample:
            samples = res.occupancy_samples
            samples.append((now, *occupancy(pool)))
            if adaptive_samples:
                if sample_every == 0.0:
                    sample_every = dt
                if len(samples) >= 400:
                    del samples[1::2]
                    sample_every *= 2
            next_sample = now + sample_every
        if prompt_priority:
            mgr.advance_eviction_clock(1)
        yield now

    if arrived < n_req:  # an engine of a cluster: only its own requests
        res.num_requests = arrived
        for name in ("req_arrival", "req_offered", "req_admit", "req_first", "req_finish",
                     "req_output", "req_prompt", "req_gpu_hit", "req_host_hit",
                     "req_disk_hit"):  # fmt: skip
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
