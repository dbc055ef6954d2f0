"""Goodput targets of ``kvcoord plan`` (``--goodput``, ``--goodput-min``), in
the sense of ``vllm bench serve --goodput``.

A request is *good* when it meets every per-request limit given: its TTFT
(arrival to first token), its TPOT (``(finish - first token) / (output
tokens - 1)``; a request of one output token has none and passes it) and its
end-to-end latency ``e2el`` (arrival to finish). The target is either the
share of all requests that are good (``--goodput-min 95%``) or the rate of
good requests over the replay's makespan (``--goodput-min 2.5req/s``: good
requests / (last finish - first arrival), as ``vllm bench serve`` divides by
its run's duration).

While a replay runs, a request is *certainly bad* once a limit is exceeded
whatever happens next: its first token came later than the TTFT limit or it
has waited longer than that without one; it finished over the TPOT or e2el
limit, or has waited longer than the e2el limit unfinished. A share target is certainly
missed once fewer requests than it needs can still be good; a rate target
once the requests that can still be good over the least makespan there can
be (the latest engine clock or the last arrival, less the first arrival) fall
short of the rate.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

__all__ = ["GOODPUT_METRICS", "Goodput", "parse_goodput_limit", "parse_goodput_min"]

#: Per-request limits ``--goodput`` takes, in vLLM's names.
GOODPUT_METRICS: tuple[str, ...] = ("ttft", "tpot", "e2el")


def parse_goodput_limit(text: str) -> tuple[str, float]:
    """``ttft:2s`` -> ``("ttft", 2.0)``; raises ValueError naming what is wrong."""
    from kvcoord._suggest import unknown_name
    from kvcoord.replay.plan import parse_duration

    metric, sep, value = text.partition(":")
    metric = metric.strip().lower()
    if not sep:
        raise ValueError(f"expected METRIC:DURATION such as ttft:2s or tpot:50ms, got {text!r}")
    if metric not in GOODPUT_METRICS:
        raise ValueError(unknown_name("goodput metric", metric, GOODPUT_METRICS))
    return metric, parse_duration(value)


def parse_goodput_min(text: str) -> tuple[str, float]:
    """``95%`` -> ``("share", 0.95)``; ``2.5req/s`` -> ``("rate", 2.5)``."""
    t = text.strip()
    if m := re.fullmatch(r"([0-9]*\.?[0-9]+)\s*%", t):
        share = float(m.group(1)) / 100
        if not 0 < share <= 1:
            raise ValueError(f"a share of requests above 0% and at most 100%, got {text!r}")
        return "share", share
    if m := re.fullmatch(r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*req/s", t):
        rate = float(m.group(1))
        if not 0 < rate < math.inf:
            raise ValueError(f"a positive rate of good requests, got {text!r}")
        return "rate", rate
    hint = f": did you mean {t}% or {t}req/s?" if re.fullmatch(r"[0-9.]+", t) else ""
    raise ValueError(
        f"expected a share of requests (95%) or a rate of good requests (2.5req/s), "
        f"got {text!r}{hint}"
    )


@dataclass(frozen=True)
class Goodput:
    """Per-request ``limits`` (metric -> seconds) and the goodput required:
    ``kind`` ``share`` (of all requests, 0 to 1) or ``rate`` (good requests
    per second)."""

    limits: dict[str, float]
    kind: str
    minimum: float

    def describe(self) -> str:
        """``goodput (TTFT <= 2 s, TPOT <= 50 ms) >= 95% of requests``."""
        from kvcoord.replay.plot_axes import format_duration

        each = ", ".join(f"{m.upper()} <= {format_duration(v)}" for m, v in self.limits.items())
        return f"goodput ({each}) >= {self.format(self.minimum)}"

    def format(self, value: float) -> str:
        """A goodput as the target states it (``95.0% of requests``, ``2.5 req/s``)."""
        if self.kind == "share":
            return f"{100 * value:.4g}% of requests"
        return f"{value:,.3g} req/s"

    def good(
        self, arrival: np.ndarray, first: np.ndarray, finish: np.ndarray, out_len: np.ndarray
    ) -> np.ndarray:
        """Per finished request: whether it meets every limit (NaN times: not good)."""
        ok: np.ndarray = ~np.isnan(finish) & ~np.isnan(first)
        with np.errstate(invalid="ignore"):
            if "ttft" in self.limits:
                ok &= first - arrival <= self.limits["ttft"]
            if "tpot" in self.limits:
                multi = out_len > 1
                tpot = (finish - first) / np.where(multi, out_len - 1, 1)
                ok &= ~multi | (tpot <= self.limits["tpot"])
            if "e2el" in self.limits:
                ok &= finish - arrival <= self.limits["e2el"]
        return ok

    def certainly_bad(
        self,
        arrival: np.ndarray,
        first: np.ndarray,
        finish: np.ndarray,
        out_len: np.ndarray,
        clock: float,
    ) -> np.ndarray:
        """Per request an engine has: whether it misses a limit whatever happens
        after ``clock`` (that engine's simulated time; see the module docstring)."""
        bad = np.zeros(arrival.shape[0], dtype=bool)
        no_first, done = np.isnan(first), ~np.isnan(finish)
        with np.errstate(invalid="ignore"):
            if "ttft" in self.limits:
                bad |= np.where(no_first, clock - arrival, first - arrival) > self.limits["ttft"]
            if "tpot" in self.limits:  # out_len: 0 until a request finishes
                multi = done & (out_len > 1)
                spent = (finish - first) / np.where(multi, out_len - 1, 1)
                bad |= multi & (spent > self.limits["tpot"])
            if "e2el" in self.limits:
                bad |= np.where(done, finish, clock) - arrival > self.limits["e2el"]
        return bad

    def achieved(self, good: int, n: int, makespan: float) -> float:
        """The goodput of ``good`` good requests of ``n`` over ``makespan`` seconds."""
        if self.kind == "share":
            return good / n if n else 0.0
        return good / makespan if makespan > 0 else math.inf

    def met(self, good: int, n: int, makespan: float) -> bool:
        return self.achieved(good, n, makespan) >= self.minimum

    def ratio(self, value: float | None) -> float:
        """``minimum / value`` (above 1: missed; inf: unknown or none good)."""
        if value is None or value <= 0:
            return math.inf
        return self.minimum / value
