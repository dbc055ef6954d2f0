"""The latency check's table, its medians against the targets, and its plot.

``python -m kvcoord.replay.validate --latency`` (``--markdown`` for
``docs/validation.md``, ``--plot PNG`` for its figure) prints one line per
row of :func:`~kvcoord.replay.latency_check.latency_rows`: each measured
TTFT and TPOT statistic beside its prediction and the relative error, then
the median |error| of the rows' headline statistics (the median, else the
mean: :meth:`~kvcoord.replay.latency_check.LatencyRow.headline`) over all
checked rows, the calibration rows and the held-out rows, against
:data:`TPOT_TARGET` and :data:`TTFT_TARGET` (issue 31), and the rows not
covered with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvcoord.replay.latency_check import (
    MAX_REQUESTS,
    LatencyRow,
    latency_rows,
    median_errors,
)

__all__ = [
    "TPOT_TARGET",
    "TTFT_TARGET",
    "format_latency_table",
    "latency_check_main",
    "meets_targets",
    "plot_latency",
    "summary_lines",
]

#: Largest median |relative error| of TPOT and of TTFT over the checked rows.
TPOT_TARGET = 0.15
TTFT_TARGET = 0.25
_TARGETS = {"ttft": TTFT_TARGET, "tpot": TPOT_TARGET}


def _cell(row: LatencyRow, metric: str) -> str:
    m = row.measured.get(metric)
    if m is None:
        return ""
    p = row.predicted.get(metric)
    e = row.error(metric)
    if p is None or e is None:
        return f"{m:,.1f}"
    return f"{m:,.1f} / {p:,.1f} ({100 * e:+.0f}%)"


_COLUMNS = ("ttft_median", "ttft_mean", "ttft_p99", "tpot_median", "tpot_mean", "tpot_p99")


def format_latency_table(rows: Sequence[LatencyRow], markdown: bool = False) -> str:
    """Measured / predicted ms (error) per statistic, one line per checked row."""
    head = (
        "row",
        "model",
        "gpu x tp",
        "load",
        "status",
        *(f"{c[:4]} {c[5:]} ms" for c in _COLUMNS),
    )
    body = [
        (
            r.id,
            r.model,
            f"{r.gpu} x {r.tp}",
            r.load.describe() if r.load is not None else "",
            r.status,
            *(_cell(r, c) for c in _COLUMNS),
        )
        for r in rows
        if r.checked and r.predicted
    ]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        lines += ["| " + " | ".join(line) + " |" for line in body]
        return "\n".join(lines)
    widths = [max(len(line[i]) for line in (head, *body)) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in (head, *body)
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def meets_targets(rows: Sequence[LatencyRow]) -> bool:
    """Whether the median headline |error| over the checked rows meets both targets."""
    checked = [r for r in rows if r.checked and r.predicted]
    for kind, target in _TARGETS.items():
        med = median_errors(checked, kind)
        if med is None or med > target:
            return False
    return True


def summary_lines(rows: Sequence[LatencyRow], max_requests: int = MAX_REQUESTS) -> list[str]:
    """The medians (all, calibration, held out) against the targets, caps, rows not covered."""
    checked = [r for r in rows if r.checked and r.predicted]
    out = []
    for label, subset in (
        ("all checked", checked),
        ("calibration", [r for r in checked if r.status == "calibration"]),
        ("held out", [r for r in checked if r.status == "held out"]),
    ):
        parts = []
        for kind, target in _TARGETS.items():
            n = sum(1 for r in subset if r.headline_error(kind) is not None)
            med = median_errors(subset, kind)
            shown = "n/a" if med is None else f"{100 * med:.1f}%"
            parts.append(f"{kind.upper()} {shown} over {n} rows (target <= {100 * target:g}%)")
        out.append(f"median |error|, {label}: " + "; ".join(parts))
    capped = [r.id for r in checked if r.load and r.load.num_requests < r.load.measured_requests]
    if capped:
        out.append(
            f"{len(capped)} closed-loop / finite-rate rows replay their first {max_requests} "
            f"requests of more: {', '.join(capped)}"
        )
    out.append("headline statistic per row: the median where the source printed one, else the mean")
    out.extend(f"{r.id}: not covered: {r.reason}" for r in rows if not r.checked)
    out.append("verdict: " + ("targets met" if meets_targets(rows) else "targets MISSED"))
    return out


def plot_latency(rows: Sequence[LatencyRow], path: str) -> None:
    """Predicted against measured headline TTFT and TPOT, log-log, y = x drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    for ax, kind in zip(axes, ("ttft", "tpot"), strict=True):
        lo, hi = float("inf"), 0.0
        for status, marker, colour in (
            ("calibration", "o", "tab:blue"),
            ("held out", "^", "tab:orange"),
        ):
            pts = [
                (r.measured[m], r.predicted[m])
                for r in rows
                if r.status == status and (m := r.headline(kind)) and m in r.predicted
            ]
            if not pts:
                continue
            xs, ys = zip(*pts, strict=True)
            lo, hi = min(lo, *xs, *ys), max(hi, *xs, *ys)
            ax.scatter(xs, ys, marker=marker, color=colour, label=f"{status} ({len(pts)})")
        if hi > 0:
            span = (lo / 1.5, hi * 1.5)
            ax.plot(span, span, color="grey", linewidth=1, label="predicted = measured")
            ax.fill_between(
                span,
                [v * (1 - _TARGETS[kind]) for v in span],
                [v * (1 + _TARGETS[kind]) for v in span],
                color="grey",
                alpha=0.12,
                label=f"+-{100 * _TARGETS[kind]:g}%",
            )
            ax.set_xlim(span)
            ax.set_ylim(span)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"measured {kind.upper()} (ms)")
        ax.set_ylabel(f"predicted {kind.upper()} (ms)")
        ax.set_title(f"{kind.upper()}: median (or mean) per published run")
        ax.legend(loc="upper left", fontsize=8)
    fig.suptitle("kvcoord's step-time model against published vLLM measurements")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def latency_check_main(
    measurements: Sequence[dict[str, str]],
    max_requests: int = MAX_REQUESTS,
    markdown: bool = False,
    plot: str | None = None,
) -> bool:
    """Run the latency check on ``measurements`` (CSV rows) and print it; True
    when the targets are met."""
    rows = latency_rows(measurements, max_requests)
    print(format_latency_table(rows, markdown))
    print()
    for line in summary_lines(rows, max_requests):
        print(f"- {line}" if markdown else line)
    if plot:
        plot_latency(rows, plot)
    return meets_targets(rows)
