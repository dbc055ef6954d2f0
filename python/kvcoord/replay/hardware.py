"""GPU presets for the step-time model: the one table of hardware facts.

Figures are the vendors' published per-GPU datasheet numbers: dense (no
sparsity) BF16 and FP8 tensor throughput, HBM bandwidth, the GPU-to-GPU link
(NVLink, or PCIe where there is none; one direction) and the host link used
by a host-memory tier (PCIe, one direction). Memory is the total
``nvidia-smi`` reports for the part (MiB), not the marketing "80 GB".

vLLM sizes its KV cache from the total the CUDA runtime reports
(``cudaMemGetInfo``, :attr:`GPUSpec.cuda_total_bytes`), which is smaller by
what the driver keeps for itself: on an H100 SXM, vLLM 0.19.0 logs a total of
79.19 GiB (llm-d-planner's start-up logs, in
``kvcoord/replay/data/vllm_measurements.csv``) against ``nvidia-smi``'s
81,559 MiB, 468 MiB less. The other parts are taken to keep the same 468 MiB
(not measured).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcoord._suggest import unknown_name

__all__ = ["DRIVER_RESERVED_BYTES", "GPUS", "GPUSpec", "HardwareError", "load_gpu"]

GB = 1e9
TB = 1e12
MiB = 1 << 20

#: Memory the driver keeps out of the CUDA runtime's total (H100 SXM, see above).
DRIVER_RESERVED_BYTES = 468 * MiB


class HardwareError(ValueError):
    """An unknown GPU name."""


@dataclass(frozen=True)
class GPUSpec:
    name: str
    description: str
    bf16_flops: float
    fp8_flops: float
    hbm_bytes: float
    hbm_bandwidth: float
    #: GPU-to-GPU bandwidth per direction (bytes/s) and per-hop latency (s).
    link_bandwidth: float
    link_latency: float
    #: Host (CPU memory) link per direction, bytes/s.
    host_bandwidth: float

    @property
    def cuda_total_bytes(self) -> float:
        """The total ``cudaMemGetInfo`` reports: what vLLM's
        ``gpu_memory_utilization`` is a share of."""
        return self.hbm_bytes - DRIVER_RESERVED_BYTES

    def peak_flops(self, weight_dtype: str) -> float:
        """Dense tensor FLOP/s for matmuls with weights of ``weight_dtype``."""
        if weight_dtype.startswith("fp8") and self.fp8_flops > 0:
            return self.fp8_flops
        return self.bf16_flops


#: name -> spec. A100 = SXM 80 GB; ``a100-40gb`` is the SXM 40 GB part.
GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        GPUSpec("a100", "NVIDIA A100 SXM 80GB", 312 * TB, 0.0, 81920 * MiB, 2.039 * TB,
                300 * GB, 5e-6, 25 * GB),
        GPUSpec("a100-40gb", "NVIDIA A100 SXM 40GB", 312 * TB, 0.0, 40960 * MiB, 1.555 * TB,
                300 * GB, 5e-6, 25 * GB),
        GPUSpec("h100", "NVIDIA H100 SXM 80GB", 989 * TB, 1979 * TB, 81559 * MiB, 3.35 * TB,
                450 * GB, 4e-6, 55 * GB),
        GPUSpec("h200", "NVIDIA H200 SXM 141GB", 989 * TB, 1979 * TB, 143771 * MiB, 4.8 * TB,
                450 * GB, 4e-6, 55 * GB),
        GPUSpec("b200", "NVIDIA B200 (HGX) 180GB", 2250 * TB, 4500 * TB, 183359 * MiB, 8.0 * TB,
                900 * GB, 3e-6, 55 * GB),
        GPUSpec("l40s", "NVIDIA L40S 48GB (PCIe, no NVLink)", 362 * TB, 733 * TB, 46068 * MiB,
                0.864 * TB, 25 * GB, 10e-6, 25 * GB),
    )
}  # fmt: skip


def load_gpu(name: str) -> GPUSpec:
    """A GPU preset by name (case-insensitive)."""
    key = name.lower()
    if key not in GPUS:
        raise HardwareError(unknown_name("GPU", name, GPUS))
    return GPUS[key]
