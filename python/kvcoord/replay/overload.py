"""Whether a replay's deployment keeps up with its offered load: the overload verdict.

A replay of traffic the deployment cannot serve still finishes (the trace is
finite) and reports latencies, but they only measure how long the queue got
before the trace ended. :func:`overload_verdict` says so, from the replay's
own accounting:

* **offered rate**: requests per second of the (scaled) trace, between its
  first and last offered time;
* **capacity**: what the deployment serves at a limit: requests finished in
  the steps that ended with requests still waiting (the token budget, the
  running cap or the pool refused them) or held back by a concurrency cap,
  per simulated second of those steps (``SimResult.saturated_finished /
  saturated_seconds``, from the first such step that finished requests to
  the last, so that the batch filling and draining do not count; times the
  engine count behind a router). It is the service rate at this request mix
  and hit rate, measured only when at least :data:`MIN_SATURATED_FINISHED`
  requests finished so over at least :data:`MIN_SATURATED_SHARE` of the
  simulated time; it is the capacity only when the deployment is at its
  limit throughout (in a replay that keeps up, the steps at a limit are the
  prefill-heavy ones, which finish fewer requests);
* **queue growth**: how much the delay from offered time to first scheduled
  grows per second of trace, from the medians of the first and the last
  fifth of the requests (medians: one huge prompt does not decide it). A
  load ``f`` times the capacity grows it by ``f - 1``.

The load is **overloaded** when the offered rate exceeds the capacity and
the queue grows by at least :data:`GROWTH_MIN` per second: queues grow
without bound, and the latencies depend on the trace's length. The
sustained rate is then the capacity, which is also the highest rate at
which queueing stays bounded; with no latency target given, that is the
rate reported as sustainable (``target``: bounded queueing), with the
``--time-scale`` that brings the offered rate down to it. A load that keeps
up sustains its offered rate; its limit lies above it, unmeasured (None). A
closed loop (every request offered at once, at most N in flight) cannot
overload, nor can a burst (everything at once, no cap): both sustain the
achieved rate, requests over the run; only the burst's (a full batch
throughout) is also the bounded-queueing rate.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kvcoord.replay.sim import SimResult

__all__ = [
    "GROWTH_MIN",
    "MIN_SATURATED_FINISHED",
    "MIN_SATURATED_SHARE",
    "format_overload",
    "overload_verdict",
]

#: Queue growth (seconds of delay per second of trace) that counts as growing.
GROWTH_MIN = 0.01
#: Requests that must finish at a limit, and the share of the simulated time
#: spent there, before a sustained rate is measured.
MIN_SATURATED_FINISHED = 10
MIN_SATURATED_SHARE = 0.25


def _arr(a: Any) -> np.ndarray:
    return np.frombuffer(a, dtype=np.float64) if len(a) else np.zeros(0)


def overload_verdict(
    res: SimResult,
    max_concurrency: int | None = None,
    instances: int = 1,
    time_scale: float = 1.0,
) -> dict[str, Any]:
    """The JSON ``overload`` object of a replay (see the module docstring);
    ``time_scale`` is the replay's (``time_scale_needed``: the one at which
    the offered rate would be the sustained one)."""
    offered = _arr(res.req_offered)
    admit = _arr(res.req_admit)
    finish = _arr(res.req_finish)
    done = ~np.isnan(finish)
    n = int(offered.shape[0])
    first = float(offered.min()) if n else 0.0
    span = float(offered.max()) - first if n else 0.0
    end = float(np.nanmax(finish)) if done.any() else 0.0
    v: dict[str, Any] = {
        "overloaded": False,
        "regime": "open loop",
        "offered_rps": None,
        "sustained_rps": None,
        "capacity_rps": None,
        "saturated_share": 0.0,
        "sustainable_rps_at_target": None,
        "target": "bounded queueing (no latency target given)",
        "queue_growth": None,
        "queue_delay_first_s": None,
        "queue_delay_last_s": None,
        "trace_seconds": span,
        "simulated_seconds": end - first,
        "max_concurrency": max_concurrency,
        "time_scale_needed": None,
    }
    share = res.saturated_seconds / (end - first) if end > first else 0.0
    v["saturated_share"] = share
    mu = None
    if res.saturated_finished >= MIN_SATURATED_FINISHED and share >= MIN_SATURATED_SHARE:
        mu = instances * res.saturated_finished / res.saturated_seconds
    v["capacity_rps"] = mu
    if span <= 0 or n < 2:
        v["regime"] = "closed loop" if max_concurrency is not None else "burst"
        if end > first:
            v["sustained_rps"] = int(done.sum()) / (end - first)
        # a burst measures full-batch service; a closed loop only its N clients' rate
        if v["regime"] == "burst" and n >= 2:
            v["sustainable_rps_at_target"] = v["sustained_rps"]
        return v
    order = np.argsort(offered, kind="stable")
    t, delay = offered[order], (admit - offered)[order]
    k = max(1, n // 5)
    d1, d5 = float(np.nanmedian(delay[:k])), float(np.nanmedian(delay[-k:]))
    t1, t5 = float(np.median(t[:k])), float(np.median(t[-k:]))
    growth = (d5 - d1) / (t5 - t1) if t5 > t1 else 0.0
    lam = (n - 1) / span
    over = mu is not None and lam > mu and growth >= GROWTH_MIN
    v.update(
        offered_rps=lam,
        queue_growth=growth,
        queue_delay_first_s=d1,
        queue_delay_last_s=d5,
        overloaded=bool(over),
        sustained_rps=mu if over else lam,
    )
    if over:
        assert mu is not None
        v["sustainable_rps_at_target"] = mu
        v["time_scale_needed"] = time_scale * lam / mu
    return v


def _rps(x: float) -> str:
    return f"{x:,.3g} req/s" if x < 100 else f"{x:,.0f} req/s"


def _s(x: float) -> str:
    return f"{x * 1e3:.0f} ms" if abs(x) < 1 else f"{x:,.1f} s"


def format_overload(v: dict[str, Any]) -> str:
    """The verdict as the summary table's one ``load`` line."""
    mu = v["sustained_rps"]
    if v["regime"] == "closed loop":
        rate = _rps(mu) if mu is not None else "n/a"
        return (
            f"closed loop, {v['max_concurrency']:,} clients: {rate} sustained (a client sends "
            "its next request when its last one finishes: queues cannot grow)"
        )
    if v["regime"] == "burst":
        rate = f"served at {_rps(mu)}" if mu is not None else "too few requests for a rate"
        return f"every request arrives at once (a throughput test): {rate}"
    lam = v["offered_rps"]
    delays = (
        f"median queueing delay {_s(v['queue_delay_first_s'])} in the first fifth of the "
        f"requests, {_s(v['queue_delay_last_s'])} in the last"
    )
    if v["overloaded"]:
        cap = v["max_concurrency"]
        who = f"{cap:,} clients get" if cap is not None else "the deployment serves"
        more = "a higher --concurrency or more GPUs" if cap is not None else "more GPUs"
        return (
            f"OVERLOADED: offered {_rps(lam)}, {who} {_rps(mu)} at the limit; queueing "
            f"delay grows {v['queue_growth']:.2f} s per s of trace ({delays}) and the "
            f"{v['trace_seconds']:,.0f} s trace takes {v['simulated_seconds']:,.0f} simulated s, "
            f"so its latencies measure the backlog. Queues stay bounded below {_rps(mu)} "
            f"(no latency target given): --time-scale {_ceil(v['time_scale_needed'])} or more, "
            f"or {more}"
        )
    limit = v["saturated_share"]
    at_limit = f"; at a limit {limit:.0%} of the time" if limit >= MIN_SATURATED_SHARE else ""
    return f"keeps up: offered {_rps(lam)}, queueing stays bounded ({delays}){at_limit}"


def _ceil(x: float) -> str:
    """``x`` rounded up to two significant digits (a --time-scale that suffices)."""
    if not math.isfinite(x) or x <= 0:
        return "n/a"
    digits = 1 - math.floor(math.log10(x))
    q = 10.0**digits
    return f"{math.ceil(x * q - 1e-9) / q:g}"
