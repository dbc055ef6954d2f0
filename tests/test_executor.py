"""The sweep executors (kvcoord.replay.executor) and the cluster flags of the CLI."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from kvcoord.cli import main
from kvcoord.replay.executor import (
    ExecutorUnavailable,
    InlineExecutor,
    LocalExecutor,
    RayExecutor,
    make_executor,
)

HAS_RAY = importlib.util.find_spec("ray") is not None
#: `make test` installs Ray, so in CI its absence is a failure, not a skip.
IN_CI = bool(os.environ.get("CI"))


def _scaled(shared: dict[str, int], item: int) -> tuple[int, int]:
    """A task: module level, so that it pickles to any worker."""
    import os

    if item < 0:
        raise ValueError(f"bad item {item}")
    return item * shared["factor"], os.getpid()


@pytest.mark.parametrize("make", [InlineExecutor, lambda: LocalExecutor(2)])
def test_map_returns_in_order_and_reports_each(make: object) -> None:
    ex = make()  # type: ignore[operator]
    seen: list[int] = []
    out = ex.map(_scaled, {"factor": 3}, list(range(7)), done=lambda r: seen.append(r[0]))
    assert [r[0] for r in out] == [3 * i for i in range(7)]
    assert seen == [r[0] for r in out]


@pytest.mark.parametrize("make", [InlineExecutor, lambda: LocalExecutor(2)])
def test_map_stops_at_the_first_result_until_accepts(make: object) -> None:
    """``until``: the results up to the first accepted one, in order; the rest
    are not returned (a negative control: without it, all of them are)."""
    ex = make()  # type: ignore[operator]
    seen: list[int] = []
    out = ex.map(
        _scaled, {"factor": 1}, list(range(8)), done=lambda r: seen.append(r[0]),
        until=lambda r: r[0] == 3,
    )  # fmt: skip
    assert [r[0] for r in out] == [0, 1, 2, 3] == seen
    assert len(ex.map(_scaled, {"factor": 1}, list(range(8)))) == 8


def test_local_executor_uses_worker_processes() -> None:
    import os

    out = LocalExecutor(2).map(_scaled, {"factor": 1}, list(range(4)))
    assert all(pid != os.getpid() for _, pid in out)
    inline = LocalExecutor(1).map(_scaled, {"factor": 1}, [1])
    assert inline[0][1] == os.getpid()


@pytest.mark.parametrize("ex", [InlineExecutor(), LocalExecutor(2)])
def test_task_failure_propagates(ex: object) -> None:
    with pytest.raises(ValueError, match="bad item -1"):
        ex.map(_scaled, {"factor": 1}, [1, -1, 2])  # type: ignore[attr-defined]


def test_make_executor() -> None:
    assert isinstance(make_executor("local", jobs=3), LocalExecutor)
    with pytest.raises(ValueError, match="unknown executor"):
        make_executor("slurm")
    with pytest.raises(ValueError, match="--address is for --executor ray"):
        make_executor("local", address="auto")
    with pytest.raises(ValueError, match="jobs"):
        LocalExecutor(0)


@pytest.mark.skipif(HAS_RAY, reason="Ray is installed")
def test_ray_absent_is_a_clear_error() -> None:
    with pytest.raises(ExecutorUnavailable, match=r"kvcoord\[ray\]"):
        RayExecutor()


def test_ray_executor_of_a_local_instance_gets_the_jobs_cpus() -> None:
    if not HAS_RAY:
        pytest.skip("Ray is not installed")
    local = make_executor("ray", jobs=2)
    assert isinstance(local, RayExecutor) and local.num_cpus == 2
    cluster = make_executor("ray", jobs=2, address="auto")  # the cluster's CPUs are its own
    assert isinstance(cluster, RayExecutor) and cluster.num_cpus is None


def test_ray_executor_runs_a_sweep_on_a_local_instance(tmp_path: Path) -> None:
    if not HAS_RAY:
        assert not IN_CI, "CI installs Ray (make test): tests/test_executor.py must run it"
        pytest.skip("Ray is not installed (pip install 'kvcoord[ray]')")
    # the task function must be importable on Ray's workers: the sweep's own
    argv = ["sweep", "--limit", "30", "--sizes", "400,600", "--no-progress"]
    rows = {}
    for ex in ("local", "ray"):
        out = tmp_path / f"{ex}.json"
        assert main([*argv, "--executor", ex, "--jobs", "2", "--json", str(out)]) == 0
        rows[ex] = [
            (r["num_blocks"], r["prefix_hit_tokens"], r["evictions"])
            for r in json.loads(out.read_text())["rows"]
        ]
    assert rows["ray"] == rows["local"] and len(rows["ray"]) == 2


# --------------------------------------------------------------------------- CLI flags


def _args(tmp_path: Path, *extra: str) -> list[str]:
    return ["--limit", "60", "--num-blocks", "600", "--no-progress", *extra]


def test_replay_cluster_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.json"
    argv = ["replay", *_args(tmp_path), "--instances", "3", "--router", "prefix-aware"]
    assert main([*argv, "--policy", "lfu", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "router prefix-aware:balance=1, 3 engines, eviction lfu" in text
    doc = json.loads(out.read_text())
    assert doc["instances"] == 3 and doc["eviction_policy"] == "lfu"
    assert len(doc["engines"]) == 3
    assert sum(e["num_requests"] for e in doc["engines"]) == doc["num_requests"] == 60
    for key in ("load_imbalance_requests", "ttft_p90_s", "prefix_hit_rate", "router_events_seen"):
        assert key in doc


def test_replay_policy_flag(tmp_path: Path) -> None:
    outs = {}
    for policy in ("lru", "priority"):
        out = tmp_path / f"{policy}.json"
        assert main(["replay", *_args(tmp_path), "--policy", policy, "--json", str(out)]) == 0
        outs[policy] = json.loads(out.read_text())
    assert outs["lru"]["num_finished"] == outs["priority"]["num_finished"] == 60


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["replay", "--policy", "bogus"], "argument --policy"),
        (["replay", "--router", "nearest"], "argument --router: unknown router"),
        (["replay", "--instances", "0"], "argument --instances"),
        (["replay", "--instances", "2", "--plot", "x.png"], "--plot draws one engine"),
        (["sweep", "--routers", "least-loaded"], "--routers needs --instances"),
        (["sweep", "--policies", "lru,nope"], "argument --policies"),
        (["sweep", "--address", "auto"], "--address is for --executor ray"),
        (["sweep", "--executor", "dask"], "argument --executor"),
    ],
)
def test_cluster_flag_errors(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        main([*argv, "--limit", "5", "--no-progress"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_sweep_axes(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    argv = ["sweep", "--limit", "40", "--sizes", "500", "--no-progress", "--jobs", "1"]
    argv += ["--policies", "lru,lfu", "--instances", "1,2", "--routers", "round-robin,least-loaded"]
    assert main([*argv, "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    got = sorted((r["eviction_policy"], r["instances"], r["router"] or "") for r in rows)
    want = sorted(
        (p, n, r)
        for p in ("lru", "lfu")
        for n, r in ((1, ""), (2, "round-robin"), (2, "least-loaded"))
    )
    assert got == want
    assert len({r["variant"] for r in rows}) == 6
