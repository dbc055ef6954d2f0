"""From the planner's flags to one replay set-up: model, GPU, layout, pool size, tiers.

:func:`make_plan` resolves ``--model``/``--model-config``/``--kv-dtype``,
``--gpu``/``--tp``, the pool size (``--kv-memory``, ``--capacity-tokens``,
``--num-blocks`` or a default picked from the GPU and the trace) and
``--host-memory`` into a :class:`Plan`; every problem is a :class:`PlanError`
naming the flag the user passed (or the default that was used).

Default size: what vLLM would leave for the KV cache, per GPU::

    GPU memory x 0.9 (vLLM's gpu_memory_utilization) - weights / tp - 2 GiB activations

raised to the smallest pool that holds the trace's longest request (with a
note) when that is not enough. Whatever sets it, a pool must fit on the GPU:
at most ``GPU memory - weights / tp`` of KV per GPU, or it is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kvcoord._arith import cdiv
from kvcoord._suggest import did_you_mean
from kvcoord.replay.hardware import GPUS, GPUSpec, HardwareError, load_gpu
from kvcoord.replay.hf_config import load_model, read_hf_config
from kvcoord.replay.layouts import Layout, LayoutError, load_layout, num_blocks_for_capacity
from kvcoord.replay.memory import DEFAULT_GPU_MEMORY_UTILIZATION, MemoryBudget, vllm_kv_memory
from kvcoord.replay.models import (
    MODELS,
    KVFootprint,
    ModelError,
    ModelSpec,
    check_dtype_names,
    model_layout,
)
from kvcoord.replay.tiers import DEFAULT_CHUNK_TOKENS, HostTier
from kvcoord.replay.timing import StepTimeModel
from kvcoord.replay.workloads import Workload

__all__ = [
    "DEFAULT_GPU",
    "DEFAULT_MODEL",
    "GiB",
    "Plan",
    "PlanError",
    "flag_of",
    "format_bytes",
    "make_plan",
    "min_blocks",
    "parse_bytes",
    "parse_duration",
]

GiB = 1 << 30
DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_GPU = "h100"

#: Size units (case-insensitive), as they are written in messages.
_UNIT_NAMES = ("B", "kB", "KiB", "MB", "MiB", "GB", "GiB", "TB", "TiB", "k", "M", "G", "T")
_UNITS = {
    "b": 1,
    "k": 1e3,
    "kb": 1e3,
    "m": 1e6,
    "mb": 1e6,
    "g": 1e9,
    "gb": 1e9,
    "t": 1e12,
    "tb": 1e12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}


def flag_of(option: str | None) -> str | None:
    """The ``kvcoord replay`` flag of a :func:`make_plan` keyword (``kv_memory`` ->
    ``--kv-memory``)."""
    return None if option is None else "--" + option.replace("_", "-")


class PlanError(ValueError):
    """A value the planner cannot use. ``option`` is the :func:`make_plan` keyword
    it came from (None: no one option), ``value`` how it was given (or None) and
    ``problem`` what is wrong; the message names ``kvcoord replay``'s flag for the
    option (``--kv-memory 8 TiB: ...``), :meth:`worded` any other flag."""

    def __init__(self, option: str | None, problem: str, value: str | None = None) -> None:
        self.option = option
        self.problem = problem
        self.value = value
        super().__init__(self.worded(flag_of(option)))

    def worded(self, flag: str | None) -> str:
        """The message with ``flag`` naming the option."""
        if flag is None:
            return self.problem
        head = flag if self.value is None else f"{flag} {self.value}"
        return f"{head}: {self.problem}"

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.option, self.problem, self.value))


def parse_bytes(text: str, *, allow_zero: bool = False) -> float:
    """``40GiB``, ``512 MiB``, ``1.5TB``, ``4096B``: a positive size with its unit
    (zero, in any unit or none, with ``allow_zero``). A number without a unit is
    refused with a hint (``40`` is not 40 bytes by accident: "did you mean 40GiB?")."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m:
        raise ValueError(f"expected a size like 40GiB, 512MiB or 2TB, got {text!r}")
    number, unit = m.group(1), m.group(2)
    v = float(number)
    if v == 0:
        if not allow_zero:
            raise ValueError(f"expected a positive size, got {text!r}")
        return 0.0
    if not unit:
        raise ValueError(
            f"a size needs a unit, got {text!r}: did you mean {number}GiB? "
            f"({number}B for bytes; units: {', '.join(_UNIT_NAMES[:9])})"
        )
    if unit.lower() not in _UNITS:
        raise ValueError(
            f"unknown size unit {unit!r} in {text!r}{did_you_mean(unit, _UNIT_NAMES)}; "
            f"units: {', '.join(_UNIT_NAMES[:9])}"
        )
    return v * _UNITS[unit.lower()]


