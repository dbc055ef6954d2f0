"""Exact replays of candidates, each stopped once a target is certainly missed.

A candidate is replayed exactly as ``kvcoord replay`` with its flags replays
it (the same set-up, :mod:`kvcoord._cli_setup`; one engine or a cluster
behind its router), with the best-possible pass left out (the planner makes
it once). While it runs, the engines' per-request arrays are watched: a
request whose first token came later than the TTFT target after its arrival,
or that has waited longer than that without one, misses it; a finished
request whose TPOT exceeds the target misses that. Once more requests miss
a target than its percentile allows (:func:`kvcoord.planner.bounds.needed`),
the percentile must miss it whatever the rest of the replay does, and the
replay stops (``status`` "stopped", with lower bounds of the percentiles
from what it had seen); so it does once a goodput target can no longer be
met (:mod:`kvcoord.planner.goodput`; an upper bound of the goodput then).
A replay that runs to the end ``meets`` or ``misses`` its targets on exact
percentiles and goodput.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from time import perf_counter
from typing import Any

import numpy as np

from kvcoord.planner.bounds import Targets, needed
from kvcoord.planner.space import Candidate
from kvcoord.replay.sim import SimResult

__all__ = ["EvalShared", "TargetMissed", "replay_candidate", "verdict"]


@dataclass
class EvalShared:
    """What every replay of a search shares (sent to each worker once)."""

    args: argparse.Namespace
    setup: Any
    targets: Targets


class TargetMissed(Exception):
    """Raised inside a replay once a target is certainly missed."""

    def __init__(self, what: str, lower: dict[str, float], share: float) -> None:
        super().__init__(what)
        self.what, self.lower, self.share = what, lower, share


def _copy(a: Any, dtype: Any) -> np.ndarray:
    # a copy, not a view: a view would pin the array's buffer while the replay grows it
    return np.array(a, dtype=dtype)


class _Watch:
    """The progress callback that stops a replay once a target is missed."""

    def __init__(
        self,
        results: list[SimResult],
        targets: Targets,
        n: int,
        n_multi: int,
        arrivals: tuple[float, float] = (0.0, 0.0),
    ) -> None:
        self.results, self.targets = results, targets
        self.n, self.n_multi = n, n_multi
        #: The first and the last (scaled) arrival of the workload.
        self.arrivals = arrivals
        self.finished = 0
        self.next_check = self.every = max(20, n // 200)

    def __call__(self, k: int) -> None:
        self.finished += k
        if self.finished >= self.next_check:
            self.next_check = self.finished + self.every
            self.check()

    def _gathered(self) -> tuple[np.ndarray, ...]:
        ttft, tpot = [], []
        for r in self.results:
            arrival = _copy(r.req_arrival, np.float64)
            first = _copy(r.req_first, np.float64)
            finish = _copy(r.req_finish, np.float64)
            out = _copy(r.req_output, np.int64)
            clock = r.step_time[-1] if len(r.step_time) else 0.0
            waited = np.where(np.isnan(first), clock - arrival, first - arrival)
            ttft.append(waited[~np.isnan(waited)])
            done = ~np.isnan(finish) & (out > 1)
            tpot.append((finish[done] - first[done]) / (out[done] - 1))
        return np.concatenate(ttft), np.concatenate(tpot)

    def _goodput_missed(self) -> None:
        """Raise once the goodput target can no longer be met (:mod:`.goodput`)."""
        g = self.targets.goodput
        if g is None or not self.n:
            return
        bad, clock = 0, self.arrivals[1]
        for r in self.results:
            engine_clock = r.step_time[-1] if len(r.step_time) else 0.0
            clock = max(clock, engine_clock)
            bad += int(
                g.certainly_bad(
                    _copy(r.req_arrival, np.float64), _copy(r.req_first, np.float64),
                    _copy(r.req_finish, np.float64), _copy(r.req_output, np.int64),
                    engine_clock,
                ).sum()
            )  # fmt: skip
        upper = g.achieved(self.n - bad, self.n, clock - self.arrivals[0])
        if upper < g.minimum:
            raise TargetMissed(
                "goodput", {"goodput_at_most": upper}, self.finished / max(1, self.n)
            )

    def check(self) -> None:
        self._goodput_missed()
        ttft, tpot = self._gathered()
        for (metric, q), limit in self.targets.limits.items():
            seen, total = (ttft, self.n) if metric == "ttft" else (tpot, self.n_multi)
            if not total or int((seen > limit).sum()) <= total - needed(total, q):
                continue
            lower = {}
            for (m2, q2), _ in self.targets.limits.items():
                s2, t2 = (ttft, self.n) if m2 == "ttft" else (tpot, self.n_multi)
                if t2:  # the unseen count as 0: a lower bound of the final percentile
                    full = np.concatenate([s2, np.zeros(max(0, t2 - s2.shape[0]))])
                    lower[f"{m2}_p{q2}_s"] = float(np.percentile(full, q2))
            raise TargetMissed(f"{metric.upper()} p{q}", lower, self.finished / max(1, self.n))


def _capacity(results: list[SimResult]) -> float | None:
    """Requests per second one engine finished while at a limit (the service rate
    of :mod:`kvcoord.replay.overload`), averaged over the engines; None: too few
    such requests to tell."""
    from kvcoord.replay.overload import MIN_SATURATED_FINISHED

    rates = [
        r.saturated_finished / r.saturated_seconds
        for r in results
        if r.saturated_finished >= MIN_SATURATED_FINISHED and r.saturated_seconds > 0
    ]
    return sum(rates) / len(rates) if rates else None


def replay_candidate(shared: EvalShared, cand: Candidate) -> dict[str, Any]:
    """Replay ``cand`` (a worker's task): its outcome as a JSON-ready dict."""
    from kvcoord._cli_setup import _plan, _sim_config
    from kvcoord.replay.cluster import simulate_cluster
    from kvcoord.replay.overload import overload_verdict
    from kvcoord.replay.report import latency_metrics
    from kvcoord.replay.scheduler import run_engine

    args, st, targets = shared.args, shared.setup, shared.targets
    wall0 = perf_counter()
    plan = _plan(args, st, **cand.plan_options())
    cfg = replace(_sim_config(args, plan, cand.eviction), track_best=False)
    wl = st.workload
    n_multi = sum(1 for r in wl.requests if r.output_len > 1)
    results = [SimResult() for _ in range(cand.replicas)]
    scale = args.time_scale
    first_last = (
        (wl.requests[0].arrival_s * scale, wl.requests[-1].arrival_s * scale)
        if wl.requests
        else (0.0, 0.0)
    )
    watch = _Watch(results, targets, len(wl.requests), n_multi, first_last)
    out: dict[str, Any] = {"kv_memory_gib_per_gpu": plan.kv_bytes_per_gpu / (1 << 30)}
    try:
        if cand.replicas == 1:
            for _ in run_engine(wl, cfg, watch, result=results[0]):
                pass
            res = results[0]
        else:
            cres = simulate_cluster(
                wl, cfg, cand.replicas, cand.router, watch, track_global_best=False,
                engine_results=results,
            )  # fmt: skip
            res = cres.total
        watch.check()  # the last finishes may not have reached a check
    except TargetMissed as e:
        out.update(status="stopped", missed=e.what, progress=e.share, **e.lower)
        out["wall_seconds"] = perf_counter() - wall0
        out["capacity_rps_per_replica"] = _capacity(results)
        return out
    lat = latency_metrics(res)
    prompt = res.prompt_tokens or 1
    verdict = overload_verdict(res, cfg.max_concurrency, cand.replicas, cfg.time_scale)
    values = {key: lat.get(f"{key[0]}_p{key[1]}_s") for key in targets.limits}
    missed = [
        f"{m.upper()} p{q}"
        for (m, q), v in values.items()
        if v is None or v > targets.limits[(m, q)]
    ]
    g = targets.goodput
    if g is not None:
        good = g.good(
            _copy(res.req_arrival, np.float64), _copy(res.req_first, np.float64),
            _copy(res.req_finish, np.float64), _copy(res.req_output, np.int64),
        )  # fmt: skip
        out["goodput"] = g.achieved(int(good.sum()), res.num_requests, lat["makespan_seconds"])
        if out["goodput"] < g.minimum:
            missed.append("goodput")
    out.update(
        status="misses" if missed else "meets",
        missed=", ".join(missed) or None,
        progress=1.0,
        hit_rate=(res.hit_tokens + res.host_hit_tokens + res.disk_hit_tokens) / prompt,
        overloaded=bool(verdict["overloaded"]),
        makespan_seconds=lat["makespan_seconds"],
        tokens=res.prompt_tokens + res.output_tokens,
        output_tokens_per_s=lat["output_tokens_per_s"],
        wall_seconds=perf_counter() - wall0,
        capacity_rps_per_replica=_capacity(results),
    )
    for m in ("ttft", "tpot"):
        for q in (50, 90, 99):
            out[f"{m}_p{q}_s"] = lat[f"{m}_p{q}_s"]
    return out


def _dur(x: float | None) -> str:
    from kvcoord.replay.plot_axes import format_duration

    return "n/a" if x is None else format_duration(x)


def verdict(r: dict[str, Any]) -> str:
    """One replay's outcome in words."""
    st = r["status"]
    if st == "stopped":
        return (
            f"misses {r['missed']} (stopped after {100 * r['progress']:.0f}% of the requests "
            f"finished, in {r['wall_seconds']:.1f} s)"
        )
    lat = f"TTFT p90 {_dur(r['ttft_p90_s'])}, TPOT p90 {_dur(r['tpot_p90_s'])}"
    what = "meets the targets" if st == "meets" else f"misses {r['missed']}"
    return f"{what}: {lat}, hit rate {100 * r['hit_rate']:.1f}% ({r['wall_seconds']:.1f} s)"
