"""What ``kvcoord plan`` prints and writes: the answer in a sentence with the
``kvcoord replay`` command that reproduces it, the ranked table, the JSON."""

from __future__ import annotations

import shlex
from typing import Any

from kvcoord.planner.search import Outcome, SearchResult
from kvcoord.replay.plot_axes import format_duration

__all__ = [
    "EXIT_NO_DEPLOYMENT",
    "closest",
    "format_table",
    "plan_json",
    "ranked",
    "replay_command",
    "sentence",
]

#: Exit status of ``kvcoord plan`` when no candidate meets the targets.
EXIT_NO_DEPLOYMENT = 3


def _d(x: float | None, at_least: bool = False) -> str:
    if x is None:
        return "n/a"
    return (">= " if at_least else "") + format_duration(x)


def _value(o: Outcome, key: str) -> float | None:
    """A candidate's percentile: exact when replayed to the end, else the larger of
    its lower bounds (the bounds stage's and, when stopped, the replay's)."""
    assert o.candidate is not None
    if o.stage == "replayed" and o.result.get("status") != "stopped":
        v = o.result.get(key)
        return None if v is None else float(v)
    vals = [v for v in (o.candidate.bound.get(key), o.result.get(key)) if v is not None]
    return max(float(v) for v in vals) if vals else None


def _goodput(o: Outcome) -> float | None:
    """A candidate's goodput: exact when replayed to the end, else the smaller of
    its upper bounds (the bounds stage's and, when stopped, the replay's)."""
    assert o.candidate is not None
    if o.stage == "replayed" and o.result.get("status") != "stopped":
        v = o.result.get("goodput")
        return None if v is None else float(v)
    key = "goodput_at_most"
    vals = [v for v in (o.candidate.bound.get(key), o.result.get(key)) if v is not None]
    return min(float(v) for v in vals) if vals else None


def _goodput_cell(res: SearchResult, o: Outcome) -> str:
    g = res.targets.goodput
    assert g is not None
    v = _goodput(o)
    if v is None:
        return "n/a"
    exact = o.stage == "replayed" and o.result.get("status") != "stopped"
    return ("" if exact else "<= ") + g.format(v).replace(" of requests", "")


def replay_command(workload_argv: list[str], o: Outcome) -> str:
    """The ``kvcoord replay`` command line that replays ``o``'s deployment."""
    assert o.candidate is not None
    return shlex.join(["kvcoord", "replay", *workload_argv, *o.candidate.replay_flags()])


def _per_million(o: Outcome) -> float | None:
    r = o.result
    if o.candidate is None or not r.get("tokens") or not r.get("makespan_seconds"):
        return None
    hours = float(r["makespan_seconds"]) / 3600
    return o.candidate.usd_per_hour * hours / (float(r["tokens"]) / 1e6)


def closest(res: SearchResult) -> Outcome | None:
    """With no answer: the candidate nearest the targets (the smallest worst
    ``value / target``, exact or a lower bound), the cheaper first on a tie."""
    pool = [o for o in res.outcomes if o.stage == "replayed"] or res.of_stage("bounds")

    def worst(o: Outcome) -> tuple[float, float]:
        assert o.candidate is not None
        vals = {k: _value(o, f"{k[0]}_p{k[1]}_s") for k in res.targets.limits}
        return res.targets.ratio(vals, _goodput(o)), o.candidate.usd_per_hour

    return min(pool, key=worst) if pool else None


def sentence(res: SearchResult, command: str | None) -> str:
    """The answer a user acts on (or why there is none)."""
    t = res.targets.describe()
    o = res.chosen
    if o is not None and o.candidate is not None:
        c, r = o.candidate, o.result
        per_m = _per_million(o)
        cost = f"${c.usd_per_hour:,.2f} per hour" + (
            f" (${per_m:,.3f} per million tokens)" if per_m is not None else ""
        )
        g = res.targets.goodput
        good = f", goodput {g.format(r['goodput'])}" if g is not None else ""
        return (
            f"The cheapest deployment that meets {t}: {c.label()}, at {cost}; predicted TTFT "
            f"p90 {_d(r['ttft_p90_s'])}, TPOT p90 {_d(r['tpot_p90_s'])}{good}, prefix-cache "
            f"hit rate {100 * r['hit_rate']:.1f}%. Replay it: {command}"
        )
    near = closest(res)
    head = f"No deployment in the search space meets {t}"
    if near is None or near.candidate is None:
        why = next((o.reason for o in res.outcomes if o.reason), "")
        return (
            f"{head}: none fits in memory ({why}). Try larger GPUs, more TP or quantized weights."
        )
    bound = near.stage != "replayed" or near.result.get("status") == "stopped"
    parts = [
        f"{m.upper()} p{q} {_d(_value(near, f'{m}_p{q}_s'), bound)}"
        for (m, q) in res.targets.limits
    ]
    if res.targets.goodput is not None:
        parts.append(f"goodput {_goodput_cell(res, near)}")
    lat = ", ".join(parts)
    return (
        f"{head}. The closest is {near.candidate.label()} at ${near.candidate.usd_per_hour:,.2f} "
        f"per hour ({lat}). Widen the search (--replicas, --tp, --gpus, --weight-dtype, "
        "--host-memory) or relax the targets."
    )