#: Duration units, as they are written in messages, and their seconds.
_DURATION_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """``2s``, ``50ms``, ``1.5 min``, ``800us``: a positive duration with its unit,
    in seconds. A number without a unit is refused with a hint (``2`` is not
    taken as seconds or milliseconds by accident: "did you mean 2s?")."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    units = ", ".join(_DURATION_UNITS)
    if not m:
        raise ValueError(f"expected a duration like 2s, 50ms or 1.5min, got {text!r}")
    number, unit = m.group(1), m.group(2)
    v = float(number)
    if not unit:
        raise ValueError(
            f"a duration needs a unit, got {text!r}: did you mean {number}s? "
            f"({number}ms for milliseconds; units: {units})"
        )
    if unit.lower() not in _DURATION_UNITS:
        raise ValueError(
            f"unknown duration unit {unit!r} in {text!r}{did_you_mean(unit, _DURATION_UNITS)}; "
            f"units: {units}"
        )
    seconds = v * _DURATION_UNITS[unit.lower()]
    if not 0 < seconds < float("inf"):
        raise ValueError(f"expected a positive finite duration, got {text!r}")
    return seconds


def format_bytes(n: float) -> str:
    """Bytes in GiB (or MiB below 1 GiB)."""
    if n >= GiB:
        return f"{n / GiB:,.2f} GiB"
    return f"{n / (1 << 20):,.1f} MiB" if n >= 1 << 20 else f"{n:,.0f} B"


@dataclass
class Plan:
    """Everything one replay needs besides the workload and scheduler knobs."""

    model: ModelSpec
    gpu: GPUSpec
    tp: int
    layout: Layout
    footprint: KVFootprint
    step_model: StepTimeModel
    num_blocks: int
    #: The make_plan keyword that set the size ("kv_memory", ...); None: the default.
    size_option: str | None
    #: Why this size, in words (printed and in --json).
    size_note: str
    #: One GPU's memory as vLLM divides it (the default size's terms).
    memory: MemoryBudget
    host_bytes: float = 0.0
    disk_bytes: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def size_flag(self) -> str:
        """``kvcoord replay``'s flag that set the size, or "default"."""
        return flag_of(self.size_option) or "default"

    def memory_keys(self) -> dict[str, object]:
        """``--json``'s ``memory``: the terms of the default size, per GPU."""
        return {"memory": self.memory.as_dict()}

    @property
    def kv_bytes_per_gpu(self) -> float:
        return self.footprint.memory_for_blocks(self.num_blocks)

    @property
    def token_slots(self) -> int:
        """Tokens the pool holds counting every group's slot (null block excluded)."""
        return (self.num_blocks - 1) * self.footprint.block_size

    @property
    def context_tokens(self) -> int:
        """Tokens of context the pool holds if every group keeps all of them."""
        per = max(1, len(self.layout.groups))
        return (self.num_blocks - 1) // per * self.footprint.block_size

    def host_tier(self) -> HostTier | None:
        return self._tier(self.host_bytes)

    def disk_tier(self) -> HostTier | None:
        return self._tier(self.disk_bytes)

    def _tier(self, size: float) -> HostTier | None:
        if size <= 0 or not self.layout.enable_caching:
            return None
        tokens = int(size // self.footprint.token_bytes)
        return HostTier(max(tokens, DEFAULT_CHUNK_TOKENS), DEFAULT_CHUNK_TOKENS)


def min_blocks(layout: Layout, workload: Workload) -> int:
    """Smallest pool that holds the workload's longest request alone."""
    lay = layout
    if layout.has_sparse_groups:
        lay = Layout(layout.name, layout.groups[:1], layout.enable_caching)
        need = num_blocks_for_capacity(lay, workload.max_sequence_len)
        return need + len(layout.groups) - 1 + _sparse_blocks(layout, workload.max_sequence_len)
    return num_blocks_for_capacity(lay, workload.max_sequence_len)


def _sparse_blocks(layout: Layout, tokens: int) -> int:
    out = 0
    for g in layout.groups[1:]:
        spec = g.spec
        span = getattr(spec, "sliding_window", None) or getattr(spec, "attention_chunk_size", None)
        out += cdiv(min(tokens, (span or spec.block_size) + spec.block_size), spec.block_size)
    return out


def make_plan(
    workload: Workload,
    *,
    model: str | None = None,
    model_config: str | None = None,
    kv_dtype: str | None = None,
    gpu: str | None = None,
    tp: int = 1,
    layout: str | None = None,
    block_size: int | None = None,
    kv_memory: float | None = None,
    capacity_tokens: int | None = None,
    num_blocks: int | None = None,
    host_memory: float | None = None,
    disk_memory: float | None = None,
    weight_dtype: str | None = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 8192,
) -> Plan:
    """Resolve the planner's flags (see the module docstring). ``max_num_seqs``
    and ``max_num_batched_tokens`` are the replay's ``--max-running`` and
    ``--token-budget``, at which vLLM's start-up profile sizes the activation."""
    if model is not None and model_config is not None:
        raise PlanError(None, "--model and --model-config: give one")
    if not 0 < gpu_memory_utilization <= 1:  # also refuses NaN
        raise PlanError(
            "gpu_memory_utilization",
            "must be in (0, 1], a share of the GPU's memory (vLLM's default is 0.9)",
            f"{gpu_memory_utilization:g}",
        )
    try:
        if model_config is not None:
            check_dtype_names(kv_dtype, weight_dtype)  # a bad flag before the file's problems
            spec = read_hf_config(model_config, kv_dtype, weight_dtype)
        else:
            spec = load_model(DEFAULT_MODEL if model is None else model, kv_dtype, weight_dtype)
    except ModelError as e:
        which = e.option or ("model" if model_config is None else "model_config")
        raise PlanError(which, str(e)) from None
    try:
        g = load_gpu(DEFAULT_GPU if gpu is None else gpu)
    except HardwareError as e:
        raise PlanError("gpu", str(e)) from None
    base_layout = None
    if layout is not None:
        try:
            base_layout = load_layout(layout)
            if block_size is not None:
                base_layout = base_layout.with_block_size(block_size)
        except LayoutError as e:
            raise PlanError("layout", str(e)) from None
    lay, fp = model_layout(spec, tp, block_size or 16, base_layout)
    if block_size is not None and base_layout is None and fp.block_size != block_size:
        raise PlanError(
            "block_size",
            f"{spec.name}'s Mamba state needs attention blocks of at least {fp.block_size} tokens",
            str(block_size),
        )
    step = StepTimeModel(spec, g, tp, fp)
    need = min_blocks(lay, workload)
    notes = []
    if model is None and model_config is None:
        notes.append(f"model: {DEFAULT_MODEL} (default; --model to choose: {', '.join(MODELS)})")
    if gpu is None:
        notes.append(f"GPU: {DEFAULT_GPU} (default; --gpu to choose: {', '.join(GPUS)})")
    if not lay.enable_caching:
        notes.append(f"prefix caching is off for {lay.name} ({spec.note or lay.description})")

    mem = vllm_kv_memory(
        spec,
        g,
        tp,
        gpu_memory_utilization=gpu_memory_utilization,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    #: What one GPU holds for the KV cache at most: all of its memory but the rest.
    room = mem.gpu_kv_bytes
    option: str | None
    if num_blocks is not None:
        n, option, why = num_blocks, "num_blocks", f"--num-blocks {num_blocks}"
    elif capacity_tokens is not None:
        n = num_blocks_for_capacity(lay, capacity_tokens)
        option, why = "capacity_tokens", f"--capacity-tokens {capacity_tokens:,} in every group"
    elif kv_memory is not None:
        n = fp.blocks_for_memory(kv_memory)
        option, why = "kv_memory", f"--kv-memory {format_bytes(kv_memory)} per GPU"
    else:
        free = mem.kv_bytes
        if free <= 0:
            raise PlanError(
                "tp",
                f"{spec.name}'s weights ({format_bytes(mem.weight_bytes)} per GPU in "
                f"{spec.weight_dtype}) leave no KV memory on a {g.description}: "
                f"{mem.describe()}; raise the TP degree or --gpu-memory-utilization, "
                "or give a pool size",
                str(tp),
            )
        n = fp.blocks_for_memory(free)
        option = None
        why = f"default: {mem.describe()}"
        if n < need:
            why += (
                f"; raised to {need:,} blocks to hold the longest request "
                f"({workload.max_sequence_len:,} tokens)"
            )
            n = need
    label = "the default pool" if option is None else None
    if n < 2:
        raise PlanError(
            option, _sized(label, "a pool needs at least 2 blocks (block 0 is the null block)")
        )
    if n < need:
        raise PlanError(
            option,
            _sized(
                label,
                f"{n:,} blocks ({format_bytes(fp.memory_for_blocks(n))} per GPU) cannot hold "
                f"the longest request ({workload.max_sequence_len:,} tokens needs about "
                f"{need:,} blocks, {format_bytes(fp.memory_for_blocks(need))} per GPU)",
            ),
        )
    kv = fp.memory_for_blocks(n)
    if kv > room:
        raise PlanError(
            option,
            _sized(
                label,
                f"{n:,} blocks are {format_bytes(kv)} of KV per GPU, more than a {g.name} holds: "
                f"{format_bytes(mem.total_bytes)} of memory - {format_bytes(mem.weight_bytes)} of "
                f"{spec.name} weights ({spec.weight_dtype}) per GPU (TP {tp}) - "
                f"{format_bytes(mem.activation_bytes)} of activation - "
                f"{format_bytes(mem.non_torch_bytes)} non-torch leaves "
                f"{format_bytes(max(room, 0.0))} for the KV cache"
                + ("; the longest request alone needs this much" if option is None else ""),
            ),
        )
    plan = Plan(spec, g, tp, lay, fp, step, n, option, why, mem, notes=notes)
    for opt, size in (("host_memory", host_memory), ("disk_memory", disk_memory)):
        if size is None:
            continue
        if not lay.enable_caching:
            raise PlanError(opt, f"{lay.name} has prefix caching off; nothing to offload")
        if size < fp.token_bytes * DEFAULT_CHUNK_TOKENS:
            raise PlanError(
                opt,
                f"smaller than one {DEFAULT_CHUNK_TOKENS}-token chunk "
                f"({format_bytes(fp.token_bytes * DEFAULT_CHUNK_TOKENS)})",
                format_bytes(size),
            )
    plan.host_bytes = host_memory or 0.0
    plan.disk_bytes = disk_memory or 0.0
    return plan


def _sized(label: str | None, problem: str) -> str:
    return problem if label is None else f"{label}: {problem}"
