"""Best possible hit rate with an unbounded cache, on hand-made workloads (no manager needed)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from kvcoord.replay.bestcase import best_possible_hits, prefix_block_keys
from kvcoord.replay.workloads import Workload, WorkloadRequest, read_mooncake, synthetic_chat

DATA = Path(__file__).parent / "data"


def _req(
    rid: str, prompt: list[int], t: float, out: list[int] | None = None, salt: str | None = None
) -> WorkloadRequest:
    out = out if out is not None else [1]
    return WorkloadRequest(
        rid, t, len(prompt), len(out), lambda p=tuple(prompt): p, salt, tuple(out)
    )


def test_identical_prompts_hit_all_but_the_last_block() -> None:
    p = list(range(100, 164))  # 64 tokens = 4 blocks of 16
    best = best_possible_hits(Workload("w", [_req("a", p, 0), _req("b", p, 1)]), 16)
    assert best.prompt_tokens == 128
    assert best.hit_tokens == 48  # the last prompt token is recomputed: 3 whole blocks
    p65 = [*p, 7]
    best = best_possible_hits(Workload("w", [_req("a", p65, 0), _req("b", p65, 1)]), 16)
    assert best.hit_tokens == 64


def test_partial_shared_prefix_and_block_size() -> None:
    a = list(range(40)) + [900] * 24
    b = list(range(40)) + [901] * 24
    wl = Workload("w", [_req("a", a, 0), _req("b", b, 1)])
    assert best_possible_hits(wl, 16).hit_tokens == 32
    assert best_possible_hits(wl, 8).hit_tokens == 40
    assert best_possible_hits(wl, 64).hit_tokens == 0


def test_reply_tokens_are_cached_for_the_follow_up() -> None:
    prompt = list(range(32))
    reply = list(range(500, 520))  # 20 output tokens; 19 computed
    follow = prompt + reply + [7] * 10
    wl = Workload("w", [_req("a", prompt, 0, reply), _req("b", follow, 1)])
    # computed: 32 + 19 = 51 tokens -> 3 full blocks cached
    assert best_possible_hits(wl, 16).hit_tokens == 48


def test_cache_salt_separates() -> None:
    p = list(range(64))
    wl = Workload(
        "w", [_req("a", p, 0, salt="x"), _req("b", p, 1, salt="y"), _req("c", p, 2, salt="x")]
    )
    assert best_possible_hits(wl, 16).hit_tokens == 48


def _reference(wl: Workload, bs: int) -> int:
    seen: set[tuple[int, ...]] = set()
    hits = 0
    for r in wl.requests:
        toks = list(r.make_prompt()) + list(r.output_tokens())
        toks = toks[: r.prompt_len + r.output_len - 1]
        m = 0
        while m < (r.prompt_len - 1) // bs and (r.cache_salt, *toks[: (m + 1) * bs]) in seen:
            m += 1
        hits += m * bs
        for k in range(1, len(toks) // bs + 1):
            seen.add((r.cache_salt, *toks[: k * bs]))
    return hits


@pytest.mark.parametrize("seed", range(5))
def test_matches_a_naive_reference(seed: int) -> None:
    rng = random.Random(seed)
    stems = [[rng.randrange(5) for _ in range(rng.randrange(1, 80))] for _ in range(4)]
    reqs = []
    for i in range(30):
        p = list(rng.choice(stems)) + [rng.randrange(5) for _ in range(rng.randrange(1, 40))]
        if reqs and rng.random() < 0.3:
            prev = reqs[-1]
            p = list(prev.make_prompt()) + list(prev.output_tokens()) + p[:5]
        out = [rng.randrange(5) for _ in range(rng.randrange(1, 20))]
        reqs.append(_req(f"r{i}", p, float(i), out, rng.choice([None, None, "s"])))
    wl = Workload("w", reqs)
    for bs in (1, 4, 16):
        assert best_possible_hits(wl, bs).hit_tokens == _reference(wl, bs)


def test_mooncake_and_default_workloads() -> None:
    wl = read_mooncake(DATA / "mooncake_small.jsonl")
    best = best_possible_hits(wl, 16)
    # r1 shares ids [0, 1] with r0, r3 is ids [0, 1] (1024 tokens, last token recomputed),
    # r4 shares id 4 with r2
    assert best.hit_tokens == 1024 + 1008 + 512
    assert best.prompt_tokens == 1100 + 1300 + 600 + 1024 + 700 + 40
    chat = best_possible_hits(synthetic_chat(), 16)
    assert 0.5 < chat.hit_rate < 1.0


def test_prefix_keys() -> None:
    t = np.arange(64)
    k = prefix_block_keys(t, 16)
    assert k.shape == (4,)
    assert len(set(k.tolist())) == 4
    t2 = t.copy()
    t2[20] = 999
    k2 = prefix_block_keys(t2, 16)
    assert k2[0] == k[0]
    assert (k2[1:] != k[1:]).all()
    assert prefix_block_keys(t[:15], 16).shape == (0,)
    with pytest.raises(ValueError):
        best_possible_hits(Workload("w", []), 0)


def test_unbounded_prefix_cache_counts_like_a_python_reference() -> None:
    """The core's unbounded cache against a plain set of token prefixes."""

    from kvcoord._core import UnboundedPrefixCache

    rng = random.Random(7)
    bs = 4
    cache = UnboundedPrefixCache(bs)
    seen: set[tuple[object, ...]] = set()
    stems = [[rng.randrange(50) for _ in range(rng.randrange(0, 20))] for _ in range(6)]
    for _ in range(300):
        prompt = rng.choice(stems) + [rng.randrange(50) for _ in range(rng.randrange(1, 12))]
        output = [rng.randrange(50) for _ in range(rng.randrange(0, 9))]
        salt = rng.choice([None, None, "s"])
        computed = (prompt + output)[: len(prompt) + len(output) - 1]
        blocks = len(computed) // bs
        cap = min((len(prompt) - 1) // bs, blocks)
        want = 0
        while want < cap and (salt, tuple(computed[: (want + 1) * bs])) in seen:
            want += 1
        seen.update((salt, tuple(computed[: (k + 1) * bs])) for k in range(blocks))
        assert cache.add(prompt, np.asarray(output, dtype=np.int64), salt) == want * bs
    assert len(cache) == len(seen)


def test_unbounded_prefix_cache_refuses_bad_input_unchanged() -> None:
    from kvcoord._core import UnboundedPrefixCache
    from kvcoord.errors import ConfigError, InvalidTokenError

    with pytest.raises(ConfigError):
        UnboundedPrefixCache(0)
    cache = UnboundedPrefixCache(2)
    cache.add([1, 2, 3], [])
    with pytest.raises(InvalidTokenError):
        cache.add([1, 2, -1], [])
    assert (cache.prompt_tokens, cache.hit_tokens, len(cache)) == (3, 0, 1)


def test_tracker_block_size_is_checked_by_the_core() -> None:
    from kvcoord.errors import ConfigError
    from kvcoord.replay.bestcase import BestCaseTracker

    with pytest.raises(ConfigError):
        BestCaseTracker(0)
    assert BestCaseTracker(16).block_size == 16
