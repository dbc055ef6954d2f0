"""vLLM 0.33.0's KV-cache events (``enable_kv_cache_events=True``) from
kvcoord's core events.

kvcoord's pool records what changed in its prefix index, in order: blocks
stored by one caching call (which blocks, at which positions of the
request, their digests and the digest before the range), a block that lost
its key, the whole index cleared. The manager drains those right after each
core call that caches blocks for a vLLM request, while that request is at
hand, and :class:`EventLog` turns them into vLLM's own
``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` objects:

* hashes are the core's digests, which are vLLM's (the adapter keys the
  cache by the request's ``block_hashes``), in vLLM's external form
  (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``: the digest's last 8 bytes as a
  big-endian integer, else the bytes);
* what the pool cannot know comes from the vLLM request: token ids of the
  range, LoRA id and name, session id, per-block extra keys (made by vLLM's
  own key functions, so LoRA, multimodal, cache salt, prompt embeddings and
  lookahead windows match) and the lookahead tokens of each block;
* ``kv_cache_spec_kind`` / ``kv_cache_spec_sliding_window`` are annotated
  at ``take_events`` from the manager's per-group metadata, as vLLM does.

Only runs when events are on: the scheduler's path is unchanged otherwise.
Events are made one Python object per event, with per-block lists because
vLLM's event types hold lists.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

from kvcoord.vllm.serve._pool_view import PoolView

__all__ = ["EventLog", "EventPoolView", "event_metadata", "pool_view"]

_GPU = "GPU"  # vLLM's medium of its device pool


def _vllm(name: str) -> Any:
    return importlib.import_module(name)


def event_metadata(kv_cache_config: Any) -> tuple[tuple[str, int | None], ...]:
    """vLLM's ``kv_cache_event_metadata``: (spec kind, sliding window) per group."""
    interface = _vllm("vllm.v1.kv_cache_interface")
    return tuple(
        (
            interface.get_kv_cache_spec_kind(g.kv_cache_spec).value,
            interface.get_kv_cache_spec_sliding_window(g.kv_cache_spec),
        )
        for g in kv_cache_config.kv_cache_groups
    )


def pool_view(pool: Any, core: Any, args: Mapping[str, Any]) -> tuple[PoolView, EventLog | None]:
    """A manager's ``block_pool`` view and, when its constructor arguments
    (``args``) enable KV-cache events, the log that fills its event queue."""
    if not args.get("enable_kv_cache_events", False):
        return PoolView(pool, core), None
    view = EventPoolView(pool, core)
    ahead = int(args.get("num_hash_lookahead_tokens", 0))
    return view, EventLog(core, view, args["kv_cache_config"], ahead)


class EventPoolView(PoolView):
    """A manager's pool view with vLLM's ``kv_event_queue`` (the converted
    events not yet taken) and a ``take_events`` that drains the core first."""

    __slots__ = ("_log", "kv_event_queue")

    def __init__(self, pool: Any, core: Any) -> None:
        super().__init__(pool, core)
        self.kv_event_queue: list[Any] = []
        self._log: EventLog | None = None

    def _cached_by(self, request: Any) -> None:
        # Stored events of a caching call through the pool take what only
        # the vLLM request knows (tokens, LoRA, extra keys) from it.
        if self._log is not None:
            self._log.drain(request)

    def take_events(self) -> list[Any]:
        """vLLM's ``BlockPool.take_events``: every event so far, oldest first."""
        if self._log is not None:
            self._log.drain(None)
        events = self.kv_event_queue
        self.kv_event_queue = []
        return events


