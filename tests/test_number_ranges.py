"""Every integer parameter of ``kvcoord._core`` keeps its documented range.

``_core.pyi`` names each integer parameter's kind (``TokenCount``,
``BlockCount``, ``BlockId``, ...; README, "Bad input and limits"). The table
below says how to call each function or method; the test checks it covers
every such parameter of the stub, then feeds each the boundary values of
its kind (-1, 0, the kind's maximum and one past it, 2^63, 2^64 - 1, 2^64)
as ints and numpy scalars: out of range, the call raises a kvcoord error
that is a ``ValueError`` (never ``OverflowError``) and leaves the state as it
was; in range, it returns or raises such an error, and a setter reads back
exactly what was set."""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import asdict
from dataclasses import fields as dataclass_fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvcoord
from kvcoord import _core
from snapshot import pool_state, request_state

STUB = Path(kvcoord.__file__).with_name("_core.pyi")

#: The stub's integer aliases and the kind each one is.
KINDS = {
    "TokenCount": "tokens",
    "BlockCount": "blocks",
    "BlockId": "block_id",
    "GroupId": "group_id",
    "U32": "u32",
    "U64": "u64",
    "I64": "i64",
}

#: Each kind's range as the README documents it (inclusive).
RANGES = {
    "tokens": (0, 2**48 - 1),
    "blocks": (0, 2**32 - 1),
    "block_id": (0, 2**32 - 1),
    "group_id": (0, 2**32 - 1),
    "u32": (0, 2**32 - 1),
    "u64": (0, 2**64 - 1),
    "i64": (-(2**63), 2**63 - 1),
}

#: Bare ``int`` parameters of the sequence protocol (indices clamp like a
#: list's); every other integer parameter names its kind.
PROTOCOL_INTS = {
    ("BlockHashes.__getitem__", "index"),
    ("BlockHashes.index", "start"),
    ("BlockHashes.index", "stop"),
}

#: Parameters the table does not call, with the reason.
NOT_CALLED = {
    # The base class of kvcoord.vllm's manager: its allocate_slots hands
    # every call to the subclass's `_allocate` (vLLM's), which converts the
    # counts through CoordinatorCore.allocate_slots (called here).
    "DecodeFastPath.allocate_slots": "needs vLLM's manager",
}


def stub_parameters() -> dict[tuple[str, str], str]:
    """``(qualname, parameter) -> kind`` for every integer parameter of the
    stub; a bare ``int`` outside the sequence protocol fails the test."""
    found: dict[tuple[str, str], str] = {}
    bare: list[tuple[str, str]] = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.FunctionDef):
                a = node.args
                for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                    text = ast.unparse(arg.annotation) if arg.annotation else ""
                    alias = text.removesuffix(" | None")
                    key = (f"{prefix}{node.name}", arg.arg)
                    if alias in KINDS:
                        found[key] = KINDS[alias]
                    elif alias == "int" and key not in PROTOCOL_INTS:
                        bare.append(key)

    visit(ast.parse(STUB.read_text()).body, "")
    assert not bare, f"integer parameters without a kind in _core.pyi: {bare}"
    return found


# ---- the calls ---------------------------------------------------------------

B = 4  # block size and hash unit of every object below
Call = Callable[[str, object], object]


def pool_world() -> tuple[Any, Call, Callable[[], object]]:
    pool = _core.BlockPool(16, hash_block_size=B)
    ids = pool.get_new_blocks(3)
    req = _core.Request("r", list(range(12)), hash_block_size=B)
    hashes = list(req.block_hashes)
    pool.cache_full_blocks(ids, hashes, 0, 2, 0)
    spec = _core.GroupSpec.full_attention(B)
    defaults: dict[str, dict[str, object]] = {
        "set_priority": {"block_ids": ids[:1]},
        "enable_sampled_lives": {"sample_rate": 0.5},
        "cache_full_blocks": {
            "block_ids": ids,
            "block_hashes": hashes,
            "num_cached_blocks": 2,
            "num_full_blocks": 2,
            "group_id": 0,
        },
        "insert_key": {"block_id": ids[2], "block_hash": hashes[2], "group_id": 0},
        "find_longest_cache_hit": {
            "spec": spec,
            "group_ids": [0],
            "block_hashes": hashes,
            "max_length": 12,
            "alignment": B,
        },
    }
    return pool, method_calls(pool, defaults), lambda: pool_state(pool)


