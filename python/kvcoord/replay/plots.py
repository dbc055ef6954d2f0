"""Plots of ``kvcoord replay`` and ``kvcoord sweep`` (matplotlib, PNG).

Every axis names its quantity and unit, legends sit outside the data (right
of the axes), and per-step series are reduced to at most
:data:`MAX_POINTS` bins by keeping each bin's maximum, so no peak is lost.
Axes follow :mod:`kvcoord.replay.plot_axes` (plain log labels that never
overlap, hit-rate axes fitted to the data, durations in words, an optional
TTFT target line). ``*_figure`` builds the figure (tests inspect it);
``plot_*`` writes the PNG.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from kvcoord.replay.plot_axes import (
    draw_ttft_target,
    fit_hit_rate_axis,
    format_duration,
    log_if_wide,
    plain_log,
    value_ticks,
)
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


def _deployment(summary: dict[str, Any]) -> str:
    """The deployment in words (llama-3.1-8b on 1x h100 (TP 1)); empty without a plan."""
    if "gpu" not in summary:
        return ""
    text = f"{summary.get('model', '?')} on {summary.get('num_gpus', summary['tp'])}x "
    text += f"{summary['gpu']} (TP {summary['tp']})"
    scale = summary.get("time_scale", 1.0)
    return text if scale == 1.0 else f"{text}, time scale {scale:g}"


def _per_request(a: Any, dtype: Any) -> np.ndarray:
    return np.frombuffer(a, dtype=dtype) if len(a) else np.zeros(0, dtype=dtype)


def replay_figure(
    res: SimResult, summary: dict[str, Any], ttft_target_s: float | None = None
) -> Any:
    """Pool occupancy and cumulative hit rate (every tier) against simulated
    time, and TTFT against each request's arrival (the axis spans the trace's
    arrivals, not the simulation's end); a TTFT target line when given."""
    plt = _pyplot()
    t = np.frombuffer(res.step_time, dtype=np.float64) if res.steps else np.zeros(1)
    usage = np.frombuffer(res.step_usage, dtype=np.float64) if res.steps else np.zeros(1)
    residency = (
        res.residency if res.residency is not None and res.residency.lifetime.count else None
    )
    rows = 3 if residency is None else 4
    fig = plt.figure(figsize=(10, 2.85 * rows))
    grid = fig.add_gridspec(rows, 1)
    first = fig.add_subplot(grid[0])
    axes = [first, fig.add_subplot(grid[1], sharex=first), fig.add_subplot(grid[2])]
    if residency is not None:
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
    ax.tick_params(labelbottom=False)
    _legend_outside(ax)
    title = f"{summary['workload']}, layout {summary['layout']}: {summary['num_blocks']:,} blocks"
    if "kv_memory_gib_per_gpu" in summary:
        title += f" ({summary['kv_memory_gib_per_gpu']:,.1f} GiB/GPU)"
    deployment = _deployment(summary)
    ax.set_title(f"{title}\n{deployment}" if deployment else title, fontsize=10)

    _plot_hit_rates(axes[1], res, summary)
    axes[1].set_xlabel("simulated time (s)")
    _plot_ttft(axes[2], res, summary, ttft_target_s)
    fig.tight_layout()
    return fig


def _plot_hit_rates(ax: Any, res: SimResult, summary: dict[str, Any]) -> None:
    """Cumulative hit rate at each admission: the GPU pool, then with the host
    and disk tiers (each line includes the tiers above it)."""
    admit = _per_request(res.req_admit, np.float64)
    prompt = _per_request(res.req_prompt, np.int64)
    order = np.argsort(admit, kind="stable")
    counted = order[~np.isnan(admit[order])]
    x = admit[counted]
    total = np.maximum(np.cumsum(prompt[counted]), 1)
    tiers = [("GPU pool", res.req_gpu_hit, True)]
    tiers.append(("GPU + host tier", res.req_host_hit, summary.get("host_memory_gib", 0) > 0))
    tiers.append(("GPU + host + disk", res.req_disk_hit, summary.get("disk_memory_gib", 0) > 0))
    hits = np.zeros(counted.shape[0], dtype=np.int64)
    drawn = [0.0]
    for label, per_req, present in tiers:
        hits = hits + _per_request(per_req, np.int64)[counted]
        if not present or not x.shape[0]:
            continue
        rate = 100 * np.cumsum(hits) / total
        xb, rb = binned_max(x, rate)
        ax.plot(xb, rb, lw=1.5, label=f"{label} (cumulative)")
        drawn.append(float(rate.max()))
    best = summary.get("best_possible_hit_rate")
    if best is not None:
        ax.axhline(100 * best, ls="--", color="gray", lw=1, label="best possible (unbounded)")
        drawn.append(100 * best)
    ax.set_ylabel("prompt tokens hit (%)")
    fit_hit_rate_axis(ax, drawn)
    _legend_outside(ax)


