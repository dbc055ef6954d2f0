"""The parts of kvcoord.vllm that need no vLLM: the request registry that
keeps kvcoord's request in step with a vLLM-shaped one, and the vLLM-shaped
block results and pool view."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import kvcoord
from kvcoord.vllm.serve._blocks import KVCacheBlocks, ids_of
from kvcoord.vllm.serve._pool_view import PoolView
from kvcoord.vllm.serve._requests import RequestRegistry, stats


class FakeRequest:
    """The attributes of vLLM's Request that the registry reads. Its block
    hashes are made as vLLM's hasher makes them (``sha256_cbor``), unless the
    test sets ``block_hashes`` itself."""

    def __init__(self, rid: str, prompt: list[int] | None, **extra: object) -> None:
        self.request_id = rid
        self.prompt_token_ids = None if prompt is None else list(prompt)
        self._all = list(prompt) if prompt is not None else [0] * int(extra["num_prompt"])  # type: ignore[call-overload]
        self.num_prompt_tokens = len(self._all)
        self.num_computed_tokens = 0
        self.cache_salt = extra.get("cache_salt")
        self.lora_request = extra.get("lora_request")
        self.mm_features = extra.get("mm_features", [])
        self.prompt_embeds = extra.get("prompt_embeds")
        self.block_hashes: list[bytes] = hashes(self._all)

    def extend(self, tokens: list[int]) -> None:
        self._all += tokens
        self.block_hashes = hashes(self._all)

    @property
    def num_tokens(self) -> int:
        return len(self._all)

    @property
    def all_token_ids(self) -> list[int]:
        return self._all


def hashes(tokens: list[int]) -> list[bytes]:
    return kvcoord.compute_block_hashes(
        [t % 2**32 for t in tokens], hash_block_size=4, hash_algo="sha256_cbor"
    )


def test_registry_follows_appended_tokens_and_computed_count() -> None:
    reg = RequestRegistry(4)
    req = FakeRequest("a", list(range(10)))
    mine = reg.get(req)
    assert (mine.num_tokens, mine.num_prompt_tokens, mine.num_block_hashes) == (10, 10, 2)
    req.extend([10, 11, 12])
    req.num_computed_tokens = 9
    again = reg.get(req)
    assert again is mine
    assert (mine.num_tokens, mine.num_block_hashes, mine.num_computed_tokens) == (13, 3, 9)
    assert mine.all_token_ids == list(range(13))


def test_registry_keys_are_the_vllm_requests_own_hashes() -> None:
    reg = RequestRegistry(4)
    req = FakeRequest("a", list(range(6)))
    reg.get(req)
    req.extend(list(range(6, 17)))
    mine = reg.get(req)
    assert mine.hash_algo == "supplied"
    assert list(mine.block_hashes) == req.block_hashes == hashes(list(range(17)))


def test_registry_stops_where_vllms_hashes_stop() -> None:
    # A hash-lookahead hasher (or none) leaves full blocks without a hash:
    # kvcoord's request holds exactly the hashes vLLM's holds, whatever they are.
    reg = RequestRegistry(4)
    req = FakeRequest("a", list(range(12)))
    req.block_hashes = [b"\x01" * 32]
    mine = reg.get(req)
    assert list(mine.block_hashes) == [b"\x01" * 32]
    req.extend([12, 13])
    req.block_hashes = [b"\x01" * 32, b"\x02" * 32]
    assert list(reg.get(req).block_hashes) == [b"\x01" * 32, b"\x02" * 32]
    req.block_hashes = []
    assert reg.get(FakeRequest("b", list(range(12)))).num_block_hashes == 3
    unhashed = FakeRequest("c", list(range(12)))
    unhashed.block_hashes = []
    assert reg.get(unhashed).num_block_hashes == 0


def test_negative_placeholder_tokens_are_taken_modulo_2_32() -> None:
    reg = RequestRegistry(4)
    req = FakeRequest("a", [1, -1, 3, 4, 5])
    mine = reg.get(req)
    assert mine.all_token_ids == [1, 2**32 - 1, 3, 4, 5]
    req.extend([-2, 7, 8])
    assert reg.get(req).all_token_ids[-3:] == [2**32 - 2, 7, 8]


def test_shrunk_request_is_rebuilt() -> None:
    reg = RequestRegistry(4)
    req = FakeRequest("a", list(range(8)))
    req.extend([8, 9, 10])
    first = reg.get(req)
    del req._all[-2:]
    req.block_hashes = hashes(req._all)
    before = stats["rebuilt"]
    second = reg.get(req)
    assert second is not first and second.num_tokens == 9
    assert list(second.block_hashes) == req.block_hashes
    assert stats["rebuilt"] == before + 1


def test_extra_keys_are_kept_for_events() -> None:
    reg = RequestRegistry(4)
    lora = SimpleNamespace(lora_name="ad", lora_path="/p")
    mm = [SimpleNamespace(identifier="img", mm_position=SimpleNamespace(offset=4, length=2))]
    with_lora = reg.get(FakeRequest("l", list(range(8)), lora_request=lora))
    with_mm = reg.get(FakeRequest("m", list(range(8)), mm_features=mm))
    salted = reg.get(FakeRequest("s", list(range(8)), cache_salt="x"))
    assert with_lora.lora == ("ad", "/p")
    assert with_mm.mm_features == [("img", 4, 2)]
    assert salted.cache_salt == "x"


def test_prompt_embeds_requests_are_keyed_by_vllms_hashes() -> None:
    # vLLM hashes the embeddings; kvcoord takes its digests and placeholder tokens.
    reg = RequestRegistry(4)
    a = FakeRequest("a", None, num_prompt=8, prompt_embeds=object())
    a.block_hashes = [b"\x0a" * 32, b"\x0b" * 32]
    mine = reg.get(a)
    assert mine.num_tokens == 8 and list(mine.block_hashes) == a.block_hashes


def test_drop_forgets() -> None:
    reg = RequestRegistry(4)
    req = FakeRequest("a", list(range(8)))
    first = reg.get(req)
    reg.drop("a")
    reg.drop("never-seen")
    assert len(reg) == 0 and reg.get(req) is not first


def test_kv_cache_blocks_interface() -> None:
    pool = kvcoord.BlockPool(16, hash_block_size=4)
    a = KVCacheBlocks(([1, 2], []), pool)
    b = KVCacheBlocks((np.array([3], dtype=np.uint32), [4]), pool)
    assert a.get_block_ids() == ([1, 2], [])
    assert a.get_block_ids(group_ids=[1], allow_none=True) is None
    assert b.get_block_ids() == ([3], [4])
    assert (a + b).get_block_ids() == ([1, 2, 3], [4])
    assert a.new_empty().get_block_ids(allow_none=True) is None
    assert a == KVCacheBlocks(([1, 2], []))
    assert [v.block_id for v in a.blocks[0]] == [1, 2]
    assert a.blocks[0][0].ref_cnt == 0 and not a.blocks[0][0].is_null
    ids = a.get_block_ids()
    ids[0].append(99)
    assert a.get_block_ids() == ([1, 2], [])  # callers get fresh lists


def test_unhashed_ids_and_block_views_follow_the_pool() -> None:
    pool = kvcoord.BlockPool(16, hash_block_size=4)
    got = pool.get_new_blocks(3)
    digest = b"\x01" * 32
    pool.cache_full_blocks(got, [digest], 0, 1, group_id=2)
    blocks = KVCacheBlocks(([0, *got],), pool)
    assert blocks.get_unhashed_block_ids() == [0, *got[1:]]
    assert blocks.get_unhashed_block_ids_all_groups() == [got[1:]]
    view = blocks.blocks[0][1]
    assert view.block_hash == digest + (2).to_bytes(4, "big")
    assert view.ref_cnt == 1 and blocks.blocks[0][0].is_null
    with pytest.raises(ValueError):
        KVCacheBlocks(([1], [2])).get_unhashed_block_ids()


def test_pool_view_frees_block_objects_and_ids() -> None:
    pool = kvcoord.BlockPool(8, hash_block_size=4)
    view = PoolView(pool)
    got = pool.get_new_blocks(3)
    assert view.get_num_free_blocks() == 4 and view.num_gpu_blocks == 8
    view.free_blocks(reversed(KVCacheBlocks((got,), pool).blocks[0]))
    assert view.get_num_free_blocks() == 7 and view.get_usage() == 0.0
    assert view.free_block_ids().tolist()[:3] == got[::-1]
    assert ids_of([]) == [] and ids_of(np.array([5, 6])) == [5, 6]


class PlainConnector:
    """A connector that uses only the scheduler's calls."""

    def get_num_new_matched_tokens(self, request: object, num_computed: int) -> tuple[int, bool]:
        return 0, False


