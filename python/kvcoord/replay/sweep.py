"""The variants of ``kvcoord sweep``: named axes, combined into variants.

A sweep replays every *variant* at every pool size. Variants come from a
list of :class:`Axis` (models, layouts, host tiers, ...): each axis is a name
and its values, each value a label (shown in the variant's name; empty for a
value that is not worth naming, such as "no host tier") and the options it
sets. The variants are the cartesian product of the axes, in axis order.

An axis value sets options for two consumers:

* ``plan``: keyword arguments of :func:`kvcoord.replay.plan.make_plan`
  (``model``, ``layout``, ``host_memory``, ``disk_memory``, ...);
* ``run``: overrides for the replay itself, applied by whoever runs a point
  (for :class:`~kvcoord.replay.scheduler.SimConfig`, its field names).

Two axes may not set the same option (checked when the variants are built),
so a variant's options never depend on axis order. Adding an axis is adding
one function that returns an :class:`Axis` and passing it in the list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import Any

__all__ = [
    "Axis",
    "AxisValue",
    "SweepError",
    "Variant",
    "disk_axis",
    "host_axis",
    "layout_axis",
    "model_axis",
    "variants",
]

_GiB = float(1 << 30)


class SweepError(ValueError):
    """The axes cannot be combined (an empty axis, two axes setting one option)."""


@dataclass(frozen=True)
class AxisValue:
    """One value of an axis: its label and the options it sets."""

    label: str
    plan: Mapping[str, Any] = field(default_factory=dict)
    run: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Axis:
    """A named list of values; a sweep replays each."""

    name: str
    values: tuple[AxisValue, ...]


@dataclass(frozen=True)
class Variant:
    """One combination of axis values."""

    #: The non-empty labels joined by " + " (the line name in the table and plots).
    name: str
    #: Axis name -> the label of this variant's value on it.
    labels: Mapping[str, str]
    plan: Mapping[str, Any]
    run: Mapping[str, Any]


def variants(axes: Sequence[Axis]) -> list[Variant]:
    """Every combination of the axes' values (the first axis varies slowest)."""
    for ax in axes:
        if not ax.values:
            raise SweepError(f"sweep axis {ax.name!r} has no values")
    names = [ax.name for ax in axes]
    if len(set(names)) != len(names):
        raise SweepError(f"sweep axes must have distinct names, got {', '.join(names)}")
    owner: dict[tuple[str, str], str] = {}
    for ax in axes:
        for kind, keys in (("plan", _keys(ax, "plan")), ("run", _keys(ax, "run"))):
            for k in keys:
                prev = owner.setdefault((kind, k), ax.name)
                if prev != ax.name:
                    raise SweepError(f"sweep axes {prev!r} and {ax.name!r} both set {kind} {k!r}")
    for ax in axes:
        given = [v.label for v in ax.values]
        twice = sorted({x for x in given if given.count(x) > 1})
        if twice:
            raise SweepError(
                f"sweep axis {ax.name!r} has two values labelled {twice[0]!r}: "
                "their rows could not be told apart"
            )
    out = []
    for combo in product(*(ax.values for ax in axes)):
        plan: dict[str, Any] = {}
        run: dict[str, Any] = {}
        for v in combo:
            plan.update(v.plan)
            run.update(v.run)
        labels = {ax.name: v.label for ax, v in zip(axes, combo, strict=True)}
        name = " + ".join(v.label for v in combo if v.label) or "default"
        out.append(Variant(name, labels, plan, run))
    return out


def _keys(ax: Axis, kind: str) -> set[str]:
    return {k for v in ax.values for k in getattr(v, kind)}


# --------------------------------------------------------------------------- the planner's axes


def model_axis(models: Sequence[str | None], default_name: str) -> Axis:
    """Models by preset name (None: the default model, labelled ``default_name``)."""
    return Axis("model", tuple(AxisValue(m or default_name, {"model": m}) for m in models))


def layout_axis(layouts: Sequence[str | None]) -> Axis:
    """Cache layouts (a preset or a file; None: the model's own, unlabelled)."""
    return Axis("layout", tuple(AxisValue(_layout_label(x), {"layout": x}) for x in layouts))


def host_axis(sizes: Sequence[float]) -> Axis:
    """Host-memory tiers in bytes per replica (0: none, unlabelled)."""
    return Axis(
        "host_memory",
        tuple(AxisValue(f"host {_gib(s)}" if s else "", {"host_memory": s or None}) for s in sizes),
    )


def disk_axis(sizes: Sequence[float]) -> Axis:
    """Disk tiers in bytes per replica (0: none, unlabelled)."""
    return Axis(
        "disk_memory",
        tuple(AxisValue(f"disk {_gib(s)}" if s else "", {"disk_memory": s or None}) for s in sizes),
    )


def _layout_label(name: str | None) -> str:
    if name is None:
        return ""
    from pathlib import PurePath

    return PurePath(name).stem if name.endswith((".json", ".toml")) else name


def _gib(v: float) -> str:
    return f"{v / _GiB:,.4g} GiB" if v < 1024 * _GiB else f"{v / _GiB / 1024:,.4g} TiB"
