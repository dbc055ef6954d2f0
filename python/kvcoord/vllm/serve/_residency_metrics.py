"""vLLM's KV-cache residency metrics (``--kv-cache-metrics``) on kvcoord's
pool.

vLLM's scheduler makes a ``KVCacheMetricsCollector`` and hands it to the
manager; vLLM's pool calls it for every block it allocates, hits and evicts,
and the scheduler drains its eviction samples right after
``make_prefix_cache_stats``. kvcoord's pool follows the sampled block lives
itself (the core's ``sampled_lives``: the same sampling, the same life
rule, monotonic nanoseconds), so the per-block work stays in Rust; what
crosses to Python is one tuple per sampled eviction, which
:meth:`ResidencyFeed.feed` hands to the collector as vLLM's
``KVCacheEvictionEvent`` before the scheduler drains it.
"""

from __future__ import annotations

import importlib
import random
from typing import Any

__all__ = ["ResidencyFeed"]

_NS = 1e-9


class ResidencyFeed:
    """The samples of one kvcoord pool, fed to vLLM's collector."""

    __slots__ = ("_event", "_pool", "collector")

    def __init__(self, collector: Any, pool: Any) -> None:
        """Follow `collector`'s sample of the lives of `pool`'s blocks (a
        ``CoordinatorCore``, or any owner of a kvcoord pool)."""
        self.collector = collector
        self._pool = pool
        # The seed comes from Python's generator, as vLLM's collector draws
        # from it: random.seed() makes both reproducible.
        pool.enable_sampled_lives(float(collector.sample_rate), random.getrandbits(64))
        stats = importlib.import_module("vllm.v1.metrics.stats")
        self._event = stats.KVCacheEvictionEvent

    def feed(self) -> None:
        """Hand the samples of lives ended since the last call to the
        collector (where its ``drain_events`` finds them)."""
        samples = self._pool.drain_life_samples()
        if not samples:
            return
        event = self._event
        self.collector._eviction_events.extend(
            event(
                lifetime_seconds=lifetime * _NS,
                idle_seconds=idle * _NS,
                reuse_gaps_seconds=tuple(g * _NS for g in gaps),
            )
            for lifetime, idle, gaps in samples
        )

    def reset(self) -> None:
        """After a prefix-cache reset of the pool: the collector forgets its
        blocks and undrained samples, as vLLM's pool makes it."""
        self.collector.reset()
