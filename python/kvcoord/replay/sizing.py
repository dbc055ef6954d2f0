"""The pool a workload needs for its best hit rate (``kvcoord replay --find-size``).

The best hit rate is the best-case one (:mod:`kvcoord.replay.bestcase`: an
unbounded cache), or, where the scheduler cannot reach it even with a pool
that never evicts (a prefix asked for again while still being computed is
computed twice), that pool's hit rate. The pool needed is the smallest that
reaches within 1% of it (:data:`NEAR_BEST`), found by a few replays: from
the pool replayed, doubling until one is near the best, then bisecting (in
log space) until the pool that is near the best and the largest that is not
are within :data:`RESOLUTION` of each other. The hit rate counts every
tier (GPU pool, host, disk), as ``total_hit_rate`` of the summary; the size
is that of the GPU pool, with the tiers as given.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kvcoord.replay.plan import GiB, Plan, min_blocks
from kvcoord.replay.report import summarize
from kvcoord.replay.scheduler import SimConfig, SimResult, simulate
from kvcoord.replay.workloads import Workload

__all__ = ["NEAR_BEST", "RESOLUTION", "SizePoint", "Sizing", "find_size", "sweep_sentences"]

#: "Near the best": a hit rate of at least this share of the best one.
NEAR_BEST = 0.99
#: The search stops when the bracketing pools differ by at most this share.
RESOLUTION = 0.05


@dataclass(frozen=True)
class SizePoint:
    """One replayed pool size."""

    num_blocks: int
    kv_bytes_per_gpu: float
    hit_rate: float
    evictions: int

    def to_json(self) -> dict[str, Any]:
        return {
            "num_blocks": self.num_blocks,
            "kv_memory_gib_per_gpu": self.kv_bytes_per_gpu / GiB,
            "hit_rate": self.hit_rate,
            "evictions": self.evictions,
        }


@dataclass
class Sizing:
    """The answer: the pool needed, the pool given, every pool replayed."""

    #: The best hit rate (see the module docstring) and the best-case one.
    best_hit_rate: float
    best_possible_hit_rate: float
    given: SizePoint
    #: The smallest pool replayed that is near the best; None: none was, up to ``max_blocks``.
    needed: SizePoint | None
    points: list[SizePoint] = field(default_factory=list)
    #: The largest pool the search may try (per engine).
    max_blocks: int = 0
    #: What the deployment leaves for the KV cache per GPU (the default pool), if known.
    room_bytes: float | None = None
    #: The GPUs in words ("each h100 at TP 1"), for the sentence.
    deployment: str = ""

    def sentence(self) -> str:
        """The answer as a sentence a user can act on (sizes to 3 figures: the
        search resolves them to 5%)."""
        best = f"{100 * self.best_hit_rate:.1f}%"
        given = _size(self.given.kv_bytes_per_gpu)
        reach = f"{100 * self.given.hit_rate:.1f}%"
        if self.needed is None:
            top = max(self.points, key=lambda p: p.num_blocks)
            return (
                f"Even {_size(top.kv_bytes_per_gpu)} of KV cache per GPU reaches only "
                f"{100 * top.hit_rate:.1f}% of this workload's prompt tokens (best {best}); "
                f"with {given} it reaches {reach}."
            )
        need = self.needed.kv_bytes_per_gpu
        text = (
            f"This workload needs {_size(need)} of KV cache per GPU for its best hit "
            f"rate ({best}); with {given} it reaches {reach}."
        )
        if self.room_bytes is not None and need > self.room_bytes * (1 + RESOLUTION):
            text += (
                f" That is more than the {_size(self.room_bytes)} {self.deployment} "
                "leaves for the KV cache: add GPUs (--tp) or a host tier (--host-memory)."
            )
        elif self.needed.num_blocks < self.given.num_blocks:
            text += f" {_size(self.given.kv_bytes_per_gpu - need)} of it is spare."
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "near_best": NEAR_BEST,
            "best_hit_rate": self.best_hit_rate,
            "best_possible_hit_rate": self.best_possible_hit_rate,
            "needed": None if self.needed is None else self.needed.to_json(),
            "given": self.given.to_json(),
            "replays": [p.to_json() for p in sorted(self.points, key=lambda p: p.num_blocks)],
            "sentence": self.sentence(),
        }


def _size(n: float) -> str:
    """Bytes to 3 significant figures, in GiB (MiB below 1 GiB)."""
    v, unit = (n / GiB, "GiB") if n >= GiB else (n / (1 << 20), "MiB")
    return f"{v:,.0f} {unit}" if v >= 100 else f"{v:.3g} {unit}"


def _hit_rate(res: SimResult, cfg: SimConfig, workload: Workload) -> float:
    rate: float = summarize(res, None, cfg, workload.name)["total_hit_rate"]
    return rate


def find_size(
    workload: Workload,
    cfg: SimConfig,
    plan: Plan,
    first: SimResult,
    *,
    max_blocks: int,
    room_bytes: float | None = None,
    progress: Callable[[SizePoint], None] | None = None,
    max_replays: int = 16,
) -> Sizing:
    """The smallest pool near the best hit rate, from ``first`` (the replay of
    ``cfg``, with its best case) and at most ``max_replays`` more replays of
    pools between the smallest that holds the longest request and
    ``max_blocks``; ``progress`` is called after each."""
    if first.best is None:
        raise ValueError("find_size needs the first replay's best case (SimConfig.track_best)")
    fp = plan.footprint

    def point(n: int, res: SimResult, c: SimConfig) -> SizePoint:
        return SizePoint(n, fp.memory_for_blocks(n), _hit_rate(res, c, workload), res.evictions)

    given = point(cfg.num_blocks, first, cfg)
    pts = {given.num_blocks: given}
    best_case = first.best.hit_rate
    ceiling = best_case
    floor = max(2, min_blocks(plan.layout, workload))
    top_blocks = max(max_blocks, cfg.num_blocks)
    for _ in range(max_replays + 1):
        n = _next_size(pts, NEAR_BEST * ceiling, floor, top_blocks)
        if n is None:
            top = pts[max(pts)]
            if top.evictions == 0 and top.hit_rate < NEAR_BEST * ceiling:
                ceiling = top.hit_rate  # a pool that never evicts: nothing more to gain
                continue
            break
        c = replace(cfg, num_blocks=n, track_best=False)
        p = point(n, simulate(workload, c), c)
        pts[n] = p
        if progress is not None:
            progress(p)
    meets = [p for n, p in sorted(pts.items()) if p.hit_rate >= NEAR_BEST * ceiling]
    return Sizing(
        best_hit_rate=ceiling,
        best_possible_hit_rate=best_case,
        given=given,
        needed=meets[0] if meets else None,
        points=list(pts.values()),
        max_blocks=top_blocks,
        room_bytes=room_bytes,
        deployment=f"each {plan.gpu.name} at TP {plan.tp}",
    )


def _next_size(pts: dict[int, SizePoint], target: float, floor: int, top: int) -> int | None:
    """The next pool to replay, or None when the answer is known (or out of range)."""
    meets = [n for n in sorted(pts) if pts[n].hit_rate >= target]
    if not meets:
        largest = max(pts)
        if largest >= top or pts[largest].evictions == 0:
            return None
        return min(2 * largest, top)
    hi = meets[0]
    below = [n for n in pts if n < hi]
    if not below:
        return None if hi <= floor else floor
    lo = max(below)
    if hi - lo <= 1 or hi <= lo * (1 + RESOLUTION):
        return None
    mid = round(math.sqrt(lo * hi))
    return min(max(mid, lo + 1), hi - 1)


def sweep_sentences(rows: list[dict[str, Any]]) -> list[str]:
    """One sentence per variant of a sweep: the smallest pool swept near its
    best hit rate (every tier), or that none was."""
    variants: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("kv_memory_gib_per_gpu") is not None:
            variants.setdefault(str(r.get("variant", r["layout"])), []).append(r)
    out = []
    for name, rs in variants.items():
        rs = sorted(rs, key=lambda r: float(r["kv_memory_gib_per_gpu"]))
        best = rs[0].get("best_possible_hit_rate")
        if best is None:
            continue
        top = rs[-1]
        if top["evictions"] == 0:  # a pool that never evicts: nothing more to gain
            best = min(best, top["total_hit_rate"])
        near = [r for r in rs if r["total_hit_rate"] >= NEAR_BEST * best]
        prefix = f"{name}: " if len(variants) > 1 else ""
        if near:
            r = near[0]
            out.append(
                f"{prefix}{_size(r['kv_memory_gib_per_gpu'] * GiB)} of KV cache per GPU is the "
                f"smallest pool swept near the best hit rate ({100 * best:.1f}%): it reaches "
                f"{100 * r['total_hit_rate']:.1f}%."
            )
        else:
            out.append(
                f"{prefix}no pool swept reaches the best hit rate ({100 * best:.1f}%): "
                f"{_size(top['kv_memory_gib_per_gpu'] * GiB)} per GPU reaches "
                f"{100 * top['total_hit_rate']:.1f}%; `kvcoord replay --find-size` finds "
                "the pool it needs."
            )
    return out
