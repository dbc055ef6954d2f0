"""The step-time model against published serving measurements: TTFT and TPOT per row.

For every row of ``kvcoord/replay/data/vllm_measurements.csv`` with a
measured TTFT or TPOT, :func:`latency_rows` builds the load the source ran
(:func:`row_load`), replays it on the row's model, GPU and TP degree with
:class:`~kvcoord.replay.timing.StepTimeModel` and the KV pool vLLM would
allocate, and sets the predicted TTFT and TPOT (mean, median, p99, in
milliseconds, as ``vllm bench serve`` prints them) beside the measured ones.

How a row becomes a load:

* ``concurrency`` rows are closed loops (``max_concurrency``, every request
  queued at 0); ``rate`` rows are Poisson arrivals at ``load_value`` per
  second (``inf``: all at 0);
* lengths: where ``notes`` quote the run's totals (``total input tokens N,
  total generated tokens M``), every request has the mean (the sources ran
  without ``--ignore-eos``, so the mean is what was generated); a
  ``+-P%`` in ``dataset`` spreads the lengths uniformly by that share; a
  ShareGPT row without totals takes :data:`SHAREGPT_MEAN_LENGTHS`, and a
  ShareGPT row's lengths are drawn uniformly between 1 and twice the mean
  (the dataset is not shipped: its spread, not its shape);
* the server's ``--max-num-batched-tokens`` / ``--max-num-seqs`` /
  ``--async-scheduling`` in ``notes`` are used; otherwise ``vllm serve``'s
  defaults for the GPU (:func:`~kvcoord.replay.memory.vllm_serve_batch`);
* at most :data:`MAX_REQUESTS` requests of a closed loop or a finite rate
  are replayed (their latencies are those of a steady state); a burst (rate
  ``inf``) is replayed whole, because its TTFT is the time to drain the
  queue and grows with its length.

A row is ``calibration`` (in :data:`~kvcoord.replay.timing.CALIBRATION_ROWS`,
which the model's constants were fitted to), ``held out``, or ``not
covered`` with the reason (its model or GPU is not a preset, or it measures
throughput only).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kvcoord.replay.hardware import GPUS, load_gpu
from kvcoord.replay.loads import LengthDist, random_load
from kvcoord.replay.memory import vllm_serve_batch
from kvcoord.replay.models import MODELS
from kvcoord.replay.plan import make_plan
from kvcoord.replay.report import latency_metrics
from kvcoord.replay.scheduler import simulate
from kvcoord.replay.sim import SimConfig, SimResult
from kvcoord.replay.timing import CALIBRATION_ROWS, StepTimeModel
from kvcoord.replay.workloads import Workload

__all__ = [
    "MAX_REQUESTS",
    "METRICS",
    "SHAREGPT_MEAN_LENGTHS",
    "LatencyRow",
    "RowLoad",
    "latency_rows",
    "median_errors",
    "metrics_ms",
    "predict_row",
    "row_load",
    "row_setup",
]

#: Requests replayed at most per closed-loop or finite-rate row.
MAX_REQUESTS = 200
#: Mean prompt and output tokens of ``vllm bench serve``'s ShareGPT dataset,
#: for a row that does not quote its totals: the 1,000-prompt run of
#: ``gpustack-gptoss120b-h100-01`` (215,312 in, 195,544 generated).
SHAREGPT_MEAN_LENGTHS = (215, 196)
#: The statistics compared, as the CSV's columns name them (``<name>_ms``).
METRICS = ("ttft_mean", "ttft_median", "ttft_p99", "tpot_mean", "tpot_median", "tpot_p99")

_TOTALS = re.compile(r"total input tokens (\d+), total generated tokens (\d+)")
_SPREAD = re.compile(r"\+-(\d+)%")
_FLAG = re.compile(r"--(max-num-batched-tokens|max-num-seqs)[ =](\d+)")


@dataclass(frozen=True)
class RowLoad:
    """The load and server settings one row ran."""

    num_requests: int
    measured_requests: int
    input_len: LengthDist
    output_len: LengthDist
    request_rate: float
    max_concurrency: int | None
    max_num_seqs: int
    max_num_batched_tokens: int
    async_scheduling: bool

    def describe(self) -> str:
        load = (
            f"c={self.max_concurrency}"
            if self.max_concurrency is not None
            else ("burst" if math.isinf(self.request_rate) else f"{self.request_rate:g} req/s")
        )
        n = f"{self.num_requests}" + (
            f" of {self.measured_requests}" if self.num_requests < self.measured_requests else ""
        )
        return f"{load}, {n} req, in {self.input_len.describe()}, out {self.output_len.describe()}"


@dataclass
class LatencyRow:
    """One measured row: what was measured, what the model predicts, or why not."""

    id: str
    model: str
    gpu: str
    tp: int
    status: str
    reason: str = ""
    load: RowLoad | None = None
    measured: dict[str, float] = field(default_factory=dict)
    predicted: dict[str, float] = field(default_factory=dict)

    @property
    def checked(self) -> bool:
        return self.status in ("calibration", "held out")

    def error(self, metric: str) -> float | None:
        """Relative error of one statistic (``ttft_median``, ...), None where not both."""
        m, p = self.measured.get(metric), self.predicted.get(metric)
        if m is None or p is None or m <= 0:
            return None
        return p / m - 1

    def headline(self, kind: str) -> str | None:
        """The statistic a row's ``kind`` ("ttft", "tpot") error is judged on:
        the median, else the mean, else the p99 (what the source printed)."""
        for stat in ("median", "mean", "p99"):
            if f"{kind}_{stat}" in self.measured:
                return f"{kind}_{stat}"
        return None

    def headline_error(self, kind: str) -> float | None:
        metric = self.headline(kind)
        return None if metric is None else self.error(metric)


def _measured(row: dict[str, str]) -> dict[str, float]:
    return {m: float(row[f"{m}_ms"]) for m in METRICS if row.get(f"{m}_ms")}


def _lengths(row: dict[str, str]) -> tuple[LengthDist, LengthDist]:
    n = int(row["num_prompts"])
    totals = _TOTALS.search(row["notes"])
    sharegpt = row["dataset"] == "sharegpt"
    if totals:
        mean_in, mean_out = (max(1, round(int(t) / n)) for t in totals.groups())
    elif sharegpt:
        mean_in, mean_out = SHAREGPT_MEAN_LENGTHS
    else:
        if not row["input_len"] or not row["output_len"]:
            raise ValueError("input/output lengths not stated")
        mean_in, mean_out = int(row["input_len"]), int(row["output_len"])
    if sharegpt:
        return LengthDist("uniform", 1, 2 * mean_in - 1), LengthDist("uniform", 1, 2 * mean_out - 1)
    spread = _SPREAD.search(row["dataset"])
    if spread:
        share = int(spread.group(1)) / 100
        return tuple(  # type: ignore[return-value]
            LengthDist("uniform", round(m * (1 - share)), round(m * (1 + share)))
            for m in (mean_in, mean_out)
        )
    return LengthDist("fixed", mean_in), LengthDist("fixed", mean_out)


def row_load(row: dict[str, str], max_requests: int = MAX_REQUESTS) -> RowLoad:
    """The load ``row`` measured (see the module docstring); ValueError when it has none."""
    kind, value = row["load_kind"], row["load_value"]
    if kind not in ("concurrency", "rate"):
        raise ValueError(f"load {kind or 'none'!r}: no TTFT/TPOT to compare")
    inp, out = _lengths(row)
    seqs, tokens = vllm_serve_batch(load_gpu(row["gpu"]))
    flags = dict(_FLAG.findall(row["notes"]))
    seqs = int(flags.get("max-num-seqs", seqs))
    tokens = int(flags.get("max-num-batched-tokens", tokens))
    rate = math.inf if kind == "concurrency" else float(value)
    measured = int(row["num_prompts"])
    n = measured if math.isinf(rate) and kind == "rate" else min(measured, max_requests)
    return RowLoad(
        num_requests=n,
        measured_requests=measured,
        input_len=inp,
        output_len=out,
        request_rate=rate,
        max_concurrency=int(value) if kind == "concurrency" else None,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        async_scheduling="--async-scheduling" in row["notes"],
    )


def _status(row: dict[str, str]) -> tuple[str, str]:
    if row["model"] not in MODELS:
        return "not covered", f"model {row['model']!r} is not a preset"
    if row["gpu"] not in GPUS:
        return "not covered", f"GPU {row['gpu']!r} is not a preset"
    return ("calibration" if row["id"] in CALIBRATION_ROWS else "held out"), ""


def row_setup(
    row: dict[str, str],
    load: RowLoad,
    tune: Callable[[StepTimeModel], StepTimeModel] | None = None,
) -> tuple[Workload, SimConfig]:
    """The workload and replay set-up of ``row`` under ``load``; ``tune`` may
    replace the step-time model (a trial of other constants)."""
    workload: Workload = random_load(
        num_requests=load.num_requests,
        input_len=load.input_len,
        output_len=load.output_len,
        request_rate=load.request_rate,
    )
    plan = make_plan(
        workload,
        model=row["model"],
        kv_dtype=row["kv_dtype"] or None,
        weight_dtype=row["weight_dtype"] or None,
        gpu=row["gpu"],
        tp=int(row["tp"]),
        gpu_memory_utilization=float(row["gpu_memory_utilization"] or 0.9),
        max_num_seqs=load.max_num_seqs,
        max_num_batched_tokens=load.max_num_batched_tokens,
    )
    step = replace(plan.step_model, async_scheduling=load.async_scheduling)
    if tune is not None:
        step = tune(step)
    cfg = SimConfig(
        layout=plan.layout,
        num_blocks=plan.num_blocks,
        max_running=load.max_num_seqs,
        token_budget=load.max_num_batched_tokens,
        step_model=step,
        track_best=False,
        max_concurrency=load.max_concurrency,
    )
    return workload, cfg


def metrics_ms(res: SimResult) -> dict[str, float]:
    """The :data:`METRICS` of one replay, in milliseconds."""
    m: dict[str, Any] = latency_metrics(res)
    return {k: float(m[f"{k}_ms"]) for k in METRICS if m.get(f"{k}_ms") is not None}


def predict_row(
    row: dict[str, str],
    load: RowLoad,
    tune: Callable[[StepTimeModel], StepTimeModel] | None = None,
) -> dict[str, float]:
    """Predicted TTFT/TPOT statistics (ms) of ``row`` under ``load`` (see :func:`row_setup`)."""
    return metrics_ms(simulate(*row_setup(row, load, tune)))


def latency_rows(
    rows: Sequence[dict[str, str]],
    max_requests: int = MAX_REQUESTS,
    tune: Callable[[StepTimeModel], StepTimeModel] | None = None,
    only: Callable[[dict[str, str]], bool] | None = None,
) -> list[LatencyRow]:
    """Every row with a measured TTFT or TPOT (see the module docstring);
    ``only`` picks which covered rows are replayed (the others are skipped)."""
    out = []
    for row in rows:
        measured = _measured(row)
        if not measured and row["load_kind"] != "offline":
            continue  # a memory-only row: validate --memory checks it
        status, reason = _status(row)
        r = LatencyRow(row["id"], row["model"], row["gpu"], int(row["tp"]), status, reason)
        r.measured = measured
        if r.checked:
            try:
                r.load = row_load(row, max_requests)
            except ValueError as e:
                r.status, r.reason = "not covered", str(e)
        if r.checked and (only is None or only(row)):
            assert r.load is not None
            r.predicted = predict_row(row, r.load, tune)
        out.append(r)
    return out


def median_errors(rows: Sequence[LatencyRow], kind: str) -> float | None:
    """Median of the rows' headline |error| for ``kind`` ("ttft", "tpot")."""
    errs = sorted(abs(e) for r in rows if (e := r.headline_error(kind)) is not None)
    if not errs:
        return None
    mid = len(errs) // 2
    return errs[mid] if len(errs) % 2 else (errs[mid - 1] + errs[mid]) / 2
