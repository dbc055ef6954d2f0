"""The pytest plugin's rule for lending kvcoord's stand-ins to vLLM's tests
(kvcoord.vllm.testing._lending): synthetic test functions, written in a module of
their own under a temporary test tree, get kvcoord's class for a name
exactly when everything they do with it is served, and keep vLLM's when
they use an unserved attribute, assign a served one, or build vLLM code
that would stand on kvcoord's pool.

Skipped when vLLM is not installed.
"""

from __future__ import annotations

import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "vllm.v1.core.block_pool", reason="needs vLLM 0.33.0 (pip install kvcoord[vllm])"
)

import torch
from vllm.utils.hashing import sha256
from vllm.v1.core import single_type_kv_cache_manager as vllm_managers
from vllm.v1.core.block_pool import BlockPool as VllmPool
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec, SlidingWindowSpec

import kvcoord.vllm as kv
from kvcoord.vllm.serve import _versions
from kvcoord.vllm.testing import _hit_search, _lending, pytest_plugin

HEADER = """
import vllm.v1.core.block_pool as block_pool_module
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.core.single_type_kv_cache_manager import (
    FullAttentionManager,
    MambaManager,
    SlidingWindowManager,
)
"""


@pytest.fixture(autouse=True)
def _none_hash() -> None:
    init_none_hash(sha256)


def synthetic(root: Path, body: str) -> types.ModuleType:
    """A test module under ``root`` made of HEADER and ``body``."""
    source = HEADER + textwrap.dedent(body)
    path = root / "test_synthetic.py"
    path.write_text(source)
    module = types.ModuleType("test_synthetic")
    module.__file__ = str(path)
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module


def decide(
    module: types.ModuleType, test: str, values: tuple[Any, ...] = (), names: tuple[str, ...] = ()
) -> tuple[dict[str, type], str]:
    found = _lending.scan([getattr(module, test)], values, Path(module.__file__).parent, names)
    return _lending.decide(module, found)


POOL_ONLY = """
def test_served():
    pool = BlockPool(num_gpu_blocks=4, enable_caching=True, hash_block_size=4)
    blocks = pool.get_new_blocks(2)
    pool.free_blocks(blocks)
    assert pool.get_num_free_blocks() == 3 and blocks[0].ref_cnt == 0

def test_unserved():
    pool = BlockPool(num_gpu_blocks=4, enable_caching=True, hash_block_size=4)
    pool.move_block_hashes([], [])

def test_assigns():
    pool = BlockPool(num_gpu_blocks=4, enable_caching=True, hash_block_size=4)
    pool.enable_kv_cache_events = True

def test_unserved_keyword():
    BlockPool(4, True, 4, metrics_collector=object())

def test_unserved_by_name():
    pool = BlockPool(num_gpu_blocks=4, enable_caching=True, hash_block_size=4)
    getattr(pool, "cache_partial_block")

def test_patching(monkeypatch):
    pool = BlockPool(num_gpu_blocks=4, enable_caching=True, hash_block_size=4)
    monkeypatch.setattr(pool, "get_new_blocks", lambda n: [])

def test_free_queue_edit():
    pool = BlockPool(num_gpu_blocks=4, enable_caching=True, hash_block_size=4)
    pool.free_block_queue.append(pool.get_new_blocks(1)[0])

def test_list_append_without_the_queue():
    pool = BlockPool(num_gpu_blocks=4, enable_caching=True, hash_block_size=4)
    seen = []
    seen.append(pool.get_new_blocks(1)[0].block_id)

def test_no_pool():
    assert KVCacheBlock(block_id=1).block_id == 1

def test_vllm_pool_by_module_attribute():
    ours = BlockPool(num_gpu_blocks=4, enable_caching=True, hash_block_size=4)
    theirs = block_pool_module.BlockPool(num_gpu_blocks=4, enable_caching=True, hash_block_size=4)
    theirs.touch(ours.get_new_blocks(1))
"""


def test_served_names_get_kvcoords_pool(tmp_path: Path) -> None:
    module = synthetic(tmp_path, POOL_ONLY)
    assert decide(module, "test_served") == ({"BlockPool": kv.BlockPool}, "")
    # list.append is not the free queue's when the test never reads the queue
    assert decide(module, "test_list_append_without_the_queue")[0] == {"BlockPool": kv.BlockPool}


@pytest.mark.parametrize(
    ("test", "why"),
    [
        ("test_unserved", "BlockPool: uses move_block_hashes"),
        ("test_assigns", "BlockPool: assigns enable_kv_cache_events"),
        ("test_unserved_keyword", "BlockPool: uses metrics_collector"),
        ("test_unserved_by_name", "BlockPool: uses cache_partial_block"),
        ("test_free_queue_edit", "BlockPool: uses append"),
        ("test_vllm_pool_by_module_attribute", "reaches vLLM's"),
    ],
)
def test_unserved_use_keeps_vllms_pool(tmp_path: Path, test: str, why: str) -> None:
    lent, reason = decide(synthetic(tmp_path, POOL_ONLY), test)
    assert lent == {}
    assert reason.startswith(why)


