"""A :class:`~kvcoord.replay.models.ModelSpec` from a Hugging Face ``config.json``,
and :func:`load_model`: a preset by name or a ``config.json`` path."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvcoord._suggest import missing_file, unknown_name
from kvcoord.replay.dtypes import quantized_dtype, weight_dtype_name
from kvcoord.replay.layouts import MAX_LAYERS
from kvcoord.replay.models import (
    MODELS,
    ModelError,
    ModelSpec,
    check_dtype_names,
    check_weight_dtype,
    resolve_kv_dtype,
)

__all__ = ["load_model", "read_config", "read_hf_config"]


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


def read_config(
    path: str | Path, kv_dtype: str | None = None, weight_dtype: str | None = None
) -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face ``config.json``.

    Reads layers, heads, KV heads, head size, sliding-window / chunked
    patterns (``layer_types``, ``sliding_window_pattern``,
    ``no_rope_layers``), MLA latents, the vocabulary, MLP and MoE sizes (for
    the parameter estimate) and the weight dtype (``quantization_config``,
    else ``torch_dtype``; ``weight_dtype`` overrides); a nested ``text_config``
    is used when present. Every value
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
    sizes = _sizes(path, raw, cfg, layers, hidden, heads, kv_heads, head_dim)
    try:
        wdtype = weight_dtype_name(weight_dtype) if weight_dtype else quantized_dtype(path, raw)
    except ValueError as e:
        raise ModelError(str(e)) from None
    name = raw.get("_name_or_path")
    spec = ModelSpec(
        name=name if isinstance(name, str) and name else (path.parent.name or path.stem),
        hf_id=name if isinstance(name, str) else "",
        layer_kinds=tuple(kinds.items()),
        hidden_size=hidden,
        num_heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim if not kv_lora else kv_lora + rope,
        weight_dtype=wdtype,
        kv_dtype=resolve_kv_dtype(kv_dtype, wdtype),
        window=window,
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=rope,
        qk_dim=qk_dim,
        v_dim=v_dim,
        note=f"read from {path}",
        **sizes,
    )
    try:
        check_weight_dtype(spec)
    except ModelError as e:  # the file's own dtype is the file's fault
        raise (e if weight_dtype else ModelError(f"{path}: {e}")) from None
    return spec


def _sizes(
    path: Path,
    raw: dict[str, Any],
    cfg: dict[str, Any],
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
) -> dict[str, Any]:
    """Vocabulary, MLP and expert sizes and the (all, active) parameter counts
    they give: embeddings, attention, dense and MoE MLPs."""
    vocab = _int(path, cfg, "vocab_size", default=32000)
    inter = _int(path, cfg, "intermediate_size", default=4 * hidden)
    attn = hidden * head_dim * (2 * heads + 2 * kv_heads)
    experts = _int(
        path, cfg, "n_routed_experts", "num_local_experts", "num_experts", default=0, minimum=0
    )
    top_k = moe_inter = moe_layers = shared = 0
    if experts:
        top_k = _int(path, cfg, "num_experts_per_tok", "experts_per_token", default=1)
        moe_inter = _int(path, cfg, "moe_intermediate_size", default=inter)
        shared = _int(path, cfg, "n_shared_experts", default=0, minimum=0)
        dense = _int(path, cfg, "first_k_dense_replace", default=0, minimum=0, maximum=layers)
        period = _int(
            path, cfg, "expert_layer_period", "interleave_moe_layer_step", default=1, maximum=layers
        )
        moe_layers = (layers - dense) // period
    tied = _get(cfg, "tie_word_embeddings", default=_get(raw, "tie_word_embeddings", default=False))
    spec = ModelSpec(
        "", "", (), hidden, heads, kv_heads, head_dim, 0.0, 0.0,
        vocab_size=vocab, tie_embeddings=bool(tied), experts=experts,
        moe_intermediate_size=moe_inter, moe_layers=moe_layers,
    )  # fmt: skip
    dense_mlp = 3 * hidden * inter
    shared_mlp = shared * 3 * hidden * moe_inter
    per_expert = 3 * hidden * moe_inter
    body = layers * attn + (layers - moe_layers) * dense_mlp + moe_layers * shared_mlp
    params = spec.embedding_params + body + spec.expert_params
    active = spec.embedding_params + body + moe_layers * top_k * per_expert
    return {
        "params": float(params),
        "active_params": float(active),
        "vocab_size": vocab,
        "tie_embeddings": bool(tied),
        "intermediate_size": inter if moe_layers < layers else 0,
        "experts": experts,
        "experts_per_token": top_k,
        "moe_intermediate_size": moe_inter,
        "moe_layers": moe_layers,
    }


def _get(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    return default


def load_model(
    name_or_path: str, kv_dtype: str | None = None, weight_dtype: str | None = None
) -> ModelSpec:
    """A preset by name (case-insensitive) or a ``config.json`` path;
    ``kv_dtype`` and ``weight_dtype`` override the model's own. The KV dtype
    follows the weight dtype's compute dtype unless given (``--weight-dtype
    fp32`` keeps an FP32 KV cache, as vLLM's ``--dtype float32`` does)."""
    wdtype = check_dtype_names(kv_dtype, weight_dtype)
    key = name_or_path.lower()
    if key in MODELS:
        spec = MODELS[key]
        w = wdtype or spec.weight_dtype
        kv = resolve_kv_dtype(kv_dtype, w) if kv_dtype or wdtype else spec.kv_dtype
        spec = replace(spec, weight_dtype=w, kv_dtype=kv)
        check_weight_dtype(spec)
        return spec
    if name_or_path.endswith(".json"):
        return read_config(name_or_path, kv_dtype, wdtype)
    raise ModelError(unknown_name("model", name_or_path, MODELS))


def read_hf_config(
    path: str | Path, kv_dtype: str | None = None, weight_dtype: str | None = None
) -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face ``config.json`` (:func:`read_config`)."""
    return read_config(path, kv_dtype, weight_dtype)
