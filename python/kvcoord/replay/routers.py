"""Request routers in front of a simulated cluster of engines (:mod:`.cluster`).

A router sees each request once, at its arrival, and picks the engine that
serves it. It knows only what a real router in front of vLLM-style engines
knows:

* what it sent where, and which requests have finished (its own count of
  each engine's outstanding work);
* for :class:`PrefixAwareRouter`, the KV events each engine publishes
  (``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``, the same
  objects ``KVCacheManager.take_events()`` returns): its index of which
  engine caches which block (:class:`PrefixIndex`, the core's
  ``RouterIndex``: per engine, how many of its blocks hold each key, and
  which engines hold each key) is rebuilt from those events alone, never
  read from an engine's pool.

Routers (``--router NAME[:key=value]``):

``round-robin``
    Request ``i`` goes to engine ``i mod N``.
``least-loaded``
    The engine with the fewest outstanding requests (routed, not finished);
    ties go to the fewest outstanding tokens, then the lowest index.
``prefix-aware[:balance=W]``
    For each engine, the prompt tokens it would have to prefill (the prompt
    minus the longest cached prefix the index says it holds) plus ``W``
    times its outstanding tokens (prompt + output tokens of requests routed
    to it and not finished: the KV it holds or will hold). The cheapest
    engine wins; ties go to the lower load, then the lowest index. ``W = 1``
    (the default) prices one token of cache hit like one token of queued
    work, the same trade as a cost that adds prefill blocks to active
    blocks; ``W = 0`` is pure cache affinity, a large ``W`` approaches
    least-loaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from kvcoord._core import PrefixIndex, Request
from kvcoord._suggest import did_you_mean, unknown_name
from kvcoord.replay.workloads import WorkloadRequest

__all__ = [
    "ROUTERS",
    "LeastLoadedRouter",
    "PrefixAwareRouter",
    "PrefixIndex",
    "RoundRobinRouter",
    "Router",
    "block_keys",
    "make_router",
]


def block_keys(request: Request) -> list[int]:
    """The request's block hashes in the events' integer form (the digest's
    last 8 bytes, big-endian: vLLM's default external block hash)."""
    digests = request.block_hashes_array()
    if digests.shape[0] == 0:
        return []
    tail = np.ascontiguousarray(digests[:, -8:])
    keys: list[int] = tail.view(">u8").ravel().tolist()
    return keys


class Router:
    """Base class: the outstanding-work bookkeeping every router keeps.

    The cluster calls :meth:`route` at each arrival, then :meth:`routed`
    with the chosen engine, :meth:`finished` when a request completes, and
    (when :attr:`uses_events`) :meth:`observe` with each engine's new KV
    events before every routing decision.
    """

    #: The name ``--router`` takes.
    name: ClassVar[str]
    #: Whether the router reads the engines' KV events (and needs each
    #: request's block hashes).
    uses_events: ClassVar[bool] = False

    def __init__(self, num_engines: int) -> None:
        if num_engines < 1:
            raise ValueError(f"a cluster needs at least one engine, got {num_engines}")
        self.num_engines = num_engines
        #: Per engine: requests routed and not finished.
        self.outstanding = [0] * num_engines
        #: Per engine: prompt + output tokens of those requests.
        self.outstanding_tokens = [0] * num_engines

    def describe(self) -> str:
        return self.name

    def route(self, request: WorkloadRequest, block_hashes: Sequence[int] | None) -> int:
        """The engine for ``request`` (``block_hashes``: its prompt's block
        hashes, :func:`block_keys`, when :attr:`uses_events`, else None)."""
        raise NotImplementedError

    def routed(self, engine: int, request: WorkloadRequest) -> None:
        self.outstanding[engine] += 1
        self.outstanding_tokens[engine] += request.prompt_len + request.output_len

    def finished(self, engine: int, request: WorkloadRequest) -> None:
        self.outstanding[engine] -= 1
        self.outstanding_tokens[engine] -= request.prompt_len + request.output_len

    def observe(self, engine: int, events: Sequence[Any]) -> None:
        """The engine's KV events since the last call (ignored by default)."""

    def observe_manager(self, engine: int, manager: Any) -> None:
        """The KV events ``manager`` (engine ``engine``'s) recorded since the last
        call, drained from it: :meth:`observe` of its ``take_events()``."""
        self.observe(engine, manager.take_events())


class RoundRobinRouter(Router):
    name = "round-robin"

    def __init__(self, num_engines: int) -> None:
        super().__init__(num_engines)
        self._next = 0

    def route(self, request: WorkloadRequest, block_hashes: Sequence[int] | None) -> int:
        k = self._next
        self._next = (k + 1) % self.num_engines
        return k


class LeastLoadedRouter(Router):
    name = "least-loaded"

    def route(self, request: WorkloadRequest, block_hashes: Sequence[int] | None) -> int:
        n, t = self.outstanding, self.outstanding_tokens
        return min(range(self.num_engines), key=lambda k: (n[k], t[k], k))


class PrefixAwareRouter(Router):
    name = "prefix-aware"
    uses_events = True

    def __init__(
        self, num_engines: int, *, block_size: int, balance: float = 1.0, group_idx: int = 0
    ) -> None:
        super().__init__(num_engines)
        if not balance >= 0 or balance == float("inf"):
            raise ValueError(f"prefix-aware: balance must be a finite number >= 0, got {balance}")
        self.balance = balance
        self.block_size = block_size
        self.index = PrefixIndex(num_engines, group_idx)
        #: Prompt tokens the index promised as cached at routing time.
        self.predicted_hit_tokens = 0

    def describe(self) -> str:
        return f"{self.name}:balance={self.balance:g}"

    def observe(self, engine: int, events: Sequence[Any]) -> None:
        self.index.apply(engine, events)

    def observe_manager(self, engine: int, manager: Any) -> None:
        # the same events, straight from the engine's core into the index
        self.index.drain(engine, manager.coordinator.core)

    def route(self, request: WorkloadRequest, block_hashes: Sequence[int] | None) -> int:
        if block_hashes is None:
            raise ValueError("the prefix-aware router needs the request's block hashes")
        matched = self.index.matched_blocks(block_hashes)
        # like the engine's own lookup: the last prompt token is always recomputed
        cap = (request.prompt_len - 1) // self.block_size
        w, load, n = self.balance, self.outstanding_tokens, self.outstanding
        best_k, best_key = 0, None
        for k in range(self.num_engines):
            hit = min(matched[k], cap) * self.block_size
            key = (request.prompt_len - hit + w * load[k], n[k], k)
            if best_key is None or key < best_key:
                best_k, best_key = k, key
        self.predicted_hit_tokens += min(matched[best_k], cap) * self.block_size
        return best_k


#: Router names (``--router``).
ROUTERS: tuple[str, ...] = ("round-robin", "least-loaded", "prefix-aware")


def make_router(spec: str, num_engines: int, *, block_size: int, group_idx: int = 0) -> Router:
    """A router from ``NAME[:key=value,...]`` (the ``--router`` syntax).

    Raises:
        ValueError: unknown name or parameter, or a bad value.
    """
    name, _, params = spec.strip().partition(":")
    kv: dict[str, str] = {}
    for part in params.split(","):
        if not part.strip():
            continue
        key, eq, value = part.partition("=")
        if not eq:
            raise ValueError(f"router {spec!r}: expected key=value, got {part!r}")
        kv[key.strip()] = value.strip()
    if name == "prefix-aware":
        unknown = set(kv) - {"balance"}
        if unknown:
            odd = sorted(unknown)[0]
            raise ValueError(
                f"router {spec!r}: unknown parameter {odd!r}{did_you_mean(odd, ['balance'])}"
            )
        try:
            balance = float(kv.get("balance", "1"))
        except ValueError:
            raise ValueError(f"router {spec!r}: balance must be a number") from None
        return PrefixAwareRouter(
            num_engines, block_size=block_size, balance=balance, group_idx=group_idx
        )
    routers: dict[str, type[Router]] = {
        "round-robin": RoundRobinRouter,
        "least-loaded": LeastLoadedRouter,
    }
    if name not in routers:
        raise ValueError(unknown_name("router", name, ROUTERS))
    if kv:
        raise ValueError(f"router {spec!r}: {name} takes no parameters")
    return routers[name](num_engines)
