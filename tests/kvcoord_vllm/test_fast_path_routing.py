"""Where kvcoord.vllm's per-step entry points send a call: the manager's
``allocate_slots`` (``kvcoord._core.DecodeFastPath``) answers decode steps
inside a request's room and sends every other call to the manager's
``_allocate`` with all twelve arguments (vLLM's defaults for those not
passed); the request block hasher's gate (``kvcoord._core.BlockHashGate``)
answers appends that complete no block and hands every other call to the
hasher behind it. What the answers are is checked beside vLLM's manager in
``test_decode_fast_path.py``; here, that each call takes its route.

Skipped when vLLM is not installed (``make test-vllm`` runs it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip(
    "vllm.v1.core.kv_cache_manager", reason="needs vLLM 0.33.0 (pip install kvcoord[vllm])"
)

from test_decode_fast_path import hasher_for, ids, make_request, managers
from vllm.v1.request import RequestStatus

from kvcoord._core import BlockHashGate
from kvcoord.errors import InvalidArgumentError

DEFAULTS = (0, None, 0, 0, False, 0, False, 0, True, ())


def running(manager: Any, rid: str = "r") -> Any:
    """A running request of 5 computed tokens and one sampled (6 tokens;
    slots 7 and 8 are in its room, 8 completes a block)."""
    req = make_request(rid, [1, 2, 3, 4, 5], hasher_for("kvcoord"))
    assert ids(manager.allocate_slots(req, 5)) is not None
    req.num_computed_tokens = 5
    req.status = RequestStatus.RUNNING
    req.append_output_token_ids(6)
    return req


def spy_general(manager: Any) -> list[tuple[Any, ...]]:
    """The calls that reach the manager's ``_allocate`` (its arguments after
    the request's id), recorded while they still run."""
    calls: list[tuple[Any, ...]] = []
    general = manager._allocate

    def recorded(request: Any, *args: Any) -> Any:
        calls.append((request.request_id, *args))
        return general(request, *args)

    manager._allocate = recorded
    return calls


def test_steps_inside_the_room_are_answered_without_the_general_path() -> None:
    _, ours, _ = managers((4,), num_blocks=16)
    req = running(ours)
    calls = spy_general(ours)
    empty = ours.empty_kv_cache_blocks
    assert ours.allocate_slots(req, 1) is empty
    assert ours.allocate_slots(req, np.int64(1), num_lookahead_tokens=np.int32(0)) is empty
    assert ours.allocate_slots(req, 1, 0, None, 0, 0, False, 0, False, 0, True, ()) is empty
    assert ours.allocate_slots(req, 1, new_computed_blocks=empty) is empty
    # Inside the room nothing is cached, so a delayed cache changes nothing.
    assert ours.allocate_slots(req, 1, delay_cache_blocks=True) is empty
    assert calls == []
    ours.check_invariants()


@pytest.mark.parametrize(
    ("kwargs", "position", "value"),
    [
        ({"num_lookahead_tokens": 2}, 2, 2),  # rooms are for 0 speculative tokens
        ({"reserved_blocks": 1}, 7, 1),
        ({"full_sequence_must_fit": True}, 6, True),
        ({"num_encoder_tokens": 1}, 5, 1),
        ({"num_external_computed_tokens": 1}, 3, 1),
        ({"has_scheduled_reqs": False}, 8, False),
    ],
)
def test_other_steps_take_the_general_path_with_every_argument(
    kwargs: dict[str, Any], position: int, value: Any
) -> None:
    theirs, ours, _ = managers((4,), num_blocks=16)
    a, b = running(theirs), running(ours)
    calls = spy_general(ours)
    assert ids(theirs.allocate_slots(a, 1, **kwargs)) == ids(ours.allocate_slots(b, 1, **kwargs))
    expected = list(DEFAULTS)
    if position != 8:  # has_scheduled_reqs alone leaves the step in the room
        expected[position] = value
        assert calls == [("r", 1, *expected)]
    else:
        assert calls == []
    assert theirs.get_block_ids("r") == ours.get_block_ids("r")
    ours.check_invariants()


