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
request sent at 0) schedules the same steps whatever they cost: which
requests run in which step depends on the step count, never on the clock.
So each calibration row is replayed once, with a step-time model that
records every step's work (:class:`StepRecorder`, one simulated second a
step), and a trial's TTFT and TPOT follow from that record and the trial's
step times (:meth:`RecordedRow.metrics`), exactly. Rows with a finite
request rate depend on the clock and are not used for calibration.

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

__all__ = ["FITTED", "RecordedRow", "StepRecorder", "fit", "main", "record_row"]

#: The fitted fields of :class:`StepTimeModel` (timing.py's constants of the same
#: meaning); ``compute_efficiency:ARCH`` is :data:`~kvcoord.replay.timing.COMPUTE_EFFICIENCY`'s.
FITTED = (
    "compute_efficiency:ampere",
    "compute_efficiency:hopper",
    "bandwidth_efficiency",
    "moe_efficiency",
    "overhead_s",
    "cpu_scale",
    "request_latency_s",
)
_CAPPED = ("compute_efficiency:ampere", "compute_efficiency:hopper", "bandwidth_efficiency",
           "moe_efficiency")  # fmt: skip


@dataclass(frozen=True)
class StepRecorder(StepTimeModel):
    """A step-time model that records each step's work and takes one second a step."""

    steps: list[tuple[int, ...]] = field(default_factory=list)

    def step_seconds(self, *work: Any) -> Any:
        self.steps.append(work)
        return 1.0


@dataclass
class RecordedRow:
    """One calibration row's steps and requests, replayed once."""

    row: LatencyRow
    model: StepTimeModel
    work: tuple[np.ndarray, ...]
    result: SimResult
    arrival: np.ndarray
    first: np.ndarray
    finish: np.ndarray

    def metrics(self, model: StepTimeModel) -> dict[str, float]:
        """TTFT/TPOT statistics (ms) had every step taken ``model``'s time."""
        clock = np.concatenate(([0.0], np.cumsum(model.step_seconds(*self.work))))
        res = copy(self.result)
        lat = model.request_latency_s
        res.req_arrival = array("d", clock[self.arrival])
        res.req_first = array("d", clock[self.first] + lat)
        res.req_finish = array("d", clock[self.finish] + lat)
        return metrics_ms(res)


def record_row(row: dict[str, str], status: LatencyRow) -> RecordedRow:
    """Replay ``row`` once with a :class:`StepRecorder` (see the module docstring)."""
    load = row_load(row)
    if not math.isinf(load.request_rate):
        raise ValueError(f"{row['id']}: a finite request rate depends on the clock")
    holder: list[StepTimeModel] = []

    def record(step: StepTimeModel) -> StepTimeModel:
        holder.append(step)
        kept = {f.name: getattr(step, f.name) for f in fields(step)}
        return StepRecorder(**{**kept, "request_latency_s": 0.0})

    workload, cfg = row_setup(row, load, record)
    res = simulate(workload, cfg)
    rec = cfg.step_model
    assert isinstance(rec, StepRecorder)
    work = tuple(np.array(col, dtype=np.float64) for col in zip(*rec.steps, strict=True))

    def steps(a: array[float]) -> np.ndarray:
        return np.rint(np.frombuffer(a, dtype=np.float64)).astype(np.int64)

    return RecordedRow(
        status, holder[0], work, res, steps(res.req_arrival), steps(res.req_first),
        steps(res.req_finish),
    )  # fmt: skip


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
        cpu_scale=timing.CPU_SCALE,
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


def fit(recorded: Sequence[RecordedRow]) -> dict[str, float]:
    """The :data:`FITTED` constants that minimise the calibration loss."""
    x0 = np.log([max(v, 1e-4) for v in _start()])
    capped = np.array([name in _CAPPED for name in FITTED])

    def values(x: np.ndarray) -> np.ndarray:
        v = np.exp(x)
        out: np.ndarray = np.where(capped, np.minimum(v, 1.0), v)
        return out

    best = _nelder_mead(lambda x: _loss(recorded, values(x)), x0)
    best = _nelder_mead(lambda x: _loss(recorded, values(x)), best, scale=0.1)
    return dict(zip(FITTED, values(best).tolist(), strict=True))


def main(argv: Sequence[str] | None = None) -> int:
    from kvcoord.replay.validate import measurement_rows

    p = argparse.ArgumentParser(
        prog="python -m kvcoord.replay.calibrate",
        description="Fit the step-time model's constants to the calibration rows.",
    )
    p.parse_args(argv)
    rows = {r["id"]: r for r in measurement_rows()}
    status = {r.id: r for r in latency_rows(list(rows.values()), only=lambda _: False)}
    recorded = [record_row(rows[i], status[i]) for i in CALIBRATION_ROWS]
    constants = fit(recorded)
    print(f"fit on {len(recorded)} rows (timing.CALIBRATION_ROWS):")
    for name, v in constants.items():
        print(f"  {name} = {v:.4g}")
    print("\nrow  metric  measured  fitted  error")
    for rec in recorded:
        pred = rec.metrics(_tuned(rec.model, list(constants.values())))
        for kind in ("ttft", "tpot"):
            metric = rec.row.headline(kind)
            if metric is None:
                continue
            m, q = rec.row.measured[metric], pred[metric]
            print(f"{rec.row.id}  {metric}  {m:.1f}  {q:.1f}  {100 * (q / m - 1):+.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
