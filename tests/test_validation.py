"""The step-time model against published vLLM measurements (``make validate``'s check, in CI).

CI replays every covered row (closed loops and finite rates capped at
:data:`CI_MAX_REQUESTS` requests, bursts whole, as ``validate
--max-requests`` does) and asserts the medians of |error| over all of them
meet issue 31's targets, over all of them and over the held-out rows. The
negative control
runs the same check, with a perturbed constant, on every third covered row
in id order (:func:`_every_third`), which meets the targets unperturbed. The
fit's fast path (one recorded replay per row) is checked against real replays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import cache

import pytest

from kvcoord.replay.calibrate import record_row
from kvcoord.replay.latency_check import (
    MAX_REQUESTS,
    LatencyRow,
    latency_rows,
    median_errors,
    predict_row,
    row_load,
)
from kvcoord.replay.latency_report import (
    TPOT_TARGET,
    TTFT_TARGET,
    format_latency_table,
    meets_targets,
    summary_lines,
)
from kvcoord.replay.timing import CALIBRATION_ROWS, StepTimeModel
from kvcoord.replay.validate import kv_pool_rows, main, measurement_rows

ROWS = {r["id"]: r for r in measurement_rows()}
#: Requests replayed at most per closed-loop or finite-rate row in CI.
CI_MAX_REQUESTS = 60


Tune = Callable[[StepTimeModel], StepTimeModel]


def _covered(
    tune: Tune | None = None, only: Callable[[str], bool] | None = None
) -> list[LatencyRow]:
    rows = latency_rows(
        list(ROWS.values()),
        max_requests=CI_MAX_REQUESTS,
        tune=tune,
        only=None if only is None else (lambda r: only(r["id"])),
    )
    return [r for r in rows if r.checked and (only is None or only(r.id))]


@cache
def _covered_ids() -> list[str]:
    return sorted(
        r.id for r in latency_rows(list(ROWS.values()), only=lambda _: False) if r.checked
    )


def _every_third(row_id: str) -> bool:
    """Every third covered row, in id order (the negative control's rows)."""
    return _covered_ids().index(row_id) % 3 == 0


@pytest.fixture(scope="module")
def covered_rows() -> list[LatencyRow]:
    return _covered()


def _check(rows: list[LatencyRow]) -> None:
    """Both targets over every row and over the held-out rows."""
    held_out = [r for r in rows if r.status == "held out"]
    for subset in (rows, held_out):
        for kind in ("ttft", "tpot"):
            med = median_errors(subset, kind)
            target = TTFT_TARGET if kind == "ttft" else TPOT_TARGET
            assert med is not None and med <= target, summary_lines(rows)


def test_every_covered_row_meets_the_targets(covered_rows: list[LatencyRow]) -> None:
    assert len(covered_rows) >= 50 and all(r.predicted for r in covered_rows)
    _check(covered_rows)
    assert meets_targets(covered_rows)


@pytest.mark.parametrize(
    "tune",
    [
        pytest.param(lambda m: replace(m, bandwidth_efficiency=0.5), id="half-bandwidth"),
        pytest.param(
            lambda m: replace(m, frontend_request_s=0.0, frontend_output_s=0.0),
            id="no-api-server",
        ),
    ],
)
def test_a_perturbed_model_misses_them(covered_rows: list[LatencyRow], tune: Tune) -> None:
    """Negative control: every third row meets the targets, and misses them perturbed."""
    sample = [r for r in covered_rows if _every_third(r.id)]
    assert meets_targets(sample)
    assert not meets_targets(_covered(tune, _every_third))


def test_every_timed_row_is_checked_or_listed_with_a_reason() -> None:
    rows = latency_rows(list(ROWS.values()), only=lambda _: False)
    timed = {i for i, r in ROWS.items() if r["load_kind"]}
    assert {r.id for r in rows} == timed
    for r in rows:
        assert r.checked or r.reason, r.id
    checked = {r.id for r in rows if r.checked}
    assert set(CALIBRATION_ROWS) <= checked
    assert len(checked - set(CALIBRATION_ROWS)) >= 30  # held out
    assert "vllmperf-9513-h200-throughput-llama8B-tp1" not in checked  # offline only
    lines = summary_lines(rows)
    assert any("gist-azure-a100pcie-llama70b-qps1: not covered: GPU" in line for line in lines)


def test_a_row_becomes_the_load_it_ran() -> None:
    burst = row_load(ROWS["gpustack-qwen3-14b-a100-03"])
    # 500 requests at once, the totals' mean lengths, A100's serve defaults
    assert (burst.num_requests, burst.max_concurrency) == (500, None)
    assert (burst.input_len.describe(), burst.output_len.describe()) == ("3996", "200")
    assert (burst.max_num_seqs, burst.max_num_batched_tokens) == (256, 2048)
    loop = row_load(ROWS["gpustack-gptoss120b-a100-11"], max_requests=MAX_REQUESTS)
    assert loop.max_concurrency == 4 and loop.async_scheduling
    assert loop.max_num_batched_tokens == 4096  # the server's --max-num-batched-tokens
    assert loop.input_len.kind == "uniform"  # ShareGPT: spread around the mean
    capped = row_load(ROWS["vllmperf-9513-h200-serving-llama70b-qps1"], max_requests=50)
    assert (capped.num_requests, capped.measured_requests) == (50, 200)


def test_the_fit_fast_path_is_the_replay() -> None:
    """A recorded replay re-timed gives what a replay gives: at the recorded
    constants, and for a burst (its requests reach the engine at once, so
    its steps do not depend on the clock) at others too."""
    for row_id in ("gpustack-qwen3-8b-h100-04", "gpustack-qwen3-14b-h100-05"):
        row = ROWS[row_id]
        (status,) = latency_rows([row], only=lambda _: False)
        recorded = record_row(row, status)
        same = recorded.metrics(recorded.model)
        assert same == pytest.approx(predict_row(row, row_load(row)), rel=1e-9)

    def tune(m: StepTimeModel) -> StepTimeModel:
        return replace(m, overhead_s=5e-3, frontend_request_s=0.02, request_latency_s=0.01)

    fast = recorded.metrics(tune(recorded.model))
    assert fast == pytest.approx(predict_row(row, row_load(row), tune), rel=1e-9)
    assert fast != pytest.approx(same, rel=1e-3)


def test_tables_and_kv_pool_check(covered_rows: list[LatencyRow]) -> None:
    md = format_latency_table(covered_rows, markdown=True)
    assert md.count("\n") == len(covered_rows) + 1 and "gpustack-qwen3-8b-h100-02" in md
    assert all(r.within_tolerance for r in kv_pool_rows() if r.checked)
    with pytest.raises(SystemExit) as ei:
        main(["--max-requests", "0"])
    assert ei.value.code == 2
