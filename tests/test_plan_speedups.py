"""The speed-ups of ``kvcoord plan`` change no result: replays started ahead
of their turn on several workers give the outcome of one replay after
another, and the running batch's step in the core is the array arithmetic
it replaced (a numpy reference here), each with a negative control."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvcoord._core import batch_plan, batch_step
from kvcoord.cli import main
from test_plan import LOAD

SPACE = ["--gpus", "h100,a100", "--tp", "1,2", "--replicas", "3", "--no-progress"]


def _outcomes(tmp_path: Path, *flags: str) -> tuple[str | None, list[tuple[str, str, str]]]:
    out = tmp_path / "plan.json"
    main(["plan", *LOAD, *SPACE, *flags, "--json", str(out)])
    doc = json.loads(out.read_text())
    rows = [
        (c["label"], c["stage"], (c.get("replay") or {}).get("status", ""))
        for c in doc["candidates"]
    ]
    chosen = doc["chosen"]["label"] if doc["chosen"] else None
    return chosen, rows


def test_replays_ahead_of_their_turn_give_the_one_by_one_outcome(tmp_path: Path) -> None:
    targets = ["--goodput", "ttft:300ms", "tpot:40ms", "--goodput-min", "90%"]
    one = _outcomes(tmp_path, *targets, "--jobs", "1")
    two = _outcomes(tmp_path, *targets, "--jobs", "2")
    assert one == two
    stages = {stage for _, stage, _ in one[1]}
    assert {"replayed", "rate", "not replayed"} <= stages, stages  # every kind of turn taken
    # negative control: the comparison sees a different search
    assert _outcomes(tmp_path, *targets[:-1], "99.7%", "--jobs", "2") != two


def _reference_plan(computed, num_tokens, budget, steady_bs):  # type: ignore[no-untyped-def]
    """The array arithmetic the core's ``plan_tokens`` replaced."""
    rem = num_tokens - computed
    before = np.cumsum(rem) - rem
    n = np.minimum(rem, np.maximum(budget - before, 0))
    count = int(np.count_nonzero(before < budget))
    if steady_bs:
        m, cc = n[:count], computed[:count]
        edge = (m != 1) | (cc % steady_bs == 0) | ((cc + 1) % steady_bs == 0)
        return n, count, edge.nonzero()[0].tolist()
    return n, count, list(range(count))