def test_patching_counts_names_as_assigned(tmp_path: Path) -> None:
    lent, reason = decide(synthetic(tmp_path, POOL_ONLY), "test_patching", names=("monkeypatch",))
    assert lent == {} and reason.startswith("BlockPool: assigns")


def test_nothing_named_nothing_lent(tmp_path: Path) -> None:
    assert decide(synthetic(tmp_path, POOL_ONLY), "test_no_pool") == ({}, "")


MANAGERS = """
SPEC = None

def make_manager(spec, pool):
    return SlidingWindowManager(
        spec, block_pool=pool, enable_caching=True, kv_cache_group_id=0,
        scheduler_block_size=spec.block_size, max_admission_blocks_per_request=10**9,
    )

def test_hit_search(spec):
    pool = BlockPool(num_gpu_blocks=16, enable_caching=True, hash_block_size=2)
    manager = make_manager(spec, pool)
    def search(hashes):
        return manager.find_longest_cache_hit(
            block_hashes=hashes, max_length=4, kv_cache_group_ids=[0], block_pool=pool,
            kv_cache_spec=spec, drop_eagle_block=False, alignment_tokens=2,
        )
    assert search([])[1] == 0 and manager.sliding_window == 4

def test_manager_edits(spec):
    pool = BlockPool(num_gpu_blocks=16, enable_caching=True, hash_block_size=2)
    make_manager(spec, pool).remove_skipped_blocks("r", 8)

def test_vllm_manager_over_the_pool(spec):
    pool = BlockPool(num_gpu_blocks=16, enable_caching=True, hash_block_size=2)
    MambaManager(spec, block_pool=pool, enable_caching=True, kv_cache_group_id=0,
                 scheduler_block_size=2)

def test_full_attention_allocates(spec):
    pool = BlockPool(num_gpu_blocks=16, enable_caching=True, hash_block_size=2)
    FullAttentionManager(spec, block_pool=pool).allocate_new_blocks("r", 4, 4)

def test_manager_without_the_pool(spec, pool):
    make_manager(spec, pool)

def test_manager_class_as_a_parameter(spec, manager_cls):
    pool = BlockPool(num_gpu_blocks=16, enable_caching=True, hash_block_size=2)
    manager_cls(spec, block_pool=pool)
"""


def test_hit_search_gets_kvcoords_manager_and_pool(tmp_path: Path) -> None:
    lent, reason = decide(synthetic(tmp_path, MANAGERS), "test_hit_search")
    assert reason == ""
    assert lent == {
        "BlockPool": kv.BlockPool,
        "SlidingWindowManager": _hit_search.SlidingWindowManager,
    }


@pytest.mark.parametrize(
    ("test", "values", "why"),
    [
        ("test_manager_edits", (), "SlidingWindowManager: uses remove_skipped_blocks"),
        ("test_vllm_manager_over_the_pool", (), "reaches vLLM's MambaManager over a pool"),
        ("test_full_attention_allocates", (), "FullAttentionManager: uses allocate_new_blocks"),
        ("test_manager_without_the_pool", (), "SlidingWindowManager: needs"),
        (
            "test_manager_class_as_a_parameter",
            (vllm_managers.SlidingWindowManager,),
            "reaches vLLM's SlidingWindowManager over a pool",
        ),
    ],
)
def test_vllm_manager_over_the_pool_keeps_vllms(
    tmp_path: Path, test: str, values: tuple[Any, ...], why: str
) -> None:
    lent, reason = decide(synthetic(tmp_path, MANAGERS), test, values)
    assert lent == {}
    assert reason.startswith(why)


def test_plugin_rebinds_for_the_test_only(tmp_path: Path) -> None:
    module = synthetic(tmp_path, POOL_ONLY)
    for test, ours in (("test_served", kv.BlockPool), ("test_unserved", VllmPool)):
        item = types.SimpleNamespace(
            module=module,
            obj=getattr(module, test),
            cls=None,
            config=types.SimpleNamespace(rootpath=tmp_path),
            fixturenames=(),
            user_properties=[],
        )
        protocol = pytest_plugin.pytest_runtest_protocol(item, None)
        next(protocol)
        assert module.BlockPool is ours
        protocol.close()
        assert module.BlockPool is VllmPool


def _surface(cls: type) -> set[str]:
    names = set(_lending.vllm_surface(_lending._resolve(cls.vllm_class)))  # type: ignore[attr-defined]
    for other in cls.vllm_hands_out:  # type: ignore[attr-defined]
        names |= _lending.vllm_surface(_lending._resolve(other))
    return names


