"""Dtypes of the planner: what a KV element and a weight cost in bytes, and
which weights a quantization scheme stores in its own format.

:data:`KV_DTYPES` are the ``--kv-dtype`` names, :data:`WEIGHT_DTYPES` the
``--weight-dtype`` names, each with the scheme's bytes per stored weight and
its *scope*: the weights vLLM loads in that format. The rest (embeddings and
the output head always; attention and dense layers under ``mxfp4``) stay in
the model's compute dtype. :func:`quantized_dtype` reads the weight dtype
from a Hugging Face ``config.json`` (``quantization_config`` and
``torch_dtype``).

Where the scopes come from (vLLM 0.19.0):

* ``fp8`` (``quant_method`` ``fp8``, ``fbgemm_fp8``, compressed-tensors
  8-bit float, ModelOpt FP8) and ``int8``: every linear layer and every expert;
  the vocabulary embedding and ``lm_head`` are not quantized (compressed-tensors
  checkpoints list ``lm_head`` under ``ignore``). One byte per weight; the
  per-channel or 128x128-block scales are below 0.1%.
* ``int4`` (GPTQ / AWQ / compressed-tensors W4A16, 128-weight groups): half a
  byte per weight plus a 16-bit scale and a 4-bit zero point per group.
* ``nvfp4`` (ModelOpt / compressed-tensors NVFP4): half a byte plus one FP8
  scale per 16 weights.
* ``mxfp4`` (gpt-oss): vLLM's ``Mxfp4Config`` quantizes the fused-MoE experts
  only and loads every linear layer unquantized (``get_quant_method`` in
  ``vllm/model_executor/layers/quantization/mxfp4.py``). Half a byte plus one
  8-bit scale per 32 weights, with the experts' hidden dimension rounded up
  to a multiple of 256 for the CUDA MoE kernels
  (``mxfp4_round_up_hidden_size_and_intermediate_size`` in
  ``vllm/model_executor/layers/fused_moe/oracle/mxfp4.py``): gpt-oss-120b
  loads as 64.4 GiB, not the 60.6 GiB its parameter count gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kvcoord._suggest import unknown_name

__all__ = [
    "DTYPE_BYTES",
    "KV_DTYPES",
    "WEIGHT_DTYPES",
    "WeightDtype",
    "compute_dtype",
    "quantized_dtype",
    "weight_dtype_name",
]

#: Bytes per element of every dtype name the planner and its data files use.
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4,
    "float32": 4,
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "auto": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
    "int4": 0.5 + 2.5 / 128,
    "nvfp4": 0.5 + 1 / 16,
    "mxfp4": 0.5 + 1 / 32,
}

#: ``--kv-dtype`` names (vLLM's ``--kv-cache-dtype`` values and the dtype names).
KV_DTYPES: tuple[str, ...] = (
    "bf16",
    "bfloat16",
    "fp16",
    "float16",
    "fp32",
    "float32",
    "auto",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
)

Scope = Literal["all", "linear", "experts"]


@dataclass(frozen=True)
class WeightDtype:
    """A weight format: bytes per stored weight and which weights use it
    (``all``: every weight, embeddings included, the model runs in it;
    ``linear``: linear layers and experts; ``experts``: MoE experts only)."""

    name: str
    bytes: float
    scope: Scope
    #: Experts' hidden dimension rounded up to a multiple of this (0: none).
    expert_hidden_align: int = 0


#: ``--weight-dtype`` names.
WEIGHT_DTYPES: dict[str, WeightDtype] = {
    w.name: w
    for w in (
        WeightDtype("bf16", 2, "all"),
        WeightDtype("fp16", 2, "all"),
        WeightDtype("fp32", 4, "all"),
        WeightDtype("fp8", 1, "linear"),
        WeightDtype("int8", 1, "linear"),
        WeightDtype("int4", DTYPE_BYTES["int4"], "linear"),
        WeightDtype("nvfp4", DTYPE_BYTES["nvfp4"], "linear"),
        WeightDtype("mxfp4", DTYPE_BYTES["mxfp4"], "experts", expert_hidden_align=256),
    )
}

_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32"}


def weight_dtype_name(name: str) -> str:
    """The ``--weight-dtype`` name of ``name`` (``bfloat16`` is ``bf16``); a
    ValueError with a did-you-mean for an unknown one."""
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in WEIGHT_DTYPES:
        raise ValueError(unknown_name("weight dtype", name, WEIGHT_DTYPES))
    return key


def compute_dtype(weight_dtype: str) -> str:
    """The dtype activations, logits and (with ``--kv-dtype auto``) the KV cache
    use: the weights' own for an unquantized model, else bf16 (the
    ``torch_dtype`` of every quantized checkpoint the presets cover)."""
    return weight_dtype if WEIGHT_DTYPES[weight_dtype].scope == "all" else "bf16"


def quantized_dtype(path: Path, raw: dict[str, Any]) -> str:
    """The weight dtype of a Hugging Face ``config.json`` (the parsed ``raw``):
    from ``quantization_config`` when there is one, else ``torch_dtype``
    (``dtype`` in newer files; bf16 when neither is given). A scheme the
    planner does not model is a ValueError naming the file and the key."""
    q = raw.get("quantization_config")
    if q is None:
        dtype = raw.get("torch_dtype") or raw.get("dtype") or "bfloat16"
        name = _ALIASES.get(dtype, dtype) if isinstance(dtype, str) else None
        if name not in ("bf16", "fp16", "fp32"):
            raise ValueError(
                f"{path}: 'torch_dtype' {_shown(dtype)} is not one of bfloat16, float16, float32"
            )
        return str(name)
    if not isinstance(q, dict):
        raise ValueError(f"{path}: 'quantization_config' must be a JSON object")
    method = q.get("quant_method")
    found: str | None = None
    if method in ("fp8", "fbgemm_fp8"):
        found = "fp8"
    elif method == "mxfp4":
        found = "mxfp4"
    elif method in ("gptq", "awq", "gptq_marlin", "awq_marlin"):
        found = _BITS.get(q.get("bits", q.get("w_bit")))
    elif method == "modelopt":
        inner = q.get("quantization")
        algo = str((inner if isinstance(inner, dict) else q).get("quant_algo", "")).upper()
        found = {"FP8": "fp8", "NVFP4": "nvfp4"}.get(algo)
    elif method == "compressed-tensors":
        found = _compressed_tensors(q)
    if found is None:
        raise ValueError(
            f"{path}: the 'quantization_config' ('quant_method' {_shown(method)}) is not a "
            f"weight format the planner models ({', '.join(WEIGHT_DTYPES)}); give --weight-dtype"
        )
    return found


def _compressed_tensors(q: dict[str, Any]) -> str | None:
    """fp8 / int8 / int4 / nvfp4 from a compressed-tensors ``config_groups``."""
    groups = q.get("config_groups")
    if not isinstance(groups, dict):
        return None
    names = set()
    for g in groups.values():
        w = g.get("weights") if isinstance(g, dict) else None
        if not isinstance(w, dict):
            return None
        names.add(_COMPRESSED.get((w.get("num_bits"), w.get("type"))))
    return names.pop() if len(names) == 1 else None


#: GPTQ / AWQ ``bits`` and compressed-tensors (``num_bits``, ``type``) -> weight dtype.
_BITS: dict[object, str] = {4: "int4", 8: "int8"}
_COMPRESSED: dict[tuple[object, object], str] = {
    (8, "float"): "fp8",
    (8, "int"): "int8",
    (4, "int"): "int4",
    (4, "float"): "nvfp4",
}


def _shown(v: object) -> str:
    r = repr(v)
    return r if len(r) <= 40 else f"{r[:37]}..."
