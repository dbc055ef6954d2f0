"""Threads sharing one KVCacheManager (issue 11, class 7).

The contract (README, "Threads"): each manager call is atomic, but a
scheduler's get_computed_blocks -> allocate_slots sequence is not, so
another thread may evict the hit blocks in between. allocate_slots then
refuses the stale hits with InvalidArgumentError (nothing changed) instead
of adopting blocks that now hold other data. This test runs several threads
on one small, constantly evicting pool for a few seconds with a tiny GIL
switch interval (and prompts long enough that hashing releases the GIL) and
checks, after every admission, that each adopted hit block holds exactly
this request's prefix; at the end every block is free and the invariants
hold. Before hits were verified it failed within the first second.
"""

from __future__ import annotations

import random
import sys
import threading
import time

import pytest

import kvcoord
from kvcoord import (
    FullAttentionSpec,
    InvalidArgumentError,
    KVCacheConfig,
    KVCacheGroup,
    KVCacheManager,
    Request,
    SlidingWindowSpec,
)

B = 4
SECONDS = 3.0
THREADS = 4


def _worker(
    mgr: KVCacheManager,
    tid: int,
    deadline: float,
    errors: list[str],
    counts: dict[str, int],
    lock: threading.Lock,
) -> None:
    rng = random.Random(tid)
    prefixes = [[p] * 24 for p in range(6)]
    n = 0
    while time.monotonic() < deadline and not errors:
        n += 1
        # Mostly short prompts sharing prefixes; now and then a long one,
        # whose hashing runs without the GIL.
        tail = [rng.randrange(1000) for _ in range(rng.randrange(1, 12))]
        if rng.random() < 0.02:
            tail = tail * 500
        r = Request(f"t{tid}-{n}", rng.choice(prefixes) + tail, hash_block_size=B)
        blocks, hit = mgr.get_computed_blocks(r)
        time.sleep(0)  # invite a switch inside the race window
        try:
            new = mgr.allocate_slots(r, r.num_tokens - hit, hit, blocks)
        except InvalidArgumentError as e:
            with lock:
                counts["stale"] += 1
            if "not cached for this request's prefix" not in str(e) and "null block" not in str(e):
                errors.append(f"unexpected refusal: {e}")
            continue
        if new is None:
            with lock:
                counts["no_room"] += 1
            continue
        with lock:
            counts["admitted"] += 1
        # Held blocks cannot be evicted, so their keys are stable here.
        pool = mgr.block_pool
        hashes = r.block_hashes
        for g, ids in enumerate(mgr.get_block_ids(r.request_id)):
            for i, b in enumerate(ids[: hit // B]):
                if b == 0:
                    continue
                key = pool.block_hash(b)
                if key != (hashes[i], g):
                    errors.append(f"{r.request_id}: block {b} at {i} holds {key}, not its prefix")
        r.num_computed_tokens = r.num_tokens
        for _ in range(rng.randrange(3)):
            r.append_output_token_ids(rng.randrange(1000))
            if mgr.allocate_slots(r, 1) is None:
                break
            r.num_computed_tokens += 1
        mgr.free(r)


def _run(mgr: KVCacheManager) -> dict[str, int]:
    errors: list[str] = []
    counts = {"stale": 0, "no_room": 0, "admitted": 0}
    lock = threading.Lock()
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        deadline = time.monotonic() + SECONDS
        threads = [
            threading.Thread(target=_worker, args=(mgr, t, deadline, errors, counts, lock))
            for t in range(THREADS)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors[:5]
    mgr.check_invariants()
    assert mgr.num_running_requests == 0
    assert mgr.block_pool.num_free_blocks == mgr.block_pool.num_blocks - 1
    return counts


def test_threads_on_one_full_attention_manager() -> None:
    config = KVCacheConfig(48, (KVCacheGroup(FullAttentionSpec(B)),))
    counts = _run(KVCacheManager(config, max_model_len=1 << 16))
    assert counts["admitted"] > 100, counts


def test_threads_on_one_hybrid_manager() -> None:
    groups = (KVCacheGroup(FullAttentionSpec(B)), KVCacheGroup(SlidingWindowSpec(B, 8)))
    counts = _run(KVCacheManager(KVCacheConfig(96, groups), max_model_len=1 << 16))
    assert counts["admitted"] > 100, counts


def test_threading_contract_is_documented() -> None:
    from pathlib import Path

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert "### Threads" in readme
    assert kvcoord.InvalidArgumentError.__doc__


def test_call_waits_while_another_thread_is_inside_a_collection() -> None:
    """A garbage collection started inside a manager call runs Python code
    (gc callbacks, finalizers), where the interpreter may switch threads.
    The other thread's call must wait for the first one, not fail. Before
    the state was behind a lock, hundreds of the other thread's calls raised
    RuntimeError("Already borrowed") here."""
    import gc

    mgr = KVCacheManager(
        KVCacheConfig(4096, (KVCacheGroup(FullAttentionSpec(B)),)), max_model_len=1 << 16
    )
    main = threading.current_thread()
    stop = threading.Event()
    failures: list[str] = []
    other_calls = [0]

    def slow_collection(phase: str, info: dict[str, int]) -> None:
        # Hand the GIL to the other thread while this one may be inside a call.
        if phase == "start" and threading.current_thread() is main:
            time.sleep(0.0005)

    def admit_and_free(name: str) -> None:
        r = Request(name, list(range(40)), hash_block_size=B)
        blocks, hit = mgr.get_computed_blocks(r)
        if mgr.allocate_slots(r, r.num_tokens - hit, hit, blocks) is not None:
            mgr.free(r)

    def other() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                admit_and_free(f"other-{n}")
                _ = mgr.block_pool.num_free_blocks
                other_calls[0] += 1
            except RuntimeError as e:
                failures.append(str(e))

    thread = threading.Thread(target=other)
    old_threshold = gc.get_threshold()
    thread.start()
    gc.callbacks.append(slow_collection)
    gc.set_threshold(1)
    try:
        for n in range(600):
            admit_and_free(f"main-{n}")
    finally:
        gc.set_threshold(*old_threshold)
        gc.callbacks.remove(slow_collection)
        stop.set()
        thread.join()
    assert not failures, failures[:3]
    assert other_calls[0] > 0
    mgr.check_invariants()
    assert mgr.block_pool.num_free_blocks == mgr.block_pool.num_blocks - 1


def test_reentrant_call_on_the_same_thread_is_refused_and_changes_nothing() -> None:
    """An argument whose iteration calls back into the same object (here a
    generator reading the pool) cannot wait for itself: RuntimeError, and
    the call it interrupted changed nothing."""
    pool = kvcoord.BlockPool(16)
    held = pool.get_new_blocks(3)

    def ids_reading_the_pool():
        for b in held:
            _ = pool.num_free_blocks  # re-enters the pool mid-call
            yield b

    with pytest.raises(RuntimeError, match="re-entrant"):
        pool.free_blocks(ids_reading_the_pool())
    assert pool.num_free_blocks == 16 - 1 - 3
    pool.check_invariants()
    pool.free_blocks(held)
    assert pool.num_free_blocks == 15
