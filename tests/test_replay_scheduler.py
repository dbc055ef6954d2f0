"""The simulator driving the real ``kvcoord.KVCacheManager``: accounting on small workloads.

These tests need the manager (issue 4); each imports it through the ``api``
fixture so that the rest of the suite still runs while it is missing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvcoord.replay.bestcase import best_possible_hits
from kvcoord.replay.layouts import PRESETS, num_blocks_for_capacity
from kvcoord.replay.scheduler import SimConfig, SimulationError, simulate
from kvcoord.replay.workloads import Workload, WorkloadRequest, read_mooncake, synthetic_chat

DATA = Path(__file__).parent / "data"


@pytest.fixture
def api() -> Any:
    from kvcoord import KVCacheManager

    return KVCacheManager


def _req(rid: str, prompt: list[int], t: float, n_out: int = 4) -> WorkloadRequest:
    out = tuple(range(30000, 30000 + n_out))
    return WorkloadRequest(rid, t, len(prompt), n_out, lambda p=tuple(prompt): p, None, out)


def _check_clean(res: Any, n: int) -> None:
    assert res.num_requests == n
    assert res.num_finished == n
    assert res.leaked_blocks == 0


def test_hand_made_hits(api: Any) -> None:
    p = list(range(100, 164))  # 4 blocks
    q = [*list(range(100, 140)), *list(range(500, 540))]  # shares 2.5 blocks with p
    wl = Workload("w", [_req("a", p, 0.0), _req("b", p, 10.0), _req("c", q, 20.0)])
    res = simulate(wl, SimConfig(PRESETS["full"], num_blocks=64))
    _check_clean(res, 3)
    assert res.prompt_tokens == 64 + 64 + 80
    assert res.hit_tokens == 48 + 32
    assert res.preemptions == 0
    assert res.output_tokens == 12
    assert res.hit_tokens == best_possible_hits(wl, 16).hit_tokens


def test_no_prefix_cache_layout_has_no_hits(api: Any) -> None:
    p = list(range(64))
    wl = Workload("w", [_req("a", p, 0.0), _req("b", p, 10.0)])
    res = simulate(wl, SimConfig(PRESETS["no-prefix-cache"], num_blocks=64))
    _check_clean(res, 2)
    assert res.hit_tokens == 0
    assert res.evictions == 0


def test_preemption_by_recomputation(api: Any) -> None:
    # 8 requests arriving together, each growing to 64 + 40 tokens (7 blocks); 20 blocks hold 2-3
    reqs = [_req(f"r{i}", [i * 1000 + j for j in range(64)], 0.0, n_out=40) for i in range(8)]
    wl = Workload("w", reqs)
    res = simulate(wl, SimConfig(PRESETS["full"], num_blocks=20, token_budget=256))
    _check_clean(res, 8)
    assert res.preemptions > 0
    assert res.output_tokens == 8 * 40


def test_single_request_too_large_for_pool(api: Any) -> None:
    wl = Workload("w", [_req("big", list(range(200)), 0.0)])
    with pytest.raises(SimulationError, match="larger pool"):
        simulate(wl, SimConfig(PRESETS["full"], num_blocks=8))


def test_evictions_counted_under_pressure(api: Any) -> None:
    reqs = [_req(f"r{i}", [i * 1000 + j for j in range(160)], float(i)) for i in range(20)]
    wl = Workload("w", reqs)
    small = simulate(wl, SimConfig(PRESETS["full"], num_blocks=30))
    _check_clean(small, 20)
    assert small.evictions > 0
    big = simulate(wl, SimConfig(PRESETS["full"], num_blocks=400))
    _check_clean(big, 20)
    assert big.evictions == 0


def test_mooncake_replay_equals_best_possible_with_a_large_pool(api: Any) -> None:
    wl = read_mooncake(DATA / "mooncake_small.jsonl")
    res = simulate(wl, SimConfig(PRESETS["full"], num_blocks=2000))
    _check_clean(res, 6)
    assert res.preemptions == 0
    assert res.evictions == 0
    assert res.hit_tokens == best_possible_hits(wl, 16).hit_tokens == 2544


@pytest.mark.parametrize("block_size", [16, 32])
def test_default_workload_equals_best_possible_when_spread_out(api: Any, block_size: int) -> None:
    wl = synthetic_chat(num_conversations=12)
    layout = PRESETS["full"].with_block_size(block_size)
    # stretched arrivals: every turn finishes before the next one arrives
    cfg = SimConfig(
        layout, num_blocks_for_capacity(layout, 200_000), time_scale=100.0, track_best=True
    )
    res = simulate(wl, cfg)
    _check_clean(res, len(wl.requests))
    best = best_possible_hits(wl, block_size)
    assert res.hit_tokens == best.hit_tokens > 0
    assert res.best == best  # the simulator's own best-possible pass agrees


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_completes_without_leaks(api: Any, name: str) -> None:
    wl = synthetic_chat(num_conversations=16)
    layout = PRESETS[name]
    res = simulate(wl, SimConfig(layout, num_blocks_for_capacity(layout, 8192), max_running=8))
    _check_clean(res, len(wl.requests))
    if not layout.enable_caching:
        assert res.hit_tokens == 0
    assert res.steps == len(res.step_usage) == len(res.step_manager_s)
    assert all(0.0 <= u <= 1.0 for u in res.step_usage)


def test_bare_kvcoord_runs_the_bundled_default(
    api: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvcoord.cli import main

    assert main(["--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "synthetic-chat" in out
    assert "LEAKED" not in out


def test_cli_replay_and_sweep_end_to_end(
    api: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvcoord.cli import main

    out = tmp_path / "r.json"
    assert main(["replay", "--limit", "40", "--json", str(out), "--no-progress"]) == 0
    table = capsys.readouterr().out
    assert "prefix-cache hit rate" in table and "best possible" in table
    doc = json.loads(out.read_text())
    for key in (
        "prefix_hit_rate",
        "best_possible_hit_rate",
        "num_requests",
        "preemptions",
        "evictions",
        "manager_seconds",
        "peak_usage",
        "mean_usage",
        "manager_us_per_step_p50",
        "manager_us_per_step_p99",
    ):
        assert key in doc
    assert doc["num_requests"] == doc["num_finished"] == 40
    assert 0.0 <= doc["prefix_hit_rate"] <= doc["best_possible_hit_rate"] <= 1.0

    trace = str(DATA / "mooncake_small.jsonl")
    png = tmp_path / "r.png"
    assert (
        main(
            [
                "replay",
                "--trace",
                trace,
                "--num-blocks",
                "2000",
                "--plot",
                str(png),
                "--no-progress",
            ]
        )
        == 0
    )
    assert png.read_bytes()[:4] == b"\x89PNG"

    sj, sp = tmp_path / "s.json", tmp_path / "s.png"
    argv = [
        "sweep",
        "--trace",
        trace,
        "--sizes",
        "300,600,2000",
        "--json",
        str(sj),
        "--plot",
        str(sp),
    ]
    assert main([*argv, "--no-progress", "--jobs", "2"]) == 0
    rows = json.loads(sj.read_text())["rows"]
    assert [r["num_blocks"] for r in rows] == [300, 600, 2000]
    assert rows[-1]["prefix_hit_rate"] == pytest.approx(2544 / 4764)
    assert sp.read_bytes()[:4] == b"\x89PNG"
