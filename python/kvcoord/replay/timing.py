"""Roofline step-time model: how long one scheduler step takes on a model + GPU + TP.

One step computes ``T`` tokens (uncached prefill chunks plus one token per
decoding request). On each of the ``tp`` GPUs of the replica::

    flops  = [2 x active_params x T + A x sum over attention layers of query-key pairs] / tp
    bytes  = weight_bytes x touched(T) / tp  +  KV bytes read and written on this GPU
    t_gemm = flops / (peak FLOP/s x COMPUTE_EFFICIENCY)
    t_mem  = bytes / (HBM bandwidth x BANDWIDTH_EFFICIENCY)
    t_comm = 2 x layers x (link latency + T x hidden x 2 bytes x 2 (tp-1)/tp / link bandwidth)
    step   = max(t_gemm, t_mem) + t_comm + STEP_OVERHEAD_S

* ``A`` = 2 x heads x (query-key width + value width): FLOPs of one query
  token attending one key token in one layer (QK^T and PV).
* A request that computes ``n`` new tokens after ``c`` cached/computed ones
  contributes ``n x c + n (n+1) / 2`` query-key pairs in a full-attention
  layer and reads ``c + n`` tokens of KV once per step (flash-attention
  style); a sliding-window / chunked-local layer caps both at the window.
* ``touched(T)``: the share of weights one step reads. Dense models read all
  of them; a mixture-of-experts model with active share ``r`` reads
  ``1 - (1 - r)^T`` of them (independent routing per token).
* KV written: ``T`` tokens; Mamba layers read and write their state once per
  request per step (their FLOPs are ignored).

Efficiencies are round values chosen once (compute 0.6 of peak for the
GEMMs, 0.8 of HBM bandwidth), plus a fixed 0.5 ms per step of launch and
scheduling overhead; ``docs/replay.md`` compares the model with a published
vLLM measurement and states the error.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from kvcoord.replay.hardware import GPUSpec
from kvcoord.replay.models import DTYPE_BYTES, KVFootprint, ModelSpec

__all__ = [
    "BANDWIDTH_EFFICIENCY",
    "COMPUTE_EFFICIENCY",
    "STEP_OVERHEAD_S",
    "StepCost",
    "StepTimeModel",
    "attention_pairs",
    "prefill_gpu_seconds_saved",
]

COMPUTE_EFFICIENCY = 0.6
BANDWIDTH_EFFICIENCY = 0.8
STEP_OVERHEAD_S = 0.5e-3


def attention_pairs(cached: int, new: int, window: int = 0) -> int:
    """Query-key pairs of ``new`` tokens after ``cached`` ones (causal; window-capped if > 0)."""
    if window <= 0:
        return new * cached + new * (new + 1) // 2
    # token at position p (0-based) attends min(p + 1, window) keys
    total = 0
    lo, hi = cached, cached + new  # positions [lo, hi)
    full_end = min(hi, window)  # positions < window attend p + 1
    if lo < full_end:
        a, b = lo + 1, full_end
        total += (a + b) * (b - a + 1) // 2
    capped_start = max(lo, window)
    if hi > capped_start:
        total += (hi - capped_start) * window
    return total


class StepCost:
    """Per-step work :meth:`StepTimeModel.step_seconds` needs, summed over scheduled requests."""

    __slots__ = ("full_kv", "full_pairs", "seqs", "window", "window_kv", "window_pairs")

    def __init__(self, window: int) -> None:
        self.window = window
        self.full_pairs = self.window_pairs = self.full_kv = self.window_kv = self.seqs = 0

    def add(self, cached: int, new: int) -> None:
        self.full_pairs += new * cached + new * (new + 1) // 2
        self.full_kv += cached + new
        self.seqs += 1
        w = self.window
        if w:
            self.window_pairs += attention_pairs(cached, new, w)
            self.window_kv += min(cached + new, w)


@dataclass(frozen=True)
class StepTimeModel:
    """Step time of one model replica (``tp`` GPUs); see the module docstring."""

    model: ModelSpec
    gpu: GPUSpec
    tp: int
    footprint: KVFootprint
    compute_efficiency: float = COMPUTE_EFFICIENCY
    bandwidth_efficiency: float = BANDWIDTH_EFFICIENCY
    overhead_s: float = STEP_OVERHEAD_S

    # ------------------------------------------------------------- per-layer constants
    @cached_property
    def full_layers(self) -> int:
        return sum(n for k, n in self.model.layer_kinds if k == "full_attention")

    @cached_property
    def window_layers(self) -> int:
        return sum(n for k, n in self.model.layer_kinds if k in ("sliding_window", "chunked_local"))

    @cached_property
    def mamba_layers(self) -> int:
        return sum(n for k, n in self.model.layer_kinds if k == "mamba")

    @cached_property
    def _coeffs(self) -> tuple[float, ...]:
        """Per-step constants of :meth:`step_seconds` (computed once)."""
        m, tp = self.model, self.tp
        attn = m.attention_flops_per_pair()
        per_layer = m.kv_bytes_per_token_layer(tp)
        state = 0.0
        if self.mamba_layers:
            state = m.mamba_state_elems * DTYPE_BYTES[m.kv_dtype] / max(1, min(tp, 8))
        return (
            2.0 * m.active_params,
            attn * self.full_layers,
            attn * self.window_layers,
            per_layer * self.full_layers,
            per_layer * self.window_layers,
            per_layer * (self.full_layers + self.window_layers),
            2 * state * self.mamba_layers,
            1.0 / (tp * self.flops_per_second),
            1.0 / self.bytes_per_second,
        )

    @property
    def window(self) -> int:
        return self.model.window

    @property
    def flops_per_second(self) -> float:
        """Achieved GEMM FLOP/s of one GPU."""
        return self.gpu.peak_flops(self.model.weight_dtype) * self.compute_efficiency

    @property
    def bytes_per_second(self) -> float:
        """Achieved HBM bytes/s of one GPU."""
        return self.gpu.hbm_bandwidth * self.bandwidth_efficiency

    def weight_share(self, tokens: int) -> float:
        m = self.model
        if m.active_params >= m.params or tokens <= 0:
            return 1.0 if tokens > 0 else 0.0
        r = m.active_params / m.params
        return float(1.0 - (1.0 - r) ** tokens)

    def step_seconds(
        self,
        tokens: int,
        full_pairs: int,
        window_pairs: int,
        full_kv_read: int,
        window_kv_read: int,
        num_seqs: int,
    ) -> float:
        """Seconds of one step.

        ``tokens`` computed; query-key pairs and KV tokens read, summed over the
        step's requests, for full-attention layers and for window-capped layers
        (per layer); ``num_seqs`` requests scheduled (Mamba state traffic).
        """
        if tokens <= 0:
            return 0.0
        gemm, attn_f, attn_w, kv_f, kv_w, kv_new, state, inv_flops, inv_bytes = self._coeffs
        flops = gemm * tokens + attn_f * full_pairs + attn_w * window_pairs
        kv_bytes = kv_f * full_kv_read + kv_w * window_kv_read + kv_new * tokens + state * num_seqs
        w_bytes = self.model.weight_bytes * self.weight_share(tokens) / self.tp
        t_gemm = flops * inv_flops
        t_mem = (w_bytes + kv_bytes) * inv_bytes
        return max(t_gemm, t_mem) + self.comm_seconds(tokens) + self.overhead_s

    def comm_seconds(self, tokens: int) -> float:
        """Two ring all-reduces of the hidden state per layer under tensor parallelism."""
        tp = self.tp
        if tp <= 1:
            return 0.0
        g = self.gpu
        data = tokens * self.model.hidden_size * 2.0 * 2.0 * (tp - 1) / tp
        return 2 * self.model.num_layers * (g.link_latency + data / g.link_bandwidth)

    def prefill_flops(self, tokens: int) -> float:
        """FLOPs of prefilling ``tokens`` tokens from an empty context (all GPUs together)."""
        m = self.model
        pairs_full = attention_pairs(0, tokens)
        pairs_win = attention_pairs(0, tokens, self.window) if self.window_layers else 0
        return 2.0 * m.active_params * tokens + m.attention_flops_per_pair() * (
            self.full_layers * pairs_full + self.window_layers * pairs_win
        )

    def prefill_gpu_seconds(self, tokens: int) -> float:
        """GPU-seconds of compute to prefill ``tokens`` tokens from scratch (compute-bound)."""
        return self.prefill_flops(tokens) / self.flops_per_second

    def describe(self) -> str:
        return (
            f"{self.model.name} on {self.tp}x {self.gpu.name}: "
            f"{self.flops_per_second / 1e12:.0f} TFLOP/s and "
            f"{self.bytes_per_second / 1e12:.2f} TB/s achieved per GPU, "
            f"+{self.overhead_s * 1e3:.1f} ms per step"
        )


def prefill_gpu_seconds_saved(model: StepTimeModel, hit_tokens: np.ndarray) -> float:
    """GPU-seconds of prefill compute that ``hit_tokens`` (one entry per request) avoided.

    A hit of ``h`` tokens skips the GEMMs of those tokens and their attention
    among themselves (later tokens still attend to them): ``prefill_flops(h)``.
    """
    h = np.asarray(hit_tokens, dtype=np.float64)
    m = model.model
    flops = 2.0 * m.active_params * h + m.attention_flops_per_pair() * model.full_layers * (
        h * (h + 1) / 2
    )
    if model.window_layers:
        w = float(model.window)
        pairs_w = np.where(h <= w, h * (h + 1) / 2, w * (w + 1) / 2 + (h - w) * w)
        flops += m.attention_flops_per_pair() * model.window_layers * pairs_w
    return float(flops.sum() / model.flops_per_second)
