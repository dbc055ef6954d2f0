"""``kvcoord._core.BlockHashGate``: the request block hasher kvcoord.vllm
hands vLLM's ``Request``, in front of the adapter's Python hasher.

An append that completes no block is answered with ``[]``; one that
completes a block of a request already hashed by kvcoord (its
:class:`kvcoord._core.Request` under ``hashes_attr``) is that request's
``catch_up``, with no call to the hasher behind; every case ``catch_up``
refuses goes to the hasher behind, with nothing changed. No vLLM needed:
the gate reads only ``_all_token_ids``, ``block_hashes`` and the attribute.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvcoord._core import BlockHashGate, Request

ATTR = "_hashes"
BS = 4


class Behind:
    """The hasher behind the gate: counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, request: Any) -> list[bytes]:
        self.calls += 1
        return [b"behind"]


class Scheduled:
    """The parts of vLLM 0.33.0's ``Request`` the gate reads."""

    def __init__(self, tokens: list[int], hashes: list[bytes]) -> None:
        self._all_token_ids = tokens
        self.block_hashes = hashes


def hashing_request(tokens: list[int]) -> Request:
    return Request("r", tokens, hash_block_size=BS, hash_algo="sha256_cbor")


def digests(tokens: list[int]) -> list[bytes]:
    """What kvcoord hashes for ``tokens`` from scratch."""
    return hashing_request(tokens).catch_up(tokens, 0)


def test_a_completed_block_is_caught_up_without_the_hasher_behind() -> None:
    behind = Behind()
    gate = BlockHashGate(BS, behind, ATTR)
    tokens = [1, 2, 3, 4, 5, 6]
    req = Scheduled(tokens, digests(tokens))
    setattr(req, ATTR, hashing_request(tokens))
    for t in (7, 8):
        tokens.append(t)
        new = gate.hash_request(req)
        req.block_hashes.extend(new)
        assert new == (() if t == 7 else digests(tokens)[1:2])
    assert req.block_hashes == digests(tokens)
    assert behind.calls == 0
    assert getattr(req, ATTR).num_tokens == 8


@pytest.mark.parametrize(
    "case", ["no attribute", "not a kvcoord request", "tokens not a list", "request ahead"]
)
def test_every_other_completed_block_goes_to_the_hasher_behind(case: str) -> None:
    behind = Behind()
    gate = BlockHashGate(BS, behind, ATTR)
    tokens: Any = [1, 2, 3, 4]
    mine = hashing_request([1, 2, 3])
    if case == "not a kvcoord request":
        mine = object()  # type: ignore[assignment]
    if case == "request ahead":
        mine = hashing_request([1, 2, 3, 4, 5])
    req = Scheduled(tokens, [])
    if case != "no attribute":
        setattr(req, ATTR, mine)
    if case == "tokens not a list":
        req._all_token_ids = tuple(tokens)
    assert gate.hash_request(req) == [b"behind"]
    assert behind.calls == 1
    if isinstance(mine, Request):
        # Refused or skipped: the kvcoord request is as it was.
        assert mine.num_tokens == (5 if case == "request ahead" else 3)


def test_a_refused_token_leaves_the_request_unchanged_for_the_hasher_behind() -> None:
    behind = Behind()
    gate = BlockHashGate(BS, behind, ATTR)
    mine = hashing_request([1, 2, 3])
    req = Scheduled([1, 2, 3, -1], [])
    setattr(req, ATTR, mine)
    assert gate.hash_request(req) == [b"behind"]
    assert behind.calls == 1
    assert mine.num_tokens == 3
    assert list(mine.block_hashes) == []


def test_without_the_attribute_name_every_completed_block_goes_behind() -> None:
    behind = Behind()
    gate = BlockHashGate(BS, behind)
    tokens = [1, 2, 3, 4]
    req = Scheduled(tokens, [])
    setattr(req, ATTR, hashing_request([1, 2, 3]))
    assert gate.hash_request(req) == [b"behind"]
    assert gate.hash_request(Scheduled([1, 2, 3], [])) == ()
    assert behind.calls == 1