def core_world() -> tuple[Any, Call, Callable[[], object]]:
    core = _core.CoordinatorCore(
        32,
        [_core.GroupSpec.full_attention(B)],
        kind=_core.CoordinatorKind.Unitary,
        max_model_len=1024,
        options=kvcoord.CoordinatorOptions(hash_block_size=B),
    )
    req = _core.Request("r", list(range(10)), hash_block_size=B)
    assert core.allocate_slots(req, 10) is not None
    rid = {"request_id": "r"}
    row = {**rid, "group": 0, "page": 0}
    defaults: dict[str, dict[str, object]] = {
        "num_cacheable_tokens": {"group": 0, "num_computed_tokens": 8},
        "find_longest_cache_hit": {
            "group_ids": [0],
            "request": req,
            "max_length": 8,
            "alignment": B,
        },
        "allocate_slots": {"request": req, "num_new_tokens": 1},
        "decode_room": {"need": 10, "cached_to": 8, "hashed": 8, "num_lookahead_tokens": 0},
        "decode_slots": {
            "request": object(),
            "mine": req,
            "request_id": "r",
            "num_new_tokens": 1,
            "num_lookahead_tokens": 0,
            "rooms": {},
        },
        "num_blocks_to_allocate": {"request": req, "num_tokens": 4},
        "remove_skipped_blocks": {**rid, "num_computed_tokens": 4},
        "cache_blocks": {"request": req, "num_tokens": 8},
        "request_mamba_checkpoint": {**rid, "group": 0},
        "finalize_partial_tail_offloads": {
            **rid,
            "num_computed_tokens": 8,
            "num_in_flight_tokens": 0,
        },
        "set_priority": {"block_ids": []},
        "enable_sampled_lives": {"sample_rate": 0.5},
        "resident_page": row,
        "unpin_resident_page": row,
        "drop_resident_page": row,
        "adopt_resident_page": {**row, "block_id": 1},
        "residency_row": {**rid, "group": 0},
        "touch_resident_blocks": {"group": 0, "block_ids": []},
        "unpin_resident_block": {"group": 0, "block_id": 1},
        **{m: {**rid, "group": 0} for m in ("require_hot", "has_hot", "allocate_hot")},
        "hot_required": {**rid, "group": 0},
        "cache_caller_blocks": {
            "block_ids": [],
            "block_hashes": [],
            "num_cached_blocks": 0,
            "num_full_blocks": 0,
            "group_id": 0,
            "block_size": B,
        },
        "insert_cache_key": {"block_hash": bytes(32), "group_id": 0, "block_ids": []},
    }

    def state() -> object:
        blocks = core.blocks("r").get_block_ids() if core.num_requests else None
        return pool_state(core.block_pool), core.num_requests, blocks, request_state(req)

    return core, method_calls(core, defaults), state


def pair_world() -> tuple[Any, Call, Callable[[], object]]:
    host = _core.CoordinatorCore(32, [_core.GroupSpec.full_attention(B)], **core_kinds)
    groups = [
        _core.GroupSpec.full_attention(B),
        _core.GroupSpec.hisparse_resident(B),
        _core.GroupSpec.hisparse_hot(B, 2),
    ]
    device_options = kvcoord.CoordinatorOptions(hash_block_size=B, group_id_base=1)
    hybrid = {**core_kinds, "kind": _core.CoordinatorKind.Hybrid, "options": device_options}
    device = _core.CoordinatorCore(32, groups, **hybrid)
    pair = _core.HiSparsePair(host, device)
    req = _core.Request("r", list(range(10)), hash_block_size=B)
    assert pair.allocate_slots(req, 10) is not None
    defaults: dict[str, dict[str, object]] = {
        "allocate_slots": {"request": req, "num_new_tokens": 1},
        "num_blocks_to_allocate": {"request": req, "num_tokens": 4},
        "host_admission_blocks": {"request": req, "num_tokens": 4},
        "max_admission_blocks": {"group": 2, "max_in_flight_tokens": 8},
    }

    def state() -> object:
        cores = (host, device)
        held = tuple(c.blocks("r").get_block_ids() if c.num_requests else None for c in cores)
        pools = pool_state(host.block_pool), pool_state(device.block_pool)
        return pools, held, request_state(req)

    return pair, method_calls(pair, defaults), state


