"""A comparison plot for cluster sweeps: hit rate (every tier) and TTFT p90
of each variant (eviction policy x router) at each pool size, one row of
panels per trace (``docs/img/cluster-*.png``; see docs/cluster.md). Axes
follow :mod:`kvcoord.replay.plot_axes`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvcoord.replay.plot_axes import draw_ttft_target, fit_hit_rate_axis

__all__ = ["cluster_comparison_figure", "plot_cluster_comparison"]


def _label(row: Mapping[str, Any]) -> str:
    router = row.get("router") or "1 engine"
    return f"{row.get('eviction_policy', 'lru')} / {router}"


def _hit_pct(row: Mapping[str, Any]) -> float:
    """Hit rate of every tier, in %."""
    return 100 * float(row.get("total_hit_rate", row["prefix_hit_rate"]) or 0.0)


def _ttft_p90(row: Mapping[str, Any]) -> float:
    return float(row["ttft_p90_s"] or 0.0)


def plot_cluster_comparison(
    traces: Mapping[str, Sequence[Mapping[str, Any]]],
    path: str,
    ttft_target_s: float | None = None,
) -> list[str]:
    """Write :func:`cluster_comparison_figure` as a PNG; returns the variant
    labels in legend order."""
    import matplotlib.pyplot as plt

    fig, labels = cluster_comparison_figure(traces, ttft_target_s)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return labels


def cluster_comparison_figure(
    traces: Mapping[str, Sequence[Mapping[str, Any]]], ttft_target_s: float | None = None
) -> tuple[Any, list[str]]:
    """Grouped bars: for each trace (a row of two panels), the hit rate (%,
    GPU pool and host tier) and TTFT p90 (s) of every variant at every KV
    size per GPU; a TTFT target line when given. Returns the figure and the
    variant labels in legend order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels: list[str] = []
    for rows in traces.values():
        for r in rows:
            if _label(r) not in labels:
                labels.append(_label(r))
    n = len(traces)
    fig, axes = plt.subplots(n, 2, figsize=(12, 3.6 * n), squeeze=False)
    cmap = plt.get_cmap("tab10")
    width = 0.8 / max(1, len(labels))
    for i, (trace, rows) in enumerate(traces.items()):
        sizes = sorted({float(r["kv_memory_gib_per_gpu"]) for r in rows})
        best = rows[0].get("best_possible_hit_rate") if rows else None
        panels = (
            (_hit_pct, "hit rate, GPU + host\n(% of prompt tokens)"),
            (_ttft_p90, "TTFT p90 (s)"),
        )
        for j, (value, ylabel) in enumerate(panels):
            ax = axes[i][j]
            drawn: list[float] = []
            for k, lab in enumerate(labels):
                xs, ys = [], []
                for s_i, size in enumerate(sizes):
                    for r in rows:
                        if _label(r) == lab and float(r["kv_memory_gib_per_gpu"]) == size:
                            xs.append(s_i + (k - (len(labels) - 1) / 2) * width)
                            ys.append(value(r))
                ax.bar(xs, ys, width, color=cmap(k % 10), label=lab)
                drawn += ys
            if j == 0:
                if best is not None:
                    ax.axhline(100 * best, ls="--", lw=1, color="gray", label="best possible")
                    drawn.append(100 * best)
                fit_hit_rate_axis(ax, drawn)
            else:
                draw_ttft_target(ax, ttft_target_s)
            ax.set_xticks(range(len(sizes)))
            ax.set_xticklabels([f"{s:.3g} GiB" for s in sizes])
            ax.set_xlabel("KV-cache memory per GPU (each of the engines)")
            ax.set_ylabel(ylabel)
            inst = rows[0].get("instances", 1) if rows else 1
            where = _where(rows)
            ax.set_title(f"{trace}, {inst} engines{where}", fontsize=10)
    handles, names = axes[0][0].get_legend_handles_labels()
    for h, name in zip(*axes[0][1].get_legend_handles_labels(), strict=True):
        if name.startswith("TTFT target"):  # the target line's entry, once
            handles, names = [*handles, h], [*names, name]
    fig.legend(handles, names, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    return fig, labels


def _where(rows: Sequence[Mapping[str, Any]]) -> str:
    """The GPU and TP every row shares, as a title suffix (empty when they differ)."""
    gpus = {(r.get("gpu"), r.get("tp")) for r in rows}
    if len(gpus) != 1:
        return ""
    gpu, tp = next(iter(gpus))
    return "" if gpu is None else f", each on {gpu} (TP {tp})"