def _reference_pairs(cached, new, window):  # type: ignore[no-untyped-def]
    lo, hi = cached, cached + new
    full_end = np.minimum(hi, window)
    a, b = lo + 1, full_end
    head = np.where(lo < full_end, (a + b) * (b - a + 1) // 2, 0)
    capped_start = np.maximum(lo, window)
    tail = np.where(hi > capped_start, (hi - capped_start) * window, 0)
    return head + tail


def _reference_step(n, count, window, c, num_tokens, out_pos, out_len, out_base, out_tokens):  # type: ignore[no-untyped-def]
    nn, cc = n[:count], c[:count]
    sched = nn > 0
    new_c = cc + nn
    kv = new_c * sched
    sums = (
        int(nn.sum()), int((nn * cc + nn * (nn + 1) // 2).sum()),
        int(_reference_pairs(cc, nn, window).sum()) if window else 0,
        int(kv.sum()), int(np.minimum(kv, window).sum()) if window else 0, int(sched.sum()),
    )  # fmt: skip
    done = sched & (new_c >= num_tokens[:count])
    idx = done.nonzero()[0]
    pos = out_pos[idx]
    sampled = np.full(count, -1)
    sampled[idx] = out_tokens[out_base[idx] + pos]
    first = idx[pos == 0].tolist()
    fin = idx[pos + 1 >= out_len[idx]].tolist()
    return sums, len(idx) - len(first), first, fin, sampled, new_c, done


def _batch(rng: np.random.Generator, k: int) -> tuple[np.ndarray, ...]:
    computed = rng.integers(0, 300, k)
    num_tokens = computed + rng.integers(1, 200, k) * (rng.random(k) < 0.3) + 1
    out_len = rng.integers(1, 6, k)
    out_pos = np.minimum(rng.integers(0, 6, k), out_len - 1)
    out_base = np.cumsum(out_len) - out_len
    out_tokens = rng.integers(0, 32000, int(out_len.sum()))
    return computed, num_tokens, out_pos, out_len, out_base, out_tokens


@pytest.mark.parametrize("seed", range(6))
def test_the_core_step_is_the_array_arithmetic(seed: int) -> None:
    from kvcoord import Request

    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 40))
    computed, num_tokens, out_pos, out_len, out_base, out_tokens = _batch(rng, k)
    budget, steady, window = (
        int(rng.integers(1, 2000)),
        int(rng.choice([0, 16])),
        int(rng.choice([0, 64])),
    )
    n = np.zeros(k, dtype=np.int64)
    count, events = batch_plan(computed, num_tokens, budget, steady, n)
    ref_n, ref_count, ref_events = _reference_plan(computed, num_tokens, budget, steady)
    assert (count, events) == (ref_count, ref_events)
    assert n.tolist() == ref_n.tolist()
    # negative control: another budget plans differently
    other = np.zeros(k, dtype=np.int64)
    batch_plan(computed, num_tokens, budget + 500, steady, other)
    assert other.tolist() != n.tolist() or int(num_tokens.sum() - computed.sum()) <= budget

    reqs = []
    for i in range(k):
        r = Request(f"r{i}", list(range(int(num_tokens[i]))), hash_block_size=16)
        r.num_computed_tokens = int(computed[i])
        reqs.append(r)
    ref = _reference_step(n, count, window, computed, num_tokens, out_pos, out_len, out_base,
                          out_tokens)  # fmt: skip
    arrays = [a.copy() for a in (computed, num_tokens, out_pos)]
    sums, later, first, fin = batch_step(n, count, window, *arrays, out_len, out_base,
                                         out_tokens, reqs)  # fmt: skip
    assert (sums, later, first, fin) == ref[:4]
    new_c, done = ref[5], ref[6]
    assert arrays[0][:count].tolist() == new_c.tolist()
    assert arrays[1][:count].tolist() == (num_tokens[:count] + done).tolist()
    assert arrays[2][:count].tolist() == (out_pos[:count] + done).tolist()
    for i in range(count):
        assert reqs[i].num_computed_tokens == int(new_c[i])
        want = int(num_tokens[i]) + int(done[i])
        assert reqs[i].num_tokens == want
        if done[i]:
            assert reqs[i].all_token_ids[-1] == int(ref[4][i])


def test_a_bad_batch_is_refused_unchanged() -> None:
    from kvcoord import Request

    computed = np.array([0, 4], dtype=np.int64)
    num_tokens = np.array([4, 5], dtype=np.int64)
    out_pos = np.zeros(2, dtype=np.int64)
    out_len = np.array([2, 2], dtype=np.int64)
    out_base = np.array([0, 2], dtype=np.int64)
    reqs = [Request(f"r{i}", [1, 2, 3, 4, 5][: int(num_tokens[i])], hash_block_size=4)
            for i in range(2)]  # fmt: skip
    reqs[1].num_computed_tokens = 4
    short = np.array([7, 8], dtype=np.int64)  # request 1's tokens lie past it
    n = np.array([4, 1], dtype=np.int64)
    with pytest.raises(ValueError, match="out_tokens"):
        batch_step(n, 2, 0, computed, num_tokens, out_pos, out_len, out_base, short, reqs)
    assert computed.tolist() == [0, 4] and reqs[0].num_computed_tokens == 0
    with pytest.raises(ValueError, match="at least 2 entries"):
        batch_plan(computed, num_tokens[:1], 10, 0, np.zeros(2, dtype=np.int64))
