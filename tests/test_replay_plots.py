"""Every planner plot renders and reads right: axes name their quantity and
unit, legends sit off the data and word durations, hit-rate axes fit the
data, TTFT is drawn over the trace's span, targets are drawn when given,
host-tier hits are shown, and no two tick labels overlap (their window
extents, after drawing, are compared)."""

from __future__ import annotations

import copy
import itertools
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from kvcoord.replay.cluster import simulate_cluster, summarize_cluster
from kvcoord.replay.cluster_plots import cluster_comparison_figure, plot_cluster_comparison
from kvcoord.replay.plan import make_plan
from kvcoord.replay.plot_axes import (
    MAX_VALUE_TICKS,
    draw_ttft_target,
    fit_hit_rate_axis,
    format_duration,
)
from kvcoord.replay.plots import binned_max, plot_replay, plot_sweep, replay_figure, sweep_figure
from kvcoord.replay.report import summarize
from kvcoord.replay.scheduler import SimConfig, simulate
from kvcoord.replay.workloads import Workload, synthetic_chat


@pytest.fixture(scope="module")
def workload() -> Workload:
    return synthetic_chat(num_conversations=10)


def _run(
    wl: Workload, capacity: int | None = None, host: float | None = None, time_scale: float = 1.0
) -> tuple[Any, dict[str, Any]]:
    plan = make_plan(wl, capacity_tokens=capacity, host_memory=host)
    cfg = SimConfig(
        layout=plan.layout,
        num_blocks=plan.num_blocks,
        step_model=plan.step_model,
        host_tier=plan.host_tier(),
        token_bytes_per_gpu=plan.footprint.token_bytes_per_gpu,
        time_scale=time_scale,
    )
    res = simulate(wl, cfg)
    s = summarize(res, res.best, cfg, wl.name, plan)
    s["variant"] = plan.model.name + (" + host" if host else "")
    return res, s


# --------------------------------------------------------------------------- inspection


def _drawn(fig: Any) -> Any:
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _labels(axis: Any) -> list[Any]:
    """The tick labels drawn: visible, not empty, at a tick inside the view."""
    lo, hi = sorted(axis.get_view_interval())
    i = 0 if axis.axis_name == "x" else 1
    return [
        t
        for t in axis.get_ticklabels(which="both")
        if t.get_visible() and t.get_text() and lo <= t.get_position()[i] <= hi
    ]


def _overlaps(fig: Any) -> list[str]:
    """Pairs of tick labels of one axis whose boxes overlap (more than 0.5 px)."""
    r = _drawn(fig)
    out = []
    for ax in fig.axes:
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            boxes = [(t.get_text(), t.get_window_extent(r)) for t in _labels(axis)]
            for (ta, a), (tb, b) in itertools.combinations(boxes, 2):
                w = min(a.x1, b.x1) - max(a.x0, b.x0)
                h = min(a.y1, b.y1) - max(a.y0, b.y0)
                if w > 0.5 and h > 0.5:
                    out.append(f"{ax.get_ylabel()!r} {name}: {ta!r} over {tb!r}")
    return out


def _legend_texts(fig: Any) -> list[str]:
    legends = [ax.get_legend() for ax in fig.axes] + list(fig.legends)
    return [t.get_text() for leg in legends if leg is not None for t in leg.get_texts()]


def _assert_readable(fig: Any) -> None:
    assert not _overlaps(fig), _overlaps(fig)
    for text in _legend_texts(fig):
        assert not re.search(r"\de[+-]\d", text), f"legend {text!r} in scientific notation"
    for ax in fig.axes:
        for t in _labels(ax.xaxis) + _labels(ax.yaxis):
            assert not re.search(r"\de[+-]\d", t.get_text()), t.get_text()
        assert ax.get_ylabel(), "every axis names its quantity"


def _legend_outside(fig: Any, ax: Any) -> None:
    r = _drawn(fig)
    leg = ax.get_legend()
    assert leg is not None
    assert leg.get_window_extent(r).x0 >= ax.get_window_extent(r).x1


# --------------------------------------------------------------------------- helpers


