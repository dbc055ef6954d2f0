"""The KV-cache memory vLLM leaves on each GPU, term by term.

:func:`vllm_kv_memory` is the one model. It follows vLLM 0.19.0's start-up
profile (``Worker.determine_available_memory`` in
``vllm/v1/worker/gpu_worker.py`` and ``memory_profiling`` in
``vllm/utils/mem_utils.py``, https://github.com/vllm-project/vllm/tree/v0.19.0)::

    requested  = total x gpu_memory_utilization
    KV memory  = requested - weights - peak activation - non-torch memory

* **total** is what ``cudaMemGetInfo`` reports for the GPU
  (:attr:`~kvcoord.replay.hardware.GPUSpec.cuda_total_bytes`), not the
  ``nvidia-smi`` figure.
* **weights**: ``model_memory_usage``, the bytes the loaded model takes on
  this GPU: :attr:`~kvcoord.replay.models.ModelSpec.weight_bytes` (each part
  in the format the weight dtype gives it) divided by the TP degree.
* **peak activation**: the growth of PyTorch's peak allocation during
  ``GPUModelRunner.profile_run``, which runs one forward pass of
  ``max_num_batched_tokens`` tokens and then the sampler on the last hidden
  state of ``min(max_num_seqs, max_num_batched_tokens)`` requests (top-k
  and top-p on, over the whole vocabulary). The peak is the larger of

  - the forward pass: per token, :data:`HIDDEN_BUFFERS` hidden-size vectors
    beside the widest MLP output on this GPU (gate and up projections and
    their product, ``3 x intermediate / tp``; for MoE layers the fused-MoE
    buffers of each of the token's experts, ``top_k x (3 x expert width / tp
    + hidden)``), in the compute dtype;
  - the sampler: the logits in the compute dtype plus
    :data:`SAMPLER_FP32_TENSORS` float32 tensors of the same
    ``requests x vocabulary`` shape (the float32 logits, probabilities and
    the random-sampling buffers), on top of the forward pass's output that
    is still held (the hidden states of every token and of the sampled ones).

  Logits span the whole vocabulary on every GPU (they are gathered across
  the TP group), so this term does not shrink with TP.
* **non-torch memory**: memory allocated outside PyTorch's allocator between
  vLLM's first memory snapshot (after the CUDA context exists) and the end
  of the profile: cuBLAS workspaces and other runtime buffers
  (:data:`NON_TORCH_BYTES`) and, under TP, NCCL's and the custom all-reduce's
  communication buffers, allocated by the profile run's first collectives
  (:data:`TP_COMM_BYTES`).
* **CUDA graphs** are not subtracted: vLLM 0.19.0 captures them after the KV
  cache is allocated, in the memory outside ``gpu_memory_utilization``; the
  estimate that would subtract them is off by default
  (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0``, ``vllm/envs.py``). A
  multimodal model's encoder profile is not modelled.

The three constants below are the only calibrated numbers, read from two
rows of ``kvcoord/replay/data/vllm_measurements.csv`` (vLLM 0.19.0 start-up
logs on H100, https://github.com/jgchn/llm-d-planner): ``llmdplanner-kv-01``
(Llama-3.1-8B BF16, one GPU: activation 1.89 GiB, non-torch 0.25 GiB) and
``llmdplanner-kv-05`` (the same at TP 2: non-torch 2.07 GiB). Every other row
is predicted, not fitted: ``python -m kvcoord.replay.validate --memory``
prints them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvcoord.replay.dtypes import DTYPE_BYTES
from kvcoord.replay.hardware import GPUSpec
from kvcoord.replay.models import ModelSpec

__all__ = [
    "CALIBRATION_ROWS",
    "DEFAULT_GPU_MEMORY_UTILIZATION",
    "HIDDEN_BUFFERS",
    "NON_TORCH_BYTES",
    "SAMPLER_FP32_TENSORS",
    "TP_COMM_BYTES",
    "VLLM_VERSION",
    "MemoryBudget",
    "vllm_kv_memory",
    "vllm_serve_batch",
]

GiB = float(1 << 30)

#: The vLLM release whose start-up profile :func:`vllm_kv_memory` follows.
VLLM_VERSION = "0.19.0"
#: vLLM's default ``--gpu-memory-utilization``.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9

#: The rows of ``vllm_measurements.csv`` the constants below are read from.
CALIBRATION_ROWS = ("llmdplanner-kv-01", "llmdplanner-kv-05")
#: Memory outside PyTorch on one GPU (llmdplanner-kv-01: 0.25 GiB).
NON_TORCH_BYTES = 0.25 * GiB
#: Communication buffers added under TP (llmdplanner-kv-05: 2.07 - 0.25 GiB;
#: measured on H100 SXM with NVLink, used for every GPU).
TP_COMM_BYTES = 1.82 * GiB
#: Float32 tensors of ``requests x vocabulary`` alive at the sampler's peak
#: besides the logits (llmdplanner-kv-01: 1.89 GiB of activation for 1,024
#: requests x 128,256 entries, less the 80 MiB of held hidden states).
SAMPLER_FP32_TENSORS = 3.2
#: Hidden-size vectors per token alive beside the MLP output (residual,
#: layer input, normalised input): first principles, not calibrated.
HIDDEN_BUFFERS = 3


def vllm_serve_batch(gpu: GPUSpec) -> tuple[int, int]:
    """``vllm serve``'s default ``(max_num_seqs, max_num_batched_tokens)`` on
    ``gpu``: (1024, 8192) on a GPU of at least 70 GiB that is not an A100,
    else (256, 2048) (``EngineArgs.get_batch_defaults`` in
    ``vllm/engine/arg_utils.py``)."""
    big = gpu.cuda_total_bytes >= 70 * GiB and not gpu.name.startswith("a100")
    return (1024, 8192) if big else (256, 2048)


@dataclass(frozen=True)
class MemoryBudget:
    """One GPU's memory as vLLM divides it (bytes; see the module docstring)."""

    gpu: str
    total_bytes: float
    gpu_memory_utilization: float
    weight_bytes: float
    weight_dtype: str
    forward_bytes: float
    sampler_bytes: float
    non_torch_bytes: float
    max_num_seqs: int
    max_num_batched_tokens: int

    @property
    def requested_bytes(self) -> float:
        return self.total_bytes * self.gpu_memory_utilization

    @property
    def activation_bytes(self) -> float:
        """The profile's peak: the larger of the forward pass and the sampler."""
        return max(self.forward_bytes, self.sampler_bytes)

    @property
    def non_kv_bytes(self) -> float:
        return self.weight_bytes + self.activation_bytes + self.non_torch_bytes

    @property
    def kv_bytes(self) -> float:
        """KV memory vLLM allocates (negative: none is left)."""
        return self.requested_bytes - self.non_kv_bytes

    @property
    def gpu_kv_bytes(self) -> float:
        """The most KV memory the whole GPU holds (``gpu_memory_utilization`` 1)."""
        return self.total_bytes - self.non_kv_bytes

    @property
    def activation_source(self) -> str:
        if self.sampler_bytes >= self.forward_bytes:
            return f"sampling {min(self.max_num_seqs, self.max_num_batched_tokens):,} requests"
        return f"{self.max_num_batched_tokens:,}-token forward"

    def describe(self) -> str:
        """The terms in one line, as the summary's "size from" shows them."""
        return (
            f"{self.gpu} {_gib(self.total_bytes)} x {self.gpu_memory_utilization:g} "
            f"utilization - weights {_gib(self.weight_bytes)} ({self.weight_dtype}) "
            f"- activation {_gib(self.activation_bytes)} ({self.activation_source}) "
            f"- non-torch {_gib(self.non_torch_bytes)} = {_gib(self.kv_bytes)} per GPU"
        )

    def as_dict(self) -> dict[str, Any]:
        """The terms in GiB per GPU (``--json``'s ``memory``)."""
        return {
            "source": f"vLLM {VLLM_VERSION} start-up profile",
            "gpu_total_gib": self.total_bytes / GiB,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "requested_gib": self.requested_bytes / GiB,
            "weights_gib": self.weight_bytes / GiB,
            "weight_dtype": self.weight_dtype,
            "activation_gib": self.activation_bytes / GiB,
            "activation_forward_gib": self.forward_bytes / GiB,
            "activation_sampler_gib": self.sampler_bytes / GiB,
            "non_torch_gib": self.non_torch_bytes / GiB,
            "kv_budget_gib": self.kv_bytes / GiB,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
        }