def batch_step_world() -> tuple[Any, Call, Callable[[], object]]:
    """A running batch of one request one token from its first output token."""
    req = _core.Request("r", list(range(4)), hash_block_size=B)
    req.num_computed_tokens = 3
    arrays = {
        "computed": np.array([3]),
        "num_tokens": np.array([4]),
        "out_pos": np.array([0]),
        "out_len": np.array([2]),
        "out_base": np.array([0]),
        "out_tokens": np.array([7, 8]),
    }
    given = {"n": np.array([1]), "count": 1, "window": 0, **arrays, "requests": [req]}

    def state() -> object:
        return request_state(req), [a.tolist() for a in arrays.values()]

    return None, lambda _name, kw: _core.batch_step(**{**given, **dict(kw)}), state


def prefix_index_world() -> tuple[Any, Call, Callable[[], object]]:
    index = _core.PrefixIndex(2)
    core = _core.CoordinatorCore(**core_args)
    defaults: dict[str, dict[str, object]] = {
        "apply": {"events": []},
        "drain": {"coordinator": core},
    }

    def state() -> object:
        return [sorted(index.keys(e)) for e in range(2)], index.events_seen

    return index, method_calls(index, defaults), state


def view_world() -> tuple[Any, Call, Callable[[], object]]:
    core, _, state = core_world()
    view = core.block_pool
    return view, method_calls(view, {}), state


def request_world() -> tuple[Any, Call, Callable[[], object]]:
    req = _core.Request("r", list(range(10)), hash_block_size=B)
    defaults: dict[str, dict[str, object]] = {"catch_up": {"token_ids": list(range(13))}}
    call = method_calls(req, defaults)

    def set_or_call(name: str, kw: object) -> object:
        if name in ("num_computed_tokens", "shared_prefix_boundary", "num_in_flight_tokens"):
            (value,) = dict(kw).values()  # type: ignore[call-overload]
            setattr(req, name, value)
            got = getattr(req, name)
            assert got == value and type(got) is int, (name, value, got)
            return got
        return call(name, kw)

    return req, set_or_call, lambda: request_state(req)


def method_calls(obj: Any, defaults: dict[str, dict[str, object]]) -> Call:
    def call(name: str, kw: object) -> object:
        return getattr(obj, name)(**{**defaults.get(name, {}), **dict(kw)})  # type: ignore[call-overload]

    return call


def free(
    make: Callable[..., object], **defaults: object
) -> Callable[[], tuple[Any, Call, Callable[[], object]]]:
    """A function or constructor: no state but the object it returns."""
    return lambda: (None, lambda _name, kw: make(**{**defaults, **dict(kw)}), lambda: None)  # type: ignore[call-overload]


def spec_world(
    name: str, **defaults: object
) -> Callable[[], tuple[Any, Call, Callable[[], object]]]:
    return free(getattr(_core.GroupSpec, name), block_size=B, **defaults)


core_kinds: dict[str, Any] = {
    "kind": _core.CoordinatorKind.Unitary,
    "max_model_len": 1024,
    "options": kvcoord.CoordinatorOptions(hash_block_size=B),
}
core_args = {"num_blocks": 32, "groups": [_core.GroupSpec.full_attention(B)], **core_kinds}

#: The integer fields of ``CoordinatorOptions``, which the core reads by
#: attribute (no stub parameter names them), and their kinds.
OPTION_INTS = {
    "hash_block_size": "u32",
    "num_reprefillable_tokens": "tokens",
    "num_hash_lookahead_tokens": "tokens",
    "group_id_base": "u32",
}


def core_with_options(**changed: object) -> object:
    """A core built from options whose fields ``changed`` replaces, past the
    Python checks (an object with the same attributes): the core's own
    conversion of each field is what is tested."""
    fields = {**asdict(kvcoord.CoordinatorOptions(hash_block_size=B)), **changed}
    return _core.CoordinatorCore(**{**core_args, "options": SimpleNamespace(**fields)})