def ranked(res: SearchResult) -> list[Outcome]:
    """Candidates replayed or bounded, the meeting ones first, each group by cost."""
    rank = {"meets": 0, "misses": 1, "stopped": 2}
    rows = [o for o in res.outcomes if o.candidate is not None and o.stage != "memory"]

    def key(o: Outcome) -> tuple[int, float, int]:
        assert o.candidate is not None
        if o.stage == "replayed":
            group = rank[o.result["status"]]
        else:
            group = {"not replayed": 3, "rate": 4}.get(o.stage, 5)
        return group, o.candidate.usd_per_hour, o.candidate.order

    return sorted(rows, key=key)


#: Rows of the table per kind of outcome not replayed (the rest are in --json).
TABLE_UNREPLAYED_ROWS = 3


def format_table(res: SearchResult) -> str:
    """The ranked candidates as a text table: every one replayed, then the
    cheapest few of those set aside (costlier than the answer, too little
    measured rate, missing by the bounds)."""
    keys = list(res.targets.limits)
    good = res.targets.goodput is not None
    head = ["candidate", "$/h", *[f"{m.upper()} p{q}" for m, q in keys]]
    head += ["goodput"] * good + ["hit rate", "verdict"]
    lines = []
    rows = ranked(res)
    shown: list[Outcome] = []
    per: dict[str, int] = {}
    for o in rows:
        if o.stage != "replayed":
            per[o.stage] = per.get(o.stage, 0) + 1
            if per[o.stage] > TABLE_UNREPLAYED_ROWS:
                continue
        shown.append(o)
    for o in shown:
        c = o.candidate
        assert c is not None
        bound = o.stage != "replayed" or o.result.get("status") == "stopped"
        if o.stage == "replayed":
            v = o.result["status"] if o.result["status"] != "stopped" else "misses (stopped)"
            hit = o.result.get("hit_rate")
        else:
            v = {
                "bounds": "cannot meet (bounds)",
                "rate": "too little rate (measured)",
            }.get(o.stage, "not replayed (costs more)")
            hit = None
        vals = [_d(_value(o, f"{m}_p{q}_s"), bound) for m, q in keys]
        if good:
            vals.append(_goodput_cell(res, o))
        lines.append(
            [
                c.label(),
                f"{c.usd_per_hour:,.2f}",
                *vals,
                "n/a" if hit is None else f"{100 * hit:.1f}%",
                v,
            ]
        )
    widths = [
        max(len(h), *(len(r[i]) for r in lines)) if lines else len(h) for i, h in enumerate(head)
    ]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    out = [fmt.format(*head), *(fmt.format(*r) for r in lines)]
    if len(rows) > len(shown):
        out.append(f"... {len(rows) - len(shown):,} more candidates in --json")
    n_mem = len(res.of_stage("memory"))
    if n_mem:
        out.append(f"{n_mem:,} engine set-ups do not fit in memory (in --json)")
    return "\n".join(out)


def _targets_json(res: SearchResult) -> dict[str, Any]:
    out: dict[str, Any] = {f"{m}_p{q}_s": v for (m, q), v in res.targets.limits.items()}
    g = res.targets.goodput
    if g is not None:
        out["goodput"] = {
            "limits_s": dict(g.limits),
            "min_share" if g.kind == "share" else "min_requests_per_s": g.minimum,
        }
    return out


def plan_json(
    res: SearchResult, workload: str, workload_argv: list[str], prices: str
) -> dict[str, Any]:
    """The ``--json`` document."""

    def one(o: Outcome) -> dict[str, Any]:
        d: dict[str, Any] = {"stage": o.stage, "reason": o.reason}
        c = o.candidate
        if c is not None:
            e = c.engine
            d.update(
                label=c.label(), gpu=e.gpu, tp=e.tp, replicas=c.replicas, num_gpus=c.num_gpus,
                kv_dtype=c.kv_dtype_name, weight_dtype=c.weight_dtype_name,
                host_memory_gib=c.host_bytes / (1 << 30), router=c.router, eviction=c.eviction,
                usd_per_gpu_hour=c.usd_per_gpu_hour, usd_per_hour=c.usd_per_hour,
                usd_per_million_tokens=_per_million(o),
                bounds={k: v for k, v in c.bound.items() if k != "misses"},
                replay_command=replay_command(workload_argv, o),
            )  # fmt: skip
        elif o.engine is not None:
            e = o.engine
            d.update(gpu=e.gpu, tp=e.tp, kv_dtype=e.kv_dtype, weight_dtype=e.weight_dtype)
        if o.result:
            d["replay"] = dict(o.result)
        return d

    chosen = res.chosen
    near = closest(res) if chosen is None else None
    return {
        "workload": workload,
        "targets": _targets_json(res),
        "prices": prices,
        "best_possible_hit_rate": res.facts.best_hit_rate,
        "candidates_considered": res.considered,
        "chosen": one(chosen) if chosen is not None else None,
        "closest": one(near) if near is not None else None,
        "sentence": sentence(res, replay_command(workload_argv, chosen) if chosen else None),
        "candidates": [one(o) for o in ranked(res)],
        "memory": [one(o) for o in res.of_stage("memory")],
    }
