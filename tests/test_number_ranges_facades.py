"""Every integer parameter of the Python facades keeps its range (the other
half of ``test_number_ranges.py``, whose boundary check this reuses).

The parameters are found by introspection: every function, method and
dataclass of ``kvcoord.__all__`` defined in Python whose signature has an
``int`` parameter. The table gives each one's kind and a call; the test
checks it covers them all."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvcoord
from kvcoord import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroup,
    KVCacheManager,
    MambaSpec,
    Request,
    SlidingWindowSpec,
)
from snapshot import manager_state
from test_number_ranges import RANGES, as_numpy, boundaries

#: Results the core fills (never an argument crossing into it).
OUTPUTS = {"EvictionRecord", "PrefixCacheStats", "ResidencySnapshot"}
#: Abstract: its subclasses' own methods are called.
NOT_CALLED = {"KVCacheCoordinator.find_longest_cache_hit": "abstract"}


def facade_parameters() -> set[tuple[str, str]]:
    """``(qualname, parameter)`` of every ``int`` parameter of the facades."""
    found = set()
    for name in kvcoord.__all__:
        obj = getattr(kvcoord, name)
        if name in OUTPUTS or getattr(obj, "__module__", "").startswith("kvcoord._core"):
            continue
        members = [(name, obj)] if inspect.isfunction(obj) else []
        if inspect.isclass(obj):
            for m, f in vars(obj).items():
                f = getattr(f, "__func__", getattr(f, "fset", f))
                if inspect.isfunction(f) and (
                    not m.startswith("_") or m in ("__init__", "__call__")
                ):
                    members.append((f"{name}.{m}", f))
        for qualname, f in members:
            for p in inspect.signature(f).parameters.values():
                if str(p.annotation).removesuffix(" | None") == "int":
                    found.add((qualname, p.name))
    return found


B = 4
World = tuple[Callable[[str, object], object], Callable[[], object]]


def config(*specs: Any, retention: int | None = None) -> KVCacheConfig:
    groups = tuple(KVCacheGroup(s, (f"l{i}",)) for i, s in enumerate(specs))
    return KVCacheConfig(64, groups, retention)


def manager_world() -> World:
    mgr = KVCacheManager(config(FullAttentionSpec(B)), max_model_len=1024)
    req = Request("r", list(range(10)), hash_block_size=B)
    assert mgr.allocate_slots(req, 10) is not None
    defaults: dict[str, dict[str, object]] = {
        "cache_blocks": {"request": req, "num_computed_tokens": 8},
        "set_request_priority": {"request": req, "priority": 1, "num_tokens": 8},
    }

    def call(name: str, kw: object) -> object:
        method = mgr.allocate_slots if name == "__call__" else getattr(mgr, name)
        args = {"request": req, "num_new_tokens": 1} if name == "__call__" else {}
        return method(**{**args, **defaults.get(name, {}), **dict(kw)})  # type: ignore[call-overload]

    return call, lambda: manager_state(mgr, [req])


def coordinator_world(kind: str) -> Callable[[], World]:
    def world() -> World:
        two = kind == "Hybrid"
        cfg = config(FullAttentionSpec(B), *([SlidingWindowSpec(B, 8)] if two else []))
        name = (
            "KVCacheCoordinatorNoPrefixCache"
            if kind == "NoPrefixCache"
            else f"{kind}KVCacheCoordinator"
        )
        coord = getattr(kvcoord, name)(cfg, max_model_len=1024)
        req = Request("r", list(range(10)), hash_block_size=B)

        def call(name: str, kw: object) -> object:
            return getattr(coord, name)(req, **dict(kw))  # type: ignore[call-overload]

        return call, lambda: (coord.core.num_requests, coord.block_pool.num_free_blocks)

    return world


def made(make: Callable[..., object], **defaults: object) -> Callable[[], World]:
    """A constructor or function: its only state is what it returns."""

    def world() -> World:
        return lambda _name, kw: make(**{**defaults, **dict(kw)}), lambda: None  # type: ignore[call-overload]

    return world


def coordinator_args(**extra: object) -> dict[str, object]:
    return {"config": config(FullAttentionSpec(B)), "max_model_len": 1024, **extra}


#: The token counts of a Mamba chunk rule.
CHUNK_COUNTS = [
    "num_new_tokens",
    "start",
    "num_tokens",
    "num_prompt_tokens",
    "shared_prefix_boundary",
    "max_chunk_tokens",
]
chunk_args = {
    "num_new_tokens": 8,
    "start": 0,
    "num_tokens": 16,
    "num_prompt_tokens": 16,
    "block_size": B,
}
mamba = MambaSpec(B, mamba_cache_mode="align")
rule = kvcoord.MambaChunkRule(mamba, B)

#: ``(qualname, parameter) -> kind``; the calls are ``WORLDS[qualname]``.
KINDS: dict[tuple[str, str], str] = {}
WORLDS: dict[str, Callable[[], World]] = {}


def table(qualname: str, world: Callable[[], World], **kinds: str) -> None:
    WORLDS[qualname] = world
    KINDS.update({(qualname, p): k for p, k in kinds.items()})


for spec, params in {
    "FullAttentionSpec": ["block_size"],
    "CrossAttentionSpec": ["block_size"],
    "MLAAttentionSpec": ["block_size"],
    "SlidingWindowSpec": ["block_size", "sliding_window"],
    "SlidingWindowMLASpec": ["block_size", "sliding_window"],
    "ChunkedLocalAttentionSpec": ["block_size", "attention_chunk_size"],
    "RSWASpec": ["block_size", "rswa_window"],
    "MambaSpec": [
        "block_size",
        "num_speculative_blocks",
        "num_prefill_checkpoint_blocks",
        "prefill_checkpoint_alignment",
    ],
}.items():
    cls = getattr(kvcoord, spec)
    defaults = {p: 8 for p in params}
    if spec == "MambaSpec":
        defaults = {"block_size": B, "mamba_cache_mode": "align"}
    # A spec's sizes cross into the core as signed 64-bit values (its rules).
    table(f"{spec}.__init__", made(cls, **defaults), **dict.fromkeys(params, "i64"))
table(
    "KVCacheConfig.__init__",
    made(KVCacheConfig, num_blocks=8, groups=(KVCacheGroup(FullAttentionSpec(B), ("l",)),)),
    num_blocks="blocks",
    prefix_cache_retention_interval="i64",
)
table("KVCacheManagerOptions.__init__", made(kvcoord.KVCacheManagerOptions), hash_block_size="i64")
table(
    "KVCacheManager.__init__",
    made(KVCacheManager, config=config(FullAttentionSpec(B))),
    max_model_len="tokens",
)
table(
    "AllocateSlots.__call__",
    manager_world,
    **dict.fromkeys(
        ["num_new_tokens", "num_new_computed_tokens", "num_lookahead_tokens", "num_encoder_tokens"],
        "tokens",
    ),
)
table("KVCacheManager.cache_blocks", manager_world, num_computed_tokens="tokens")
table("KVCacheManager.set_residency_clock", manager_world, now="u64")
table("KVCacheManager.set_request_priority", manager_world, priority="u32", num_tokens="tokens")
table("KVCacheManager.advance_eviction_clock", manager_world, ticks="u32")
coordinator_kinds = {"max_model_len": "tokens"}
# The options' counts keep their ranges once a coordinator is built from
# them (whether given as an object or as the coordinators' keywords, which
# become one).
table(
    "CoordinatorOptions.__init__",
    made(
        lambda **fields: kvcoord.UnitaryKVCacheCoordinator(
            **coordinator_args(), options=kvcoord.CoordinatorOptions(**fields)
        )
    ),
    hash_block_size="u32",
    num_reprefillable_tokens="tokens",
    num_hash_lookahead_tokens="tokens",
    group_id_base="u32",
)
for name in ("KVCacheCoordinator", "UnitaryKVCacheCoordinator", "HybridKVCacheCoordinator"):
    cls = kvcoord.KVCacheCoordinatorNoPrefixCache if name == "KVCacheCoordinator" else None
    cls = cls or getattr(kvcoord, name)
    two = config(FullAttentionSpec(B), SlidingWindowSpec(B, 8))
    args = coordinator_args(config=two) if name.startswith("Hybrid") else coordinator_args()
    table(f"{name}.__init__", made(cls, **args), **coordinator_kinds)
table(
    "get_kv_cache_coordinator",
    made(kvcoord.get_kv_cache_coordinator, **coordinator_args(enable_caching=True)),
    **coordinator_kinds,
)
for qualname, kind in {
    "KVCacheCoordinatorNoPrefixCache.find_longest_cache_hit": "NoPrefixCache",
    "UnitaryKVCacheCoordinator.find_longest_cache_hit": "Unitary",
    "HybridKVCacheCoordinator.find_longest_cache_hit": "Hybrid",
}.items():
    table(qualname, coordinator_world(kind), max_length="tokens")
table(
    "HybridKVCacheCoordinator.find_longest_cache_hit_per_group",
    coordinator_world("Hybrid"),
    max_length="tokens",
)
table(
    "mamba_aligned_chunk",
    made(kvcoord.mamba_aligned_chunk, **chunk_args),
    **dict.fromkeys(
        CHUNK_COUNTS,
        "tokens",
    ),
    **dict.fromkeys(["block_size", "hash_block_size", "checkpoint_alignment"], "u32"),
)
table("MambaChunkRule.__init__", made(kvcoord.MambaChunkRule, spec=mamba), hash_block_size="u32")
rule_args = {k: v for k, v in chunk_args.items() if k != "block_size"}
table(
    "MambaChunkRule.__call__",
    made(rule, **rule_args),
    **dict.fromkeys(
        CHUNK_COUNTS,
        "tokens",
    ),
)
table(
    "mamba_chunk_rule",
    made(kvcoord.mamba_chunk_rule, config=config(mamba)),
    hash_block_size="u32",
)

PARAMS = sorted((q, p, k) for (q, p), k in KINDS.items())


def check(qualname: str, param: str, kind: str, value: int, numpy: bool) -> None:
    call, state = WORLDS[qualname]()
    before = state()
    name = qualname.split(".")[-1]
    lo, hi = RANGES[kind]
    try:
        got = call(name, {param: as_numpy(value) if numpy else value})
    except kvcoord.KvCoordError as e:
        assert isinstance(e, ValueError) and not isinstance(e, TypeError), (qualname, param, e)
        assert state() == before, (qualname, param, value, "changed state on error")
        return
    assert lo <= value <= hi, (qualname, param, value, "accepted out of its range")
    if dataclasses.is_dataclass(got):  # a configuration keeps the value exactly
        kept = getattr(got, param)
        assert kept == value and type(kept) is int, (qualname, param, value, kept)


def test_the_table_covers_every_integer_parameter_of_the_facades() -> None:
    found = facade_parameters()
    assert len(found) > 40
    missing = {(q, p) for q, p in found if q not in NOT_CALLED} - set(KINDS)
    assert not missing, f"facade integer parameters the table does not call: {sorted(missing)}"
    assert set(KINDS) <= found, set(KINDS) - found


@pytest.mark.parametrize(("qualname", "param", "kind"), PARAMS)
def test_boundary_values(qualname: str, param: str, kind: str) -> None:
    for value in boundaries(kind):
        for numpy in (False, True):
            check(qualname, param, kind, value, numpy)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(PARAMS),
    st.one_of(st.integers(-(2**70), -1), st.integers(2**48, 2**70), st.integers(0, 64)),
    st.booleans(),
)
def test_random_values(target: tuple[str, str, str], value: int, numpy: bool) -> None:
    check(*target, value, numpy)
