"""What one replay is given and what it returns: :class:`SimConfig` and :class:`SimResult`.

:func:`kvcoord.replay.scheduler.simulate` turns the first into the second;
:func:`kvcoord.replay.report.summarize` turns the result into metrics.
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass, field

from kvcoord.errors import InvalidArgumentError
from kvcoord.replay.bestcase import BestCase
from kvcoord.replay.layouts import Layout
from kvcoord.replay.tiers import DISK_BANDWIDTH, HostTier
from kvcoord.replay.timing import StepTimeModel
from kvcoord.replay.workloads import WorkloadRequest
from kvcoord.residency import ResidencySnapshot

__all__ = ["EngineFeed", "SimConfig", "SimResult", "SimulationError"]


class SimulationError(RuntimeError):
    """The workload cannot be replayed with this configuration (e.g. a request never fits)."""


@dataclass
class SimConfig:
    """Scheduler and pool parameters of one replay."""

    layout: Layout
    num_blocks: int
    max_running: int = 256
    token_budget: int = 8192
    max_model_len: int | None = None
    #: Simulated step time: ``step_base_s + step_token_s * scheduled tokens``.
    step_base_s: float = 0.005
    step_token_s: float = 2e-6
    #: Multiplies arrival times (0: everything arrives at once).
    time_scale: float = 1.0
    #: Also compute the best possible hit rate (unbounded cache) from the same
    #: tokens, as each request is first scheduled (arrival order).
    track_best: bool = True
    #: Roofline step time (None: the fixed ``step_base_s + step_token_s`` model).
    step_model: StepTimeModel | None = None
    #: Host-memory tier below the GPU pool (None: none).
    host_tier: HostTier | None = None
    #: Bytes of one token's KV on one GPU (host-tier transfer size).
    token_bytes_per_gpu: float = 0.0
    #: Disk tier below the host tier (None: none), and its read bandwidth per
    #: replica in bytes/s (one NVMe Gen4 SSD's sequential read).
    disk_tier: HostTier | None = None
    disk_bandwidth: float = DISK_BANDWIDTH
    #: The pool's eviction policy (``KVCacheManagerOptions.eviction_policy``).
    eviction_policy: str = "lru"
    #: With the ``priority`` policy: the priority the prompt blocks of a
    #: finished request that was served a prefix hit (a follow-up turn, a
    #: shared template) get before they are freed (0: none); the pool's clock
    #: ticks once per step.
    prompt_priority: int = 0
    #: Clients' cap on requests in flight (None: none), as ``vllm bench serve
    #: --max-concurrency``: a request is sent at its arrival time or, when
    #: that many are in flight (sent, not finished), when one finishes.
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        cap = self.max_concurrency
        # 0 would hold every request back for ever (the loop would never end)
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise InvalidArgumentError(
                f"max_concurrency must be a positive integer or None, got {cap!r}"
            )


@dataclass
class SimResult:
    """Raw accounting of one replay; ``report.summarize`` turns it into metrics."""

    num_requests: int = 0
    num_finished: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    output_tokens: int = 0
    computed_tokens: int = 0
    preemptions: int = 0
    evictions: int = 0
    steps: int = 0
    sim_seconds: float = 0.0
    #: Simulated seconds with at least one request scheduled.
    busy_seconds: float = 0.0
    manager_seconds: float = 0.0
    wall_seconds: float = 0.0
    #: Wall time building prompt/output tokens, in the best-possible pass, and
    #: constructing ``kvcoord.Request`` objects (block hashing), outside manager_seconds.
    token_seconds: float = 0.0
    best_seconds: float = 0.0
    request_seconds: float = 0.0
    leaked_blocks: int = 0
    #: Best possible hits with an unbounded cache (``SimConfig.track_best``).
    best: BestCase | None = None
    num_blocks: int = 0
    #: Per step: manager seconds, pool usage, simulated time, cumulative hit rate.
    step_manager_s: array[float] = field(default_factory=lambda: array("d"))
    step_usage: array[float] = field(default_factory=lambda: array("d"))
    step_time: array[float] = field(default_factory=lambda: array("d"))
    step_hit_rate: array[float] = field(default_factory=lambda: array("d"))
    #: Per step: the tokens after a request's first it sampled, and how long
    #: after the step before's the client saw them (inter-token latency; a
    #: request sampled in every step it runs, so exact unless it was preempted
    #: or left without tokens by the budget).
    step_later_tokens: array[int] = field(default_factory=lambda: array("q"))
    step_itl: array[float] = field(default_factory=lambda: array("d"))
    #: Per step: blocks in the prefix index (referenced or free).
    step_cached: array[float] = field(default_factory=lambda: array("d"))
    #: Sampled (time, referenced, cached-but-free, empty) block counts, exact at each sample.
    occupancy_samples: list[tuple[float, int, int, int]] = field(default_factory=list)
    #: The service rate at a limit: requests finished by the steps that ended
    #: with requests left waiting (the token budget, running cap or pool
    #: refused them) or held back by ``SimConfig.max_concurrency``, after the
    #: first such step that finished any, and those steps' simulated seconds
    #: from that step's end to the last one's.
    saturated_seconds: float = 0.0
    saturated_finished: int = 0
    #: Per request (arrival order): arrival (when sent), first scheduled, first
    #: token, finish (simulated s).
    req_arrival: array[float] = field(default_factory=lambda: array("d"))
    req_admit: array[float] = field(default_factory=lambda: array("d"))
    req_first: array[float] = field(default_factory=lambda: array("d"))
    req_finish: array[float] = field(default_factory=lambda: array("d"))
    req_output: array[int] = field(default_factory=lambda: array("q"))
    #: Per request: when its client meant to send it (the trace's scaled time);
    #: later than that only when ``SimConfig.max_concurrency`` held it back.
    req_offered: array[float] = field(default_factory=lambda: array("d"))
    #: Per request: prompt tokens, hits served by the GPU pool and by the host tier.
    req_prompt: array[int] = field(default_factory=lambda: array("q"))
    req_gpu_hit: array[int] = field(default_factory=lambda: array("q"))
    req_host_hit: array[int] = field(default_factory=lambda: array("q"))
    host_hit_tokens: int = 0
    host_transfer_seconds: float = 0.0
    #: Per request: hits served by the disk tier (beyond the GPU pool and host tier).
    req_disk_hit: array[int] = field(default_factory=lambda: array("q"))
    disk_hit_tokens: int = 0
    disk_transfer_seconds: float = 0.0
    #: Block residency histograms, in simulated microseconds.
    residency: ResidencySnapshot | None = None


@dataclass
class EngineFeed:
    """The requests routed to one engine: ``pending`` in arrival order, and
    whether more may still come (a cluster's router appends while the
    engines run; :func:`~kvcoord.replay.scheduler.simulate` hands a closed
    feed of the whole trace)."""

    pending: deque[WorkloadRequest]
    closed: bool = True
    #: When a list: each finished request is appended (the router's count).
    finished: list[WorkloadRequest] | None = None
