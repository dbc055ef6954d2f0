"""The overload verdict (``kvcoord.replay.overload``): an underloaded replay says
it keeps up, an overloaded one says so with a sustained rate near the true
capacity, a closed loop and a burst are told apart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvcoord.cli import main
from kvcoord.replay.cluster import simulate_cluster, summarize_cluster
from kvcoord.replay.layouts import PRESETS
from kvcoord.replay.loads import parse_lengths, random_load
from kvcoord.replay.overload import format_overload, overload_verdict
from kvcoord.replay.report import format_summary, format_sweep, summarize
from kvcoord.replay.scheduler import SimConfig, simulate

N = 600


def _cfg(**kw: Any) -> SimConfig:
    # a small batch, so that capacity is low and an overload cheap to replay
    kw.setdefault("max_running", 8)
    return SimConfig(PRESETS["full"], num_blocks=4096, track_best=False, **kw)


def _load(rate: float, n: int = N) -> Any:
    return random_load(
        num_requests=n,
        input_len=parse_lengths("uniform:64:192"),
        output_len=parse_lengths("uniform:8:24"),
        request_rate=rate,
    )


@pytest.fixture(scope="module")
def capacity() -> float:
    """Requests per second the deployment serves with a full batch throughout:
    everything offered at once, measured over the whole run."""
    res = simulate(_load(float("inf")), _cfg())
    v = overload_verdict(res)
    assert v["regime"] == "burst" and not v["overloaded"]
    assert v["sustained_rps"] == pytest.approx(N / res.sim_seconds)
    return float(v["sustained_rps"])


def test_underloaded_keeps_up(capacity: float) -> None:
    res = simulate(_load(0.2 * capacity), _cfg())
    v = overload_verdict(res)
    assert v["regime"] == "open loop" and v["overloaded"] is False
    assert v["offered_rps"] == pytest.approx(0.2 * capacity, rel=0.15)
    assert abs(v["queue_growth"]) < 0.01
    assert v["sustained_rps"] == v["offered_rps"]  # it served what it was offered
    assert v["time_scale_needed"] is None and v["sustainable_rps_at_target"] is None
    line = format_overload(v)
    assert line.startswith("keeps up") and "\n" not in line


def test_overloaded_says_so_with_the_capacity(capacity: float) -> None:
    res = simulate(_load(5 * capacity), _cfg())
    v = overload_verdict(res, time_scale=1.0)
    assert v["overloaded"] is True
    assert capacity / 1.2 <= v["sustained_rps"] <= 1.2 * capacity
    assert v["capacity_rps"] == v["sustained_rps"] and v["saturated_share"] > 0.9
    assert v["sustainable_rps_at_target"] == v["sustained_rps"]
    assert v["queue_growth"] > 1  # about offered / capacity - 1 = 4
    assert v["queue_delay_last_s"] > v["queue_delay_first_s"]
    assert v["simulated_seconds"] > 2 * v["trace_seconds"]
    assert v["time_scale_needed"] == pytest.approx(v["offered_rps"] / v["sustained_rps"])
    line = format_overload(v)
    assert line.startswith("OVERLOADED") and "\n" not in line
    assert "--time-scale" in line and "no latency target given" in line


def test_the_suggested_time_scale_keeps_up(capacity: float) -> None:
    wl = _load(5 * capacity)
    v = overload_verdict(simulate(wl, _cfg()))
    scale = 1.2 * v["time_scale_needed"]  # a margin: at the capacity itself queues random-walk
    w = overload_verdict(simulate(wl, _cfg(time_scale=scale)), time_scale=scale)
    assert w["overloaded"] is False
    assert w["offered_rps"] == pytest.approx(v["offered_rps"] / scale)


def test_time_scale_zero_is_a_burst() -> None:
    res = simulate(_load(2.0, n=50), _cfg(time_scale=0.0))
    v = overload_verdict(res)
    assert v["regime"] == "burst" and v["offered_rps"] is None
    assert "arrives at once" in format_overload(v)


def test_closed_loop_cannot_overload(capacity: float) -> None:
    res = simulate(_load(float("inf")), _cfg(max_concurrency=4))
    v = overload_verdict(res, max_concurrency=4)
    assert v["regime"] == "closed loop" and v["overloaded"] is False
    assert v["sustained_rps"] == pytest.approx(N / res.sim_seconds)
    assert v["sustained_rps"] < capacity  # 4 clients keep half the batch of 8 busy
    assert v["sustainable_rps_at_target"] is None
    assert format_overload(v).startswith("closed loop, 4 clients")
    s = summarize(res, None, _cfg(max_concurrency=4), "w")
    assert "closed loop" in format_sweep([s]).splitlines()[1]


def test_capped_clients_behind_a_high_rate_are_overloaded(capacity: float) -> None:
    closed = overload_verdict(simulate(_load(float("inf")), _cfg(max_concurrency=2)), 2)
    res = simulate(_load(5 * capacity), _cfg(max_concurrency=2))
    v = overload_verdict(res, max_concurrency=2)
    assert v["overloaded"] is True  # the clients' backlog grows
    assert v["sustained_rps"] == pytest.approx(closed["sustained_rps"], rel=0.3)
    assert "2 clients get" in format_overload(v)


def test_summary_and_sweep_row_carry_the_verdict(capacity: float) -> None:
    cfg = _cfg()
    res = simulate(_load(5 * capacity), cfg)
    s = summarize(res, None, cfg, "w")
    assert s["overload"]["overloaded"] is True
    lines = [ln for ln in format_summary(s).splitlines() if ln.startswith("load ")]
    assert len(lines) == 1 and "OVERLOADED" in lines[0]
    json.dumps(s, allow_nan=False)
    assert "over x" in format_sweep([s])


def test_cluster_capacity_counts_every_engine(capacity: float) -> None:
    cfg = _cfg()
    cres = simulate_cluster(_load(10 * capacity), cfg, 2, "round-robin")
    s = summarize_cluster(cres, cfg, "w")
    v = s["overload"]
    assert v["overloaded"] is True
    assert 2 * capacity / 1.5 <= v["sustained_rps"] <= 2 * 1.5 * capacity
    with pytest.raises(ValueError, match="single engine"):
        simulate_cluster(_load(1.0, n=5), _cfg(max_concurrency=2), 2, "round-robin")


def test_cli_json_has_the_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o.json"
    argv = ["replay", "--num-requests", "40", "--input-len", "64", "--output-len", "4",
            "--request-rate", "1", "--num-blocks", "2048", "--no-progress",
            "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "keeps up: offered" in capsys.readouterr().out
    v = json.loads(out.read_text())["overload"]
    assert v["overloaded"] is False and v["offered_rps"] > 0
