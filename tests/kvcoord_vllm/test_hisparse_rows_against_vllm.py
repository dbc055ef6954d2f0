"""kvcoord's HiSparse device groups (the core's resident and hot kinds)
beside vLLM 0.33.0's own managers for them: a vLLM ``KVCacheManager`` over
an indexer (full attention), a ``HiSparseResidentSpec`` group and a
``HiSparseHotSpec`` group, and a ``kvcoord._core.CoordinatorCore`` over the
same three kinds, driven by random schedules of admissions (with and
without imported tokens), chunked prefill and decode steps, and the row
operations vLLM's ``HiSparseCoordinator`` issues: asking for the hot
region, unpinning a resident page, dropping the pages whose blocks the pool
reused, adopting a device copy into a host-only page, spill pins (a touch
and a later free), frees and preemptions (readmission from token 0); with
and without prefix caching (hits on the indexer make host-prefix rows) and
an admission cap. Every hit, allocation, prediction (a step's, and the
capped full-sequence one), block table, residency row, hot region, reuse
report and the free queue must be equal, and the core's invariants hold
after each operation.

This covers kvcoord's rules under the HiSparse policy, not the policy
itself: the test plays the coordinator's part (vLLM's managers get a stub
coordinator that records nothing), and the source (host) group is not
here. kvcoord.vllm still hands HiSparse configurations to vLLM's manager
(docs/hisparse.md). Skipped without vLLM.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

pytest.importorskip(
    "vllm.v1.core.kv_cache_manager", reason="needs vLLM 0.33.0 (pip install kvcoord[vllm])"
)

from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmManager
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.kv_cache_interface import (
    HiSparseHotSpec,
    HiSparseResidentSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm_helpers import free_queue, full_spec, make_request, manager_args, needs_served_hisparse

import kvcoord._core as kc
from kvcoord.config import FullAttentionSpec as OurFull
from kvcoord.config import HiSparseHotSpec as OurHot
from kvcoord.config import HiSparseResidentSpec as OurResident
from kvcoord.config import KVCacheConfig as OurConfig
from kvcoord.config import KVCacheGroup
from kvcoord.coordinator import KVCacheCoordinator, get_kv_cache_coordinator

BS = 16
HOT = 2
INDEXER, RESIDENT, HOT_GROUP = 0, 1, 2
MAX_MODEL_LEN = 160

pytestmark = needs_served_hisparse


@pytest.fixture(autouse=True)
def _none_hash() -> None:
    init_none_hash(sha256)


def vllm_manager(num_blocks: int, max_in_flight: int | None, caching: bool) -> VllmManager:
    groups = [
        KVCacheGroupSpec(["indexer"], full_spec(BS)),
        KVCacheGroupSpec(["resident"], HiSparseResidentSpec(block_size=BS, page_size=BS * 4)),
        KVCacheGroupSpec(
            ["hot"], HiSparseHotSpec(block_size=BS, page_size=BS * 4, blocks_per_request=HOT)
        ),
    ]
    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    manager = VllmManager(
        config,
        **manager_args(
            max_model_len=MAX_MODEL_LEN,
            max_in_flight_tokens=max_in_flight,
            enable_caching=caching,
            hash_block_size=BS,
            scheduler_block_size=BS,
        ),
    )
    managers = manager.coordinator.single_type_managers
    # The test plays HiSparseCoordinator's part itself.
    stub = SimpleNamespace(
        resident_managers=(managers[RESIDENT],),
        commit_computed_blocks=lambda *_: None,
        free=lambda *_: None,
    )
    for m in managers[1:]:
        m.coordinator = stub
    return manager


def ours_coordinator(num_blocks: int, caching: bool) -> KVCacheCoordinator:
    groups = (OurFull(BS), OurResident(BS), OurHot(BS, HOT))
    config = OurConfig(num_blocks=num_blocks, groups=tuple(KVCacheGroup(g) for g in groups))
    return get_kv_cache_coordinator(
        config, max_model_len=MAX_MODEL_LEN, enable_caching=caching, hash_block_size=BS
    )


class Pair:
    """One request on both engines."""

    def __init__(self, rid: str, tokens: list[int]) -> None:
        self.rid = rid
        self.theirs = make_request(rid, tokens, BS)
        self.ours = kc.Request(rid, tokens, hash_block_size=BS)
        self.unpinned: set[int] = set()  # pages whose reference the row gave up

    @property
    def computed(self) -> int:
        return int(self.theirs.num_computed_tokens)

    def set_computed(self, n: int) -> None:
        self.theirs.num_computed_tokens = n
        self.ours.num_computed_tokens = n

    def append(self, token: int) -> None:
        self.theirs.append_output_token_ids(token)
        self.ours.append_output_token_ids(token)


def compare(theirs: VllmManager, ours: kc.CoordinatorCore, live: dict[str, Pair]) -> None:
    managers = theirs.coordinator.single_type_managers
    assert free_queue(theirs) == ours.block_pool.free_block_ids().tolist()
    for rid in live:
        tables = ours.blocks(rid).get_block_ids()
        for g, m in enumerate(managers):
            assert [b.block_id for b in m.req_to_blocks[rid]] == tables[g], (rid, g)
        row = [b.block_id for b in managers[RESIDENT].get_residency_row(rid)]
        assert row == ours.residency_row(rid, RESIDENT)
        assert managers[HOT_GROUP].has_hot(rid) == ours.has_hot(rid, HOT_GROUP)
    ours.check_invariants()


@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("max_in_flight", [None, 48])
@pytest.mark.parametrize("seed", range(20))
def test_hisparse_rows_match_vllm(seed: int, max_in_flight: int | None, caching: bool) -> None:
    rng = random.Random(seed)
    num_blocks = rng.choice([12, 20, 32])
    theirs = vllm_manager(num_blocks, max_in_flight, caching)
    lookup = ours_coordinator(num_blocks, caching)
    ours = lookup.core
    managers = theirs.coordinator.single_type_managers
    resident, hot = managers[RESIDENT], managers[HOT_GROUP]
    pool = theirs.block_pool
    live: dict[str, Pair] = {}
    owners: dict[int, set[tuple[str, int]]] = {}
    reused: list[int] = []
    pins: list[int] = []  # spill pins (caller references) on both engines
    waiting: list[Pair] = []  # preempted requests
    next_id = 0
    bases = [[rng.randrange(1000) for _ in range(90)] for _ in range(3)]

    def on_reuse(block: object) -> None:
        reused.append(block.block_id)  # type: ignore[attr-defined]

    def lose_reused() -> None:
        """What the coordinator does when the pool hands an unpinned block
        out: every page reading it becomes host-only."""
        assert ours.take_reused_watched() == reused
        for b in reused:
            for rid, page in owners.pop(b, ()):
                pair = live.get(rid)
                if pair is None or page not in pair.unpinned:
                    continue
                got = resident.drop_resident_page(rid, page)
                assert ours.drop_resident_page(rid, RESIDENT, page) == got.block_id
                pair.unpinned.discard(page)
        reused.clear()

    def predictions_agree(pair: Pair, new: int, external: int, hit: tuple[object, ...]) -> None:
        """vLLM's full-sequence admission prediction (capped) and a step's."""
        their_hits = tuple([] for _ in managers)
        our_hits = None
        local = pair.computed
        if hit:
            their_hits, computed, our_hits = hit[0].blocks, hit[1], hit[2]
            local += computed
        total = min(local + external, MAX_MODEL_LEN)
        for num_tokens, cap in (
            (min(pair.theirs.num_tokens, MAX_MODEL_LEN), True),
            (min(total + new, MAX_MODEL_LEN), False),
        ):
            want = theirs.coordinator.get_num_blocks_to_allocate(
                request_id=pair.rid,
                num_tokens=num_tokens,
                new_computed_blocks=their_hits,
                num_encoder_tokens=0,
                total_computed_tokens=total,
                num_local_computed_tokens=local,
                num_tokens_main_model=num_tokens,
                apply_admission_cap=cap,
            )
            got = ours.num_blocks_to_allocate(
                pair.ours,
                num_tokens,
                our_hits,
                total_computed_tokens=total,
                max_in_flight_tokens=(max_in_flight or MAX_MODEL_LEN) if cap else None,
                num_local_computed_tokens=local,
            )
            assert got == want, (pair.rid, num_tokens, cap, local, external)

    def allocate(pair: Pair, new: int, external: int = 0, hit: tuple[object, ...] = ()) -> None:
        predictions_agree(pair, new, external, hit)
        kw: dict[str, object] = {"num_external_computed_tokens": external} if external else {}
        computed = 0
        if hit:
            their_blocks, computed, our_blocks = hit
            kw.update(num_new_computed_tokens=computed, new_computed_blocks=their_blocks)
        got = theirs.allocate_slots(pair.theirs, new, **kw)
        mine = ours.allocate_slots(
            pair.ours,
            new,
            num_new_computed_tokens=computed,
            new_computed_blocks=our_blocks if computed else None,
            num_external_computed_tokens=external,
        )
        assert (got is None) == (mine is None), (pair.rid, new, external, computed)
        if got is not None:
            assert got.get_block_ids() == mine.get_block_ids()
            live[pair.rid] = pair
            pair.set_computed(pair.computed + computed + external + new)

    for _ in range(70):
        op = rng.choice(["new", "new", "step", "step", "step", "hot", "unpin", "unpin",
                         "adopt", "pin", "unpin_pin", "free"])  # fmt: skip
        running = [p for p in live.values()]
        if op == "new":
            readmit = bool(waiting) and rng.random() < 0.5
            if readmit:
                # A preempted request comes back from token 0.
                pair = waiting.pop(0)
                n = pair.theirs.num_tokens
            else:
                n = rng.randint(1, 90)
                # Prompts share prefixes of a few bases (hits, with caching on).
                base = rng.choice(bases)[: rng.randint(0, n)]
                tokens = base + [rng.randrange(1000) for _ in range(n - len(base))]
                pair = Pair(f"r{next_id}", tokens)
                next_id += 1
            hit: tuple[object, ...] = ()
            computed = 0
            if caching:
                their_blocks, computed, _ = theirs.get_computed_blocks(pair.theirs)
                found = lookup.find_longest_cache_hit(pair.ours, n - 1)
                assert found[1] == computed
                assert [len(g) for g in their_blocks.get_block_ids()] == [
                    len(g) for g in found[0].get_block_ids()
                ]
                if computed:
                    hit = (their_blocks, computed, found[0])
            rest = n - computed
            external = rng.choice([0, 0, rng.randint(1, rest)]) if rest else 0
            chunk = rng.randint(0 if external or computed else 1, rest - external)
            allocate(pair, chunk, external, hit)
            if readmit and pair.rid not in live:
                waiting.insert(0, pair)
        elif op == "step" and running:
            pair = rng.choice(running)
            left = pair.theirs.num_tokens - pair.computed
            if left <= 0:
                if pair.theirs.num_tokens >= MAX_MODEL_LEN:
                    continue
                pair.append(rng.randrange(1000))
                left = 1
            allocate(pair, rng.randint(1, left))
        elif op == "hot" and running:
            pair = rng.choice(running)
            hot.require_hot(pair.rid)
            ours.require_hot(pair.rid, HOT_GROUP)
        elif op == "unpin" and running:
            pair = rng.choice(running)
            pages = [
                i
                for i in range(len(resident.req_to_blocks[pair.rid]))
                if resident.get_resident_page(pair.rid, i) is not None and i not in pair.unpinned
            ]
            if not pages:
                continue
            page = rng.choice(pages)
            block = resident.get_resident_page(pair.rid, page)
            # vLLM's coordinator names the block to its pool, as here.
            pool.unpin_blocks([block], on_reuse)
            if rng.random() < 0.5:
                ours.unpin_resident_block(RESIDENT, block.block_id)
            else:
                assert ours.unpin_resident_page(pair.rid, RESIDENT, page) == block.block_id
            pair.unpinned.add(page)
            owners.setdefault(block.block_id, set()).add((pair.rid, page))
        elif op == "adopt" and running and pool.get_num_free_blocks():
            pair = rng.choice(running)
            host_only = [
                i
                for i in range(len(resident.req_to_blocks[pair.rid]))
                if resident.get_resident_page(pair.rid, i) is None
            ]
            if not host_only:
                continue
            page = rng.choice(host_only)
            (copy,) = pool.get_new_blocks(1)
            assert ours.get_caller_blocks(1) == [copy.block_id]
            lose_reused()
            # vLLM's coordinator adopts, then touches the block.
            assert resident.adopt_resident_page(pair.rid, page, copy)
            assert ours.adopt_resident_page(pair.rid, RESIDENT, page, copy.block_id)
            pool.touch([copy])
            ours.touch_resident_blocks(RESIDENT, [copy.block_id])
            pool.free_blocks([copy])
            ours.free_caller_blocks([copy.block_id])
        elif op == "pin" and running:
            pair = rng.choice(running)
            row = [b for b in resident.get_residency_row(pair.rid) if not b.is_null]
            if not row:
                continue
            block = rng.choice(row)
            pool.touch([block])
            ours.touch_resident_blocks(RESIDENT, [block.block_id])
            pins.append(block.block_id)
        elif op == "unpin_pin" and pins:
            b = pins.pop(rng.randrange(len(pins)))
            pool.free_blocks([pool.blocks[b]])
            ours.free_caller_blocks([b])
        elif op == "free" and running:
            pair = rng.choice(running)
            # As vLLM's coordinator frees a request: its unpinned pages
            # first become host-only (their references are gone already).
            for page in sorted(pair.unpinned, reverse=True):
                got = resident.drop_resident_page(pair.rid, page)
                assert ours.drop_resident_page(pair.rid, RESIDENT, page) == got.block_id
            pair.unpinned.clear()
            theirs.free(pair.theirs)
            assert ours.free(pair.rid)
            del live[pair.rid]
            if rng.random() < 0.5:
                # Preempted: it will be admitted again from token 0.
                pair.set_computed(0)
                waiting.append(pair)
        lose_reused()
        compare(theirs, ours, live)
