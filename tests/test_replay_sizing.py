"""``kvcoord replay --find-size`` (bare ``kvcoord``): the pool a workload needs
for its best hit rate, found by replays and said in a sentence."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from kvcoord.cli import main
from kvcoord.replay.plan import make_plan
from kvcoord.replay.scheduler import SimConfig, simulate
from kvcoord.replay.sizing import NEAR_BEST, RESOLUTION, SizePoint, _next_size, find_size
from kvcoord.replay.workloads import Workload, synthetic_chat


@pytest.fixture(scope="module")
def workload() -> Workload:
    return synthetic_chat(num_conversations=20)


@pytest.fixture(scope="module")
def small(workload: Workload) -> Any:
    """The sizing of a pool too small for the workload."""
    return _sized(workload, capacity=10_000)


def _sized(wl: Workload, capacity: int | None = None, host: float | None = None) -> Any:
    plan = make_plan(wl, capacity_tokens=capacity, host_memory=host)
    cfg = SimConfig(
        layout=plan.layout,
        num_blocks=plan.num_blocks,
        step_model=plan.step_model,
        host_tier=plan.host_tier(),
        token_bytes_per_gpu=plan.footprint.token_bytes_per_gpu,
    )
    res = simulate(wl, cfg)
    seen: list[SizePoint] = []
    sizing = find_size(
        wl,
        cfg,
        plan,
        res,
        max_blocks=1 << 20,
        room_bytes=plan.kv_bytes_per_gpu,
        progress=seen.append,
    )
    return sizing, seen, cfg


def test_a_small_pool_is_told_the_size_it_needs(small: Any) -> None:
    sizing, seen, cfg = small
    assert sizing.given.num_blocks == cfg.num_blocks and sizing.given.evictions > 0
    need = sizing.needed
    assert need is not None and need.num_blocks > cfg.num_blocks
    # near the best, and the largest pool below it that was replayed is not
    assert need.hit_rate >= NEAR_BEST * sizing.best_hit_rate
    below = [p for p in sizing.points if p.num_blocks < need.num_blocks]
    assert below and all(p.hit_rate < NEAR_BEST * sizing.best_hit_rate for p in below)
    assert need.num_blocks <= max(p.num_blocks for p in below) * (1 + RESOLUTION) + 1
    assert sizing.best_hit_rate <= sizing.best_possible_hit_rate
    assert seen == [p for p in sizing.points if p is not sizing.given]  # progress per replay
    text = sizing.sentence()
    assert re.fullmatch(
        r"This workload needs [\d.,]+ (GiB|MiB) of KV cache per GPU for its best hit rate "
        r"\([\d.]+%\); with [\d.,]+ (GiB|MiB) it reaches [\d.]+%\. That is more than .* "
        r"add GPUs \(--tp\) or a host tier \(--host-memory\)\.",
        text,
    ), text
    doc = sizing.to_json()
    assert doc["needed"]["num_blocks"] == need.num_blocks and doc["sentence"] == text


def test_a_large_pool_is_told_what_is_spare(workload: Workload) -> None:
    sizing, _, cfg = _sized(workload)  # the default pool: nothing is evicted
    assert sizing.given.evictions == 0
    assert sizing.needed is not None and sizing.needed.num_blocks < cfg.num_blocks
    assert sizing.sentence().endswith("of it is spare.")


def test_host_tier_hits_count_toward_the_best(workload: Workload, small: Any) -> None:
    without = small[0]
    with_host, _, _ = _sized(workload, capacity=10_000, host=8 * 2**30)
    assert with_host.given.hit_rate > without.given.hit_rate
    assert with_host.needed is not None and without.needed is not None
    assert with_host.needed.num_blocks <= without.needed.num_blocks


def _pt(n: int, hit: float, evictions: int = 1) -> SizePoint:
    return SizePoint(n, float(n), hit, evictions)


def test_next_size_doubles_then_bisects() -> None:
    pts = {100: _pt(100, 0.2)}
    assert _next_size(pts, 0.5, 10, 10_000) == 200  # below the target: double
    pts[200] = _pt(200, 0.6)
    assert _next_size(pts, 0.5, 10, 10_000) == 141  # bracketed: the geometric middle
    pts[141] = _pt(141, 0.55)
    pts[119] = _pt(119, 0.4)
    pts[130] = _pt(130, 0.5)
    assert _next_size(pts, 0.5, 10, 10_000) == 124
    pts[124] = _pt(124, 0.45)
    assert _next_size(pts, 0.5, 10, 10_000) is None  # 124 -> 130: within 5%
    # the top of the range, or a pool that never evicts, ends the growth
    assert _next_size({100: _pt(100, 0.2)}, 0.5, 10, 100) is None
    assert _next_size({100: _pt(100, 0.2, evictions=0)}, 0.5, 10, 10_000) is None
    # a pool already near the best: the search goes down to the smallest first
    assert _next_size({100: _pt(100, 0.6)}, 0.5, 10, 10_000) == 10


def test_bare_kvcoord_is_a_demo_under_memory_pressure(capsys: pytest.CaptureFixture[str]) -> None:
    """The newcomer's first run: the bundled workload evicts on the default
    pool, misses hits it could have, and ends on the pool it needs."""
    assert main([]) == 0
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    evictions = int(next(x for x in lines if x.startswith("evictions")).split()[1].replace(",", ""))
    assert evictions > 0
    hit = next(x for x in lines if x.startswith("prefix-cache hit rate"))
    got, best = (float(v) for v in re.findall(r"([\d.]+)%", hit))
    assert got < best - 5  # real pressure: well below its best
    assert re.fullmatch(
        r"This workload needs [\d,.]+ GiB of KV cache per GPU for its best hit rate "
        r"\([\d.]+%\); with [\d.]+ GiB it reaches [\d.]+%\..*",
        lines[-1],
    ), lines[-1]
    assert "sizing: " in err  # each sizing replay is reported as it ends


def test_find_size_in_json_and_refused_for_a_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    argv = ["replay", "--limit", "150", "--capacity-tokens", "12000", "--no-progress"]
    assert main([*argv, "--find-size", "--json", str(out)]) == 0
    text = capsys.readouterr()
    assert text.err == ""  # --no-progress: no sizing lines either
    doc = json.loads(out.read_text())
    assert doc["sizing"]["sentence"] == text.out.strip().splitlines()[-1]
    assert doc["sizing"]["given"]["num_blocks"] == doc["num_blocks"]
    with pytest.raises(SystemExit) as e:
        main(["replay", "--find-size", "--instances", "2", "--limit", "5", "--no-progress"])
    assert e.value.code == 2
    assert "--find-size sizes one engine" in capsys.readouterr().err


def _row(variant: str, gib: float, hit: float, evictions: int = 10) -> dict[str, Any]:
    return {
        "variant": variant,
        "layout": "full",
        "kv_memory_gib_per_gpu": gib,
        "total_hit_rate": hit,
        "best_possible_hit_rate": 0.40,
        "evictions": evictions,
    }


def test_sweep_sentences_name_the_smallest_pool_near_the_best() -> None:
    from kvcoord.replay.sizing import sweep_sentences

    rows = [_row("a", 8, 0.2), _row("a", 32, 0.399), _row("a", 16, 0.30)]
    rows += [_row("b", 8, 0.1), _row("b", 16, 0.2)]
    a, b = sweep_sentences(rows)
    assert a == (
        "a: 32 GiB of KV cache per GPU is the smallest pool swept near the best hit rate "
        "(40.0%): it reaches 39.9%."
    )
    assert b.startswith("b: no pool swept reaches the best hit rate (40.0%): 16 GiB per GPU")
    # a pool that never evicts is the best the scheduler reaches
    (c,) = sweep_sentences([_row("c", 8, 0.30), _row("c", 16, 0.35, evictions=0)])
    assert c.startswith("16 GiB of KV cache per GPU") and "(35.0%)" in c
