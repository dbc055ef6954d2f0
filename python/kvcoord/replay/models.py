"""Model architectures for ``kvcoord replay``: what a KV-cache token costs in bytes.

:data:`MODELS` is the one table of model facts (from each model's published
Hugging Face ``config.json``); :func:`read_hf_config` builds the same
:class:`ModelSpec` from a ``config.json`` file. :func:`model_layout` turns a
model into a cache :class:`~kvcoord.replay.layouts.Layout` and a
:class:`KVFootprint` (bytes per block and per token, per GPU and per replica).

How the pool is shared (vLLM's hybrid allocator): layers are grouped so that
every KV-cache group has the same number of layers, ``group_size`` = the
smallest layer count of any kind; each kind gets ``ceil(count / group_size)``
groups. One pool block holds ``block_size`` tokens of every layer of one
group, so every block has the same size in bytes (the *page*)::

    page_bytes = block_size x group_size x bytes per token per layer

A Mamba layer keeps one fixed-size state per request instead of per-token
KV; the attention block size is raised (in steps of 16) until an attention
page is at least as large as a Mamba group's state, as vLLM does.

Bytes per token per layer: ``2 x kv_heads x head_dim x dtype bytes`` (K and
V; GQA/MHA) or ``(kv_lora_rank + qk_rope_head_dim) x dtype bytes`` (MLA: one
compressed latent). Under tensor parallelism ``--tp N`` each GPU holds
``ceil(kv_heads / N)`` KV heads (heads are replicated when ``N > kv_heads``);
an MLA latent is replicated on every GPU.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvcoord._suggest import missing_file, unknown_name
from kvcoord.config import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheGroup,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from kvcoord.replay.layouts import MAX_LAYERS, Layout

__all__ = [
    "DTYPE_BYTES",
    "MODELS",
    "KVFootprint",
    "ModelError",
    "ModelSpec",
    "load_model",
    "model_layout",
    "read_hf_config",
]

#: Bytes per element of each KV / weight dtype name.
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
    "mxfp4": 4.25 / 8,
}


class ModelError(ValueError):
    """An unknown model name or an unreadable/unsupported model config."""


@dataclass(frozen=True)
class ModelSpec:
    """The dimensions of one model that the planner needs.

    ``layer_kinds`` counts layers per kind: ``full_attention``,
    ``sliding_window``, ``chunked_local`` (``window`` tokens for both) or
    ``mamba``. ``params`` / ``active_params`` are all and per-token weights
    (equal for dense models); ``weight_bytes`` is their size as served.
    """

    name: str
    hf_id: str
    layer_kinds: tuple[tuple[str, int], ...]
    hidden_size: int
    num_heads: int
    kv_heads: int
    head_dim: int
    params: float
    active_params: float
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    window: int = 0
    #: MLA: compressed KV latent and decoupled RoPE key per token per layer.
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    #: Attention math per head (query-key and value widths; MLA differs from head_dim).
    qk_dim: int = 0
    v_dim: int = 0
    #: Mamba state elements per layer per request (conv + SSM state).
    mamba_state_elems: int = 0
    note: str = ""

    @property
    def num_layers(self) -> int:
        return sum(n for _, n in self.layer_kinds)

    @property
    def attention_layers(self) -> int:
        return sum(n for k, n in self.layer_kinds if k != "mamba")

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def weight_bytes(self) -> float:
        return self.params * DTYPE_BYTES[self.weight_dtype]

    def kv_bytes_per_token_layer(self, tp: int = 1) -> float:
        """KV bytes of one token in one attention layer on one GPU of a TP group."""
        b = DTYPE_BYTES[self.kv_dtype]
        if self.is_mla:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * b
        return 2 * math.ceil(self.kv_heads / tp) * self.head_dim * b

    def attention_flops_per_pair(self) -> float:
        """FLOPs of one query token attending one key token, summed over heads, one layer."""
        qk = self.qk_dim or self.head_dim
        v = self.v_dim or self.head_dim
        return 2.0 * self.num_heads * (qk + v)


def _m(name: str, hf_id: str, kinds: dict[str, int], **kw: Any) -> ModelSpec:
    return ModelSpec(name, hf_id, tuple(kinds.items()), **kw)


#: The one table of model facts (Hugging Face config.json of each ``hf_id``).
MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _m(
            "llama-3.1-8b",
            "meta-llama/Llama-3.1-8B-Instruct",
            {"full_attention": 32},
            hidden_size=4096,
            num_heads=32,
            kv_heads=8,
            head_dim=128,
            params=8.03e9,
            active_params=8.03e9,
        ),
        _m(
            "llama-3.1-70b",
            "meta-llama/Llama-3.1-70B-Instruct",
            {"full_attention": 80},
            hidden_size=8192,
            num_heads=64,
            kv_heads=8,
            head_dim=128,
            params=70.6e9,
            active_params=70.6e9,
        ),
        _m(
            "deepseek-v3",
            "deepseek-ai/DeepSeek-V3",
            {"full_attention": 61},
            hidden_size=7168,
            num_heads=128,
            kv_heads=1,
            head_dim=576,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            qk_dim=192,
            v_dim=128,
            params=671e9,
            active_params=37e9,
            weight_dtype="fp8",
            note="MLA: one 576-wide latent per token per layer, replicated under TP",
        ),
        _m(
            "gpt-oss-120b",
            "openai/gpt-oss-120b",
            {"full_attention": 18, "sliding_window": 18},
            window=128,
            hidden_size=2880,
            num_heads=64,
            kv_heads=8,
            head_dim=64,
            params=116.8e9,
            active_params=5.1e9,
            weight_dtype="mxfp4",
            note="alternating full / 128-token sliding-window layers; MXFP4 MoE weights",
        ),
        _m(
            "gemma-3-27b",
            "google/gemma-3-27b-it",
            {"full_attention": 10, "sliding_window": 52},
            window=1024,
            hidden_size=5376,
            num_heads=32,
            kv_heads=16,
            head_dim=128,
            params=27.4e9,
            active_params=27.4e9,
            note="5 local (1024-token window) : 1 global layers",
        ),
        _m(
            "llama-4-scout",
            "meta-llama/Llama-4-Scout-17B-16E-Instruct",
            {"full_attention": 12, "chunked_local": 36},
            window=8192,
            hidden_size=5120,
            num_heads=40,
            kv_heads=8,
            head_dim=128,
            params=109e9,
            active_params=17e9,
            note="every 4th layer global (NoPE), the rest 8192-token chunked local attention",
        ),
        _m(
            "jamba-1.5-mini",
            "ai21labs/AI21-Jamba-1.5-Mini",
            {"full_attention": 4, "mamba": 28},
            hidden_size=4096,
            num_heads=32,
            kv_heads=8,
            head_dim=128,
            params=51.6e9,
            active_params=12e9,
            # d_inner 8192 x (d_conv-1 = 3 conv columns + d_state = 16 SSM columns)
            mamba_state_elems=8192 * (3 + 16),
            note="1 attention : 7 Mamba layers; prefix caching off (Mamba prefix caching "
            "is issue 12's work)",
        ),
    )
}


# --------------------------------------------------------------------------- HF config.json


#: Largest head count, dimension or vocabulary a model config may declare.
_DIM_LIMIT = 1 << 24


def _shown(v: object) -> str:
    r = repr(v)
    return r if len(r) <= 60 else f"{r[:57]}..."


def _int(
    path: Path,
    cfg: dict[str, Any],
    *keys: str,
    default: int,
    minimum: int = 1,
    maximum: int = _DIM_LIMIT,
) -> int:
    """The first of ``keys`` present (and not null) in ``cfg``, an integer in
    ``[minimum, maximum]``; ``default`` when none is."""
    for k in keys:
        v = cfg.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not minimum <= v <= maximum:
            raise ModelError(
                f"{path}: {k!r} must be an integer in [{minimum}, {maximum:,}], got {_shown(v)}"
            )
        return v
    return default


def read_hf_config(path: str | Path, kv_dtype: str | None = None) -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face ``config.json``.

    Reads layers, heads, KV heads, head size, sliding-window / chunked
    patterns (``layer_types``, ``sliding_window_pattern``,
    ``no_rope_layers``), MLA latents and MoE sizes (for the parameter
    estimate); a nested ``text_config`` is used when present. Every value
    read is checked (an integer in range, a pattern as long as the layers):
    a bad one is a :class:`ModelError` naming the file and the key.
    """
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(f"{path}: {missing_file(path)}") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ModelError(f"{path}: not a readable JSON model config ({e})") from None
    if not isinstance(raw, dict):
        raise ModelError(f"{path}: a model config must be a JSON object")
    cfg = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    assert isinstance(cfg, dict)
    for k in ("num_hidden_layers", "hidden_size", "num_attention_heads"):
        if cfg.get(k) is None:
            raise ModelError(f"{path}: missing {k!r} (a positive integer)")
    layers = _int(path, cfg, "num_hidden_layers", default=0, maximum=MAX_LAYERS)
    hidden = _int(path, cfg, "hidden_size", default=0)
    heads = _int(path, cfg, "num_attention_heads", default=0)
    kv_heads = _int(path, cfg, "num_key_value_heads", default=heads)
    head_dim = _int(path, cfg, "head_dim", default=max(1, hidden // heads))
    window = _int(path, cfg, "sliding_window", default=0, minimum=0, maximum=1 << 31)
    kinds: dict[str, int] = {}
    layer_types = cfg.get("layer_types")
    pattern = _int(path, cfg, "sliding_window_pattern", default=0, minimum=0, maximum=MAX_LAYERS)
    if layer_types is not None:
        if not (
            isinstance(layer_types, list)
            and len(layer_types) == layers
            and all(isinstance(t, str) for t in layer_types)
        ):
            raise ModelError(
                f"{path}: 'layer_types' must be a list of {layers} strings (one per layer)"
            )
        for t in layer_types:
            kind = "sliding_window" if "sliding" in t else "full_attention"
            kinds[kind] = kinds.get(kind, 0) + 1
    elif pattern and window:
        full = layers // pattern
        kinds = {"full_attention": full, "sliding_window": layers - full}
    elif cfg.get("attention_chunk_size") is not None and cfg.get("no_rope_layers") is not None:
        no_rope = cfg["no_rope_layers"]
        if not (
            isinstance(no_rope, list)
            and len(no_rope) == layers
            and all(isinstance(x, int) for x in no_rope)
        ):
            raise ModelError(
                f"{path}: 'no_rope_layers' must be a list of {layers} integers (one per layer)"
            )
        chunked = sum(1 for x in no_rope if x)
        kinds = {"full_attention": layers - chunked, "chunked_local": chunked}
        window = _int(path, cfg, "attention_chunk_size", default=0, maximum=1 << 31)
    else:
        kinds = {"full_attention": layers}
    kinds = {k: n for k, n in kinds.items() if n > 0}
    if "sliding_window" in kinds and not window:
        raise ModelError(f"{path}: sliding-window layers need a positive 'sliding_window'")
    kv_lora = _int(path, cfg, "kv_lora_rank", default=0, minimum=0)
    rope = _int(path, cfg, "qk_rope_head_dim", default=0, minimum=0)
    qk_dim = v_dim = 0
    if kv_lora:
        qk_dim = _int(path, cfg, "qk_nope_head_dim", default=128, minimum=0) + rope
        v_dim = _int(path, cfg, "v_head_dim", default=128)
    params, active = _estimate_params(path, cfg, layers, hidden, heads, kv_heads, head_dim)
    dtype = _get(raw, "torch_dtype", "dtype", default="bfloat16")
    wdtype = dtype if isinstance(dtype, str) and dtype in DTYPE_BYTES else "bf16"
    if isinstance(raw.get("quantization_config"), dict):
        qm = raw["quantization_config"].get("quant_method", "")
        wdtype = {"fp8": "fp8", "mxfp4": "mxfp4"}.get(qm if isinstance(qm, str) else "", wdtype)
    name = raw.get("_name_or_path")
    spec = ModelSpec(
        name=name if isinstance(name, str) and name else (path.parent.name or path.stem),
        hf_id=name if isinstance(name, str) else "",
        layer_kinds=tuple(kinds.items()),
        hidden_size=hidden,
        num_heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim if not kv_lora else kv_lora + rope,
        params=params,
        active_params=active,
        weight_dtype=wdtype,
        kv_dtype=kv_dtype or (wdtype if wdtype in ("bf16", "fp16", "float16") else "bf16"),
        window=window,
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=rope,
        qk_dim=qk_dim,
        v_dim=v_dim,
        note=f"read from {path}",
    )
    return spec


def _get(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    return default


def _estimate_params(
    path: Path,
    cfg: dict[str, Any],
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
) -> tuple[float, float]:
    """(all, active) parameters from the config: embeddings, attention, (MoE) MLP."""
    vocab = _int(path, cfg, "vocab_size", default=32000)
    inter = _int(path, cfg, "intermediate_size", default=4 * hidden)
    attn = hidden * head_dim * (2 * heads + 2 * kv_heads)
    experts = _int(
        path, cfg, "n_routed_experts", "num_local_experts", "num_experts", default=0, minimum=0
    )
    if experts:
        top_k = _int(path, cfg, "num_experts_per_tok", "experts_per_token", default=1)
        moe_inter = _int(path, cfg, "moe_intermediate_size", default=inter)
        shared = _int(path, cfg, "n_shared_experts", default=0, minimum=0)
        expert = 3 * hidden * moe_inter
        mlp_all = expert * (experts + shared)
        mlp_active = expert * (top_k + shared)
    else:
        mlp_all = mlp_active = 3 * hidden * inter
    embed = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    return float(embed + layers * (attn + mlp_all)), float(embed + layers * (attn + mlp_active))


def load_model(name_or_path: str, kv_dtype: str | None = None) -> ModelSpec:
    """A preset by name (case-insensitive) or a ``config.json`` path; ``kv_dtype`` overrides."""
    if kv_dtype is not None and kv_dtype not in DTYPE_BYTES:
        raise ModelError(unknown_name("KV dtype", kv_dtype, DTYPE_BYTES))
    key = name_or_path.lower()
    if key in MODELS:
        spec = MODELS[key]
        return replace(spec, kv_dtype=kv_dtype) if kv_dtype else spec
    if name_or_path.endswith(".json"):
        return read_hf_config(name_or_path, kv_dtype)
    raise ModelError(unknown_name("model", name_or_path, MODELS))


# --------------------------------------------------------------------------- layout + bytes


@dataclass(frozen=True)
class KVFootprint:
    """Bytes of the KV cache of one model at one TP degree."""

    model: str
    tp: int
    block_size: int
    group_size: int
    #: Bytes of one pool block on one GPU (all blocks of a pool are the same size).
    page_bytes_per_gpu: float
    num_groups: int
    #: Bytes per token of context summed over every layer, one GPU / whole replica.
    token_bytes_per_gpu: float

    @property
    def page_bytes(self) -> float:
        """Bytes of one pool block over the whole TP group."""
        return self.page_bytes_per_gpu * self.tp

    @property
    def token_bytes(self) -> float:
        return self.token_bytes_per_gpu * self.tp

    def blocks_for_memory(self, bytes_per_gpu: float) -> int:
        """Pool size (null block included) that fits in ``bytes_per_gpu`` of KV memory per GPU."""
        return int(bytes_per_gpu // self.page_bytes_per_gpu)

    def memory_for_blocks(self, num_blocks: int) -> float:
        """KV memory per GPU of a pool of ``num_blocks`` blocks."""
        return num_blocks * self.page_bytes_per_gpu


def _spec(kind: str, bs: int, window: int) -> KVCacheSpec:
    if kind == "full_attention":
        return FullAttentionSpec(bs)
    if kind == "sliding_window":
        return SlidingWindowSpec(bs, sliding_window=window)
    if kind == "chunked_local":
        return ChunkedLocalAttentionSpec(bs, attention_chunk_size=window)
    return MambaSpec(bs)


def model_layout(
    model: ModelSpec, tp: int = 1, block_size: int = 16, layout: Layout | None = None
) -> tuple[Layout, KVFootprint]:
    """The cache layout vLLM would build for ``model`` and its bytes per block.

    With ``layout`` given (``--layout`` beside ``--model``), that layout's
    groups are used and the model's attention layers are split evenly among
    them (a what-if: this model's dimensions with another cache layout).
    """
    per_layer = model.kv_bytes_per_token_layer(tp)
    if layout is not None:
        n_attn = sum(1 for g in layout.groups if not isinstance(g.spec, MambaSpec)) or 1
        group_size = max(1, model.attention_layers // n_attn)
        bs = layout.block_size
        page = bs * group_size * per_layer
        fp = KVFootprint(
            model.name,
            tp,
            bs,
            group_size,
            page,
            len(layout.groups),
            model.attention_layers * per_layer,
        )
        return replace(layout, name=f"{layout.name} ({model.name} dims)"), fp
    counts = dict(model.layer_kinds)
    group_size = min(counts.values())
    bs = block_size
    mamba_page = 0.0
    if "mamba" in counts:
        elem = DTYPE_BYTES[model.kv_dtype]
        mamba_page = group_size * model.mamba_state_elems * elem / max(1, min(tp, 8))
        while bs * group_size * per_layer < mamba_page:
            bs += 16
    groups: list[KVCacheGroup] = []
    for kind, n in model.layer_kinds:
        for gi in range(-(-n // group_size)):
            names = tuple(
                f"{kind}.{gi * group_size + j}" for j in range(min(group_size, n - gi * group_size))
            )
            groups.append(KVCacheGroup(_spec(kind, bs, model.window), layer_names=names))
    page = max(bs * group_size * per_layer, mamba_page)
    caching = "mamba" not in counts
    desc = f"{model.name}: " + ", ".join(f"{n} {k}" for k, n in model.layer_kinds)
    lay = Layout(model.name, tuple(groups), enable_caching=caching, description=desc)
    token_bytes = model.attention_layers * per_layer
    return lay, KVFootprint(model.name, tp, bs, group_size, page, len(groups), token_bytes)
