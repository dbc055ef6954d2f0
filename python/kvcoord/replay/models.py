"""Model architectures for ``kvcoord replay``: what a KV-cache token costs in bytes.

:data:`MODELS` is the one table of model facts (from each model's published
Hugging Face ``config.json``); :mod:`kvcoord.replay.hf_config` builds the
same :class:`ModelSpec` from a ``config.json`` file and resolves a preset
name or a config path (``load_model``). :func:`model_layout` turns a
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

import math
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from kvcoord._arith import cdiv
from kvcoord._suggest import unknown_name
from kvcoord.config import (
    KVCacheGroup,
    MambaSpec,
)
from kvcoord.replay.dtypes import (
    DTYPE_BYTES,
    KV_DTYPES,
    WEIGHT_DTYPES,
    compute_dtype,
    weight_dtype_name,
)
from kvcoord.replay.layouts import Layout, group_spec

__all__ = [
    "DTYPE_BYTES",
    "MODELS",
    "KVFootprint",
    "ModelError",
    "ModelSpec",
    "model_layout",
]


class ModelError(ValueError):
    """An unknown model name or dtype, or an unreadable/unsupported model config;
    ``option`` is the make_plan keyword at fault when it is not the model
    (``kv_dtype``, ``weight_dtype``)."""

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.option))


@dataclass(frozen=True)
class ModelSpec:
    """The dimensions of one model that the planner needs.

    ``layer_kinds`` counts layers per kind: ``full_attention``,
    ``sliding_window``, ``chunked_local`` (``window`` tokens for both) or
    ``mamba``. ``params`` / ``active_params`` are all and per-token weights
    (equal for dense models), both counting the input embedding and the
    output head, as :mod:`kvcoord.replay.hf_config` counts them;
    ``weight_bytes`` is their size as vLLM loads them in ``weight_dtype``
    (the checkpoint's own unless ``--weight-dtype`` says otherwise;
    :mod:`kvcoord.replay.dtypes` says which weights a format quantizes).
    The vocabulary, MLP and expert sizes split the parameters into
    embeddings, experts and the rest, and size the activations of
    :mod:`kvcoord.replay.memory`.
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
    vocab_size: int = 32000
    #: One matrix for the input embedding and the output head (else two).
    tie_embeddings: bool = False
    #: Dense MLP width (0: every layer is MoE).
    intermediate_size: int = 0
    #: MoE: routed experts per MoE layer, experts per token, one expert's MLP
    #: width and the layers with experts (the others are dense).
    experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    moe_layers: int = 0
    note: str = ""

    @cached_property
    def num_layers(self) -> int:
        return sum(n for _, n in self.layer_kinds)

    @property
    def attention_layers(self) -> int:
        return sum(n for k, n in self.layer_kinds if k != MambaSpec.kind)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def embedding_params(self) -> float:
        """Input embedding and output head."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)

    @property
    def expert_params(self) -> float:
        """Routed experts (gate, up and down projections of each)."""
        return self.moe_layers * self.experts * 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def compute_dtype(self) -> str:
        """The dtype of activations and logits (bf16 for a quantized model)."""
        return compute_dtype(self.weight_dtype)

    @cached_property
    def weight_bytes(self) -> float:
        """Bytes of all weights as vLLM loads them (every GPU of a TP group holds
        ``1/tp`` of them): experts, the other layers and the embeddings each in
        the format the weight dtype gives them."""
        return sum(self._weight_parts())

    @cached_property
    def streamed_weight_bytes(self) -> float:
        """Bytes of the weights one forward pass reads whole: all but the input
        embedding table when it is not the output head (a step looks up only its
        tokens' rows of it)."""
        embed = self._weight_parts()[0]
        return self.weight_bytes - (0.0 if self.tie_embeddings else embed / 2)

    @cached_property
    def head_params(self) -> float:
        """The output head (``lm_head``): one ``hidden x vocabulary`` matrix."""
        return float(self.vocab_size * self.hidden_size)

    @cached_property
    def expert_weight_bytes(self) -> float:
        """Bytes of the routed experts' weights (0 for a dense model)."""
        return self._weight_parts()[1]

    def _weight_parts(self) -> tuple[float, float, float]:
        """Bytes of the embeddings, the routed experts and the rest."""
        w = WEIGHT_DTYPES[self.weight_dtype]
        plain = DTYPE_BYTES[self.compute_dtype]
        embed, experts = self.embedding_params, self.expert_params
        rest = max(0.0, self.params - embed - experts)
        if w.scope == "all":
            return embed * w.bytes, experts * w.bytes, rest * w.bytes
        if w.expert_hidden_align:
            align = w.expert_hidden_align
            experts *= cdiv(self.hidden_size, align) * align / self.hidden_size
        rest_bytes = rest * (w.bytes if w.scope == "linear" else plain)
        return embed * plain, experts * w.bytes, rest_bytes

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
            vocab_size=128256,
            intermediate_size=14336,
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
            vocab_size=128256,
            intermediate_size=28672,
        ),
        *(
            _m(
                f"qwen3-{size}",
                f"Qwen/Qwen3-{size.upper()}",
                {"full_attention": layers},
                hidden_size=hidden,
                num_heads=heads,
                kv_heads=8,
                head_dim=128,
                params=params,
                active_params=params,
                vocab_size=151936,
                intermediate_size=mlp,
            )
            for size, layers, hidden, heads, mlp, params in (
                ("8b", 36, 4096, 32, 12288, 8.19e9),
                ("14b", 40, 5120, 40, 17408, 14.77e9),
                ("32b", 64, 5120, 64, 25600, 32.76e9),
            )
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
            vocab_size=129280,
            # 3 dense layers, then 58 of 256 routed experts (8 per token) + 1 shared
            intermediate_size=18432,
            experts=256,
            experts_per_token=8,
            moe_intermediate_size=2048,
            moe_layers=58,
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
            # the model card's 5.13e9 active counts the unembedding, not the
            # 0.58e9 input embedding, which this count includes
            active_params=5.71e9,
            weight_dtype="mxfp4",
            vocab_size=201088,
            experts=128,
            experts_per_token=4,
            moe_intermediate_size=2880,
            moe_layers=36,
            note="alternating full / 128-token sliding-window layers; MXFP4 MoE weights",
        ),
        _m(
            "gpt-oss-20b",
            "openai/gpt-oss-20b",
            {"full_attention": 12, "sliding_window": 12},
            window=128,
            hidden_size=2880,
            num_heads=64,
            kv_heads=8,
            head_dim=64,
            params=20.9e9,
            active_params=4.19e9,  # the model card's 3.61e9 + the input embedding
            weight_dtype="mxfp4",
            vocab_size=201088,
            experts=32,
            experts_per_token=4,
            moe_intermediate_size=2880,
            moe_layers=24,
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
            # text 27.01e9 (62 layers + tied 262,208-entry vocabulary) + SigLIP tower 0.42e9
            params=27.43e9,
            active_params=27.43e9,
            vocab_size=262208,
            tie_embeddings=True,
            intermediate_size=21504,
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
            vocab_size=202048,
            # every layer: 16 routed experts (1 per token) + a shared expert
            experts=16,
            experts_per_token=1,
            moe_intermediate_size=8192,
            moe_layers=48,
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
            vocab_size=65536,
            # every other layer has 16 experts (2 per token), the rest a dense MLP
            intermediate_size=14336,
            experts=16,
            experts_per_token=2,
            moe_intermediate_size=14336,
            moe_layers=16,
            # d_inner 8192 x (d_conv-1 = 3 conv columns + d_state = 16 SSM columns)
            mamba_state_elems=8192 * (3 + 16),
            note="1 attention : 7 Mamba layers; prefix caching off (Mamba prefix caching "
            "is issue 12's work)",
        ),
    )
}


