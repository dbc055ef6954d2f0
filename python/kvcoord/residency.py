"""Residency metrics of the prefix cache: how long cached blocks live, how
long they sit idle before eviction, how often and how far apart they are
reused.

vLLM 0.33.0 samples 1% of blocks; kvcoord tracks every block in the Rust
core (45 bytes per block, off by default, O(1) per event). Turn it on with
``KVCacheManager(..., residency_metrics=True)`` (or
``BlockPool.enable_residency()``), move the clock with
``manager.set_residency_clock(t)`` in whatever unit you like (simulated
microseconds, steps), then read :meth:`KVCacheManager.residency_snapshot`
(cheap: four histograms) or drain the per-eviction records with
:meth:`KVCacheManager.drain_eviction_records`.

An eviction is a block losing its cache key: reallocated for new data,
dropped by ``evict_blocks``, or cleared by a prefix-cache reset.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EvictionRecord", "Histogram", "ResidencySnapshot"]


@dataclass(frozen=True, slots=True)
class Histogram:
    """Log2 buckets: ``buckets[0]`` counts zeros, ``buckets[k]`` values in
    ``[2**(k-1), 2**k)``; exact count, sum and max."""

    buckets: tuple[int, ...]
    count: int
    sum: int
    max: int

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else 0.0

    def quantile(self, q: float) -> int:
        """Upper bound of the bucket holding the ``q`` quantile (0 when empty)."""
        if not self.count:
            return 0
        rank = q * self.count
        seen = 0
        for k, n in enumerate(self.buckets):
            seen += n
            if seen >= rank and n:
                return 0 if k == 0 else min((1 << k) - 1, self.max)
        return self.max


@dataclass(frozen=True, slots=True)
class ResidencySnapshot:
    """The four histograms, in the clock's units (hits: a count)."""

    lifetime: Histogram
    idle_before_eviction: Histogram
    reuse_gap: Histogram
    hits_per_block: Histogram

    @classmethod
    def from_core(cls, raw: dict[str, tuple[list[int], int, int, int]]) -> ResidencySnapshot:
        def h(name: str) -> Histogram:
            buckets, count, total, top = raw[name]
            return Histogram(tuple(buckets), count, total, top)

        return cls(h("lifetime"), h("idle_before_eviction"), h("reuse_gap"), h("hits_per_block"))


@dataclass(frozen=True, slots=True)
class EvictionRecord:
    """One evicted block's history; the content of vLLM's
    ``KVCacheEvictionEvent`` (times in clock units; ``*_seconds`` convert
    with the clock's unit)."""

    block_id: int
    lifetime: int
    idle: int
    reuse_gaps: tuple[int, ...]
    hits: int

    def as_vllm_event(self, seconds_per_unit: float) -> dict[str, object]:
        """The fields of vLLM's ``KVCacheEvictionEvent``, in seconds."""
        return {
            "lifetime_seconds": self.lifetime * seconds_per_unit,
            "idle_seconds": self.idle * seconds_per_unit,
            "reuse_gaps_seconds": tuple(g * seconds_per_unit for g in self.reuse_gaps),
        }
