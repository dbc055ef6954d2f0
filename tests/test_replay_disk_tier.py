"""The disk tier (``--disk-memory``): an LRU of prefix chunks below the host
tier, looked up after it, loaded at the disk's bandwidth."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvcoord.cli import main
from kvcoord.replay.plan import GiB, PlanError, make_plan
from kvcoord.replay.scheduler import SimConfig, simulate
from kvcoord.replay.tiers import DISK_BANDWIDTH
from kvcoord.replay.workloads import read_mooncake, synthetic_chat

MOONCAKE = str(Path(__file__).parent / "data" / "mooncake_small.jsonl")


def _run(wl: Any, host: float | None, disk: float | None) -> Any:
    p = make_plan(wl, capacity_tokens=wl.max_sequence_len + 64, host_memory=host, disk_memory=disk)
    return simulate(
        wl,
        SimConfig(
            layout=p.layout,
            num_blocks=p.num_blocks,
            step_model=p.step_model,
            host_tier=p.host_tier(),
            disk_tier=p.disk_tier(),
            token_bytes_per_gpu=p.footprint.token_bytes_per_gpu,
        ),
    )


def test_disk_tier_alone_serves_what_the_gpu_pool_evicted() -> None:
    wl = synthetic_chat(num_conversations=24)
    gpu_only, disk = _run(wl, None, None), _run(wl, None, 64 * GiB)
    assert gpu_only.disk_hit_tokens == 0
    assert disk.disk_hit_tokens > 0 and disk.host_hit_tokens == 0
    assert disk.disk_transfer_seconds > 0 and disk.host_transfer_seconds == 0
    assert disk.hit_tokens + disk.disk_hit_tokens > gpu_only.hit_tokens
    assert disk.hit_tokens + disk.disk_hit_tokens <= disk.best.hit_tokens
    assert sum(disk.req_disk_hit) == disk.disk_hit_tokens
    assert disk.leaked_blocks == 0


def test_disk_below_a_small_host_tier() -> None:
    """A host tier too small for the reuse leaves the rest to the disk; with
    the same size on both, the disk adds nothing (it holds what the host does)."""
    wl = synthetic_chat(num_conversations=24)
    host_only = _run(wl, 0.1 * GiB, None)
    both = _run(wl, 0.1 * GiB, 64 * GiB)
    assert both.disk_hit_tokens > 0
    # the host tier answers first, so the GPU + host part does not shrink
    total = both.hit_tokens + both.host_hit_tokens + both.disk_hit_tokens
    assert total > host_only.hit_tokens + host_only.host_hit_tokens
    same = _run(wl, 64 * GiB, 64 * GiB)
    assert same.disk_hit_tokens == 0 and same.host_hit_tokens > 0
    # loads from disk are slower than over PCIe: the charged time reflects the bandwidth
    per_token = both.disk_transfer_seconds / max(1, both.disk_hit_tokens)
    assert per_token > both.host_transfer_seconds / max(1, both.host_hit_tokens)
    assert DISK_BANDWIDTH == 6e9


def test_disk_memory_errors_name_the_flag() -> None:
    wl = read_mooncake(MOONCAKE)
    with pytest.raises(PlanError, match="--disk-memory 1,000 B"):
        make_plan(wl, disk_memory=1000.0)
    with pytest.raises(PlanError, match=r"--disk-memory: .*prefix caching off"):
        make_plan(wl, layout="no-prefix-cache", disk_memory=1e12)


def test_replay_and_sweep_report_the_disk_tier(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    argv = ["replay", "--trace", MOONCAKE, "--kv-memory", "256MiB", "--disk-memory", "2TiB"]
    assert main([*argv, "--no-progress", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "disk tier" in text and "disk transfers" in text
    s = json.loads(out.read_text())
    assert s["disk_memory_gib"] == 2048
    assert s["total_hit_rate"] == pytest.approx(
        s["prefix_hit_rate"] + s["host_hit_rate"] + s["disk_hit_rate"]
    )
    assert s["disk_transfer_seconds"] >= 0
    out = tmp_path / "s.json"
    argv = ["sweep", "--trace", MOONCAKE, "--disk-memories", "0,2TiB", "--kv-memories", "256MiB"]
    assert main([*argv, "--jobs", "1", "--no-progress", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["axes"]["disk_memory"] for r in rows] == ["", "disk 2 TiB"]
    assert rows[1]["variant"].endswith("+ disk 2 TiB")