def test_binned_max_keeps_every_peak() -> None:
    t = np.arange(100_000, dtype=np.float64)
    y = np.zeros(100_000)
    y[12_345] = 0.555  # a one-step spike
    tb, yb = binned_max(t, y, 1000)
    assert tb.shape[0] <= 1000 and yb.max() == 0.555
    assert tb[-1] == t[-1]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0 s"),
        (4.2e-5, "42 us"),
        (0.0123, "12.3 ms"),
        (0.99995, "1 s"),
        (2.5, "2.5 s"),
        (59.99, "1 min"),
        (200, "3 min 20 s"),
        (10_200, "2 h 50 min"),
        (3 * 86_400 + 7200, "3 d 2 h"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_hit_rate_axis_fits_the_data() -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    fit_hit_rate_axis(ax, [12.0, 30.2, None])
    assert ax.get_ylim() == (0, 40)  # 10% headroom, at least 5 points, a round top
    fit_hit_rate_axis(ax, [97.0])
    assert ax.get_ylim() == (0, 100)
    with pytest.raises(ValueError, match="positive duration"):
        draw_ttft_target(ax, 0.0)
    plt.close(fig)


# --------------------------------------------------------------------------- replay


def test_replay_figure_labels_ranges_and_peak(workload: Workload, tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    res, s = _run(workload)
    fig = replay_figure(res, s)
    axes = fig.axes
    assert [ax.get_ylabel() for ax in axes[:3]] == [
        "pool blocks (%)",
        "prompt tokens hit (%)",
        "time to first token (s)",
    ]
    assert axes[1].get_xlabel() == "simulated time (s)"
    assert axes[2].get_xlabel().startswith("request arrival (simulated s")
    assert "llama-3.1-8b on 1x h100 (TP 1)" in axes[0].get_title()
    for ax in axes[:3]:
        _legend_outside(fig, ax)
    # the drawn per-step maximum is the summary's peak (no subsampling loss)
    line = next(ln for ln in axes[0].get_lines() if "per-step max" in str(ln.get_label()))
    assert float(np.max(line.get_ydata())) == pytest.approx(100 * s["occupancy_referenced_peak"])
    # the hit-rate axis fits the data (the best case and the lines), not 100%
    top = axes[1].get_ylim()[1]
    assert 100 * s["best_possible_hit_rate"] < top <= max(100 * s["best_possible_hit_rate"] + 15, 5)
    assert not any("target" in t for t in _legend_texts(fig))  # no target given, none drawn
    _assert_readable(fig)
    plt.close(fig)
    plot_replay(res, s, tmp_path / "r.png", ttft_target_s=0.5)
    assert (tmp_path / "r.png").stat().st_size > 10_000


def test_overloaded_replay_draws_ttft_over_the_trace_span(workload: Workload) -> None:
    import matplotlib.pyplot as plt

    res, s = _run(workload, capacity=12_000, time_scale=0.01)
    arrival = np.frombuffer(res.req_arrival, dtype=np.float64)
    lo, hi = float(arrival.min()), float(arrival.max())
    assert res.sim_seconds > 2 * hi, "the test needs a run that ends long after the last arrival"
    fig = replay_figure(res, s, ttft_target_s=1.5)
    ttft = fig.axes[2]
    x0, x1 = ttft.get_xlim()
    span = hi - lo
    assert lo - 0.05 * span <= x0 <= lo and hi <= x1 <= hi + 0.05 * span
    assert fig.axes[0].get_xlim()[1] >= 0.9 * res.sim_seconds  # time panels: the whole run
    texts = _legend_texts(fig)
    assert "TTFT target (1.5 s)" in texts
    p90 = next(t for t in texts if t.startswith("TTFT p90"))
    assert p90 == f"TTFT p90 ({format_duration(s['ttft_p90_s'])})"
    target = [ln for ln in ttft.get_lines() if ln.get_label() == "TTFT target (1.5 s)"]
    assert target and ttft.get_ylim()[0] <= 1.5 <= ttft.get_ylim()[1]
    _assert_readable(fig)
    plt.close(fig)


def test_replay_figure_shows_host_tier_hits_and_residency(workload: Workload) -> None:
    import matplotlib.pyplot as plt

    res, s = _run(workload, capacity=9_000, host=2**30)
    assert s["host_hit_tokens"] > 0 and s["evictions"] > 0
    fig = replay_figure(res, s)
    hit_ax = fig.axes[1]
    lines = {str(ln.get_label()): ln for ln in hit_ax.get_lines()}
    assert "GPU pool (cumulative)" in lines and "GPU + host tier (cumulative)" in lines
    total = lines["GPU + host tier (cumulative)"].get_ydata()[-1]
    assert total == pytest.approx(100 * s["total_hit_rate"])
    assert lines["GPU pool (cumulative)"].get_ydata()[-1] == pytest.approx(
        100 * s["prefix_hit_rate"]
    )
    assert len(fig.axes) == 4 and fig.axes[3].get_title() == "block residency"
    _assert_readable(fig)
    plt.close(fig)


# --------------------------------------------------------------------------- sweep


def _sweep_rows(workload: Workload) -> list[dict[str, Any]]:
    """Real rows at two sizes, then as many rows as a long sweep has, over
    two decades of KV memory and five of TTFT (made from the real ones)."""
    rows = []
    for host in (None, 2**30):
        _, s = _run(workload, 12_000, host)
        for i, gib in enumerate(np.geomspace(0.5, 60, 12)):
            r = copy.deepcopy(s)
            r["kv_memory_gib_per_gpu"] = float(gib)
            r["total_hit_rate"] = min(s["best_possible_hit_rate"], 0.05 + 0.05 * i)
            r["ttft_p90_s"] = 10_200 / 10**i if i < 7 else 0.0102 * (i - 6)
            rows.append(r)
    return rows


def test_sweep_figure_labels_ranges_and_ticks(workload: Workload, tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    rows = _sweep_rows(workload)
    fig = sweep_figure(rows, ttft_target_s=2.0)
    axes = fig.axes
    assert [ax.get_ylabel() for ax in axes] == [
        "prompt tokens hit,\nGPU + host (%)",
        "TTFT p90 (s)",
        "throughput\n(tokens/s per busy s)",
    ]
    assert axes[-1].get_xlabel() == "KV-cache memory per GPU (GiB)"
    title = axes[0].get_title()
    assert "llama-3.1-8b" in title and "h100, TP 1" in title and "time scale 1" in title
    labels = [t.get_text() for t in axes[0].get_legend().get_texts()]
    assert "llama-3.1-8b" in labels and "llama-3.1-8b + host" in labels
    assert any("best possible" in x for x in labels)
    _legend_outside(fig, axes[0])  # one legend: the panels below share its colours
    assert all(len(ax.get_lines()) >= 2 for ax in axes)  # one line per variant
    # the hit-rate axis fits the rates drawn; the x axis has ticks at the sizes swept
    best = 100 * rows[0]["best_possible_hit_rate"]
    assert best < axes[0].get_ylim()[1] <= min(100, best + 15)
    xticks = [t.get_text() for t in _labels(axes[2].xaxis)]
    assert 2 <= len(xticks) <= MAX_VALUE_TICKS and xticks[0] == "0.5"
    assert axes[1].get_yscale() == "log"
    assert "TTFT target (2 s)" in [t.get_text() for t in axes[1].get_legend().get_texts()]
    _assert_readable(fig)
    plt.close(fig)
    plot_sweep(rows, tmp_path / "s.png")
    assert (tmp_path / "s.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    ("lo", "hi", "least", "most"),
    [(0.11, 0.9, 3, 10), (0.3, 0.5, 2, 10), (0.01, 20_000, 3, 8)],
)
def test_plain_log_axis_labels_never_overlap(lo: float, hi: float, least: int, most: int) -> None:
    """Within about a decade the minor ticks carry labels; over many decades only the decades."""
    import matplotlib.pyplot as plt

    from kvcoord.replay.plot_axes import plain_log

    fig, axes = plt.subplots(2, 1, figsize=(11, 3))  # short panels: crowded labels
    for ax in axes:
        ax.plot([lo, hi], [lo, hi])
        ax.set_ylabel("v")
        plain_log(ax, "x")
        plain_log(ax, "y")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    _drawn(fig)
    for axis in (axes[0].xaxis, axes[0].yaxis):
        assert least <= len(_labels(axis)) <= most, [t.get_text() for t in _labels(axis)]
    _assert_readable(fig)
    plt.close(fig)


# --------------------------------------------------------------------------- cluster


def test_cluster_figure_labels_ranges_and_target(workload: Workload, tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    plan = make_plan(workload, capacity_tokens=9_000)
    rows = []
    for policy in ("lru", "lfu"):
        for nb in (plan.num_blocks, 2 * plan.num_blocks):
            cfg = SimConfig(layout=plan.layout, num_blocks=nb, eviction_policy=policy)
            cres = simulate_cluster(workload, cfg, 2, "least-loaded")
            s = summarize_cluster(cres, cfg, "w", plan)
            rows.append(s)
    fig, labels = cluster_comparison_figure({"bundled": rows}, ttft_target_s=0.25)
    assert labels == ["lru / least-loaded", "lfu / least-loaded"]
    hit, ttft = fig.axes
    assert hit.get_ylabel().startswith("hit rate") and ttft.get_ylabel() == "TTFT p90 (s)"
    assert "each on h100 (TP 1)" in hit.get_title()
    rates = [100 * r["total_hit_rate"] for r in rows] + [100 * rows[0]["best_possible_hit_rate"]]
    assert max(rates) < hit.get_ylim()[1] <= min(100, max(rates) + 15)
    assert "TTFT target (250 ms)" in _legend_texts(fig)
    _assert_readable(fig)
    plt.close(fig)
    assert plot_cluster_comparison({"bundled": rows}, str(tmp_path / "c.png")) == labels
    assert (tmp_path / "c.png").stat().st_size > 10_000
