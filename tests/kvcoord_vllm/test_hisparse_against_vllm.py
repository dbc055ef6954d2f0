"""kvcoord's HiSparse manager (served unless ``KVCOORD_VLLM_HISPARSE=0``) beside
vLLM 0.33.0's own, each driven by vLLM's own ``HiSparseCoordinator``: the
four-group shape of vLLM's HiSparse tests (source on a host pool, indexer,
resident, hot), random schedules of admissions with prefix hits, chunked
prefill and decode steps (each followed by the coordinator's per-step
residency work), external loads (admitted whole, finished or failed; and
after a prefix hit, with the device cache evicted first, so the host's
longer hit is kept),
spills completed at random steps, hot regions asked for,
pool pressure (blocks taken and given back through the device pool),
finishes (a finished request's publication detaches), preemptions, prefix-cache
resets with nothing running, and
deferred frees (``pop_blocks_for_free``, the blocks freed later); with
KV-cache events on in half the caching schedules and vLLM's residency
metrics (every block sampled) in half the schedules. After
every operation both sides must agree on: hits, allocations, block tables,
residency rows, the planned page transfers, the coordinator's per-request
page states and copies, residency updates, both pools' free queues, the
residency metrics' ended block lives; and the
KV-cache events (host ones with medium CPU, group ids vLLM's); and the
kvcoord cores' invariants hold. Skipped without vLLM.
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip(
    "vllm.v1.core.kv_cache_manager", reason="needs vLLM 0.33.0 (pip install kvcoord[vllm])"
)

import torch
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmManager
from vllm.v1.core.kv_cache_metrics import KVCacheMetricsCollector
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.hisparse.coordinator import get_hisparse_coordinator
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    HiSparseHotSpec,
    HiSparseResidentSpec,
    KVCacheConfig,
    KVCacheGroupRole,
    KVCacheGroupSpec,
)
from vllm.v1.request import RequestStatus
from vllm_helpers import free_queue, make_request, manager_args, needs_served_hisparse

import kvcoord.vllm as kv
from kvcoord.vllm.hisparse._manager import HiSparseManager

BS = 16
MAX_MODEL_LEN = 160

pytestmark = needs_served_hisparse


@pytest.fixture(autouse=True)
def _setup(monkeypatch: pytest.MonkeyPatch) -> None:
    init_none_hash(sha256)
    monkeypatch.delenv("KVCOORD_VLLM_HISPARSE", raising=False)


def hisparse_config(num_blocks: int, host_blocks: int) -> KVCacheConfig:
    full = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32)
    groups = [
        KVCacheGroupSpec(
            ["source"], full, role=KVCacheGroupRole.HISPARSE_SOURCE, host_resident=True
        ),
        KVCacheGroupSpec(["indexer"], full, role=KVCacheGroupRole.HISPARSE_INDEXER),
        KVCacheGroupSpec(["resident"], HiSparseResidentSpec(block_size=BS, page_size=4 * BS)),
        KVCacheGroupSpec(
            ["hot"], HiSparseHotSpec(block_size=BS, page_size=4 * BS, blocks_per_request=2)
        ),
    ]
    return KVCacheConfig(
        num_blocks=num_blocks,
        hisparse_host_num_blocks=host_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=groups,
    )


def managers(
    num_blocks: int, host_blocks: int, caching: bool, events: bool = False, metrics: bool = False
) -> tuple[object, object]:
    args = manager_args(
        max_model_len=MAX_MODEL_LEN,
        scheduler_block_size=BS,
        hash_block_size=BS,
        enable_caching=caching,
        enable_kv_cache_events=events,
    )

    def collector() -> dict:
        # Every block sampled, so both sides follow the same lives.
        return {"metrics_collector": KVCacheMetricsCollector(1.0)} if metrics else {}

    theirs = VllmManager(hisparse_config(num_blocks, host_blocks), **args, **collector())
    ours = kv.KVCacheManager(hisparse_config(num_blocks, host_blocks), **args, **collector())
    assert type(ours) is HiSparseManager
    return theirs, ours


def ids_of(blocks: object) -> list[int]:
    return [b.block_id for b in blocks]  # type: ignore[attr-defined]


def transfers(coordinator: object) -> list[tuple]:
    command = coordinator.build_offload_command()  # type: ignore[attr-defined]
    return [
        (t.transfer_id, t.host_block_id, t.resident_block_ids, t.after_forward, t.restore)
        for t in command.page_transfers
    ]


def state_of(coordinator: object) -> dict:
    out = {}
    for rid, s in coordinator.request_states.items():  # type: ignore[attr-defined]
        out[rid] = (
            sorted(s.valid_pages),
            sorted(s.unpinned_pages),
            sorted(s.pinned_clean),
            s.ready_prefix_pages,
            sorted(s.pending_pages),
            s.publication is not None,
        )
    copies = {h: ids_of(b) for h, b in coordinator.copies.items()}  # type: ignore[attr-defined]
    return {"requests": out, "copies": copies}


def event_list(manager: object) -> list[tuple]:
    return [
        (
            type(e).__name__,
            getattr(e, "block_hashes", None),
            getattr(e, "parent_block_hash", None),
            getattr(e, "token_ids", None),
            getattr(e, "group_idx", None),
            getattr(e, "medium", None),
            getattr(e, "kv_cache_spec_kind", None),
        )
        for e in manager.take_events()  # type: ignore[attr-defined]
    ]


def lives_ended(manager: object) -> list[tuple[bool, int]]:
    """The residency metrics' block lives ended since the last call (none
    without a collector): per life, whether it was hit and its number of
    reuse gaps (the times are the clock's)."""
    collector = manager.metrics_collector  # type: ignore[attr-defined]
    if collector is None:
        return []
    manager.make_prefix_cache_stats()  # type: ignore[attr-defined]
    return [
        (e.idle_seconds < e.lifetime_seconds, len(e.reuse_gaps_seconds))
        for e in collector.drain_events()
    ]


def compare(pair: tuple, coordinators: tuple, live: list[str]) -> None:
    theirs, ours = pair
    assert event_list(theirs) == event_list(ours)
    assert lives_ended(theirs) == lives_ended(ours)
    assert free_queue(theirs) == free_queue(ours)
    host = [c.get_host_block_pool().free_block_queue.get_all_free_blocks() for c in coordinators]
    assert ids_of(host[0]) == ids_of(host[1])
    # Which free host blocks still hold a cached prefix (reuse would lose it).
    cached = [[b.block_hash is not None for b in h] for h in host]
    assert cached[0] == cached[1]
    assert state_of(coordinators[0]) == state_of(coordinators[1])
    for rid in live:
        assert theirs.get_block_ids(rid) == ours.get_block_ids(rid), rid
        rows = [ids_of(c.resident_managers[0].get_residency_row(rid)) for c in coordinators]
        assert rows[0] == rows[1], rid
        hot = [c.hot_managers[0].has_hot(rid) for c in coordinators]
        assert hot[0] == hot[1], rid
    ours.check_invariants()


@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("seed", range(40))
def test_hisparse_manager_matches_vllm(seed: int, caching: bool) -> None:
    rng = random.Random(seed)
    events = caching and seed % 2 == 0
    metrics = seed % 4 < 2
    pair = managers(rng.choice([16, 24, 40]), rng.choice([12, 24, 40]), caching, events, metrics)
    coordinators = tuple(get_hisparse_coordinator(m) for m in pair)
    bases = [[rng.randrange(1000) for _ in range(140)] for _ in range(2)]
    waiting: list[tuple] = []
    running: list[tuple] = []
    pending: list[int] = []  # transfer ids planned, not yet completed
    held: list[tuple] = []  # device blocks taken through the pool (pressure)
    importing: list[tuple] = []  # (requests, tokens) whose external load is in flight
    next_id = 0

    def step(reqs: tuple, new_tokens: int, hit: tuple | None) -> bool:
        kwargs = [{} for _ in pair]
        if hit is not None:
            for k, (blocks, n) in zip(kwargs, hit, strict=True):
                if n:
                    k.update(num_new_computed_tokens=n, new_computed_blocks=blocks)
        got = [
            m.allocate_slots(r, new_tokens, **k) for m, r, k in zip(pair, reqs, kwargs, strict=True)
        ]
        assert (got[0] is None) == (got[1] is None)
        if got[0] is None:
            return False
        assert got[0].get_block_ids() == got[1].get_block_ids()
        computed = reqs[0].num_computed_tokens + (hit[0][1] if hit else 0)
        done = min(computed + new_tokens, reqs[0].num_tokens)
        for c, r in zip(coordinators, reqs, strict=True):
            c.advance_scheduled([(r.request_id, done)])
            r.num_computed_tokens = done
        planned = [transfers(c) for c in coordinators]
        assert planned[0] == planned[1]
        pending.extend(t[0] for t in planned[0])
        # The rest of what HiSparse's connector hands the worker each step.
        scheduled = ((reqs[0].request_id, computed, done - computed),)
        for read in (
            lambda c: c.build_row_mirrors(scheduled),
            lambda c: c.all_context_pages_resident(scheduled),
            lambda c: [(x.src_block_id, x.dst_block_id) for x in c.take_host_block_copies()],
        ):
            assert read(coordinators[0]) == read(coordinators[1])
        updates = [c.take_residency_updates([reqs[0].request_id]) for c in coordinators]
        assert {k: (v.pages, v.block_ids) for k, v in updates[0].items()} == {
            k: (v.pages, v.block_ids) for k, v in updates[1].items()
        }
        return True

    for _ in range(60):
        op = rng.random()
        if op < 0.25 or not (running or waiting):
            base = rng.choice(bases)
            length = rng.randrange(8, 130)
            tokens = base[:length]
            rid = f"r{next_id}"
            next_id += 1
            waiting.append(tuple(make_request(rid, tokens, BS) for _ in pair))
        elif op < 0.3 and waiting and waiting[0][0].num_computed_tokens == 0:
            # An external (connector) load of a prefix, admitted whole.
            reqs = waiting[0]
            n = rng.randrange(1, reqs[0].num_tokens)
            got = [
                m.allocate_slots(
                    r,
                    0,
                    num_external_computed_tokens=n,
                    delay_cache_blocks=True,
                    full_sequence_must_fit=True,
                )
                for m, r in zip(pair, reqs, strict=True)
            ]
            assert (got[0] is None) == (got[1] is None)
            if got[0] is not None:
                assert got[0].get_block_ids() == got[1].get_block_ids()
                waiting.pop(0)
                importing.append((reqs, n))
        elif op < 0.33 and caching and waiting and waiting[0][0].num_computed_tokens == 0:
            # A prefix hit with an external load past it, as HiSparse's
            # connector reports the host's longer hit: the source group keeps
            # the host blocks the hit and the load cover together.
            reqs = waiting[0]
            if rng.random() < 0.6:
                # Evict the device pool's free cached blocks (the host pool
                # keeps its copies), so the host hit is the longer one.
                free = pair[0].block_pool.get_num_free_blocks()
                taken = [m.block_pool.get_new_blocks(free) for m in pair]
                for m, blocks in zip(pair, taken, strict=True):
                    m.block_pool.free_blocks(blocks)
            found = [m.get_computed_blocks(r) for m, r in zip(pair, reqs, strict=True)]
            hit_tokens = found[0][1]
            if hit_tokens + 1 >= reqs[0].num_tokens:
                continue
            n = rng.randrange(1, reqs[0].num_tokens - hit_tokens)
            got = [
                m.allocate_slots(
                    r,
                    0,
                    num_new_computed_tokens=hit_tokens,
                    new_computed_blocks=f[0],
                    num_external_computed_tokens=n,
                    delay_cache_blocks=True,
                    full_sequence_must_fit=True,
                )
                for m, r, f in zip(pair, reqs, found, strict=True)
            ]
            assert (got[0] is None) == (got[1] is None)
            if got[0] is not None:
                assert got[0].get_block_ids() == got[1].get_block_ids()
                waiting.pop(0)
                importing.append((reqs, hit_tokens + n))
        elif op < 0.35 and importing:
            reqs, n = importing.pop(rng.randrange(len(importing)))
            failed = rng.random() < 0.2
            for c, r in zip(coordinators, reqs, strict=True):
                c.finish_host_import(r.request_id, failed=failed)
            planned = [transfers(c) for c in coordinators]
            assert planned[0] == planned[1]
            pending.extend(t[0] for t in planned[0])
            if failed:
                for m, r in zip(pair, reqs, strict=True):
                    m.free(r)
            else:
                for r in reqs:
                    r.num_computed_tokens = n
                running.append(reqs)
        elif op < 0.45 and waiting:
            reqs = waiting[0]
            hit = None
            if caching:
                found = [m.get_computed_blocks(r) for m, r in zip(pair, reqs, strict=True)]
                assert [ids_of(g) for g in found[0][0].blocks] == [
                    ids_of(g) for g in found[1][0].blocks
                ]
                assert found[0][1] == found[1][1]
                hit = tuple((f[0], f[1]) for f in found)
            done = reqs[0].num_computed_tokens + (hit[0][1] if hit else 0)
            chunk = min(rng.choice([16, 32, 64]), reqs[0].num_tokens - done)
            if chunk > 0 and step(reqs, chunk, hit):
                waiting.pop(0)
                running.append(reqs)
        elif op < 0.7 and running:
            reqs = rng.choice(running)
            r0 = reqs[0]
            if r0.num_computed_tokens >= r0.num_tokens:
                if r0.num_tokens >= MAX_MODEL_LEN - 1:
                    continue
                token = rng.randrange(1000)
                for r in reqs:
                    r.append_output_token_ids(token)
            chunk = min(rng.choice([1, 16, 32]), r0.num_tokens - r0.num_computed_tokens)
            step(reqs, chunk, None)
        elif op < 0.8 and pending:
            chosen = [t for t in pending if rng.random() < 0.6]
            counts = {t: 1 for t in chosen}
            for c in coordinators:
                c.update_spills(counts, counts)
            pending[:] = [t for t in pending if t not in counts]
        elif op < 0.86 and running:
            reqs = running.pop(rng.randrange(len(running)))
            finished = rng.random() < 0.6
            deferred = rng.random() < 0.4  # freed later, as with a step in flight
            popped = []
            for m, r in zip(pair, reqs, strict=True):
                if finished:
                    r.status = RequestStatus.FINISHED_STOPPED
                if deferred:
                    popped.append(m.pop_blocks_for_free(r))
                else:
                    m.free(r)
            if popped:
                assert ids_of(popped[0]) == ids_of(popped[1])
                compare(pair, coordinators, [])
                for m, blocks in zip(pair, popped, strict=True):
                    m.block_pool.free_blocks(reversed(blocks))
            if not finished:
                for r in reqs:
                    r.num_computed_tokens = 0
                    r.status = RequestStatus.PREEMPTED
                waiting.insert(0, reqs)
        elif op < 0.92 and running:
            rid = rng.choice(running)[0].request_id
            for c in coordinators:
                c.hot_managers[0].require_hot(rid)
        elif op < 0.93 and not running and not importing:
            # A reset with nothing running: blocks held through the device
            # pool keep its cache alone.
            answers = [m.reset_prefix_cache() for m in pair]
            assert answers[0] == answers[1]
        elif held and rng.random() < 0.5:
            got = held.pop()
            for m, blocks in zip(pair, got, strict=True):
                m.block_pool.free_blocks(blocks)
        else:
            free = pair[0].block_pool.get_num_free_blocks()
            n = min(free, rng.randrange(1, 4))
            if n:
                held.append(tuple(m.block_pool.get_new_blocks(n) for m in pair))
        live = [r[0].request_id for r in running] + [r[0][0].request_id for r in importing]
        compare(pair, coordinators, live)


def test_import_past_a_device_miss_keeps_the_longer_host_hit() -> None:
    """Regression: the device pool lost a prefix the host pool still holds,
    and the connector imports tokens past the (empty) hit. vLLM's source
    group keeps the host blocks the import covers (they hold those tokens
    already); kvcoord took fresh host blocks and dropped the cached ones."""
    pair = managers(24, 40, True, True)
    coordinators = tuple(get_hisparse_coordinator(m) for m in pair)
    tokens = list(range(100))
    first = [make_request("a", tokens, BS) for _ in pair]
    for m, r in zip(pair, first, strict=True):
        assert m.allocate_slots(r, len(tokens)) is not None
    for c, r in zip(coordinators, first, strict=True):
        c.advance_scheduled([(r.request_id, len(tokens))])
        r.num_computed_tokens = len(tokens)
    planned = [transfers(c) for c in coordinators]
    assert planned[0] == planned[1] and planned[0]
    done = {t[0]: 1 for t in planned[0]}
    for c in coordinators:
        c.update_spills(done, done)  # the host copies are durable: published
    for m, r in zip(pair, first, strict=True):
        r.status = RequestStatus.FINISHED_STOPPED
        m.free(r)
    for m in pair:  # the device pool reuses every free block: its cache is gone
        m.block_pool.free_blocks(m.block_pool.get_new_blocks(m.block_pool.get_num_free_blocks()))
    second = [make_request("b", tokens, BS) for _ in pair]
    found = [m.get_computed_blocks(r) for m, r in zip(pair, second, strict=True)]
    assert found[0][1] == found[1][1] == 0
    host_hit = ids_of(found[0][0].blocks[0])
    assert len(host_hit) > 2 and ids_of(found[1][0].blocks[0]) == host_hit
    for m, r, f in zip(pair, second, found, strict=True):
        got = m.allocate_slots(
            r,
            0,
            new_computed_blocks=f[0],
            num_external_computed_tokens=2 * BS + 8,
            delay_cache_blocks=True,
            full_sequence_must_fit=True,
        )
        assert got is not None
    tables = [m.get_block_ids("b") for m in pair]
    assert tables[0] == tables[1]
    assert tables[1][0] == host_hit[:3]
    compare(pair, coordinators, ["b"])


@pytest.mark.parametrize("hold", ["device", "host", "none"])
def test_reset_prefix_cache_resets_each_free_pool(hold: str) -> None:
    """vLLM resets each pool that has no block in use and answers whether
    both did: a block held in one pool does not keep the other's cache."""
    pair = managers(24, 40, True, True)
    coordinators = tuple(get_hisparse_coordinator(m) for m in pair)
    tokens = list(range(100))
    first = [make_request("a", tokens, BS) for _ in pair]
    for m, r in zip(pair, first, strict=True):
        assert m.allocate_slots(r, len(tokens)) is not None
    for c, r in zip(coordinators, first, strict=True):
        c.advance_scheduled([(r.request_id, len(tokens))])
        r.num_computed_tokens = len(tokens)
    done = {t[0]: 1 for t in transfers(coordinators[0])}
    for c in coordinators:
        c.update_spills(done, done)
    for m, r in zip(pair, first, strict=True):
        r.status = RequestStatus.FINISHED_STOPPED
        m.free(r)
    compare(pair, coordinators, [])
    held = []
    for m, c in zip(pair, coordinators, strict=True):
        pool = {"device": m.block_pool, "host": c.get_host_block_pool(), "none": None}[hold]
        held.append((pool, pool.get_new_blocks(1) if pool is not None else []))
    answers = [m.reset_prefix_cache() for m in pair]
    assert answers[0] == answers[1] == (hold == "none"), answers
    compare(pair, coordinators, [])
    for pool, blocks in held:
        if pool is not None:
            pool.free_blocks(blocks)
    compare(pair, coordinators, [])
