"""Roofline step-time model: how long one scheduler step takes on a model + GPU + TP.

One step computes ``T`` tokens (uncached prefill chunks plus one token per
decoding request). On each of the ``tp`` GPUs of the replica::

    linear = 2 x (dense active + expert active / MOE_EFFICIENCY) x T / tp
    bf16   = [2 x head x S + A x sum over attention layers of query-key pairs] / tp
    bytes  = (other weights + expert weights x touched(T) / MOE_EFFICIENCY) / tp
             + KV bytes read and written on this GPU
    t_gemm = (linear / peak[weight dtype] + bf16 / peak[compute dtype])
             / COMPUTE_EFFICIENCY[GPU architecture]
    t_mem  = bytes / (HBM bandwidth x BANDWIDTH_EFFICIENCY)
    t_comm = 2 x layers x (link latency + T x hidden x 2 bytes x 2 (tp-1)/tp / link bandwidth)
    t_gpu  = max(t_gemm, t_mem) + t_comm + STEP_OVERHEAD_S
    t_cpu  = CPU_SCALE x (SCHEDULER_STEP_S + SCHEDULER_SEQ_S x requests scheduled)
    step   = t_gpu + t_cpu        (max(t_gpu, t_cpu) with vLLM's --async-scheduling)

* ``dense active``: the per-token weights of the layers (the active
  parameters less the input embedding, a row lookup, and the output head).
  The output head (``head`` = hidden x vocabulary) runs once per scheduled
  request (``S`` of them), on the last position of its chunk, not per token
  computed: vLLM computes logits only where it samples.
* ``A`` = 2 x heads x (query-key width + value width): FLOPs of one query
  token attending one key token in one layer (QK^T and PV).
* Peaks: the linear layers run at the tensor peak of their weight dtype
  (FP8 weights: the FP8 peak); attention and the output head compute in the
  activations' dtype (BF16: vLLM quantizes linear layers and experts only,
  and the attention kernels multiply BF16 queries by BF16 keys).
* ``other weights``: every weight but the routed experts and, when it is
  not the output head too, the input embedding (a step reads only its
  tokens' rows).
* A request that computes ``n`` new tokens after ``c`` cached/computed ones
  contributes ``n x c + n (n+1) / 2`` query-key pairs in a full-attention
  layer and reads ``c + n`` tokens of KV once per step (flash-attention
  style); a sliding-window / chunked-local layer caps both at the window.
* ``touched(T)``: the share of the routed experts one step reads: with
  ``k`` of ``E`` experts per token, ``1 - (1 - k/E)^T`` (independent routing
  per token). ``MOE_EFFICIENCY`` is how much of the dense GEMMs'
  efficiency the experts' grouped GEMMs reach (small per-expert batches).
* KV written: ``T`` tokens; Mamba layers read and write their state once per
  request per step (their FLOPs are ignored).

* ``t_cpu``: the engine's CPU time between two forward passes, which the
  GPU waits for unless the scheduler runs ahead (``async_scheduling``).
  It is measured, not fitted: vLLM 0.33's real ``Scheduler``
  (``schedule()`` + ``update_from_output()`` of a decode step) on this
  repository's bench, ``benches/bench_vllm_scheduler.py --clock cpu``, costs
  :data:`SCHEDULER_STEP_S` plus :data:`SCHEDULER_SEQ_S` per running request
  with vLLM's own KV-cache manager (what the published measurements ran),
  and :data:`KVCOORD_SCHEDULER_SEQ_S` per request with kvcoord's
  (:data:`CPU_SCALE` carries it to another CPU; 1: the bench's).
* The API server (:mod:`kvcoord.replay.scheduler` queues its work): one
  process in front of the engine, serving one job at a time:
  :data:`FRONTEND_REQUEST_S` per request sent (tokenization, chat template,
  request set-up) before the engine sees it, and
  :data:`FRONTEND_OUTPUT_S` per scheduled request of each step
  (detokenizing and streaming its token) before the client sees the token.
  It runs beside the engine, not between its steps: a burst of requests
  reaches the engine at its pace, and when many requests run, the client
  sees their tokens at its pace.
* ``request_latency_s`` (:data:`REQUEST_LATENCY_S`): per request, the
  latency outside the engine's steps and the API server's queue (HTTP,
  the hops between processes); it is in TTFT and end-to-end latency, not
  in TPOT.

The fitted constants (:data:`COMPUTE_EFFICIENCY`, :data:`MOE_EFFICIENCY`,
:data:`BANDWIDTH_EFFICIENCY`, :data:`STEP_OVERHEAD_S`, :data:`FRONTEND_REQUEST_S`,
:data:`FRONTEND_OUTPUT_S`, :data:`REQUEST_LATENCY_S`) come from
``python -m kvcoord.replay.calibrate``:
a least-absolute-deviations fit of log TTFT and log TPOT on the published vLLM runs of
:data:`CALIBRATION_ROWS` (``kvcoord/replay/data/vllm_measurements.csv``);
``python -m kvcoord.replay.validate`` compares every other row with its
prediction (``docs/validation.md``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from kvcoord.replay.hardware import GPUSpec
from kvcoord.replay.models import DTYPE_BYTES, KVFootprint, ModelSpec

__all__ = [
    "BANDWIDTH_EFFICIENCY",
    "CALIBRATION_ROWS",
    "COMPUTE_EFFICIENCY",
    "CPU_SCALE",
    "FRONTEND_OUTPUT_S",
    "FRONTEND_REQUEST_S",
    "KVCOORD_SCHEDULER_SEQ_S",
    "MOE_EFFICIENCY",
    "REQUEST_LATENCY_S",
    "SCHEDULER_SEQ_S",
    "SCHEDULER_STEP_S",
    "STEP_OVERHEAD_S",
    "StepCost",
    "StepTimeModel",
    "attention_pairs",
    "compute_efficiency",
    "prefill_gpu_seconds_saved",
]

#: The rows of ``vllm_measurements.csv`` the fitted constants below come from
#: (``python -m kvcoord.replay.calibrate``); every other row is held out.
CALIBRATION_ROWS = (
    "gpustack-qwen3-8b-h100-02",
    "gpustack-qwen3-8b-h100-04",
    "gpustack-qwen3-14b-h100-04",
    "gpustack-qwen3-14b-a100-01",
    "gpustack-qwen3-32b-h100-01",
    "gpustack-qwen3-32b-h100-03",
    "gpustack-qwen3-32b-a100-02",
    "gpustack-qwen3-32b-a100-05",
    "gpustack-gptoss120b-h100-01",
    "gpustack-gptoss120b-h100-06",
    "gpustack-gptoss120b-h100-09",
    "gpustack-gptoss120b-a100-03",
    "gpustack-gptoss120b-a100-11",
    "gpustack-dsr1-h200-01",
    "gpustack-dsr1-h200-06",
    "vllmblog-fp8kv-llama8b-01",
    "vllmblog-fp8kv-gptoss20b-01",
)

# fitted by `python -m kvcoord.replay.calibrate` on CALIBRATION_ROWS (17 rows;
# the fit's printout is in docs/validation.md); bandwidth reached its cap of 1
#: Share of the dense tensor peak reached, by GPU architecture (A100: Ampere;
#: the others: Hopper's, the only other architecture measured).
COMPUTE_EFFICIENCY = {"ampere": 0.638, "hopper": 0.341}
MOE_EFFICIENCY = 0.577
BANDWIDTH_EFFICIENCY = 1.0
STEP_OVERHEAD_S = 2.66e-3
FRONTEND_REQUEST_S = 11.5e-3
FRONTEND_OUTPUT_S = 223e-6
REQUEST_LATENCY_S = 28.2e-3
#: The scheduler bench's CPU to the servers' (not fitted: taken as equal).
CPU_SCALE = 1.0

# measured: benches/bench_vllm_scheduler.py --running 16 256 1024 --clock cpu on
# this repository's 2-core development machine (vLLM 0.33.0, CPU build): a decode
# step net of the timer took 0.42 ms at 16 running requests and 27.4 ms at 1,024
# on vLLM's manager (14.2 ms on kvcoord's); the line through them
SCHEDULER_STEP_S = 0.0
SCHEDULER_SEQ_S = 26.7e-6
KVCOORD_SCHEDULER_SEQ_S = 14.0e-6


def compute_efficiency(gpu: GPUSpec) -> float:
    """The fitted share of ``gpu``'s dense tensor peak (:data:`COMPUTE_EFFICIENCY`)."""
    return COMPUTE_EFFICIENCY["ampere" if gpu.name.startswith("a100") else "hopper"]


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
    #: Share of the dense tensor peak reached (None: the GPU's, :func:`compute_efficiency`).
    compute_efficiency: float | None = None
    bandwidth_efficiency: float = BANDWIDTH_EFFICIENCY
    overhead_s: float = STEP_OVERHEAD_S
    #: vLLM's ``--async-scheduling``: the CPU's work overlaps the GPU's.
    async_scheduling: bool = False
    cpu_scale: float = CPU_SCALE
    scheduler_step_s: float = SCHEDULER_STEP_S
    #: Scheduler CPU seconds per scheduled request and step
    #: (:data:`KVCOORD_SCHEDULER_SEQ_S` for an engine on kvcoord's manager).
    scheduler_seq_s: float = SCHEDULER_SEQ_S
    request_latency_s: float = REQUEST_LATENCY_S
    #: Routed experts' GEMMs reach this share of the dense GEMMs' efficiency.
    moe_efficiency: float = MOE_EFFICIENCY
    #: The API server's seconds per request sent, and per scheduled request
    #: of a step's output (see the module docstring).
    frontend_request_s: float = FRONTEND_REQUEST_S
    frontend_output_s: float = FRONTEND_OUTPUT_S

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
        # per computed token, at the weight dtype's rate, expressed at the
        # compute dtype's (the attention's and the head's) rate
        linear = 2.0 * self.linear_params * self.compute_flops_per_second / self.flops_per_second
        return (
            linear,
            attn * self.full_layers,
            attn * self.window_layers,
            per_layer * self.full_layers,
            per_layer * self.window_layers,
            per_layer * (self.full_layers + self.window_layers),
            2 * state * self.mamba_layers,
            1.0 / (tp * self.compute_flops_per_second),
            1.0 / self.bytes_per_second,
            2.0 * m.head_params,
        )

    @cached_property
    def linear_params(self) -> float:
        """Per-token weights of the layers (no embedding, no output head), the
        routed experts' counted at the dense GEMMs' efficiency (over
        :attr:`moe_efficiency`)."""
        m = self.model
        expert_active = m.moe_layers * m.experts_per_token * 3 * m.hidden_size
        expert_active *= m.moe_intermediate_size
        body = m.active_params - m.embedding_params
        return body - expert_active + expert_active / self.moe_efficiency

    @property
    def window(self) -> int:
        return self.model.window

    @property
    def flops_per_second(self) -> float:
        """Achieved FLOP/s of one GPU in the linear layers (their weight dtype's peak)."""
        return self.gpu.peak_flops(self.model.weight_dtype) * self._efficiency

    @property
    def compute_flops_per_second(self) -> float:
        """Achieved FLOP/s of one GPU in attention and the output head (the
        activations' dtype)."""
        return self.gpu.peak_flops(self.model.compute_dtype) * self._efficiency

    @property
    def _efficiency(self) -> float:
        eff = self.compute_efficiency
        return compute_efficiency(self.gpu) if eff is None else eff

    @property
    def bytes_per_second(self) -> float:
        """Achieved HBM bytes/s of one GPU."""
        return self.gpu.hbm_bandwidth * self.bandwidth_efficiency

    def expert_share(self, tokens: Any) -> Any:
        """Share of the routed experts a step of ``tokens`` tokens reads (an
        array: per step): each token picks ``experts_per_token`` of ``experts``
        in each MoE layer, independently."""
        m = self.model
        if not m.experts:
            return 0.0
        miss = 1.0 - m.experts_per_token / m.experts
        if isinstance(tokens, np.ndarray):
            return 1.0 - miss ** np.maximum(tokens, 0)
        return float(1.0 - miss**tokens) if tokens > 0 else 0.0

    def weight_share(self, tokens: Any) -> Any:
        """Share of all weights a step of ``tokens`` tokens reads (the routed
        experts it touches, and every other weight but a separate input embedding)."""
        m = self.model
        experts = m.expert_weight_bytes
        read = m.streamed_weight_bytes - experts + experts * self.expert_share(tokens)
        return read / m.weight_bytes

    def step_seconds(
        self,
        tokens: Any,
        full_pairs: Any,
        window_pairs: Any,
        full_kv_read: Any,
        window_kv_read: Any,
        num_seqs: Any,
    ) -> Any:
        """Seconds of one step (GPU and the CPU's work between steps).

        ``tokens`` computed; query-key pairs and KV tokens read, summed over the
        step's requests, for full-attention layers and for window-capped layers
        (per layer); ``num_seqs`` requests scheduled (Mamba state traffic, the
        scheduler's per-request work). Also takes numpy arrays, one entry per
        step (the calibration's fast path).
        """
        arrays = isinstance(tokens, np.ndarray)
        if not arrays and tokens <= 0:
            return 0.0
        big = np.maximum if arrays else max
        gemm, attn_f, attn_w, kv_f, kv_w, kv_new, state, inv_flops, inv_bytes, head = self._coeffs
        flops = gemm * tokens + attn_f * full_pairs + attn_w * window_pairs + head * num_seqs
        kv_bytes = kv_f * full_kv_read + kv_w * window_kv_read + kv_new * tokens + state * num_seqs
        experts = self.model.expert_weight_bytes
        w_bytes = (
            self.model.streamed_weight_bytes - experts
            + experts * self.expert_share(tokens) / self.moe_efficiency
        ) / self.tp  # fmt: skip
        t_gemm = flops * inv_flops
        t_mem = (w_bytes + kv_bytes) * inv_bytes
        t_gpu = big(t_gemm, t_mem) + self.comm_seconds(tokens) + self.overhead_s
        t_cpu = self.cpu_seconds(num_seqs)
        t = big(t_gpu, t_cpu) if self.async_scheduling else t_gpu + t_cpu
        return np.where(tokens > 0, t, 0.0) if arrays else t

    def cpu_seconds(self, num_seqs: Any) -> Any:
        """The engine's CPU time of one step with ``num_seqs`` requests scheduled."""
        return self.cpu_scale * (self.scheduler_step_s + self.scheduler_seq_s * num_seqs)

    def comm_seconds(self, tokens: Any) -> Any:
        """Two ring all-reduces of the hidden state per layer under tensor parallelism."""
        tp = self.tp
        if tp <= 1:
            return 0.0
        g = self.gpu
        data = tokens * self.model.hidden_size * 2.0 * 2.0 * (tp - 1) / tp
        return 2 * self.model.num_layers * (g.link_latency + data / g.link_bandwidth)

    def prefill_gpu_seconds(self, tokens: int) -> float:
        """GPU-seconds of compute (all GPUs together) to prefill ``tokens`` tokens
        from an empty context: what a prefix hit of ``tokens`` skips (the
        output head runs once per request either way)."""
        pairs_full = attention_pairs(0, tokens)
        pairs_win = attention_pairs(0, tokens, self.window) if self.window_layers else 0
        flops = self._coeffs[0] * tokens + self.model.attention_flops_per_pair() * (
            self.full_layers * pairs_full + self.window_layers * pairs_win
        )
        return flops / self.compute_flops_per_second

    def describe(self) -> str:
        return (
            f"{self.model.name} on {self.tp}x {self.gpu.name}: "
            f"{self.flops_per_second / 1e12:.0f} TFLOP/s and "
            f"{self.bytes_per_second / 1e12:.2f} TB/s achieved per GPU, "
            f"+{self.overhead_s * 1e3:.1f} ms per step, CPU "
            f"{self.cpu_scale * self.scheduler_step_s * 1e3:.2f} ms + "
            f"{self.cpu_scale * self.scheduler_seq_s * 1e6:.1f} us per request between steps"
            f"{' (overlapped: async scheduling)' if self.async_scheduling else ''}, "
            f"API server {self.frontend_request_s * 1e3:.1f} ms per request sent and "
            f"{self.frontend_output_s * 1e6:.0f} us per request's token, "
            f"+{self.request_latency_s * 1e3:.0f} ms per request outside both"
        )


def prefill_gpu_seconds_saved(model: StepTimeModel, hit_tokens: np.ndarray) -> float:
    """GPU-seconds of prefill compute that ``hit_tokens`` (one entry per request) avoided.

    A hit of ``h`` tokens skips the GEMMs of those tokens and their attention
    among themselves (later tokens still attend to them):
    :meth:`StepTimeModel.prefill_gpu_seconds` of ``h``.
    """
    h = np.asarray(hit_tokens, dtype=np.float64)
    m = model.model
    flops = model._coeffs[0] * h + m.attention_flops_per_pair() * model.full_layers * (
        h * (h + 1) / 2
    )
    if model.window_layers:
        w = float(model.window)
        pairs_w = np.where(h <= w, h * (h + 1) / 2, w * (w + 1) / 2 + (h - w) * w)
        flops += m.attention_flops_per_pair() * model.window_layers * pairs_w
    return float(flops.sum() / model.compute_flops_per_second)