def test_unknown_requests_and_zero_tokens_take_the_general_path() -> None:
    _, ours, _ = managers((4,), num_blocks=16)
    req = running(ours)
    calls = spy_general(ours)
    with pytest.raises(ValueError, match="num_new_tokens must be greater than 0"):
        ours.allocate_slots(req, 0)
    assert calls == [("r", 0, *DEFAULTS)]
    other = make_request("new", [1, 2, 3], hasher_for("kvcoord"))
    assert ids(ours.allocate_slots(other, 3)) is not None
    assert calls[-1] == ("new", 3, *DEFAULTS)


def test_a_step_past_the_room_with_delayed_caching_takes_the_general_path() -> None:
    theirs, ours, counting = managers((4,), num_blocks=16)
    a, b = running(theirs), running(ours)
    for req in (a, b):
        req.num_computed_tokens = 6
        req.append_output_token_ids(7)
        req.num_computed_tokens = 7
        req.append_output_token_ids(8)
    calls = spy_general(ours)
    before = counting.allocations
    got = ours.allocate_slots(b, 1, delay_cache_blocks=True)
    assert ids(theirs.allocate_slots(a, 1, delay_cache_blocks=True)) == ids(got)
    assert calls == [("r", 1, 0, None, 0, 0, True, 0, False, 0, True, ())]
    assert counting.allocations == before + 1  # through the core's allocate_slots
    ours.check_invariants()


def test_a_new_object_under_a_known_id_is_synced_by_the_registry() -> None:
    theirs, ours, _ = managers((4,), num_blocks=16)
    a, b = running(theirs), running(ours)
    for req in (a, b):
        req.num_computed_tokens = 6
        req.append_output_token_ids(7)
        req.num_computed_tokens = 7
        req.append_output_token_ids(8)
    # The same request rebuilt (tests and connectors do): not the registry's
    # object, so the adapter's decode path syncs kvcoord's request first.
    twin = make_request("r", b.all_token_ids[:5], hasher_for("kvcoord"))
    twin.append_output_token_ids(b.all_token_ids[5:])
    twin.num_computed_tokens = b.num_computed_tokens
    assert ids(theirs.allocate_slots(a, 1)) == ids(ours.allocate_slots(twin, 1))
    assert theirs.get_block_ids("r") == ours.get_block_ids("r")
    ours.check_invariants()


class Counting:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, request: Any) -> list[bytes]:
        self.calls += 1
        return [b"new"]


class Appending:
    def __init__(self, tokens: int, hashes: int) -> None:
        self._all_token_ids = list(range(tokens))
        self.block_hashes = [b"h"] * hashes


def test_hash_gate_answers_appends_that_complete_no_block() -> None:
    inner = Counting()
    gate = BlockHashGate(4, inner)
    assert gate.block_size == 4
    assert gate.hash_request(Appending(7, 1)) == ()
    assert gate.hash_request(Appending(3, 0)) == ()
    assert inner.calls == 0
    assert gate.hash_request(Appending(8, 1)) == [b"new"]
    assert gate.hash_request(Appending(4, 0)) == [b"new"]
    # Not vLLM 0.33.0's request: the hasher behind decides.
    assert gate.hash_request(object()) == [b"new"]
    assert inner.calls == 3
    with pytest.raises(InvalidArgumentError):
        BlockHashGate(0, inner)


def test_kvcoord_hasher_is_gated_and_hashes_as_before() -> None:
    hasher = hasher_for("kvcoord")
    assert isinstance(hasher.__self__, BlockHashGate)
    req = make_request("r", list(range(1, 10)), hasher)
    assert len(req.block_hashes) == 2
    for t in range(10, 13):
        req.append_output_token_ids(t)
        assert len(req.block_hashes) == (2 if t < 12 else 3)


def test_managers_are_collected() -> None:
    # The Rust base class holds the manager's room dict, empty blocks and
    # registry: it must let the garbage collector see them (no leaked pools).
    import gc
    import weakref

    refs = []
    for _ in range(3):
        _, ours, _ = managers((4,), num_blocks=16)
        running(ours)
        refs.append(weakref.ref(ours))
        del ours
    gc.collect()
    assert all(r() is None for r in refs)
