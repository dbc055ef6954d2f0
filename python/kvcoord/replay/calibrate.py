"""Fit the step-time model's constants to the calibration rows.

    python -m kvcoord.replay.calibrate

prints the constants of :mod:`kvcoord.replay.timing` that minimise the sum
over :data:`~kvcoord.replay.timing.CALIBRATION_ROWS` of the absolute log
error of each row's headline TTFT and TPOT (least absolute deviations: the
target is a median error, which a few rows the model cannot follow should
not pull) (the statistics
:meth:`~kvcoord.replay.latency_check.LatencyRow.headline` names), and the
calibration rows' errors at the fit. They are then written in ``timing.py``
by hand (a fit is a decision, not a side effect).

The fit does not replay a row per trial. A closed loop or a burst (every
request sent at 0) schedules the same steps whatever they cost, as long as
no request reaches the engine in another step than before: the API server's
queue (:mod:`kvcoord.replay.scheduler`) ties arrivals to the clock. So each
calibration row is replayed once with the current constants, recording every
step's work and which requests each step started after an idle engine, sent
or streamed (:class:`StepRecorder`, :func:`record_row`), and a trial's TTFT
and TPOT follow from that record, the trial's step times and its API
server's queue (:meth:`RecordedRow.metrics`): exactly at the recorded
constants, and as long as the order of steps and arrivals holds near them.
:func:`calibrate` therefore alternates: record at the constants, fit, record
again at the fitted ones, until the fit stops moving (``--rounds``). Rows
with a finite request rate depend on the clock through their arrivals too
and are not used for calibration.

The search is Nelder-Mead on the logarithms of the constants (efficiencies
capped at 1).
"""

from __future__ import annotations

import argparse
import math
import sys
from array import array
from collections.abc import Callable, Sequence
from copy import copy
from dataclasses import dataclass, field, fields, replace
from itertools import pairwise
from typing import Any

import numpy as np

from kvcoord.replay.latency_check import (
    LatencyRow,
    latency_rows,
    metrics_ms,
    row_load,
    row_setup,
)
from kvcoord.replay.scheduler import simulate
from kvcoord.replay.sim import SimResult
from kvcoord.replay.timing import CALIBRATION_ROWS, StepTimeModel

__all__ = [
    "FITTED",
    "RecordedRow",
    "StepRecorder",
    "Timeline",
    "calibrate",
    "fit",
    "main",
    "record_row",
    "retime",
]

#: The fitted fields of :class:`StepTimeModel` (timing.py's constants of the same
#: meaning); ``compute_efficiency:ARCH`` is :data:`~kvcoord.replay.timing.COMPUTE_EFFICIENCY`'s.
FITTED = (
    "compute_efficiency:ampere",
    "compute_efficiency:hopper",
    "bandwidth_efficiency",
    "moe_efficiency",
    "overhead_s",
    "frontend_request_s",
    "frontend_output_s",
    "request_latency_s",
)
_CAPPED = ("compute_efficiency:ampere", "compute_efficiency:hopper", "bandwidth_efficiency",
           "moe_efficiency")  # fmt: skip


