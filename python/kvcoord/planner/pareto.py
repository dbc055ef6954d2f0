"""The plan's Pareto plot: cost per hour against TTFT p90 for every candidate
replayed, the cheapest-first frontier of the exact ones, the TTFT target and
the chosen deployment (axes follow :mod:`kvcoord.replay.plot_axes`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from kvcoord.planner.search import SearchResult
from kvcoord.replay.plot_axes import draw_ttft_target, format_duration, log_if_wide

__all__ = ["pareto_figure", "plot_pareto"]


def _points(res: SearchResult) -> list[tuple[float, float, str, str]]:
    """(cost, TTFT p90, status, label) of each candidate replayed."""
    out = []
    for o in res.of_stage("replayed"):
        c, r = o.candidate, o.result
        v = r.get("ttft_p90_s")
        if c is None or v is None or not math.isfinite(v) or v <= 0:
            continue
        out.append((c.usd_per_hour, float(v), r["status"], c.label()))
    return out


def pareto_figure(res: SearchResult) -> Any:
    """The figure (tests inspect it; :func:`plot_pareto` writes it)."""
    from kvcoord.replay.plots import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 5))
    pts = _points(res)
    styles = {
        "meets": ("o", "tab:green", "meets the targets"),
        "misses": ("o", "tab:gray", "misses a target"),
        "stopped": ("^", "tab:orange", "misses (replay stopped: TTFT p90 at least this)"),
    }
    for status, (marker, color, label) in styles.items():
        xs = [p[0] for p in pts if p[2] == status]
        ys = [p[1] for p in pts if p[2] == status]
        if xs:
            filled = status != "stopped"
            ax.scatter(
                xs, ys, marker=marker, s=36, label=label, zorder=3,
                color=color if filled else "none", edgecolors=color,
            )  # fmt: skip
    exact = sorted((p[0], p[1]) for p in pts if p[2] != "stopped")
    front: list[tuple[float, float]] = []
    for x, y in exact:  # cheapest first: a point is on the frontier if faster than all cheaper
        if not front or y < front[-1][1]:
            front.append((x, y))
    if len(front) > 1:
        ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="tab:blue",
                lw=1, label="Pareto frontier (replayed to the end)")  # fmt: skip
    chosen = res.chosen
    if chosen is not None and chosen.candidate is not None:
        x, y = chosen.candidate.usd_per_hour, chosen.result["ttft_p90_s"]
        ax.scatter([x], [y], marker="*", s=260, color="gold", edgecolors="black", zorder=4,
                   label=f"chosen: ${x:,.2f}/h, TTFT p90 {format_duration(y)}")  # fmt: skip
    ax.set_xlabel("cost (US$ per hour)")
    ax.set_ylabel("TTFT p90 (s)")
    log_if_wide(ax, "y", [p[1] for p in pts])
    log_if_wide(ax, "x", [p[0] for p in pts])
    target = res.targets.limits.get(("ttft", 90))
    draw_ttft_target(ax, target)
    ax.set_title(f"kvcoord plan: {res.targets.describe()}", fontsize=10)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def plot_pareto(res: SearchResult, path: str | Path) -> None:
    """Write :func:`pareto_figure` as a PNG."""
    from kvcoord.replay.plots import _pyplot

    plt = _pyplot()
    fig = pareto_figure(res)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