def _plot_ttft(
    ax: Any, res: SimResult, summary: dict[str, Any], ttft_target_s: float | None
) -> None:
    """TTFT of each request at its arrival; the x axis spans the arrivals."""
    arrival = _per_request(res.req_arrival, np.float64)
    if arrival.shape[0]:
        ttft = _per_request(res.req_first, np.float64) - arrival
        ok = ~np.isnan(ttft)
        ax.scatter(arrival[ok], ttft[ok], s=2, alpha=0.4, rasterized=True, label="TTFT per request")
        p90 = summary.get("ttft_p90_s")
        if p90 is not None:
            ax.axhline(p90, color="red", lw=1, ls=":", label=f"TTFT p90 ({format_duration(p90)})")
        if ok.any():
            log_if_wide(ax, "y", [float(ttft[ok].min()), float(ttft[ok].max())])
        lo, hi = float(arrival.min()), float(arrival.max())
        pad = 0.02 * (hi - lo) if hi > lo else 1.0
        ax.set_xlim(lo - pad, hi + pad)
    draw_ttft_target(ax, ttft_target_s)
    ax.set_ylabel("time to first token (s)")
    ax.set_xlabel("request arrival (simulated s; the trace's span)")
    _legend_outside(ax)


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
    plain_log(ax, "x", linthresh=1e-3)
    ax.set_xlabel("simulated time (s, log2 buckets)")
    ax.set_ylabel("evicted blocks / reuses")
    ax.set_title("block residency", fontsize=10)
    _legend_outside(ax)


def plot_replay(
    res: SimResult,
    summary: dict[str, Any],
    path: str | Path,
    ttft_target_s: float | None = None,
) -> None:
    """Write :func:`replay_figure` as a PNG."""
    plt = _pyplot()
    fig = replay_figure(res, summary, ttft_target_s)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _x(r: dict[str, Any]) -> float:
    return float(r.get("kv_memory_gib_per_gpu") or r["num_blocks"])


def _sweep_title(rows: list[dict[str, Any]]) -> str:
    """The workload and what every row shares: GPU, TP, engines, time scale."""
    if not rows:
        return ""
    r0 = rows[0]

    def shared(key: str) -> Any:
        values = {r.get(key) for r in rows}
        return next(iter(values)) if len(values) == 1 else None

    parts = []
    gpu, tp = shared("gpu"), shared("tp")
    if gpu is not None:
        parts.append(f"{gpu}" + (f", TP {tp}" if tp is not None else ""))
    inst = shared("instances")
    if inst not in (None, 1):
        parts.append(f"{inst} engines")
    scale = shared("time_scale")
    if scale is not None:
        parts.append(f"time scale {scale:g}")
    model = shared("model")
    head = f"{r0['workload']}" + (f": {model}" if model is not None else "")
    return head + (f" on {', '.join(parts)}" if parts else "")


def sweep_figure(rows: list[dict[str, Any]], ttft_target_s: float | None = None) -> Any:
    """Hit rate (every tier), TTFT p90 and throughput against KV memory, one
    line per variant; a TTFT target line when given.

    One legend (right of the top panel) names the variants; the panels below
    use the same colours. The x axis has a tick at each pool size swept.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    variants: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        variants.setdefault(str(r.get("variant", r["layout"])), []).append(r)
    by_gib = all("kv_memory_gib_per_gpu" in r for r in rows)
    bests: dict[float, list[str]] = {}
    drawn: list[float] = []
    for i, (name, rs) in enumerate(variants.items()):
        rs = sorted(rs, key=_x)
        x = [_x(r) for r in rs]
        color = f"C{i % 10}"
        hit = [100 * r.get("total_hit_rate", r["prefix_hit_rate"]) for r in rs]
        drawn += hit
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
        drawn.append(100 * best)
    axes[0].set_ylabel("prompt tokens hit,\nGPU + host (%)")
    fit_hit_rate_axis(axes[0], drawn)
    axes[1].set_ylabel("TTFT p90 (s)")
    log_if_wide(axes[1], "y", [r.get("ttft_p90_s") for r in rows])
    draw_ttft_target(axes[1], ttft_target_s)
    if ttft_target_s is not None:
        _legend_outside(axes[1])
    axes[2].set_ylabel("throughput\n(tokens/s per busy s)")
    axes[2].set_xlabel("KV-cache memory per GPU (GiB)" if by_gib else "pool size (blocks)")
    xs = [_x(r) for r in rows]
    if log_if_wide(axes[2], "x", xs):
        value_ticks(axes[2], "x", xs)
    _legend_outside(axes[0])
    if rows:
        axes[0].set_title(_sweep_title(rows), fontsize=10)
    fig.tight_layout()
    return fig


def plot_sweep(
    rows: list[dict[str, Any]], path: str | Path, ttft_target_s: float | None = None
) -> None:
    """Write :func:`sweep_figure` as a PNG."""
    plt = _pyplot()
    fig = sweep_figure(rows, ttft_target_s)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