@dataclass(frozen=True)
class StepRecorder(StepTimeModel):
    """A step-time model that records each step's work (and takes its real time)."""

    steps: list[tuple[int, ...]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def step_seconds(self, *work: Any) -> Any:
        self.steps.append(work)
        t = super().step_seconds(*work)
        self.seconds.append(t)
        return t


@dataclass
class Timeline:
    """One replay's clock: each step's end, when the client sees its tokens, and
    when each request was sent."""

    end: np.ndarray
    shown: np.ndarray
    sent: np.ndarray


@dataclass
class RecordedRow:
    """One calibration row's steps and requests, replayed once (:func:`record_row`)."""

    row: LatencyRow
    model: StepTimeModel
    work: tuple[np.ndarray, ...]
    result: SimResult
    #: Per step: the request whose set-up at the API server ended the engine's
    #: idle wait before it (-1: it followed the step before at once).
    wake: np.ndarray
    #: Per request: the step after whose end it was sent (-1: at 0), and the
    #: steps that made its first token and its last.
    sent_step: np.ndarray
    first: np.ndarray
    finish: np.ndarray

    def timeline(self, model: StepTimeModel, seconds: np.ndarray | None = None) -> Timeline:
        """The recorded steps timed by ``model`` (or ``seconds``), with its API server's queue."""
        d = model.step_seconds(*self.work) if seconds is None else seconds
        return retime(d, self.work[5], self.wake, self.sent_step, model)

    def metrics(self, model: StepTimeModel) -> dict[str, float]:
        """TTFT/TPOT statistics (ms) had every step taken ``model``'s time."""
        t = self.timeline(model)
        res = copy(self.result)
        lat = model.request_latency_s
        res.req_arrival = array("d", t.sent)
        res.req_first = array("d", t.shown[self.first] + lat)
        res.req_finish = array("d", t.shown[self.finish] + lat)
        return metrics_ms(res)


def retime(
    d: np.ndarray, seqs: np.ndarray, wake: np.ndarray, sent_step: np.ndarray,
    model: StepTimeModel,
) -> Timeline:  # fmt: skip
    """The clock of recorded steps of durations ``d``: the scheduler's API-server
    queue (first come, first served: each step's output at its end, then the
    requests sent then), computed a run of steps at a time between the events
    that break it (a wake after an idle wait, requests sent)."""
    f, c = model.frontend_request_s, model.frontend_output_s
    n_steps, n_req = len(d), len(sent_step)
    end, shown = np.empty(n_steps), np.empty(n_steps)
    ready, sent = np.zeros(n_req), np.zeros(n_req)
    frontend = f > 0 or c > 0
    cuts = {0, n_steps, *np.flatnonzero(wake >= 0).tolist()}
    cuts.update((sent_step[sent_step >= 0] + 1).tolist())
    bounds = sorted(cuts)
    api = prev_end = 0.0
    ri = 0
    while ri < n_req and sent_step[ri] < 0:
        if frontend:
            api = api + f
        ready[ri] = api
        ri += 1
    for a, b in pairwise(bounds):
        start = prev_end
        j = int(wake[a])
        if j >= 0:
            start = max(start, ready[j])
        seg = start + np.cumsum(d[a:b])
        end[a:b] = seg
        if frontend:
            cs = c * seqs[a:b]
            acc = np.cumsum(cs)
            fe = acc + np.maximum(api, np.maximum.accumulate(seg - acc + cs))
            api = float(fe[-1])
        else:
            fe = seg
        shown[a:b] = fe
        prev_end = float(seg[-1])
        while ri < n_req and sent_step[ri] == b - 1:
            sent[ri] = prev_end
            if frontend:
                api = max(api, prev_end) + f
            ready[ri] = api if frontend else prev_end
            ri += 1
    return Timeline(end, shown, sent)


def record_row(
    row: dict[str, str],
    status: LatencyRow,
    tune: Callable[[StepTimeModel], StepTimeModel] | None = None,
) -> RecordedRow:
    """Replay ``row`` once (with ``tune``'s constants) and record it (see the module docstring)."""
    load = row_load(row)
    if not math.isinf(load.request_rate):
        raise ValueError(f"{row['id']}: a finite request rate depends on the clock")
    holder: list[StepTimeModel] = []

    def record(step: StepTimeModel) -> StepTimeModel:
        if tune is not None:
            step = tune(step)
        holder.append(step)
        kept = {f.name: getattr(step, f.name) for f in fields(step)}
        return StepRecorder(**kept)

    workload, cfg = row_setup(row, load, record)
    model = holder[0]
    if model.frontend_request_s > 0 and model.frontend_output_s <= 0:
        raise ValueError("recording needs frontend_output_s > 0 (steps told apart by their output)")
    res = simulate(workload, cfg)
    rec = cfg.step_model
    assert isinstance(rec, StepRecorder)
    work = tuple(np.array(col, dtype=np.float64) for col in zip(*rec.steps, strict=True))
    d = np.array(rec.seconds)
    end = np.frombuffer(res.step_time, dtype=np.float64)
    start = end - d
    prev = np.concatenate(([0.0], end[:-1]))
    idle = start - prev > 1e-9 * np.maximum(1.0, end)

    def per_request(a: array[float]) -> np.ndarray:
        return np.frombuffer(a, dtype=np.float64)

    # an idle engine wakes when the API server hands it every request sent so
    # far: the last one's set-up ends then
    sent = per_request(res.req_arrival)
    wake = np.full(len(end), -1, dtype=np.int64)
    idle_at = np.flatnonzero(idle)
    wake[idle_at] = np.searchsorted(sent, start[idle_at], side="right") - 1
    at = np.minimum(np.searchsorted(end, sent), len(end) - 1)
    sent_step = np.where(np.isclose(end[at], sent, rtol=1e-12, atol=0), at, -1)
    rec_row = RecordedRow(status, model, work, res, wake, sent_step, sent_step, sent_step)
    shown = rec_row.timeline(model, d).shown

    def step_of(a: array[float]) -> np.ndarray:
        t = per_request(a) - model.request_latency_s
        i = np.clip(np.searchsorted(shown, t), 1, len(shown) - 1)
        nearer = np.where(np.abs(shown[i - 1] - t) <= np.abs(shown[i] - t), i - 1, i)
        if not np.allclose(shown[nearer], t, rtol=1e-9, atol=1e-9):
            raise ValueError(f"{row['id']}: the recorded steps do not reproduce the replay")
        return nearer

    rec_row.first, rec_row.finish = step_of(res.req_first), step_of(res.req_finish)
    return rec_row


def _tuned(model: StepTimeModel, values: Sequence[float]) -> StepTimeModel:
    """``model`` with the trial ``values`` of :data:`FITTED`."""
    named = dict(zip(FITTED, values, strict=True))
    arch = "ampere" if model.gpu.name.startswith("a100") else "hopper"
    kw: dict[str, Any] = {k: v for k, v in named.items() if ":" not in k}
    kw["compute_efficiency"] = named[f"compute_efficiency:{arch}"]
    return replace(model, **kw)


def _start() -> list[float]:
    """timing.py's current constants, in :data:`FITTED`'s order."""
    from kvcoord.replay import timing

    named = {f"compute_efficiency:{k}": v for k, v in timing.COMPUTE_EFFICIENCY.items()}
    named.update(
        bandwidth_efficiency=timing.BANDWIDTH_EFFICIENCY,
        moe_efficiency=timing.MOE_EFFICIENCY,
        overhead_s=timing.STEP_OVERHEAD_S,
        frontend_request_s=timing.FRONTEND_REQUEST_S,
        frontend_output_s=timing.FRONTEND_OUTPUT_S,
        request_latency_s=timing.REQUEST_LATENCY_S,
    )
    return [named[k] for k in FITTED]


def _loss(recorded: Sequence[RecordedRow], values: Any) -> float:
    total = 0.0
    for rec in recorded:
        pred = rec.metrics(_tuned(rec.model, values))
        for kind in ("ttft", "tpot"):
            metric = rec.row.headline(kind)
            if metric is not None and pred.get(metric, 0) > 0:
                total += abs(math.log(pred[metric] / rec.row.measured[metric]))
    return total


def _nelder_mead(
    f: Callable[[np.ndarray], float], x0: np.ndarray, steps: int = 600, scale: float = 0.5
) -> np.ndarray:
    """Minimise ``f`` from ``x0`` (the standard reflect/expand/contract/shrink moves)."""
    n = len(x0)
    simplex = [x0] + [x0 + scale * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(steps):
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if values[-1] - values[0] < 1e-10:  # converged
            break
        centre = np.mean(simplex[:-1], axis=0)
        worst = simplex[-1]
        refl = centre + (centre - worst)
        fr = f(refl)
        if fr < values[0]:
            exp = centre + 2 * (centre - worst)
            fe = f(exp)
            simplex[-1], values[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = refl, fr
        else:
            con = centre + 0.5 * (worst - centre)
            fc = f(con)
            if fc < values[-1]:
                simplex[-1], values[-1] = con, fc
            else:
                best = simplex[0]
                simplex = [best] + [best + 0.5 * (x - best) for x in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
    found: np.ndarray = simplex[int(np.argmin(values))]
    return found


def fit(recorded: Sequence[RecordedRow], start: Sequence[float] | None = None) -> dict[str, float]:
    """The :data:`FITTED` constants that minimise the calibration loss on ``recorded``."""
    x0 = np.log([max(v, 1e-6) for v in (_start() if start is None else start)])
    capped = np.array([name in _CAPPED for name in FITTED])

    def values(x: np.ndarray) -> np.ndarray:
        v = np.exp(x)
        out: np.ndarray = np.where(capped, np.minimum(v, 1.0), v)
        return out

    best = _nelder_mead(lambda x: _loss(recorded, values(x)), x0)
    best = _nelder_mead(lambda x: _loss(recorded, values(x)), best, scale=0.1)
    return dict(zip(FITTED, values(best).tolist(), strict=True))


def calibrate(
    rows: dict[str, dict[str, str]], rounds: int = 3, log: Callable[[str], None] = print
) -> tuple[dict[str, float], list[RecordedRow]]:
    """Record :data:`CALIBRATION_ROWS` at the constants, fit, and again at the
    fitted ones, ``rounds`` times (see the module docstring); the last fit and
    the rows recorded at it."""
    status = {r.id: r for r in latency_rows(list(rows.values()), only=lambda _: False)}
    values = _start()
    constants: dict[str, float] = {}
    recorded: list[RecordedRow] = []
    for i in range(rounds + 1):

        def tune(m: StepTimeModel, v: Sequence[float] = values) -> StepTimeModel:
            return _tuned(m, v)

        recorded = [record_row(rows[r], status[r], tune) for r in CALIBRATION_ROWS]
        log(f"round {i}: loss {_loss(recorded, values):.3f} at the recorded constants")
        if i == rounds:
            break
        constants = fit(recorded, values)
        values = list(constants.values())
    return dict(zip(FITTED, values, strict=True)), recorded


def main(argv: Sequence[str] | None = None) -> int:
    from kvcoord.replay.validate import measurement_rows

    p = argparse.ArgumentParser(
        prog="python -m kvcoord.replay.calibrate",
        description="Fit the step-time model's constants to the calibration rows.",
    )
    p.add_argument("--rounds", type=int, default=3, help="record-and-fit rounds (default 3)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    rows = {r["id"]: r for r in measurement_rows()}
    constants, recorded = calibrate(rows, args.rounds)
    print(f"fit on {len(recorded)} rows (timing.CALIBRATION_ROWS):")
    for name, v in constants.items():
        print(f"  {name} = {v:.4g}")
    print("\nrow  metric  measured  fitted  error")
    for rec in recorded:
        pred = rec.metrics(rec.model)
        for kind in ("ttft", "tpot"):
            metric = rec.row.headline(kind)
            if metric is None:
                continue
            m, q = rec.row.measured[metric], pred[metric]
            print(f"{rec.row.id}  {metric}  {m:.1f}  {q:.1f}  {100 * (q / m - 1):+.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
