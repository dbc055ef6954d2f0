"""Lower bounds on a candidate's latencies, from the step-time model alone.

Each replay request is served at best with the best possible prefix cache
(an unbounded one, :mod:`kvcoord.replay.bestcase`: no real pool, router or
tier serves more) and alone on its engine. Two properties of the step-time
model (:class:`kvcoord.replay.timing.StepTimeModel`) make these bounds:

* a step takes at least its GEMMs and attention at the GPUs' achieved
  rates (``prefill_gpu_seconds / tp``), and
* a step takes longer the more it computes (``step_seconds`` grows with
  each of its arguments).

Then, per request ``i``:

* **TTFT** >= max(the compute of prefilling its uncached prompt over the
  engine's GPUs, one step of one token): its prompt is computed
  before its first token, in at least one step;
* **TPOT** >= one decode step of one token after its prompt (every later
  token is computed in a step of its own that reads at least that much KV);

and a percentile of a lower bound per request is a lower bound of the
percentile. For a TTFT target at percentile ``q`` over ``n`` requests, at
least ``floor(q (n - 1)) + 1`` of them (:func:`needed`) must have their
first token within the target of their arrival, so the cheapest such set's
prefill compute must fit in every GPU's compute between the first arrival
and the last one plus the target (**compute**, skipped for a closed loop,
whose clients send later than the trace says). A goodput target
(:mod:`.goodput`) is bounded by the requests whose lower bounds miss no
per-request limit (a request's end-to-end latency is at least its TTFT bound
plus one TPOT bound per later token), over the least makespan. A candidate
whose bound misses a target cannot meet it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvcoord.planner.goodput import Goodput
from kvcoord.replay.bestcase import BestCaseTracker
from kvcoord.replay.timing import StepTimeModel
from kvcoord.replay.workloads import Workload

__all__ = ["Targets", "WorkloadFacts", "candidate_bounds", "needed", "workload_facts"]


@dataclass(frozen=True)
class Targets:
    """Latency targets: ``{(metric, q): seconds}`` with metric ``ttft`` or
    ``tpot``, and a goodput target (:mod:`.goodput`) or None."""

    limits: dict[tuple[str, int], float]
    goodput: Goodput | None = None

    def describe(self) -> str:
        """``TTFT p90 <= 2 s and TPOT p90 <= 50 ms``."""
        from kvcoord.replay.plot_axes import format_duration

        parts = [f"{m.upper()} p{q} <= {format_duration(v)}" for (m, q), v in self.limits.items()]
        if self.goodput is not None:
            parts.append(self.goodput.describe())
        return " and ".join(parts)

    def ratio(
        self, values: dict[tuple[str, int], float | None], goodput: float | None = None
    ) -> float:
        """The worst ``value / target`` (for goodput ``target / value``; above 1:
        a target missed; inf: unknown)."""
        out = 0.0
        for key, limit in self.limits.items():
            v = values.get(key)
            out = max(out, math.inf if v is None else v / limit)
        if self.goodput is not None:
            out = max(out, self.goodput.ratio(goodput))
        return out


def needed(n: int, q: int) -> int:
    """Values of ``n`` that must be at most a limit for their ``q``-th percentile
    (numpy's, interpolated) to be at most it: ``floor(q (n - 1) / 100) + 1``."""
    return (q * (n - 1)) // 100 + 1 if n else 0


@dataclass
class WorkloadFacts:
    """Per request (arrival order): prompt and output tokens, scaled arrival and the
    best possible prefix hit (an unbounded cache at the layout's block size)."""

    prompt: np.ndarray
    output: np.ndarray
    arrival: np.ndarray
    best_hit: np.ndarray
    closed_loop: bool
    #: Per-request uncached prefill GPU-seconds, by step-time model (filled on first use).
    gpu_seconds: dict[Any, np.ndarray]

    @property
    def n(self) -> int:
        return int(self.prompt.shape[0])

    @property
    def best_hit_rate(self) -> float:
        total = int(self.prompt.sum())
        return float(self.best_hit.sum()) / total if total else 0.0

    def prefill_gpu_seconds(self, step: StepTimeModel) -> np.ndarray:
        """GPU-seconds of computing each request's prompt past its best possible
        hit (all GPUs together)."""
        key = (step.model, step.gpu, step.flops_per_second, step.compute_flops_per_second,
               step.linear_params)  # fmt: skip
        if key not in self.gpu_seconds:
            f = step.prefill_gpu_seconds
            self.gpu_seconds[key] = np.array(
                [f(int(p)) - f(int(h)) for p, h in zip(self.prompt, self.best_hit, strict=True)],
                dtype=np.float64,
            )
        return self.gpu_seconds[key]


def workload_facts(
    workload: Workload, block_size: int, time_scale: float, closed_loop: bool
) -> WorkloadFacts:
    """The facts the bounds need, in one pass over the workload."""
    best = BestCaseTracker(block_size)
    hits = [best.add(r.make_prompt(), r.output_tokens(), r.cache_salt) for r in workload.requests]
    reqs = workload.requests
    return WorkloadFacts(
        prompt=np.array([r.prompt_len for r in reqs], dtype=np.int64),
        output=np.array([r.output_len for r in reqs], dtype=np.int64),
        arrival=np.array([r.arrival_s * time_scale for r in reqs], dtype=np.float64),
        best_hit=np.array(hits, dtype=np.int64),
        closed_loop=closed_loop,
        gpu_seconds={},
    )


def _percentile_of_monotone(f: Any, xs: np.ndarray, q: int) -> float:
    """``np.percentile(f(xs), q)`` for a non-decreasing ``f``, calling it twice."""
    s = np.sort(xs)
    h = q * (s.shape[0] - 1) / 100
    lo = math.floor(h)
    hi = min(lo + 1, s.shape[0] - 1)
    a, b = f(int(s[lo])), f(int(s[hi]))
    return float(a + (h - lo) * (b - a))


def candidate_bounds(
    facts: WorkloadFacts, step: StepTimeModel, replicas: int, targets: Targets
) -> dict[str, Any]:
    """Lower bounds of one candidate (see the module docstring): ``ttft_pQ_s`` and
    ``tpot_pQ_s`` for each target, ``compute_share`` (the prefill the TTFT
    target needs over the compute there is; above 1 it cannot be done) and
    ``misses``: the first target the bounds miss, in words, or None."""
    gpu_seconds = facts.prefill_gpu_seconds(step)
    one_step = step.step_seconds(1, 1, 0, 1, 0, 1)
    ttft = np.maximum(gpu_seconds / step.tp, one_step)
    multi = facts.prompt[facts.output > 1]
    out: dict[str, Any] = {"compute_share": None, "misses": None}
    values: dict[tuple[str, int], float | None] = {}
    for (metric, q), limit in targets.limits.items():
        if metric == "ttft":
            v = float(np.percentile(ttft, q))
        elif multi.size:
            v = _percentile_of_monotone(
                lambda p: step.step_seconds(1, p + 1, 0, p + 1, 0, 1), multi, q
            )
        else:
            v = 0.0
        values[(metric, q)] = v
        out[f"{metric}_p{q}_s"] = v
        if v > limit and out["misses"] is None:
            out["misses"] = f"{metric.upper()} p{q} >= {v * 1e3:,.1f} ms by the bounds"
    ttft_targets = [(q, t) for (m, q), t in targets.limits.items() if m == "ttft"]
    if ttft_targets and not facts.closed_loop and facts.n:
        q, limit = max(ttft_targets)
        k = needed(facts.n, q)
        work = float(np.sort(gpu_seconds)[:k].sum())
        window = float(facts.arrival.max() - facts.arrival.min()) + limit
        share = work / (replicas * step.tp * window)
        out["compute_share"] = share
        if share > 1 and out["misses"] is None:
            out["misses"] = (
                f"too little compute: the prefill of the {k:,} requests TTFT p{q} needs "
                f"takes {share:.1f}x the GPU time there is"
            )
    g = targets.goodput
    upper = None
    if g is not None and facts.n:
        upper = _goodput_bound(facts, step, ttft, g)
        out["goodput_at_most"] = upper
        if upper < g.minimum and out["misses"] is None:
            out["misses"] = f"goodput <= {g.format(upper)} by the bounds"
    out["ratio"] = targets.ratio(values, upper)
    return out


def _goodput_bound(
    facts: WorkloadFacts, step: StepTimeModel, ttft: np.ndarray, g: Goodput
) -> float:
    """The most goodput there can be: requests whose per-request lower bounds
    (TTFT as above; TPOT one decode step after the prompt; end-to-end TTFT
    plus a step per later token) miss no limit, over the least makespan (the
    latest arrival plus its end-to-end bound, less the first arrival)."""
    one = np.ones(facts.n, dtype=np.int64)
    zero = np.zeros(facts.n, dtype=np.int64)
    multi = facts.output > 1
    tpot = np.asarray(
        step.step_seconds(one, facts.prompt + 1, zero, facts.prompt + 1, zero, one),
        dtype=np.float64,
    )
    e2e = ttft + np.where(multi, (facts.output - 1) * tpot, 0.0)
    bad = np.zeros(facts.n, dtype=bool)
    if "ttft" in g.limits:
        bad |= ttft > g.limits["ttft"]
    if "tpot" in g.limits:
        bad |= multi & (tpot > g.limits["tpot"])
    if "e2el" in g.limits:
        bad |= e2e > g.limits["e2el"]
    makespan = float((facts.arrival + e2e).max() - facts.arrival.min())
    return g.achieved(facts.n - int(bad.sum()), facts.n, makespan)
