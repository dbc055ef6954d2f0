"""kvcoord.advance_requests: one step's bookkeeping for many requests equals
the per-request updates, and bad input changes nothing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import kvcoord
from kvcoord import InvalidArgumentError, InvalidTokenError, Request


def make(n: int) -> list[Request]:
    return [Request(f"r{i}", list(range(i, i + 7 + i)), hash_block_size=4) for i in range(n)]


def state(reqs: list[Request]) -> list[tuple[int, list[int], list[bytes]]]:
    return [(r.num_computed_tokens, r.all_token_ids, list(r.block_hashes)) for r in reqs]


@given(
    st.lists(st.tuples(st.integers(0, 9), st.integers(-1, 50)), min_size=1, max_size=6).map(list)
)
def test_batched_equals_one_by_one(steps: list[tuple[int, int]]) -> None:
    batched, single = make(len(steps)), make(len(steps))
    ns = [n for n, _ in steps]
    toks = [t for _, t in steps]
    for _ in range(3):  # several steps, crossing block boundaries
        kvcoord.advance_requests(batched, ns, toks)
        for r, n, t in zip(single, ns, toks, strict=True):
            r.num_computed_tokens += n
            if t >= 0:
                r.append_output_token_ids(t)
    assert state(batched) == state(single)


def test_arrays_and_no_tokens() -> None:
    reqs = make(3)
    kvcoord.advance_requests(reqs, np.array([1, 2, 3], dtype=np.int64))
    assert [r.num_computed_tokens for r in reqs] == [1, 2, 3]
    assert [r.num_output_tokens for r in reqs] == [0, 0, 0]
    kvcoord.advance_requests(reqs, [0, 0, 0], np.array([5, -1, 6], dtype=np.int32))
    assert [r.output_token_ids for r in reqs] == [[5], [], [6]]


@pytest.mark.parametrize(
    ("ns", "toks", "error"),
    [
        ([1, 1], None, InvalidArgumentError),  # length mismatch
        ([1, 1, 1], [1, 2], InvalidArgumentError),
        ([1, -1, 1], None, InvalidArgumentError),  # negative count
        ([1, 1, 1], [1, 2**33, 3], InvalidTokenError),
    ],
)
def test_bad_input_changes_nothing(
    ns: list[int], toks: list[int] | None, error: type[Exception]
) -> None:
    reqs = make(3)
    before = state(reqs)
    with pytest.raises(error):
        kvcoord.advance_requests(reqs, ns, toks)
    assert state(reqs) == before


def test_not_a_request_changes_nothing() -> None:
    reqs = make(2)
    before = state(reqs)
    with pytest.raises(TypeError):
        kvcoord.advance_requests([reqs[0], "x", reqs[1]], [1, 1, 1])  # type: ignore[list-item]
    assert state(reqs) == before


def test_manager_facade_delegates() -> None:
    reqs = make(2)
    kvcoord.KVCacheManager.advance_requests(reqs, [2, 3], [9, -1])
    assert [(r.num_computed_tokens, r.output_token_ids) for r in reqs] == [(2, [9]), (3, [])]
