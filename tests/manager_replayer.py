"""A reusable replayer for the `manager-*.jsonl.gz` conformance traces.

It drives any object with kvcoord's `KVCacheManager` surface through a
recorded vLLM 0.33.0 scheduler session and reports the first divergence with
the trace file, line number and both values. Used by the conformance tests
and usable from a debugger or a benchmark (`replay(path, check=False)`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kvcoord
from conformance import read_trace
from kvcoord.config import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroup,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)


class Divergence(AssertionError):
    """The manager answered differently from the recording."""


def spec_from_layout(group: dict[str, Any]) -> KVCacheSpec:
    kind, bs = group["type"], group["block_size"]
    if kind == "full_attention":
        return FullAttentionSpec(bs)
    if kind == "sliding_window":
        return SlidingWindowSpec(bs, group["sliding_window"])
    if kind == "chunked_local":
        return ChunkedLocalAttentionSpec(bs, group["attention_chunk_size"])
    if kind == "mamba":
        return MambaSpec(bs)
    raise ValueError(f"unknown group type {kind!r}")


def manager_for(header: dict[str, Any], **kwargs: Any) -> kvcoord.KVCacheManager:
    layout = header["layout"]
    config = KVCacheConfig(
        num_blocks=layout["num_blocks"],
        groups=tuple(
            KVCacheGroup(spec_from_layout(g), layer_names=(f"layer{i}",))
            for i, g in enumerate(layout["groups"])
        ),
    )
    return kvcoord.KVCacheManager(
        config,
        max_model_len=layout["max_model_len"],
        options=kvcoord.KVCacheManagerOptions(
            enable_caching=layout["enable_caching"],
            hash_block_size=header["hash_block_size"],
            **kwargs,
        ),
    )


@dataclass
class ReplayStats:
    ops: int = 0
    checks: int = 0
    hits: int = 0
    allocations: int = 0


def replay(
    path: Path,
    *,
    check: bool = True,
    after_op: Callable[[kvcoord.KVCacheManager], None] | None = None,
) -> ReplayStats:
    """Replay one trace; with `check`, raise `Divergence` at the first
    mismatch. `after_op` runs after every operation (e.g. invariant checks)."""
    header, ops = read_trace(path)
    manager = manager_for(header)
    hash_block_size = header["hash_block_size"]
    requests: dict[str, kvcoord.Request] = {}
    last_hit: dict[str, kvcoord.KVCacheBlocks] = {}
    stats = ReplayStats()

    def expect(where: str, got: object, want: object) -> None:
        if check and got != want:
            raise Divergence(f"{where}: got {got!r}, recorded {want!r}")

    for lineno, op in ops:
        stats.ops += 1
        kind = op["op"]
        where = f"{path.name}:{lineno} {kind} {op.get('req', '')}"
        if kind == "add_request":
            requests[op["req"]] = kvcoord.Request(
                op["req"],
                op["prompt"],
                hash_block_size=hash_block_size,
                cache_salt=op.get("cache_salt"),
            )
        elif kind == "get_computed_blocks":
            blocks, num_tokens = manager.get_computed_blocks(requests[op["req"]])
            last_hit[op["req"]] = blocks
            stats.hits += num_tokens
            expect(where, [list(g) for g in blocks.get_block_ids()], op["expect"]["blocks"])
            expect(where, num_tokens, op["expect"]["num_computed_tokens"])
        elif kind == "allocate_slots":
            req = requests[op["req"]]
            new = manager.allocate_slots(
                req,
                op["num_new_tokens"],
                num_new_computed_tokens=op["num_new_computed_tokens"],
                new_computed_blocks=last_hit.pop(op["req"], None) if op["use_computed"] else None,
            )
            stats.allocations += 1
            got = None if new is None else [list(g) for g in new.get_block_ids()]
            expect(where, got, op["expect"])
        elif kind == "advance":
            requests[op["req"]].num_computed_tokens += op["n"]
        elif kind == "append_token":
            requests[op["req"]].append_output_token_ids(op["token"])
        elif kind == "preempt":
            manager.free(requests[op["req"]])
            requests[op["req"]].num_computed_tokens = 0
        elif kind == "finish":
            manager.free(requests.pop(op["req"]))
        elif kind == "check":
            stats.checks += 1
            expect(where, manager.block_pool.num_free_blocks, op["num_free_blocks"])
            for rid, groups in op["block_ids"].items():
                expect(f"{where} [{rid}]", [list(g) for g in manager.get_block_ids(rid)], groups)
        else:
            raise Divergence(f"{where}: unknown op")
        if after_op is not None:
            after_op(manager)
    return stats