#: How to call each function or method of the stub that takes integers:
#: ``qualname -> world()``, the world returning ``(object, call, state)``.
WORLDS: dict[str, Callable[[], tuple[Any, Call, Callable[[], object]]]] = {
    "BlockPool.__init__": free(_core.BlockPool, num_blocks=8),
    "validate_retention_interval": free(
        _core.validate_retention_interval,
        interval=None,
        scheduler_block_size=16,
        has_sparse_groups=True,
    ),
    "Request.__init__": free(_core.Request, request_id="x", prompt_token_ids=[1, 2, 3]),
    "compute_block_hashes": free(_core.compute_block_hashes, token_ids=[1, 2, 3, 4]),
    "CoordinatorCore.__init__": free(_core.CoordinatorCore, **core_args),
    "CoordinatorOptions": free(core_with_options),
    "BlockHashGate.__init__": free(_core.BlockHashGate, hasher=lambda r: ()),
    "KVCacheBlocks.empty": free(_core.KVCacheBlocks.empty),
    "mooncake_prompt_tokens": free(_core.mooncake_prompt_tokens, hash_ids=[1, 2]),
    "UnboundedPrefixCache.__init__": free(_core.UnboundedPrefixCache),
    "choose_coordinator": free(_core.choose_coordinator, enable_caching=True),
    "batch_plan": free(
        _core.batch_plan,
        computed=np.array([0, 4]),
        num_tokens=np.array([8, 8]),
        budget=8,
        steady_block_size=B,
        n=np.zeros(2, dtype=np.int64),
    ),
    "batch_step": batch_step_world,
    "PrefixIndex.__init__": free(_core.PrefixIndex, num_engines=2),
    "GroupSpec.full_attention": spec_world("full_attention"),
    "GroupSpec.sliding_window": spec_world("sliding_window", sliding_window=8),
    "GroupSpec.chunked_local": spec_world("chunked_local", attention_chunk_size=8),
    "GroupSpec.mamba": spec_world("mamba", num_speculative_blocks=0),
    "GroupSpec.cross_attention": spec_world("cross_attention"),
    "GroupSpec.mla_attention": spec_world("mla_attention"),
    "GroupSpec.sliding_window_mla": spec_world("sliding_window_mla", sliding_window=8),
    "GroupSpec.rswa": spec_world("rswa", rswa_window=8),
    "GroupSpec.hisparse_resident": spec_world("hisparse_resident"),
    "GroupSpec.hisparse_hot": spec_world("hisparse_hot", blocks_per_request=2),
    "GroupSpec.mamba_align": spec_world(
        "mamba_align",
        num_speculative_blocks=0,
        num_prefill_checkpoint_blocks=0,
        prefill_checkpoint_alignment=None,
    ),
}


def world_of(qualname: str) -> Callable[[], tuple[Any, Call, Callable[[], object]]]:
    if qualname in WORLDS:
        return WORLDS[qualname]
    owner = qualname.split(".")[0]
    return {
        "BlockPool": pool_world,
        "CoordinatorCore": core_world,
        "HiSparsePair": pair_world,
        "BlockPoolView": view_world,
        "Request": request_world,
        "PrefixIndex": prefix_index_world,
    }[owner]


PARAMS = sorted(
    {**stub_parameters(), **{("CoordinatorOptions", f): k for f, k in OPTION_INTS.items()}}.items()
)
CALLED = [(q, p, k) for (q, p), k in PARAMS if q not in NOT_CALLED]


def boundaries(kind: str) -> list[int]:
    lo, hi = RANGES[kind]
    return sorted({lo - 1, -1, 0, hi, hi + 1, 2**63, 2**64 - 1, 2**64, -(2**64)})


def as_numpy(value: int) -> object:
    """``value`` as a numpy integer scalar, where one holds it."""
    if -(2**63) <= value < 2**63:
        return np.int64(value)
    if 0 <= value < 2**64:
        return np.uint64(value)
    return value


def check(qualname: str, param: str, kind: str, value: int, numpy: bool) -> None:
    _, call, state = world_of(qualname)()
    name = qualname.split(".")[-1]
    before = state()
    given_value = as_numpy(value) if numpy else value
    lo, hi = RANGES[kind]
    try:
        call(name, {param: given_value})
    except kvcoord.KvCoordError as e:
        assert isinstance(e, ValueError), (qualname, param, value, repr(e))
        assert not isinstance(e, TypeError), (qualname, param, value, repr(e))
        assert state() == before, (qualname, param, value, "changed state on error")
        return
    assert lo <= value <= hi, (qualname, param, value, "accepted out of its range")


