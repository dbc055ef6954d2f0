"""HiSparse configurations of vLLM 0.33.0: vLLM's shape is served by the
two-core HiSparse manager (its schedules beside vLLM's are in
test_hisparse_against_vllm.py) and other shapes fall back naming what
differs; with ``KVCOORD_VLLM_HISPARSE=0`` every configuration with a
HiSparse group falls back, with a reason naming the group found; the two HiSparse fields
vLLM's manager never reads are served (kvcoord.vllm.serve._hisparse_support; their
schedules beside vLLM's are in test_against_vllm.py).

Skipped when vLLM is not installed.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

pytest.importorskip(
    "vllm.v1.core.kv_cache_manager", reason="needs vLLM 0.33.0 (pip install kvcoord[vllm])"
)

import torch
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    HiSparseHotSpec,
    HiSparseResidentSpec,
    KVCacheConfig,
    KVCacheGroupRole,
    KVCacheGroupSpec,
)
from vllm_helpers import needs_served_hisparse

import kvcoord.vllm as kv
from kvcoord.vllm.serve._support import unsupported_reason

BS = 16
ARGS = {"hash_block_size": BS, "enable_caching": True}


def full() -> FullAttentionSpec:
    return FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32)


def hisparse_config(host_num_blocks: int | None = 16) -> KVCacheConfig:
    """The shape vLLM's own HiSparse tests build: source, indexer, resident, hot."""
    groups = [
        KVCacheGroupSpec(
            ["source"], full(), role=KVCacheGroupRole.HISPARSE_SOURCE, host_resident=True
        ),
        KVCacheGroupSpec(["indexer"], full(), role=KVCacheGroupRole.HISPARSE_INDEXER),
        KVCacheGroupSpec(["resident"], HiSparseResidentSpec(block_size=BS, page_size=4 * BS)),
        KVCacheGroupSpec(
            ["hot"], HiSparseHotSpec(block_size=BS, page_size=4 * BS, blocks_per_request=2)
        ),
    ]
    return KVCacheConfig(
        num_blocks=32,
        hisparse_host_num_blocks=host_num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=groups,
    )


def one_group(group: KVCacheGroupSpec) -> KVCacheConfig:
    return KVCacheConfig(num_blocks=32, kv_cache_tensors=[], kv_cache_groups=[group])


@needs_served_hisparse
def test_opt_out_falls_back_with_its_reason(caplog, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVCOORD_VLLM_HISPARSE", "0")
    before = kv.fallbacks.copy()
    with caplog.at_level(logging.WARNING, logger="kvcoord.vllm"):
        m = kv.KVCacheManager(
            hisparse_config(),
            max_model_len=128,
            scheduler_block_size=BS,
            hash_block_size=BS,
        )
    assert type(m) is kv.original_manager_class()
    (reason,) = [r for r in kv.fallbacks if kv.fallbacks[r] != before.get(r, 0)]
    assert reason.startswith("HiSparse KV cache (a group with role hisparse_source)")
    assert "KVCOORD_VLLM_HISPARSE=0" in reason
    assert any(reason in r.getMessage() for r in caplog.records)


def test_each_hisparse_element_is_named() -> None:
    cfg = hisparse_config(host_num_blocks=None)
    reason = unsupported_reason(cfg, ARGS)
    assert reason is not None and "role hisparse_source" in reason
    resident = cfg.kv_cache_groups[2]
    reason = unsupported_reason(one_group(resident), ARGS)
    assert reason is not None and "HiSparseResidentSpec group" in reason
    reason = unsupported_reason(one_group(cfg.kv_cache_groups[3]), ARGS)
    assert reason is not None and "HiSparseHotSpec group" in reason


def test_fields_vllms_manager_never_reads_are_served() -> None:
    # A host-resident flag only places the group's tensors on the host, and
    # the host pool size is read by vLLM's HiSparseCoordinator alone: vLLM's
    # manager runs such a group as plain full attention on the device pool.
    host = KVCacheGroupSpec(["h"], full(), host_resident=True)
    assert unsupported_reason(one_group(host), ARGS) is None
    cfg = replace(one_group(host), hisparse_host_num_blocks=16)
    assert unsupported_reason(cfg, ARGS) is None
    m = kv.KVCacheManager(cfg, max_model_len=128, scheduler_block_size=BS, hash_block_size=BS)
    assert isinstance(m, kv.KVCacheManager)


def test_source_role_alone_is_not_served_as_full_attention() -> None:
    # vLLM picks HiSparseSourceManager for the role whatever the spec (its
    # admission prediction differs from full attention's): it was served as
    # plain full attention before this check.
    group = KVCacheGroupSpec(["s"], full(), role=KVCacheGroupRole.HISPARSE_SOURCE)
    assert unsupported_reason(one_group(group), ARGS) is not None


def test_indexer_role_alone_is_plain_full_attention() -> None:
    group = KVCacheGroupSpec(["i"], full(), role=KVCacheGroupRole.HISPARSE_INDEXER)
    assert unsupported_reason(one_group(group), ARGS) is None
    assert (
        unsupported_reason(one_group(replace(group, role=KVCacheGroupRole.DEFAULT)), ARGS) is None
    )


@needs_served_hisparse
def test_vllms_shape_is_served_by_default() -> None:
    from kvcoord.vllm.hisparse._manager import HiSparseManager

    assert unsupported_reason(hisparse_config(), ARGS) is None
    m = kv.KVCacheManager(
        hisparse_config(), max_model_len=128, scheduler_block_size=BS, hash_block_size=BS
    )
    assert type(m) is HiSparseManager
    assert len(m.coordinator.single_type_managers) == 4
    m.check_invariants()
    # Other shapes still fall back, naming what differs.
    reason = unsupported_reason(hisparse_config(None), ARGS)
    assert reason is not None and "no hisparse_host_num_blocks" in reason
    cfg = hisparse_config()
    swapped = replace(cfg, kv_cache_groups=[cfg.kv_cache_groups[1], cfg.kv_cache_groups[0]])
    reason = unsupported_reason(swapped, ARGS)
    assert reason is not None and "group 0" in reason
    reason = unsupported_reason(cfg, {**ARGS, "use_eagle": True})
    assert reason is not None and "EAGLE" in reason
