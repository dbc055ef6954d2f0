"""Metrics, tables and plots of ``kvcoord replay`` / ``kvcoord sweep``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from kvcoord.replay.bestcase import BestCase
from kvcoord.replay.scheduler import SimConfig, SimResult

__all__ = [
    "PlotUnavailable",
    "format_summary",
    "format_sweep",
    "plot_replay",
    "plot_sweep",
    "summarize",
]


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def summarize(
    res: SimResult, best: BestCase | None, cfg: SimConfig, workload_name: str
) -> dict[str, Any]:
    """The replay's numbers as a JSON-ready dict (the keys ``--json`` writes)."""
    per_step = np.frombuffer(res.step_manager_s, dtype=np.float64) if res.steps else np.zeros(1)
    usage = np.frombuffer(res.step_usage, dtype=np.float64) if res.steps else np.zeros(1)
    hit_rate = res.hit_tokens / res.prompt_tokens if res.prompt_tokens else 0.0
    return {
        "workload": workload_name,
        "layout": cfg.layout.name,
        "layout_description": cfg.layout.describe(),
        "num_blocks": cfg.num_blocks,
        "block_size": cfg.layout.block_size,
        "max_running": cfg.max_running,
        "token_budget": cfg.token_budget,
        "num_requests": res.num_requests,
        "num_finished": res.num_finished,
        "prompt_tokens": res.prompt_tokens,
        "output_tokens": res.output_tokens,
        "prefix_hit_tokens": res.hit_tokens,
        "prefix_hit_rate": hit_rate,
        "best_possible_hit_rate": best.hit_rate if best is not None else None,
        "preemptions": res.preemptions,
        "evictions": res.evictions,
        "peak_usage": float(usage.max()),
        "mean_usage": float(usage.mean()),
        "steps": res.steps,
        "simulated_seconds": res.sim_seconds,
        "busy_seconds": res.busy_seconds,
        # throughput proxy: prompt + output tokens served per simulated busy second
        # (prefix hits shorten steps, preemptions add recomputation)
        "throughput_tokens_per_s": (
            (res.prompt_tokens + res.output_tokens) / res.busy_seconds
            if res.busy_seconds > 0
            else 0.0
        ),
        "manager_seconds": res.manager_seconds,
        "manager_us_per_step_p50": float(np.percentile(per_step, 50) * 1e6),
        "manager_us_per_step_p99": float(np.percentile(per_step, 99) * 1e6),
        "wall_seconds": res.wall_seconds,
        "token_seconds": res.token_seconds,
        "request_seconds": res.request_seconds,
        "best_possible_seconds": res.best_seconds,
        "leaked_blocks": res.leaked_blocks,
        **_residency_keys(res),
    }


