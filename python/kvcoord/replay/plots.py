"""Plots of ``kvcoord replay`` and ``kvcoord sweep`` (matplotlib, PNG).

Every axis names its quantity and unit, legends sit outside the data (right
of the axes), and per-step series are reduced to at most
:data:`MAX_POINTS` bins by keeping each bin's maximum, so no peak is lost.
``*_figure`` builds the figure (tests inspect it); ``plot_*`` writes the PNG.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from kvcoord.replay.scheduler import SimResult

__all__ = [
    "MAX_POINTS",
    "PlotUnavailable",
    "binned_max",
    "plot_replay",
    "plot_sweep",
    "replay_figure",
    "sweep_figure",
]

#: Bins a per-step series is reduced to before drawing.
MAX_POINTS = 2000


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'kvcoord[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def binned_max(
    t: np.ndarray, y: np.ndarray, bins: int = MAX_POINTS
) -> tuple[np.ndarray, np.ndarray]:
    """At most ``bins`` points: each bin's last time and largest value (peaks survive)."""
    n = t.shape[0]
    if n <= bins:
        return t, y
    edges = np.linspace(0, n, bins + 1).astype(np.int64)
    starts = edges[:-1][np.diff(edges) > 0]
    ends = np.append(starts[1:], n) - 1
    return t[ends], np.maximum.reduceat(y, starts)


def _legend_outside(ax: Any) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8)


def replay_figure(res: SimResult, summary: dict[str, Any]) -> Any:
    """Pool occupancy, cumulative hit rate and TTFT against simulated time."""
    plt = _pyplot()
    t = np.frombuffer(res.step_time, dtype=np.float64) if res.steps else np.zeros(1)
    usage = np.frombuffer(res.step_usage, dtype=np.float64) if res.steps else np.zeros(1)
    hit = np.frombuffer(res.step_hit_rate, dtype=np.float64) if res.steps else np.zeros(1)
    residency = (
        res.residency if res.residency is not None and res.residency.lifetime.count else None
    )
    if residency is None:
        fig, axes = plt.subplots(3, 1, figsize=(10, 8.5), sharex=True)
    else:
        fig = plt.figure(figsize=(10, 11))
        grid = fig.add_gridspec(4, 1)
        first = fig.add_subplot(grid[0])
        axes = [first, *(fig.add_subplot(grid[i], sharex=first) for i in (1, 2))]
        _plot_residency(fig.add_subplot(grid[3]), residency)
    ax = axes[0]
    samples = np.asarray(res.occupancy_samples, dtype=np.float64).reshape(-1, 4)
    if samples.shape[0]:
        usable = max(1, res.num_blocks - 1)
        ax.stackplot(
            samples[:, 0],
            100 * samples[:, 1] / usable,
            100 * samples[:, 2] / usable,
            100 * samples[:, 3] / usable,
            labels=["referenced (sampled)", "cached, free (sampled)", "empty (sampled)"],
            colors=["#4c72b0", "#dd8452", "#e5e5e5"],
            alpha=0.8,
        )
    tb, ub = binned_max(t, usage)
    ax.plot(tb, 100 * ub, color="black", lw=0.8, label="referenced, per-step max")
    ax.set_ylabel("pool blocks (%)")
    ax.set_ylim(0, 105)
    _legend_outside(ax)
    title = f"{summary['workload']} on {summary['layout']}, {summary['num_blocks']:,} blocks"
    if "kv_memory_gib_per_gpu" in summary:
        title += f" ({summary['kv_memory_gib_per_gpu']:,.1f} GiB/GPU)"
    ax.set_title(title, fontsize=10)

    ax = axes[1]
    tb, hb = binned_max(t, hit)
    ax.plot(tb, 100 * hb, lw=1.5, label="prefix hit rate (cumulative)")
    best = summary.get("best_possible_hit_rate")
    if best is not None:
        ax.axhline(100 * best, ls="--", color="gray", lw=1, label="best possible (unbounded)")
    ax.set_ylabel("prompt tokens hit (%)")
    ax.set_ylim(0, 105)
    _legend_outside(ax)

    ax = axes[2]
    arrival = np.frombuffer(res.req_arrival, dtype=np.float64) if len(res.req_arrival) else None
    if arrival is not None:
        ttft = np.frombuffer(res.req_first, dtype=np.float64) - arrival
        ok = ~np.isnan(ttft)
        ax.scatter(arrival[ok], ttft[ok], s=2, alpha=0.4, rasterized=True, label="TTFT per request")
        p90 = summary.get("ttft_p90_s")
        if p90 is not None:
            ax.axhline(p90, color="red", lw=1, ls=":", label=f"TTFT p90 ({p90:.3g} s)")
        if ok.any():
            _scale(ax, "y", [float(ttft[ok].min()), float(ttft[ok].max())])
    ax.set_ylabel("time to first token (s)")
    ax.set_xlabel("simulated time (s)")
    _legend_outside(ax)
    fig.tight_layout()
    return fig