class EventLog:
    """Converts a manager's core events into vLLM's event objects, queued on
    its :class:`EventPoolView`."""

    __slots__ = (
        "_core",
        "_kv",
        "_utils",
        "lookahead",
        "medium",
        "metadata",
        "spec_block_sizes",
        "view",
    )

    def __init__(
        self,
        core: Any,
        view: EventPoolView,
        kv_cache_config: Any,
        num_hash_lookahead_tokens: int,
        medium: str | None = None,
    ) -> None:
        # ``core``: whatever records the events (a manager's CoordinatorCore,
        # or a standalone pool, whose ``kv_cache_config`` is None: no group
        # metadata). ``medium``, when given, replaces the core's medium.
        self._core = core
        self.view = view
        view._log = self
        self.lookahead = int(num_hash_lookahead_tokens)
        self.metadata = () if kv_cache_config is None else event_metadata(kv_cache_config)
        # Each group's spec block size: vLLM reports prefix-hit blocks at it,
        # not at the block size its managers use (scaled under DCP).
        self.spec_block_sizes: tuple[int, ...] = (
            ()
            if kv_cache_config is None
            else tuple(int(g.kv_cache_spec.block_size) for g in kv_cache_config.kv_cache_groups)
        )
        self.medium = medium
        self._kv = _vllm("vllm.distributed.kv_events")
        self._utils = _vllm("vllm.v1.core.kv_cache_utils")

    # ---- conversion ----------------------------------------------------------

    @staticmethod
    def _int_hashes() -> bool:
        return bool(_vllm("vllm.envs").VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)

    def drain(self, request: Any) -> None:
        """Convert the core's pending events; ``request`` is the vLLM request
        whose call cached the stored blocks (None: no caching call)."""
        pending = self._core.take_events()
        if not pending:
            return
        kv = self._kv
        as_int = self._int_hashes()
        queue = self.view.kv_event_queue
        for event in pending:
            kind = type(event).__name__
            if kind == "BlockStored":
                queue.append(self._stored(event, request, as_int))
            elif kind == "BlockRemoved":
                h = event.block_hash if as_int else event.block_hash_digest
                queue.append(
                    kv.BlockRemoved(
                        block_hashes=[h],
                        medium=self.medium or event.medium,
                        group_idx=event.group_idx,
                    )
                )
            else:
                queue.append(kv.AllBlocksCleared())

    def _stored(self, event: Any, request: Any, as_int: bool) -> Any:
        bs = int(event.block_size)
        first = int(event.first_block)
        positions: list[int] = event.positions.tolist()
        if as_int:
            hashes: list[Any] = event.block_hashes.tolist()
            parent: Any = event.parent_block_hash
        else:
            hashes = event.block_hash_digests
            parent = event.parent_block_digest
        if request is None:  # a caching call without a request: the core's record
            return self._kv.BlockStored(
                block_hashes=hashes,
                parent_block_hash=parent,
                token_ids=event.token_ids.tolist(),
                block_size=bs,
                lora_id=None,
                medium=self.medium or event.medium,
                lora_name=event.lora_name,
                extra_keys=event.extra_keys,
                group_idx=int(event.group_idx),
            )
        start, end = first * bs, (first + int(event.num_blocks)) * bs
        where = (self.medium or event.medium, int(event.group_idx))
        return self._build(request, hashes, parent, positions, (start, end), bs, where)

    def _build(
        self,
        request: Any,
        hashes: list[Any],
        parent: Any,
        positions: Sequence[int],
        span: tuple[int, int],
        block_size: int,
        where: tuple[str, int],
    ) -> Any:
        """vLLM's ``BlockStored`` of ``request`` for the blocks at ``positions``
        (``span``: the range of its tokens the call covered), in ``where``
        (medium, group)."""
        lora = request.lora_request
        tokens = request.all_token_ids
        ahead = self.lookahead
        # Passed only with hash lookahead: vLLM 0.32's BlockStored has no
        # lookahead_token_ids (nor 0.32 any lookahead); 0.33's defaults to None.
        lookahead: dict[str, Any] = (
            {
                "lookahead_token_ids": [
                    tokens[(p + 1) * block_size : (p + 1) * block_size + ahead] for p in positions
                ]
            }
            if ahead
            else {}
        )
        return self._kv.BlockStored(
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=tokens[span[0] : span[1]],
            block_size=block_size,
            lora_id=lora.adapter_id if lora else None,
            medium=where[0],
            lora_name=lora.name if lora else None,
            extra_keys=self._extra_keys(request, positions, block_size),
            group_idx=where[1],
            session_id=getattr(request, "session_id", None),
            **lookahead,
        )

    def _extra_keys(
        self, request: Any, positions: Sequence[int], block_size: int
    ) -> list[Any] | None:
        """Per stored block, its untagged extra keys (vLLM's key functions)."""
        if not positions:
            return None
        if not (
            request.lora_request
            or request.mm_features
            or request.cache_salt
            or getattr(request, "prompt_embeds", None) is not None
        ):
            return [None] * len(positions)
        utils = self._utils
        ahead = self.lookahead
        keys = []
        mm_idx = 0
        for p in positions:
            lo, hi = p * block_size, (p + 1) * block_size
            if ahead:
                k, mm_idx = utils.generate_lookahead_block_hash_extra_keys(
                    request, lo, hi, hi + ahead, mm_idx
                )
            else:
                k, mm_idx = utils.generate_block_hash_extra_keys(request, lo, hi, mm_idx)
            keys.append(k)
        out: list[Any] | None = utils.to_event_extra_keys(keys)
        return out

    # ---- what the manager calls ---------------------------------------------

    def cached_hits(self, request: Any, per_group: Sequence[Any], hash_block_size: int) -> None:
        """vLLM's events for a prefix hit of a request reporting in ``"full"``
        mode (``kv_cache_report_mode``): the reused blocks of each group as
        stored, from block 0. As vLLM's coordinator does, a group's count of
        hit blocks is reported at the group's spec block size: under decode
        context parallelism, whose blocks span ``dcp_world_size`` times
        that, the events cover the first blocks' worth of spec-sized spans
        (vLLM's own accounting, kept as it is)."""
        if getattr(request, "kv_cache_report_mode", "incremental") != "full":
            return
        sizes = self.spec_block_sizes
        for group, (ids, bs) in enumerate(zip(per_group, sizes, strict=True)):
            self.prefix_stored(request, group, len(ids), bs, hash_block_size)

    def prefix_stored(
        self, request: Any, group: int, num_blocks: int, block_size: int, hash_block_size: int
    ) -> None:
        """Queue vLLM's ``BlockStored`` for the first ``num_blocks`` blocks of
        ``request`` in ``group``, already cached (reused by a hit; vLLM's
        ``emit_cached_block_events``): from block 0, no parent, nothing in
        the pool changes. Earlier core events are queued first."""
        if not num_blocks:
            return
        if block_size % hash_block_size:
            # vLLM's resolve_block_hashes asserts the same before queueing.
            raise AssertionError(
                f"block size {block_size} is not a multiple of the hash block size "
                f"{hash_block_size}: vLLM 0.33.0 cannot report these blocks as events"
            )
        self.drain(None)
        scale = block_size // hash_block_size
        digests = request.block_hashes
        mine = [digests[(i + 1) * scale - 1] for i in range(num_blocks)]
        hashes = [int.from_bytes(d[-8:], "big") for d in mine] if self._int_hashes() else mine
        where = (self.medium or _GPU, group)
        span = (0, num_blocks * block_size)
        self.view.kv_event_queue.append(
            self._build(request, hashes, None, range(num_blocks), span, block_size, where)
        )

    def take(self) -> list[Any]:
        """vLLM's ``KVCacheManager.take_events``: drain, then annotate each
        stored event with its group's spec kind and sliding window."""
        events = self.view.take_events()
        metadata = self.metadata
        stored = self._kv.BlockStored
        for event in events:
            if not isinstance(event, stored) or event.group_idx is None:
                continue
            if not 0 <= event.group_idx < len(metadata):
                _vllm("vllm.v1.core.kv_cache_manager").logger.warning(
                    "Group index `%s` not in KV cache metadata", event.group_idx
                )
                continue
            event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window = metadata[event.group_idx]
        return events