def _residency_keys(res: SimResult) -> dict[str, Any]:
    """Block residency (simulated seconds): median and p90 of lifetime, idle
    time before eviction and reuse gap, mean hits per evicted block."""
    r = res.residency
    if r is None:
        return {}
    out: dict[str, Any] = {"residency_evicted_blocks": r.lifetime.count}
    for name, h in (
        ("lifetime", r.lifetime),
        ("idle_before_eviction", r.idle_before_eviction),
        ("reuse_gap", r.reuse_gap),
    ):
        out[f"residency_{name}_s_p50"] = h.quantile(0.5) / 1e6
        out[f"residency_{name}_s_p90"] = h.quantile(0.9) / 1e6
    out["residency_hits_per_evicted_block"] = r.hits_per_block.mean
    return out


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def format_summary(s: dict[str, Any]) -> str:
    """A two-column text table of a replay summary."""
    ev = f"{s['evictions']:,}"
    rows = [
        ("workload", s["workload"]),
        ("layout", f"{s['layout']}: {s['layout_description']}"),
        ("pool", f"{s['num_blocks']:,} blocks"),
        ("requests", f"{s['num_finished']:,} finished of {s['num_requests']:,}"),
        ("prompt tokens", f"{s['prompt_tokens']:,}"),
        ("output tokens", f"{s['output_tokens']:,}"),
        (
            "prefix-cache hit rate",
            f"{_pct(s['prefix_hit_rate'])}  (best possible, unbounded cache: "
            f"{_pct(s['best_possible_hit_rate'])})",
        ),
        ("evictions", ev),
        ("preemptions", f"{s['preemptions']:,}"),
        ("pool usage", f"peak {_pct(s['peak_usage'])}, mean {_pct(s['mean_usage'])}"),
        ("steps", f"{s['steps']:,} ({s['simulated_seconds']:.1f} simulated s)"),
        (
            "manager time",
            f"{s['manager_seconds']:.3f} s total; per step p50 "
            f"{s['manager_us_per_step_p50']:.1f} us, p99 {s['manager_us_per_step_p99']:.1f} us",
        ),
        (
            "wall time",
            f"{s['wall_seconds']:.2f} s (manager {s['manager_seconds']:.2f}, Request objects "
            f"{s['request_seconds']:.2f}, token synthesis {s['token_seconds']:.2f}, "
            f"best-possible pass {s['best_possible_seconds']:.2f}, scheduler loop the rest)",
        ),
    ]
    if s.get("residency_evicted_blocks") == 0:
        rows.append(
            (
                "block residency",
                f"no cached block evicted; reuse gap p50 {s['residency_reuse_gap_s_p50']:.2f} s",
            )
        )
    elif "residency_evicted_blocks" in s:
        rows.append(
            (
                "block residency",
                f"{s['residency_evicted_blocks']:,} evicted; lifetime p50 "
                f"{s['residency_lifetime_s_p50']:.2f} s, idle before eviction p50 "
                f"{s['residency_idle_before_eviction_s_p50']:.2f} s, reuse gap p50 "
                f"{s['residency_reuse_gap_s_p50']:.2f} s, "
                f"{s['residency_hits_per_evicted_block']:.2f} hits per evicted block "
                "(log2 buckets: upper bounds)",
            )
        )
    if s.get("leaked_blocks"):
        rows.append(("LEAKED BLOCKS", str(s["leaked_blocks"])))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def format_sweep(rows: list[dict[str, Any]]) -> str:
    """A table of sweep results, one row per pool size."""
    head = ("blocks", "hit rate", "best", "preempt", "evictions", "peak use", "tok/sim-s", "mgr s")
    lines = []
    for s in rows:
        lines.append(
            (
                f"{s['num_blocks']:,}",
                _pct(s["prefix_hit_rate"]),
                _pct(s["best_possible_hit_rate"]),
                f"{s['preemptions']:,}",
                f"{s['evictions']:,}",
                _pct(s["peak_usage"]),
                f"{s['throughput_tokens_per_s']:,.0f}",
                f"{s['manager_seconds']:.3f}",
            )
        )
    widths = [max(len(h), *(len(r[i]) for r in lines)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), *(fmt.format(*r) for r in lines)])


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'kvcoord[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_replay(res: SimResult, summary: dict[str, Any], path: str | Path) -> None:
    """PNG of pool usage and cumulative prefix hit rate against simulated time."""
    plt = _pyplot()
    t = np.frombuffer(res.step_time, dtype=np.float64)
    usage = np.frombuffer(res.step_usage, dtype=np.float64)
    hit = np.frombuffer(res.step_hit_rate, dtype=np.float64)
    if t.shape[0] > 5000:  # keep the PNG cheap: every k-th step
        k = -(-t.shape[0] // 5000)
        t, usage, hit = t[::k], usage[::k], hit[::k]
    residency = (
        res.residency if res.residency is not None and res.residency.lifetime.count else None
    )
    if residency is None:
        fig, ax = plt.subplots(figsize=(9, 4.5))
    else:
        fig, (ax, bottom) = plt.subplots(2, 1, figsize=(9, 8))
        _plot_residency(bottom, residency)
    ax.plot(t, 100 * usage, label="pool usage", lw=0.8)
    ax.plot(t, 100 * hit, label="prefix hit rate (cumulative)", lw=1.5)
    best = summary.get("best_possible_hit_rate")
    if best is not None:
        ax.axhline(100 * best, ls="--", color="gray", lw=1, label="best possible hit rate")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("%")
    ax.set_ylim(0, 105)
    ax.set_title(f"{summary['workload']} on {summary['layout']}, {summary['num_blocks']:,} blocks")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_residency(bottom: Any, r: Any) -> None:
    """Log2-bucket histograms of block lifetime, idle time before eviction
    and reuse gap (simulated seconds) on the axes ``bottom``."""
    for name, h in (
        ("lifetime", r.lifetime),
        ("idle before eviction", r.idle_before_eviction),
        ("reuse gap", r.reuse_gap),
    ):
        edges = [0.0] + [(1 << k) / 1e6 for k in range(64)]
        ks = [k for k, n in enumerate(h.buckets) if n]
        if ks:
            bottom.step(
                [edges[k] for k in ks], [h.buckets[k] for k in ks], where="post", label=name
            )
    bottom.set_xscale("symlog", linthresh=1e-3)
    bottom.set(xlabel="simulated seconds (log2 buckets)", ylabel="blocks / hits")
    bottom.set_title("block residency")
    bottom.legend(loc="upper right")


def plot_sweep(rows: list[dict[str, Any]], path: str | Path) -> None:
    """PNG of prefix hit rate against pool capacity (blocks)."""
    plt = _pyplot()
    x = [r["num_blocks"] for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(x, [100 * r["prefix_hit_rate"] for r in rows], marker="o", label="prefix hit rate")
    best = rows[0].get("best_possible_hit_rate") if rows else None
    if best is not None:
        ax.axhline(100 * best, ls="--", color="gray", lw=1, label="best possible (unbounded)")
    ax.set_xscale("log")
    ax.set_xlabel("pool size (blocks)")
    ax.set_ylabel("prefix hit rate (%)")
    ax.set_ylim(0, 105)
    if rows:
        ax.set_title(f"{rows[0]['workload']} on {rows[0]['layout']}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