def test_declared_pool_surface_is_vllms_and_real() -> None:
    pool = kv.BlockPool(num_gpu_blocks=4, enable_caching=True, hash_block_size=4)
    owners = [pool, pool.blocks[1], pool.free_block_queue, pool.cached_block_hash_to_block]
    # Hash lookahead is vLLM 0.33's: older pools lack its attribute, which
    # kvcoord's pool still has (unread there).
    newer = set() if _versions.installed().hasher_takes_lookahead else {"num_hash_lookahead_tokens"}
    assert kv.BlockPool.vllm_serves - newer <= _surface(kv.BlockPool)
    for name in kv.BlockPool.vllm_serves:
        assert any(hasattr(o, name) for o in owners), name


@pytest.mark.parametrize(
    ("cls", "spec"),
    [
        (
            _hit_search.SlidingWindowManager,
            SlidingWindowSpec(
                block_size=2, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=4
            ),
        ),
        (
            _hit_search.ChunkedLocalAttentionManager,
            ChunkedLocalAttentionSpec(
                block_size=2,
                num_kv_heads=1,
                head_size=1,
                dtype=torch.float32,
                attention_chunk_size=4,
            ),
        ),
    ],
)
def test_declared_manager_surface_is_vllms_and_real(cls: type, spec: Any) -> None:
    pool = kv.BlockPool(num_gpu_blocks=4, enable_caching=True, hash_block_size=2)
    manager = cls(
        spec, block_pool=pool, enable_caching=True, kv_cache_group_id=0, scheduler_block_size=2
    )
    assert cls.vllm_serves <= _surface(cls)  # type: ignore[attr-defined]
    for name in cls.vllm_serves:  # type: ignore[attr-defined]
        assert hasattr(manager, name), name
    assert manager.scheduler_block_size == 2


def test_stand_ins_are_keyed_by_vllms_classes() -> None:
    ours = _lending.stand_ins()
    assert ours[VllmPool] is kv.BlockPool
    assert ours[vllm_managers.SlidingWindowManager] is _hit_search.SlidingWindowManager
    assert _lending.pool_bound(vllm_managers.MambaManager)
    assert not _lending.pool_bound(kv.BlockPool)


def test_code_binding_a_pool_by_another_name_is_pool_bound() -> None:
    """vLLM's CPU-offload scheduler keeps ``cpu_block_pool`` and takes the
    GPU pool in ``bind_gpu_block_pool(gpu_block_pool)``, then reads both
    pools' internals: a test handing it a pool keeps vLLM's. Regression:
    only the exact name ``block_pool`` counted, and 53 of vLLM's
    ``simple_kv_offload`` tests failed on kvcoord's pool."""
    from vllm.v1.simple_kv_offload.manager import SimpleCPUOffloadScheduler

    assert _lending.pool_bound(SimpleCPUOffloadScheduler)


MANAGER_STATE = """
def helper_writes(manager, block):
    manager.coordinator.single_type_managers[0]._partial_hit_reqs["r"] = (0, block)

def test_writes_item(manager, block):
    source = manager.coordinator.single_type_managers[0]
    source.req_to_blocks["r"] = [block]

def test_writes_private_attribute(manager):
    manager.coordinator.single_type_managers[0]._pending_cow_copies = []

def test_writes_public_attribute(manager, spec):
    spec.block_size = 32  # specs and configs share the managers' public names

def test_writes_through_a_helper(manager, block):
    helper_writes(manager, block)

def test_reads_only(manager, request):
    blocks = manager.coordinator.single_type_managers[0].req_to_blocks["r"]
    request.num_computed_tokens = len(blocks)
    table = {}
    table["r"] = blocks
"""


@pytest.mark.parametrize(
    ("test", "written"),
    [
        ("test_writes_item", "req_to_blocks"),
        ("test_writes_private_attribute", "_pending_cow_copies"),
        ("test_writes_public_attribute", ""),
        ("test_writes_through_a_helper", "_partial_hit_reqs"),
        ("test_reads_only", ""),
    ],
)
def test_writing_manager_state_is_found(tmp_path: Path, test: str, written: str) -> None:
    # A test that builds vLLM's single-type manager state by hand can only
    # run on vLLM's manager: the plugin makes every manager it builds fall
    # back (and the test not pure).
    module = synthetic(tmp_path, MANAGER_STATE)
    found = _lending.scan([getattr(module, test)], (), tmp_path)
    assert _lending.writes_manager_state(found) == written


def test_refusing_makes_managers_fall_back() -> None:
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    from kvcoord.vllm.serve import _construct

    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32)
    cfg = KVCacheConfig(
        num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["a"], spec)]
    )
    args = {"max_model_len": 64, "scheduler_block_size": 16, "hash_block_size": 16}
    before = kv.fallbacks["why"]
    with _construct.refusing("why"):
        assert type(kv.KVCacheManager(cfg, **args)) is kv.original_manager_class()
    assert kv.fallbacks["why"] == before + 1
    assert type(kv.KVCacheManager(cfg, **args)) is not kv.original_manager_class()
