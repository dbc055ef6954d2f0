"""Replay every recorded vLLM 0.33.0 KVCacheManager trace through the facade:
every hit, every allocation result and every state check must be equal."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance import trace_files
from manager_replayer import Divergence, replay

TRACES = trace_files("manager-*.jsonl.gz")


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name.removesuffix(".jsonl.gz"))
def test_manager_trace(path: Path) -> None:
    stats = replay(path)
    assert stats.checks > 0 and stats.allocations > 0


def test_every_layout_is_covered() -> None:
    layouts = {p.name.split("-")[1] for p in TRACES}
    assert layouts == {
        "full",
        "hybrid_3g",
        "hybrid_local",
        "hybrid_mamba_nocache",
        "hybrid_swa",
        "no_cache",
        "mla",
        "hybrid_swa_mla",
        "rswa",
        "rswa_nocache",
        "hybrid_rswa",
        "hybrid_mamba_align",
        "hybrid_mamba_align_ckpt",
    }


def test_replayer_detects_divergence(tmp_path: Path) -> None:
    """The replayer must be able to fail: corrupt one recorded allocation."""
    import gzip
    import json

    src = next(p for p in TRACES if p.name.startswith("manager-full-"))
    with gzip.open(src, "rt") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines[1:], start=1):
        op = json.loads(line)
        if op["op"] == "allocate_slots" and op["expect"] and op["expect"][0]:
            op["expect"][0][0] += 1
            lines[i] = json.dumps(op)
            break
    bad = tmp_path / src.name
    with gzip.open(bad, "wt") as f:
        f.write("\n".join(lines) + "\n")
    with pytest.raises(Divergence, match="allocate_slots"):
        replay(bad)


def test_invariants_hold_after_every_op() -> None:
    path = next(p for p in TRACES if p.name.startswith("manager-hybrid_swa-"))
    replay(path, after_op=lambda m: m.check_invariants())
