"""Axis conventions shared by the planner's plots (:mod:`kvcoord.replay.plots`,
:mod:`kvcoord.replay.cluster_plots`).

* Log axes carry plain numbers (8, 16, 32; never ``10^1``), and minor ticks
  are labelled only where the axis spans about a decade or less, so labels
  never run into each other.
* An axis of given values (the pool sizes of a sweep) has a tick at each,
  thinned to every k-th when there are many.
* Durations in legends read as people say them (``2 h 50 min``, not ``1.02e+04 s``).
* Hit-rate axes run from 0 to just above the highest rate drawn, not always to 100%.
* A TTFT target, when one is given, is a labelled horizontal line inside the axis.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from kvcoord._arith import cdiv

__all__ = [
    "MAX_VALUE_TICKS",
    "draw_ttft_target",
    "fit_hit_rate_axis",
    "format_duration",
    "log_if_wide",
    "plain_log",
    "value_ticks",
]

#: Most ticks :func:`value_ticks` puts on an axis.
MAX_VALUE_TICKS = 8


def format_duration(seconds: float) -> str:
    """``seconds`` as people say it: 850 us, 12.3 ms, 4.56 s, 3 min 20 s, 2 h 50 min."""
    s = float(seconds)
    if not math.isfinite(s):
        return f"{s} s"
    if s < 0:
        return f"-{format_duration(-s)}"
    if s == 0:
        return "0 s"
    s = float(f"{s:.3g}")  # 3 figures first, so 0.9999 s is "1 s", not "1e+03 ms"
    if s < 1e-3:
        return f"{s * 1e6:.3g} us"
    if s < 1:
        return f"{s * 1e3:.3g} ms"
    if s < 60:
        return f"{s:.3g} s"
    if round(s) < 3600:
        m, r = divmod(round(s), 60)
        return f"{m} min {r} s" if r else f"{m} min"
    if round(s / 60) < 1440:
        h, r = divmod(round(s / 60), 60)
        return f"{h} h {r} min" if r else f"{h} h"
    d, r = divmod(round(s / 3600), 24)
    return f"{d} d {r} h" if r else f"{d} d"


def _plain(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1e4 else f"{v:g}"


def plain_log(ax: Any, axis: str, linthresh: float | None = None) -> None:
    """Log scale on ``axis`` ("x" or "y"; symlog, linear within ``linthresh``
    of 0, when given), labelled with plain numbers; minor ticks labelled (a
    few per decade) only where the axis spans at most one decade, so their
    labels do not overlap."""
    from matplotlib.ticker import LogFormatter

    class _Plain(LogFormatter):
        def _num_to_string(self, x: float, vmin: float, vmax: float) -> str:
            return _plain(x)

    set_scale = ax.set_xscale if axis == "x" else ax.set_yscale
    if linthresh is None:
        set_scale("log")
    else:
        set_scale("symlog", linthresh=linthresh)
    a = ax.xaxis if axis == "x" else ax.yaxis
    # matplotlib's rule: with more than one decade boundary in view only the
    # decades are labelled; within about a decade, a few or all multiples
    for set_formatter in (a.set_major_formatter, a.set_minor_formatter):
        set_formatter(_Plain(labelOnlyBase=False, minor_thresholds=(1, 0.4)))


def log_if_wide(ax: Any, axis: str, values: Iterable[float | None]) -> bool:
    """:func:`plain_log` when the positive finite ``values`` span more than a factor of 8."""
    v = [x for x in values if x is not None and x > 0 and math.isfinite(x)]
    if v and max(v) / min(v) > 8:
        plain_log(ax, axis)
        return True
    return False


def value_ticks(ax: Any, axis: str, values: Sequence[float], unit: str = "") -> None:
    """Ticks at ``values`` (sorted, distinct), labelled to 3 figures; every
    k-th of them when there are more than :data:`MAX_VALUE_TICKS`; no minor
    tick labels."""
    from matplotlib.ticker import FixedFormatter, FixedLocator, NullFormatter, NullLocator

    vs = sorted({float(v) for v in values})
    if not vs:
        return
    step = cdiv(len(vs), MAX_VALUE_TICKS)
    shown = vs[::step]
    a = ax.xaxis if axis == "x" else ax.yaxis
    a.set_major_locator(FixedLocator(shown))
    a.set_major_formatter(FixedFormatter([f"{v:.3g}{unit}" for v in shown]))
    a.set_minor_locator(NullLocator())
    a.set_minor_formatter(NullFormatter())


def fit_hit_rate_axis(ax: Any, percents: Iterable[float | None]) -> None:
    """Y from 0 to a round number just above the highest rate drawn (in %):
    10% headroom, at least 5 points, at most 100%."""
    v = [p for p in percents if p is not None and math.isfinite(p)]
    top = max(v, default=0.0)
    room = max(top * 1.1, top + 5.0)
    ax.set_ylim(0, min(100.0, 5 * math.ceil(room / 5)))


def draw_ttft_target(ax: Any, target_s: float | None) -> None:
    """A TTFT target (seconds) as a labelled dashed line, the axis widened to show it."""
    if target_s is None:
        return
    if not (target_s > 0 and math.isfinite(target_s)):
        raise ValueError(f"a TTFT target must be a positive duration, got {target_s!r} s")
    label = f"TTFT target ({format_duration(target_s)})"
    ax.axhline(target_s, color="crimson", ls="--", lw=1.2, label=label)
    lo, hi = ax.get_ylim()
    if target_s > hi:
        ax.set_ylim(lo, target_s * (1.5 if ax.get_yscale() == "log" else 1.1))
    elif target_s < lo:
        ax.set_ylim(target_s / (1.5 if ax.get_yscale() == "log" else 1.1), hi)
