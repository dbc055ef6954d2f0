"""A comparison plot for cluster sweeps: prefix-cache hit rate and TTFT p90
of each variant (eviction policy x router) at each pool size, one row of
panels per trace (``docs/img/cluster-*.png``; see docs/cluster.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["plot_cluster_comparison"]


def _label(row: Mapping[str, Any]) -> str:
    router = row.get("router") or "1 engine"
    return f"{row.get('eviction_policy', 'lru')} / {router}"


def plot_cluster_comparison(
    traces: Mapping[str, Sequence[Mapping[str, Any]]], path: str
) -> list[str]:
    """Grouped bars: for each trace (a row of two panels), the hit rate (%)
    and TTFT p90 (s) of every variant at every KV size per GPU. Returns the
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
        for j, (key, scale, ylabel) in enumerate(
            (
                ("prefix_hit_rate", 100.0, "prefix-cache hit rate\n(% of prompt tokens)"),
                ("ttft_p90_s", 1.0, "TTFT p90 (s)"),
            )
        ):
            ax = axes[i][j]
            for k, lab in enumerate(labels):
                xs, ys = [], []
                for s_i, size in enumerate(sizes):
                    for r in rows:
                        if _label(r) == lab and float(r["kv_memory_gib_per_gpu"]) == size:
                            xs.append(s_i + (k - (len(labels) - 1) / 2) * width)
                            ys.append(float(r[key] or 0.0) * scale)
                ax.bar(xs, ys, width, color=cmap(k % 10), label=lab)
            if key == "prefix_hit_rate" and best is not None:
                ax.axhline(100 * best, ls="--", lw=1, color="gray", label="best possible")
            ax.set_xticks(range(len(sizes)))
            ax.set_xticklabels([f"{s:g} GiB" for s in sizes])
            ax.set_xlabel("KV-cache memory per GPU (each of the engines)")
            ax.set_ylabel(ylabel)
            inst = rows[0].get("instances", 1) if rows else 1
            ax.set_title(f"{trace}, {inst} engines", fontsize=10)
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return labels
