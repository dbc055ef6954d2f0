"""Every planner plot renders, names its units, keeps the legend off the data, keeps peaks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from kvcoord.replay.plan import make_plan
from kvcoord.replay.plots import binned_max, plot_replay, plot_sweep, replay_figure, sweep_figure
from kvcoord.replay.report import summarize
from kvcoord.replay.scheduler import SimConfig, simulate
from kvcoord.replay.workloads import synthetic_chat


def _legend_outside(fig: Any, ax: Any) -> None:
    fig.canvas.draw()
    leg = ax.get_legend()
    assert leg is not None
    r = fig.canvas.get_renderer()
    assert leg.get_window_extent(r).x0 >= ax.get_window_extent(r).x1


def _run(capacity: int | None = None, host: float | None = None) -> tuple[Any, dict[str, Any]]:
    wl = synthetic_chat(num_conversations=10)
    plan = make_plan(wl, capacity_tokens=capacity, host_memory=host)
    cfg = SimConfig(
        layout=plan.layout,
        num_blocks=plan.num_blocks,
        step_model=plan.step_model,
        host_tier=plan.host_tier(),
        token_bytes_per_gpu=plan.footprint.token_bytes_per_gpu,
    )
    res = simulate(wl, cfg)
    s = summarize(res, res.best, cfg, wl.name, plan)
    s["variant"] = plan.model.name + (" + host" if host else "")
    return res, s


def test_binned_max_keeps_every_peak() -> None:
    t = np.arange(100_000, dtype=np.float64)
    y = np.zeros(100_000)
    y[12_345] = 0.555  # a one-step spike
    tb, yb = binned_max(t, y, 1000)
    assert tb.shape[0] <= 1000 and yb.max() == 0.555
    assert tb[-1] == t[-1]


def test_replay_figure_labels_units_and_peak(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    res, s = _run()
    fig = replay_figure(res, s)
    axes = fig.axes
    assert [ax.get_ylabel() for ax in axes] == [
        "pool blocks (%)",
        "prompt tokens hit (%)",
        "time to first token (s)",
    ]
    assert axes[-1].get_xlabel() == "simulated time (s)"
    for ax in axes:
        _legend_outside(fig, ax)
    # the drawn per-step maximum is the summary's peak (no subsampling loss)
    line = next(ln for ln in axes[0].get_lines() if "per-step max" in str(ln.get_label()))
    assert float(np.max(line.get_ydata())) == pytest.approx(100 * s["occupancy_referenced_peak"])
    plt.close(fig)
    plot_replay(res, s, tmp_path / "r.png")
    assert (tmp_path / "r.png").stat().st_size > 10_000


def test_sweep_figure_labels_and_lines(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    rows = [_run(c)[1] for c in (3000, 6000)] + [_run(3000, 2**30)[1], _run(6000, 2**30)[1]]
    fig = sweep_figure(rows)
    axes = fig.axes
    assert [ax.get_ylabel() for ax in axes] == [
        "prompt tokens hit,\nGPU + host (%)",
        "TTFT p90 (s)",
        "throughput\n(tokens/s per busy s)",
    ]
    assert axes[-1].get_xlabel() == "KV-cache memory per GPU (GiB)"
    labels = [t.get_text() for t in axes[0].get_legend().get_texts()]
    assert "llama-3.1-8b" in labels and "llama-3.1-8b + host" in labels
    assert any("best possible" in x for x in labels)
    _legend_outside(fig, axes[0])  # one legend: the panels below share its colours
    # one line per variant in every panel
    assert all(len(ax.get_lines()) >= 2 for ax in axes)
    plt.close(fig)
    plot_sweep(rows, tmp_path / "s.png")
    assert (tmp_path / "s.png").stat().st_size > 10_000
