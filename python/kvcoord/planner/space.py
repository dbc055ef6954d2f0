"""The search space of ``kvcoord plan``: candidates, their cost, their
``kvcoord replay`` flags, and the memory stage (does the model fit?)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from kvcoord.replay.plan import GiB

__all__ = ["Candidate", "Engine", "candidates_of", "format_size_flag"]


def format_size_flag(n: float) -> str:
    """Bytes as a ``--host-memory`` value that reads back exactly (``256GiB``)."""
    if n >= GiB and n % GiB == 0:
        return f"{int(n // GiB)}GiB"
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{int(n // (1 << 20))}MiB"
    return f"{int(n)}B"


@dataclass(frozen=True)
class Engine:
    """One engine's hardware and dtypes: what decides memory and step time.
    ``kv_dtype`` and ``weight_dtype`` are as given (None: the model's)."""

    gpu: str
    tp: int
    kv_dtype: str | None
    weight_dtype: str | None

    def plan_options(self) -> dict[str, Any]:
        """The :func:`kvcoord._cli_setup._plan` keywords of this engine."""
        return {
            "gpu": self.gpu,
            "tp": self.tp,
            "kv_dtype": self.kv_dtype,
            "weight_dtype": self.weight_dtype,
            "host_memory": None,
        }


@dataclass(frozen=True)
class Candidate:
    """One deployment: ``replicas`` engines behind ``router``, each with a host tier
    of ``host_bytes`` (0: none) and the ``eviction`` policy."""

    engine: Engine
    replicas: int
    host_bytes: float
    router: str
    eviction: str
    usd_per_gpu_hour: float
    #: The dtypes the model resolves them to (for the table: "bf16", not "default").
    kv_dtype_name: str = ""
    weight_dtype_name: str = ""
    #: Position in the enumeration: the tie-break after cost and bounds.
    order: int = 0
    bound: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def num_gpus(self) -> int:
        return self.engine.tp * self.replicas

    @property
    def usd_per_hour(self) -> float:
        return self.usd_per_gpu_hour * self.num_gpus

    def plan_options(self) -> dict[str, Any]:
        return {**self.engine.plan_options(), "host_memory": self.host_bytes or None}

    def label(self) -> str:
        """``3x h100 TP4 (12 GPUs), KV fp8, weights bf16, host 256 GiB, prefix-aware, lru``."""
        e = self.engine
        plural = "s" if self.num_gpus > 1 else ""
        parts = [
            f"{self.replicas}x {e.gpu} TP{e.tp} ({self.num_gpus} GPU{plural})",
            f"KV {self.kv_dtype_name}",
            f"weights {self.weight_dtype_name}",
        ]
        if self.host_bytes:
            parts.append(f"host {self.host_bytes / GiB:,.0f} GiB")
        if self.replicas > 1:
            parts.append(self.router)
        parts.append(self.eviction)
        return ", ".join(parts)

    def replay_flags(self) -> list[str]:
        """The ``kvcoord replay`` flags of this deployment (the workload's are the caller's)."""
        e = self.engine
        out = ["--gpu", e.gpu, "--tp", str(e.tp)]
        if self.replicas > 1:
            out += ["--instances", str(self.replicas), "--router", self.router]
        if self.eviction != "lru":
            out += ["--policy", self.eviction]
        if e.kv_dtype is not None:
            out += ["--kv-dtype", e.kv_dtype]
        if e.weight_dtype is not None:
            out += ["--weight-dtype", e.weight_dtype]
        if self.host_bytes:
            out += ["--host-memory", format_size_flag(self.host_bytes)]
        return out


def candidates_of(
    engine: Engine,
    replicas: list[int],
    hosts: list[float],
    routers: list[str],
    evictions: list[str],
    usd_per_gpu_hour: float,
    names: tuple[str, str],
    start: int,
) -> list[Candidate]:
    """Every candidate on ``engine``; one router with a single replica (it routes nothing)."""
    out: list[Candidate] = []
    for r, host, router, ev in itertools.product(replicas, hosts, routers, evictions):
        if r == 1 and router != routers[0]:
            continue
        out.append(
            Candidate(
                engine, r, host, router, ev, usd_per_gpu_hour, names[0], names[1], start + len(out)
            )
        )
    return out
