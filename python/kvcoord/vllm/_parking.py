"""Deferred frees (vLLM's ``pop_blocks_for_free``) on kvcoord's core.

vLLM's scheduler, while a step is in flight, takes a finished or preempted
request's blocks out of the manager and frees them itself later, through
``block_pool.free_blocks``, once the step is done. kvcoord keeps those
blocks where they are: the request stays in the core, *parked* (its
references unchanged), and is freed by the core, tail first, when the
scheduler frees exactly those ids. If vLLM brings the same request id back
before that (a preempted request re-admitted), its new blocks live in the
core under a fresh id (``RequestRegistry.core_ids``), so the two never mix.
No reference count is touched and no Python work is done per block.
"""

from __future__ import annotations

from typing import Any

from kvcoord.vllm._requests import RequestRegistry

__all__ = ["Parking"]


class Parking:
    """The parked core requests of one manager, by the ids they hold."""

    __slots__ = ("_by_ids", "_core", "_owner", "_registry", "_seq")

    def __init__(self, core: Any, registry: RequestRegistry) -> None:
        self._core = core
        self._registry = registry
        self._by_ids: dict[tuple[int, ...], list[str]] = {}
        self._owner: dict[str, str] = {}  # parked core id -> vLLM request id
        self._seq = 0

    def __len__(self) -> int:
        """Parked core requests (they hold blocks but are no vLLM request's)."""
        return len(self._owner)

    def park(self, request_id: str, ids: list[int]) -> None:
        """Keep the blocks of vLLM request ``request_id`` (now ``ids``) until
        :meth:`free` of the same ids; the id's next blocks get a fresh core id."""
        core_id = self._registry.core_id(request_id)
        self._by_ids.setdefault(tuple(sorted(ids)), []).append(core_id)
        self._owner[core_id] = request_id
        self._seq += 1
        self._registry.core_ids[request_id] = f"{request_id}\x00kvcoord-{self._seq}"

    def free(self, ids: list[int]) -> bool:
        """Free (tail first) the parked request holding exactly ``ids``;
        False when no parked request does."""
        key = tuple(sorted(ids))
        parked = self._by_ids.get(key)
        if not parked:
            return False
        core_id = parked.pop(0)
        if not parked:
            del self._by_ids[key]
        self._core.free(core_id)
        request_id = self._owner.pop(core_id)
        # The vLLM id needs its own core id no longer once nothing of it is
        # parked and it holds nothing under the fresh one.
        fresh = self._registry.core_ids.get(request_id)
        if (
            fresh is not None
            and request_id not in self._owner.values()
            and request_id not in self._registry.ids()
        ):
            del self._registry.core_ids[request_id]
        return True