def _plot_residency(ax: Any, r: Any) -> None:
    """Log2-bucket histograms of block lifetime, idle time before eviction and
    reuse gap (the core records them in simulated microseconds)."""
    edges = [0.0] + [(1 << k) / 1e6 for k in range(64)]
    for name, h in (
        ("lifetime", r.lifetime),
        ("idle before eviction", r.idle_before_eviction),
        ("reuse gap", r.reuse_gap),
    ):
        ks = [k for k, n in enumerate(h.buckets) if n]
        if ks:
            ax.step([edges[k] for k in ks], [h.buckets[k] for k in ks], where="post", label=name)
    ax.set_xscale("symlog", linthresh=1e-3)
    ax.set_xlabel("simulated time (s, log2 buckets)")
    ax.set_ylabel("evicted blocks / reuses")
    ax.set_title("block residency", fontsize=10)
    _legend_outside(ax)


def plot_replay(res: SimResult, summary: dict[str, Any], path: str | Path) -> None:
    """Write :func:`replay_figure` as a PNG."""
    plt = _pyplot()
    fig = replay_figure(res, summary)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _x(r: dict[str, Any]) -> float:
    return float(r.get("kv_memory_gib_per_gpu") or r["num_blocks"])


def _plain_log(ax: Any, axis: str) -> None:
    """A log axis labelled with plain numbers (8, 16, 32), not powers of ten."""
    from matplotlib.ticker import FuncFormatter

    fmt = FuncFormatter(lambda v, _: f"{v:g}")
    a = ax.xaxis if axis == "x" else ax.yaxis
    a.set_major_formatter(fmt)
    a.set_minor_formatter(fmt)


def _scale(ax: Any, axis: str, values: list[float | None]) -> None:
    """Log scale (plain labels) when the values span more than a factor of 8."""
    v = [x for x in values if x is not None and x > 0 and np.isfinite(x)]
    if v and max(v) / min(v) > 8:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
        _plain_log(ax, axis)


def sweep_figure(rows: list[dict[str, Any]]) -> Any:
    """Hit rate, TTFT p90 and throughput against KV memory, one line per variant.

    One legend (right of the top panel) names the variants; the panels below
    use the same colours.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    variants: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        variants.setdefault(str(r.get("variant", r["layout"])), []).append(r)
    by_gib = all("kv_memory_gib_per_gpu" in r for r in rows)
    bests: dict[float, list[str]] = {}
    for i, (name, rs) in enumerate(variants.items()):
        rs = sorted(rs, key=_x)
        x = [_x(r) for r in rs]
        color = f"C{i % 10}"
        hit = [100 * r.get("total_hit_rate", r["prefix_hit_rate"]) for r in rs]
        axes[0].plot(x, hit, marker="o", color=color, label=name)
        ttft = [r.get("ttft_p90_s") for r in rs]
        axes[1].plot(x, [np.nan if v is None else v for v in ttft], marker="o", color=color)
        axes[2].plot(x, [r["throughput_tokens_per_s"] for r in rs], marker="o", color=color)
        best = rs[0].get("best_possible_hit_rate")
        if best is not None:
            bests.setdefault(round(best, 6), []).append(color)
    for best, colors in bests.items():
        label = "best possible (unbounded cache)"
        if len(bests) > 1:
            label += f": {100 * best:.1f}%"
        axes[0].axhline(100 * best, ls="--", lw=1, color=colors[0], label=label)
    axes[0].set_ylabel("prompt tokens hit,\nGPU + host (%)")
    axes[0].set_ylim(0, 105)
    axes[1].set_ylabel("TTFT p90 (s)")
    _scale(axes[1], "y", [r.get("ttft_p90_s") for r in rows])
    axes[2].set_ylabel("throughput\n(tokens/s per busy s)")
    axes[2].set_xlabel("KV-cache memory per GPU (GiB)" if by_gib else "pool size (blocks)")
    _scale(axes[2], "x", [_x(r) for r in rows])
    _legend_outside(axes[0])
    if rows:
        axes[0].set_title(f"{rows[0]['workload']}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_sweep(rows: list[dict[str, Any]], path: str | Path) -> None:
    """Write :func:`sweep_figure` as a PNG."""
    plt = _pyplot()
    fig = sweep_figure(rows)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