def _gib(n: float) -> str:
    return f"{n / GiB:,.2f} GiB"


def vllm_kv_memory(
    model: ModelSpec,
    gpu: GPUSpec,
    tp: int = 1,
    *,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 8192,
) -> MemoryBudget:
    """What vLLM's start-up profile leaves for the KV cache on each GPU of a
    TP group (module docstring). ``max_num_seqs`` and
    ``max_num_batched_tokens`` are the engine's (the replay passes its
    ``--max-running`` and ``--token-budget``; :func:`vllm_serve_batch` gives
    ``vllm serve``'s defaults)."""
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if tp < 1 or max_num_seqs < 1 or max_num_batched_tokens < 1:
        raise ValueError("tp, max_num_seqs and max_num_batched_tokens must be positive")
    act = DTYPE_BYTES[model.compute_dtype]
    h = model.hidden_size
    tokens = max_num_batched_tokens
    requests = min(max_num_seqs, tokens)
    mlp = 3 * model.intermediate_size / tp if model.intermediate_size else 0.0
    if model.experts:
        moe = model.experts_per_token * (3 * model.moe_intermediate_size / tp + h)
        mlp = max(mlp, moe)
    forward = tokens * act * (HIDDEN_BUFFERS * h + mlp)
    # held while sampling: every token's hidden state, the sampled rows and
    # the random stand-in the sampler draws for them
    held = (tokens + 2 * requests) * h * act
    fp32 = SAMPLER_FP32_TENSORS - (1 if act == 4 else 0)  # float32 logits are the first
    sampler = held + requests * model.vocab_size * (act + 4 * fp32)
    return MemoryBudget(
        gpu=gpu.name,
        total_bytes=gpu.cuda_total_bytes,
        gpu_memory_utilization=gpu_memory_utilization,
        weight_bytes=model.weight_bytes / tp,
        weight_dtype=model.weight_dtype,
        forward_bytes=forward,
        sampler_bytes=sampler,
        non_torch_bytes=NON_TORCH_BYTES + (TP_COMM_BYTES if tp > 1 else 0.0),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )
