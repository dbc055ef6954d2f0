"""The list fast path of token conversion (plain ints) agrees with the
generic path for every other item type: numpy integers, bools, int
subclasses, ints beyond 64 bits, non-ints. Same results, same errors, and
nothing changed on error."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kvcoord
from kvcoord import ArgumentTypeError, InvalidTokenError, Request


class MyInt(int):
    pass


MIXED = [3, np.int64(5), True, MyInt(7), np.uint32(2**32 - 1), 0]
EXPECTED = [3, 5, 1, 7, 2**32 - 1, 0]


@pytest.mark.parametrize("container", [list, tuple])
def test_mixed_items_convert_like_the_generic_path(container: type) -> None:
    r = Request("a", container(MIXED * 3), hash_block_size=4)
    assert r.all_token_ids == EXPECTED * 3
    same = Request("b", np.array(EXPECTED * 3, dtype=np.uint32), hash_block_size=4)
    assert list(r.block_hashes) == list(same.block_hashes)


@pytest.mark.parametrize(
    ("bad", "error", "position"),
    [
        (-1, InvalidTokenError, 2),
        (2**32, InvalidTokenError, 2),
        (2**70, InvalidTokenError, 2),
        (-(2**70), InvalidTokenError, 2),
        (1.0, ArgumentTypeError, 2),
        ("7", ArgumentTypeError, 2),
        (None, ArgumentTypeError, 2),
    ],
)
def test_bad_item_raises_at_its_position(bad: Any, error: type, position: int) -> None:
    with pytest.raises(error, match=f"position {position}"):
        Request("a", [1, 2, bad, 4], hash_block_size=4)
    r = Request("a", [1, 2, 3], hash_block_size=4)
    with pytest.raises(error, match=f"position {3 + position}"):
        r.append_output_token_ids([9, 9, bad])
    assert r.all_token_ids == [1, 2, 3]
    assert r.num_block_hashes == 0


def test_advance_accepts_mixed_int_lists() -> None:
    reqs = [Request(f"r{i}", [1, 2, 3], hash_block_size=4) for i in range(4)]
    ns: list[Any] = [1, np.int64(2), True, MyInt(1)]
    toks: list[Any] = [5, np.int32(-1), 6, False]
    kvcoord.advance_requests(reqs, ns, toks)
    assert [r.num_computed_tokens for r in reqs] == [1, 2, 1, 1]
    assert [r.output_token_ids for r in reqs] == [[5], [], [6], [0]]


@pytest.mark.parametrize(
    ("ns", "toks", "error"),
    [
        ([1, 2**70, 1], None, (InvalidTokenError, ValueError)),
        ([1, 1.5, 1], None, TypeError),
        ([1, 1, 1], [1, 2**70, 3], (InvalidTokenError, ValueError)),
        ([1, 1, 1], [1, "x", 3], TypeError),
    ],
)
def test_advance_bad_list_items_change_nothing(
    ns: list[Any], toks: list[Any] | None, error: type
) -> None:
    reqs = [Request(f"r{i}", [1, 2, 3], hash_block_size=4) for i in range(3)]
    with pytest.raises(error):
        kvcoord.advance_requests(reqs, ns, toks)
    assert [(r.num_computed_tokens, r.num_tokens) for r in reqs] == [(0, 3)] * 3


class ShrinkingIndex:
    """An id whose ``__index__`` empties the list being read."""

    def __init__(self, value: int, victim: list[Any]) -> None:
        self.value, self.victim = value, victim

    def __index__(self) -> int:
        self.victim.clear()
        return self.value


def test_a_list_emptied_while_read_keeps_only_the_items_read() -> None:
    """Ids are written into room made for the whole list; an item's
    ``__index__`` that empties the list ends the read after that item."""
    tokens: list[Any] = [5, 6]
    tokens.append(ShrinkingIndex(7, tokens))
    tokens.append(8)
    assert Request("a", tokens, hash_block_size=4).all_token_ids == [5, 6, 7]
    pool = kvcoord.BlockPool(8)
    got = pool.get_new_blocks(3)
    ids: list[Any] = [got[0], ShrinkingIndex(got[1], [])]
    ids[1].victim = ids
    ids.append(got[2])
    free = pool.num_free_blocks
    pool.free_blocks(ids)
    assert pool.num_free_blocks == free + 2
    pool.check_invariants()