class BindingConnector(PlainConnector):
    def bind_gpu_block_pool(self, pool: object) -> None:
        self.pool = pool


class ReadingConnector(PlainConnector):
    def update_state_after_alloc(self, request: object) -> object:
        return self._kv_cache_manager.coordinator  # type: ignore[attr-defined]


class MultiConnector:
    def __init__(self, *subs: object) -> None:
        self._connectors = list(subs)


def test_connector_reason_serves_only_connectors_that_stay_off_the_managers_internals() -> None:
    from kvcoord.vllm.serve._connectors import connector_reason

    assert connector_reason(PlainConnector()) is None
    assert "BindingConnector" in (connector_reason(BindingConnector()) or "")
    assert "ReadingConnector" in (connector_reason(ReadingConnector()) or "")
    assert connector_reason(MultiConnector(PlainConnector(), PlainConnector())) is None
    reason = connector_reason(MultiConnector(PlainConnector(), ReadingConnector()))
    assert reason is not None and "ReadingConnector" in reason


def test_free_list_ends_and_cached_index_follow_the_pool() -> None:
    pool = kvcoord.BlockPool(4, hash_block_size=4)
    view = PoolView(pool)
    queue = view.free_block_queue
    head, tail = queue.fake_free_list_head, queue.fake_free_list_tail
    assert (head.next_free_block.block_id, tail.prev_free_block.block_id) == (1, 3)
    digests = hashes(list(range(8)))
    a = pool.get_new_blocks(3)
    assert head.next_free_block is tail and tail.prev_free_block is head
    assert not view.cached_block_hash_to_block
    pool.cache_full_blocks(a, digests, num_cached_blocks=0, num_full_blocks=2, group_id=0)
    index = view.cached_block_hash_to_block
    assert len(index) == 2
    key = digests[1] + (0).to_bytes(4, "big")
    assert index[key].block_id == a[1] and key in index
    pool.free_blocks(a[::-1])
    assert pool.reset_prefix_cache() and len(view.cached_block_hash_to_block) == 0


def test_a_new_request_object_under_a_known_id_gets_its_own_hashes() -> None:
    # Regression: a probe request reusing an id kept the first probe's hashes
    # (vLLM's test_scheduler_publishes_lookahead_blocks_at_allocation).
    reg = RequestRegistry(4)
    first = FakeRequest("probe", list(range(8)))
    assert list(reg.get(first).block_hashes) == hashes(list(range(8)))
    second = FakeRequest("probe", list(range(1, 9)))
    assert list(reg.get(second).block_hashes) == hashes(list(range(1, 9)))