def resolve_kv_dtype(kv_dtype: str | None, weight_dtype: str) -> str:
    """The KV dtype: the one asked for, else (and for ``auto``) the compute
    dtype, as vLLM's ``--kv-cache-dtype auto`` does."""
    if kv_dtype is not None and kv_dtype not in KV_DTYPES:
        raise ModelError(unknown_name("KV dtype", kv_dtype, KV_DTYPES), "kv_dtype")
    return compute_dtype(weight_dtype) if kv_dtype in (None, "auto") else kv_dtype


def check_weight_dtype(spec: ModelSpec) -> None:
    w = WEIGHT_DTYPES[spec.weight_dtype]
    if w.scope == "experts" and not spec.expert_params:
        raise ModelError(
            f"vLLM's {w.name.upper()} format quantizes mixture-of-experts layers only, "
            f"and {spec.name} has none",
            "weight_dtype",
        )


def check_dtype_names(kv_dtype: str | None, weight_dtype: str | None) -> str | None:
    """Refuse an unknown KV or weight dtype name (a :class:`ModelError` naming
    its option, with a did-you-mean); the weight dtype's canonical name."""
    resolve_kv_dtype(kv_dtype, "bf16")
    try:
        return None if weight_dtype is None else weight_dtype_name(weight_dtype)
    except ValueError as e:
        raise ModelError(str(e), "weight_dtype") from None


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
    if MambaSpec.kind in counts:
        elem = DTYPE_BYTES[model.kv_dtype]
        mamba_page = group_size * model.mamba_state_elems * elem / max(1, min(tp, 8))
        while bs * group_size * per_layer < mamba_page:
            bs += 16
    groups: list[KVCacheGroup] = []
    for kind, n in model.layer_kinds:
        for gi in range(cdiv(n, group_size)):
            names = tuple(
                f"{kind}.{gi * group_size + j}" for j in range(min(group_size, n - gi * group_size))
            )
            groups.append(KVCacheGroup(group_spec(kind, bs, model.window), layer_names=names))
    page = max(bs * group_size * per_layer, mamba_page)
    caching = MambaSpec.kind not in counts
    desc = f"{model.name}: " + ", ".join(f"{n} {k}" for k, n in model.layer_kinds)
    lay = Layout(model.name, tuple(groups), enable_caching=caching, description=desc)
    token_bytes = model.attention_layers * per_layer
    return lay, KVFootprint(model.name, tp, bs, group_size, page, len(groups), token_bytes)
