"""KV cache specs, groups and config: validation with messages naming the field."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

import kvcoord
from kvcoord.config import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroup,
    MambaSpec,
    SlidingWindowSpec,
)
from kvcoord.errors import ConfigError


def test_specs_are_frozen_and_comparable() -> None:
    a, b = SlidingWindowSpec(16, 128), SlidingWindowSpec(16, 128)
    assert a == b and hash(a) == hash(b)
    assert a != SlidingWindowSpec(16, 64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.block_size = 32  # type: ignore[misc]
    assert FullAttentionSpec(16).kind == "full_attention"
    assert MambaSpec(16).num_speculative_blocks == 0


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: FullAttentionSpec(0), "FullAttentionSpec.block_size"),
        (lambda: FullAttentionSpec(True), "FullAttentionSpec.block_size"),  # type: ignore[arg-type]
        (lambda: FullAttentionSpec(16.0), "FullAttentionSpec.block_size"),  # type: ignore[arg-type]
        (lambda: SlidingWindowSpec(16, -1), "SlidingWindowSpec.sliding_window"),
        (
            lambda: ChunkedLocalAttentionSpec(16, 0),
            "ChunkedLocalAttentionSpec.attention_chunk_size",
        ),
        (lambda: MambaSpec(16, -2), "MambaSpec.num_speculative_blocks"),
        (lambda: CrossAttentionSpec(-16), "CrossAttentionSpec.block_size"),
        (lambda: KVCacheGroup("full"), "KVCacheGroup.spec"),  # type: ignore[arg-type]
        (lambda: KVCacheGroup(FullAttentionSpec(16), "l0"), "KVCacheGroup.layer_names"),
        (lambda: KVCacheConfig(0, ()), "KVCacheConfig.num_blocks"),
        (lambda: KVCacheConfig(10, (FullAttentionSpec(16),)), r"KVCacheConfig.groups\[0\]"),  # type: ignore[arg-type]
        (
            lambda: KVCacheConfig(10, (KVCacheGroup(FullAttentionSpec(16)),), 1.5),  # type: ignore[arg-type]
            "KVCacheConfig.prefix_cache_retention_interval",
        ),
    ],
)
def test_invalid_values_name_the_field(make, field) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=field):
        make()


def test_retention_interval_rules() -> None:
    full = KVCacheGroup(FullAttentionSpec(16))
    swa = KVCacheGroup(SlidingWindowSpec(32, 128))
    assert KVCacheConfig(10, (full, swa), 64).scheduler_block_size == 32
    assert KVCacheConfig(10, (full,), 0).prefix_cache_retention_interval == 0
    with pytest.raises(ValueError, match="no sliding-window or Mamba"):
        KVCacheConfig(10, (full,), 32)
    with pytest.raises(ValueError, match=r"multiple of scheduler_block_size \(32\)"):
        KVCacheConfig(10, (full, swa), 48)
    with pytest.raises(ValueError, match="non-negative"):
        KVCacheConfig(10, (full, swa), -32)


def test_groups_accept_any_sequence() -> None:
    cfg = KVCacheConfig(10, [KVCacheGroup(FullAttentionSpec(16), ["a", "b"])])  # type: ignore[arg-type]
    assert isinstance(cfg.groups, tuple) and cfg.groups[0].layer_names == ("a", "b")


def test_specs_ask_the_core_for_kind_facts() -> None:
    facts = {
        type(s).__name__: (s.core.spec_name, s.core.prefix_cacheable, s.core.sparse)
        for s in (
            FullAttentionSpec(16),
            SlidingWindowSpec(16, 64),
            ChunkedLocalAttentionSpec(16, 64),
            MambaSpec(16),
            CrossAttentionSpec(16),
        )
    }
    assert facts == {
        "FullAttentionSpec": ("FullAttentionSpec", True, False),
        "SlidingWindowSpec": ("SlidingWindowSpec", True, True),
        "ChunkedLocalAttentionSpec": ("ChunkedLocalAttentionSpec", True, False),
        "MambaSpec": ("MambaSpec", False, True),
        "CrossAttentionSpec": ("CrossAttentionSpec", False, False),
    }
    assert FullAttentionSpec(16).core.prefix_closed_hits
    assert not SlidingWindowSpec(16, 64).core.prefix_closed_hits
    # The core spec follows the dataclass's value (equal specs, equal cores).
    assert SlidingWindowSpec(16, 64).core == SlidingWindowSpec(16, 64).core
    assert SlidingWindowSpec(16, 64).core != SlidingWindowSpec(16, 32).core
    full, swa = KVCacheGroup(FullAttentionSpec(16)), KVCacheGroup(SlidingWindowSpec(32, 64))
    assert not KVCacheConfig(10, (full,)).retention_applies
    assert KVCacheConfig(10, (full, swa)).retention_applies


def test_core_config_rules() -> None:
    import kvcoord
    from kvcoord._core import choose_coordinator, scheduler_block_size

    specs = [FullAttentionSpec(32).core, SlidingWindowSpec(16, 64).core]
    assert scheduler_block_size(specs) == 32
    assert kvcoord.default_hash_block_size(specs, True) == 16
    assert kvcoord.default_hash_block_size(specs, False) == 32
    assert kvcoord.default_hash_block_size(specs[:1], True) == 32
    kinds = kvcoord.CoordinatorKind
    assert choose_coordinator(2, False) == kinds.NoPrefixCache
    assert choose_coordinator(1, True) == kinds.Unitary
    assert choose_coordinator(3, True) == kinds.Hybrid


@pytest.mark.parametrize(
    "spec",
    [
        kvcoord.FullAttentionSpec(16),
        kvcoord.SlidingWindowSpec(16, 64),
        kvcoord.ChunkedLocalAttentionSpec(16, 64),
        kvcoord.MambaSpec(16, mamba_cache_mode="align"),
        kvcoord.CrossAttentionSpec(16),
        kvcoord.MLAAttentionSpec(64),
        kvcoord.SlidingWindowMLASpec(64, 128),
        kvcoord.RSWASpec(16, 64),
    ],
)
def test_specs_pickle_by_their_arguments(spec: kvcoord.KVCacheSpec) -> None:
    # Regression: `kvcoord sweep --jobs` sends layouts to worker processes; the
    # core spec inside a spec could not be pickled.
    config = kvcoord.KVCacheConfig(8, (kvcoord.KVCacheGroup(spec),))
    loaded = pickle.loads(pickle.dumps(config))
    assert loaded == config
    assert loaded.groups[0].spec.core.block_size == spec.block_size
