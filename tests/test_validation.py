"""The step-time model against published vLLM measurements (``make validate``'s check, in CI).

CI replays :data:`SAMPLE`, rows of every model, GPU and load kind that
replay in a few seconds (``make validate`` replays them all), and asserts
the medians of |error| meet issue 31's targets; a perturbed constant makes
the same check fail (the negative control). The fit's fast path (one
recorded replay per row) is checked against a real replay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

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
#: Rows CI replays: closed loops and bursts of short and mid-length prompts on
#: each model preset and GPU with measurements, calibration and held-out alike,
#: the model's worst kinds of row among them (bursts of 128-token prompts, the
#: vLLM blog's 20k-token prompts); the 32k-token bursts are left to ``make validate``.
SAMPLE = (
    "gpustack-qwen3-8b-h100-01",
    "gpustack-qwen3-8b-h100-02",
    "gpustack-qwen3-8b-h100-03",
    "gpustack-qwen3-8b-h100-04",
    "gpustack-qwen3-14b-h100-04",
    "gpustack-qwen3-14b-a100-03",
    "gpustack-qwen3-14b-a100-04",
    "gpustack-qwen3-32b-h100-04",
    "gpustack-qwen3-32b-a100-04",
    "gpustack-gptoss120b-h100-06",
    "gpustack-gptoss120b-h100-11",
    "gpustack-gptoss120b-a100-06",
    "gpustack-gptoss120b-a100-09",
    "gpustack-dsr1-h200-06",
    "gpustack-qwen3-14b-h100-05",
    "gpustack-gptoss120b-a100-05",
    "vllmblog-fp8kv-llama8b-02",
    "vllmperf-9513-h200-serving-llama70b-qps1",
)


Tune = Callable[[StepTimeModel], StepTimeModel]


def _sample(tune: Tune | None = None) -> list[LatencyRow]:
    return latency_rows([ROWS[i] for i in SAMPLE], max_requests=60, tune=tune)


@pytest.fixture(scope="module")
def sample_rows() -> list[LatencyRow]:
    return _sample()


def test_sample_meets_the_targets(sample_rows: list[LatencyRow]) -> None:
    assert all(r.checked and r.predicted for r in sample_rows)
    ttft, tpot = median_errors(sample_rows, "ttft"), median_errors(sample_rows, "tpot")
    assert ttft is not None and ttft <= TTFT_TARGET, summary_lines(sample_rows)
    assert tpot is not None and tpot <= TPOT_TARGET, summary_lines(sample_rows)
    assert meets_targets(sample_rows)
    assert {r.status for r in sample_rows} == {"calibration", "held out"}


@pytest.mark.parametrize(
    "tune",
    [
        pytest.param(lambda m: replace(m, bandwidth_efficiency=0.5), id="half-bandwidth"),
        pytest.param(lambda m: replace(m, request_latency_s=0.0, cpu_scale=0.0), id="no-cpu"),
    ],
)
def test_a_perturbed_model_misses_them(tune: Tune) -> None:
    """Negative control: the same check on the same rows fails for a worse model."""
    assert not meets_targets(_sample(tune))


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
    """A recorded replay re-timed with other constants gives what a replay with them gives."""
    row = ROWS["gpustack-qwen3-8b-h100-04"]
    (status,) = latency_rows([row], only=lambda _: False)
    recorded = record_row(row, status)

    def tune(m: StepTimeModel) -> StepTimeModel:
        return replace(m, overhead_s=2e-3, cpu_scale=3.0, request_latency_s=0.01)

    fast = recorded.metrics(tune(recorded.model))
    assert fast == pytest.approx(predict_row(row, row_load(row), tune), rel=1e-9)
    assert fast != pytest.approx(recorded.metrics(recorded.model), rel=1e-3)


def test_tables_and_kv_pool_check(sample_rows: list[LatencyRow]) -> None:
    md = format_latency_table(sample_rows, markdown=True)
    assert md.count("\n") == len(sample_rows) + 1 and "gpustack-qwen3-8b-h100-02" in md
    assert all(r.within_tolerance for r in kv_pool_rows() if r.checked)
    with pytest.raises(SystemExit) as ei:
        main(["--max-requests", "0"])
    assert ei.value.code == 2
