"""Python-level cost of the pool, FFI crossing included, beside a pure-Python
pool in vLLM's style. `make bench` runs these; compare groups pairwise."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import kvcoord
from vllm_style_pool import VllmStylePool

NUM_BLOCKS = 1_000_000
BATCH = 64
# Sub-microsecond steps are timed in rounds of many calls, so the timer's own
# cost (two perf_counter calls, comparable to one step here) is amortised.
ITERATIONS = 500
ROUNDS = 200

# Median ns per block of each get+free case, for the summary in conftest.py.
PER_BLOCK_NS: dict[str, float] = {}


def _per_block(benchmark, name: str, step) -> None:  # type: ignore[no-untyped-def]
    benchmark.pedantic(step, iterations=ITERATIONS, rounds=ROUNDS, warmup_rounds=5)
    PER_BLOCK_NS[name] = benchmark.stats.stats.median * 1e9 / BATCH


@pytest.mark.benchmark(group="pool/construct_1M")
def test_construct_kvcoord(benchmark) -> None:  # type: ignore[no-untyped-def]
    benchmark(kvcoord.BlockPool, NUM_BLOCKS)


@pytest.mark.benchmark(group="pool/construct_1M")
def test_construct_vllm_style(benchmark) -> None:  # type: ignore[no-untyped-def]
    benchmark.pedantic(VllmStylePool, args=(NUM_BLOCKS,), rounds=2, iterations=1)


@pytest.mark.benchmark(group="pool/get_free_64")
def test_get_free_kvcoord_list(benchmark) -> None:  # type: ignore[no-untyped-def]
    pool = kvcoord.BlockPool(NUM_BLOCKS)

    def step() -> None:
        ids = pool.get_new_blocks(BATCH)
        pool.free_blocks(ids)

    _per_block(benchmark, "kvcoord, lists", step)


@pytest.mark.benchmark(group="pool/get_free_64")
def test_get_free_kvcoord_array(benchmark) -> None:  # type: ignore[no-untyped-def]
    pool = kvcoord.BlockPool(NUM_BLOCKS)

    def step() -> None:
        pool.free_blocks(pool.get_new_blocks_array(BATCH))

    _per_block(benchmark, "kvcoord, numpy arrays", step)


@pytest.mark.benchmark(group="pool/get_free_64")
def test_get_free_vllm_style(benchmark) -> None:  # type: ignore[no-untyped-def]
    pool = VllmStylePool(100_000)

    def step() -> None:
        pool.free_blocks(pool.get_new_blocks(BATCH))

    _per_block(benchmark, "vLLM-style Python pool", step)


def _hashes(n: int) -> list[bytes]:
    return [hashlib.sha256(i.to_bytes(8, "little")).digest() for i in range(n)]


@pytest.mark.benchmark(group="pool/cache_full_blocks_64")
def test_cache_kvcoord(benchmark) -> None:  # type: ignore[no-untyped-def]
    hashes = _hashes(BATCH)

    def setup():  # type: ignore[no-untyped-def]
        pool = kvcoord.BlockPool(4 * BATCH)
        return (pool, pool.get_new_blocks(BATCH)), {}

    benchmark.pedantic(
        lambda pool, ids: pool.cache_full_blocks(ids, hashes, 0, BATCH, 0),
        setup=setup,
        rounds=2000,
    )


@pytest.mark.benchmark(group="pool/cache_full_blocks_64")
def test_cache_vllm_style(benchmark) -> None:  # type: ignore[no-untyped-def]
    hashes = _hashes(BATCH)

    def setup():  # type: ignore[no-untyped-def]
        pool = VllmStylePool(4 * BATCH)
        return (pool, pool.get_new_blocks(BATCH)), {}

    benchmark.pedantic(
        lambda pool, blocks: pool.cache_full_blocks(blocks, hashes, 0), setup=setup, rounds=2000
    )


@pytest.fixture(scope="module")
def cached_pools() -> tuple[kvcoord.BlockPool, VllmStylePool, list[bytes]]:
    n = 100_000
    hashes = _hashes(n)
    pool = kvcoord.BlockPool(n + 1)
    pool.cache_full_blocks(pool.get_new_blocks(n), hashes, 0, n, 0)
    ref = VllmStylePool(n + 1)
    ref.cache_full_blocks(ref.get_new_blocks(n), hashes, 0)
    return pool, ref, hashes


@pytest.mark.benchmark(group="pool/get_cached_block_hit")
def test_hit_kvcoord(benchmark, cached_pools) -> None:  # type: ignore[no-untyped-def]
    pool, _, hashes = cached_pools
    benchmark(pool.get_cached_block, hashes[777], [0])


@pytest.mark.benchmark(group="pool/get_cached_block_hit")
def test_hit_vllm_style(benchmark, cached_pools) -> None:  # type: ignore[no-untyped-def]
    _, ref, hashes = cached_pools
    benchmark(ref.get_cached_block, hashes[777], [0])


@pytest.mark.benchmark(group="pool/touch_free_64")
def test_touch_free_kvcoord(benchmark) -> None:  # type: ignore[no-untyped-def]
    pool = kvcoord.BlockPool(10_000)
    ids = np.asarray(pool.get_new_blocks(BATCH), dtype=np.int64)

    def step() -> None:
        pool.touch(ids)
        pool.free_blocks(ids)

    benchmark(step)