def test_the_table_covers_every_integer_parameter_of_the_stub() -> None:
    qualnames = {q for (q, _), _ in PARAMS}
    assert len(PARAMS) > 100  # the whole stub, not a part of it
    for q in qualnames - set(NOT_CALLED):
        world_of(q)  # a KeyError names a method the table cannot call
    assert set(NOT_CALLED) <= qualnames
    assert set(WORLDS) <= qualnames, set(WORLDS) - qualnames


def test_the_option_table_covers_every_integer_field() -> None:
    ints = {
        f.name
        for f in dataclass_fields(kvcoord.CoordinatorOptions)
        if f.type.startswith("int")  # type: ignore[union-attr]
    }
    assert ints == set(OPTION_INTS)


def test_the_kinds_are_the_documented_ones() -> None:
    kinds = {k: v for k, v in RANGES.items() if k != "i64"}
    assert {k: hi for k, (_, hi) in kinds.items()} == _core.NUMBER_MAX
    assert _core.MAX_TOKENS == 2**48


@pytest.mark.parametrize(("qualname", "param", "kind"), CALLED)
def test_boundary_values(qualname: str, param: str, kind: str) -> None:
    for value in boundaries(kind):
        for numpy in (False, True):
            check(qualname, param, kind, value, numpy)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(CALLED),
    st.one_of(
        st.integers(-(2**70), -1),
        st.integers(2**48, 2**70),
        st.integers(0, 64),
    ),
    st.booleans(),
)
def test_random_values(target: tuple[str, str, str], value: int, numpy: bool) -> None:
    # In-range values stay small: a random pool size of 2^30 would build one.
    qualname, param, kind = target
    check(qualname, param, kind, value, numpy)


def test_advance_requests_counts_up_to_the_last_token_count_exactly() -> None:
    top = _core.MAX_TOKENS - 1
    req = _core.Request("r", [1, 2, 3], hash_block_size=B)
    req.num_computed_tokens = top - 2
    kvcoord.advance_requests([req, req], [1, 1])  # the same request twice adds up
    assert req.num_computed_tokens == top
    for bad in (1, 2**64 - 1, 2**63, 2**64, -1):
        before = request_state(req)
        with pytest.raises(kvcoord.InvalidArgumentError):
            kvcoord.advance_requests([req], [bad])
        assert request_state(req) == before
    other = _core.Request("o", [1], hash_block_size=B)
    with pytest.raises(kvcoord.InvalidArgumentError):
        kvcoord.advance_requests([other, req], np.array([1, 1], dtype=np.int64))
    assert (other.num_computed_tokens, req.num_computed_tokens) == (0, top)
    with pytest.raises(kvcoord.InvalidArgumentError):
        kvcoord.advance_requests([other, other], [2**47, 2**47])
    assert other.num_computed_tokens == 0


def test_int_arg_is_the_conversion_python_code_shares() -> None:
    assert _core.int_arg(2**64 - 1, "n", "u64") == 2**64 - 1
    assert _core.int_arg(np.uint32(7), "n", "blocks") == 7
    assert _core.int_arg(-(2**63), "n", "i64", config=True) == -(2**63)
    with pytest.raises(kvcoord.InvalidArgumentError, match="invalid n: 281474976710656"):
        _core.int_arg(2**48, "n")  # tokens by default
    with pytest.raises(kvcoord.InvalidBlockIdError):
        _core.int_arg(2**32, "n", "block_id")
    with pytest.raises(kvcoord.ConfigError, match="invalid n=-1: must be non-negative"):
        _core.int_arg(-1, "n", "u32", config=True)
    with pytest.raises(kvcoord.ConfigTypeError):
        _core.int_arg(True, "n", "u32", config=True)
    for bad_kind in ("bytes", "i64"):  # i64 is a configuration kind only
        with pytest.raises(kvcoord.InvalidArgumentError, match="invalid kind"):
            _core.int_arg(1, "n", bad_kind)
