"""KV-cache layouts for ``kvcoord replay``: named presets and layout files.

A :class:`Layout` names a list of :class:`kvcoord.KVCacheGroup` (the library's
own specs, so a layout file is validated by the same rules as a config built
in code) and whether prefix caching is on; ``scheduler.build_config`` adds the
pool size to make a ``kvcoord.KVCacheConfig``.

Layout file (JSON or TOML)::

    name = "my-model"            # optional
    enable_caching = true        # optional, default true
    [[groups]]
    type = "full_attention"      # full_attention | sliding_window | chunked_local | mamba
                                 # | mla_attention | sliding_window_mla | rswa
    block_size = 16
    layers = 24                  # optional: number of layers, or a list of names
    [[groups]]
    type = "sliding_window"
    block_size = 16
    sliding_window = 4096

Type-specific keys: ``sliding_window`` (sliding_window, sliding_window_mla),
``attention_chunk_size`` (chunked_local), ``rswa_window`` (rswa),
``mamba_cache_mode`` ("none" or "align"), ``num_prefill_checkpoint_blocks``
and ``prefill_checkpoint_alignment`` (mamba).

JSON: ``{"name": ..., "enable_caching": ..., "groups": [{...}, ...]}``.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import Any, get_args

from kvcoord._arith import cdiv
from kvcoord._suggest import did_you_mean, missing_file
from kvcoord.config import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheGroup,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    RSWASpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)
from kvcoord.errors import ConfigError

__all__ = [
    "GROUP_TYPES",
    "MAX_LAYERS",
    "PRESETS",
    "Layout",
    "LayoutError",
    "group_spec",
    "load_layout",
    "num_blocks_for_capacity",
    "parse_layout",
]

#: The spec classes a layout file may name, by their ``kind``: every kind of
#: ``kvcoord.KVCacheSpec`` but cross-attention (a replay has no encoder inputs).
_SPECS: dict[str, type[KVCacheSpec]] = {
    cls.kind: cls for cls in get_args(KVCacheSpec) if cls is not CrossAttentionSpec
}
GROUP_TYPES = tuple(_SPECS)
#: Each type's own keys (its spec's constructor fields beyond block_size) and
#: which of them it needs (no default).
_PARAMS: dict[str, tuple[str, ...]] = {
    k: tuple(f.name for f in fields(cls) if f.init and f.name != "block_size")
    for k, cls in _SPECS.items()
}
_REQUIRED: dict[str, tuple[str, ...]] = {
    k: tuple(
        f.name
        for f in fields(cls)
        if f.init
        and f.name != "block_size"
        and f.default is MISSING
        and f.default_factory is MISSING
    )
    for k, cls in _SPECS.items()
}
_OWNERS: dict[str, list[str]] = {}
for _k, _ps in _PARAMS.items():
    for _p in _ps:
        _OWNERS.setdefault(_p, []).append(_k)
_ALIASES = {
    "full": "full_attention",
    "swa": "sliding_window",
    "chunked_local_attention": "chunked_local",
    "local": "chunked_local",
    "mla": "mla_attention",
    "swa_mla": "sliding_window_mla",
}


class LayoutError(ValueError):
    """A layout name or file is invalid; the message says where and why."""


def _group_type(name: str, where: str) -> str:
    """The group type ``name`` stands for (its aliases resolved)."""
    kind = _ALIASES.get(name, name)
    if kind not in _SPECS:
        raise LayoutError(
            f"{where}: unknown type {name!r}"
            f"{did_you_mean(name, [*GROUP_TYPES, *_ALIASES])} "
            f"(one of {', '.join(GROUP_TYPES)})"
        )
    return kind


def group_spec(kind: str, block_size: int, tokens: int) -> KVCacheSpec:
    """A spec of the group type ``kind`` (as a layout file names it, aliases
    included) with ``block_size``, every parameter the type needs (its window
    or chunk) set to ``tokens``.

    Raises:
        LayoutError: ``kind`` is no group type.
    """
    kind = _group_type(kind, "group_spec")
    params: dict[str, Any] = dict.fromkeys(_REQUIRED[kind], tokens)
    return _SPECS[kind](block_size, **params)


@dataclass(frozen=True)
class Layout:
    name: str
    groups: tuple[KVCacheGroup, ...]
    enable_caching: bool = True
    description: str = ""

    @property
    def block_size(self) -> int:
        """Granularity of a prefix hit: the lcm of the attention groups' block sizes."""
        sizes = [g.spec.block_size for g in self.groups if not isinstance(g.spec, MambaSpec)]
        return math.lcm(*(sizes or [g.spec.block_size for g in self.groups]))

    @property
    def keeps_whole_context(self) -> bool:
        """Whether every group keeps all of a running request's blocks until it
        is freed (full attention, MLA), from the kinds' facts: hits are
        prefix-closed and a table never holds a null after a real block."""
        return all(
            g.spec.core.prefix_closed_hits and not g.spec.core.interior_nulls for g in self.groups
        )

    @property
    def has_sparse_groups(self) -> bool:
        """Whether some group keeps only part of a long context (window, chunk, state)."""
        return not self.keeps_whole_context

    def with_block_size(self, block_size: int) -> Layout:
        """The same layout with every group's block size set to ``block_size``."""
        if block_size <= 0:
            raise LayoutError(f"block size must be positive, got {block_size}")
        groups = tuple(replace(g, spec=replace(g.spec, block_size=block_size)) for g in self.groups)
        return replace(self, groups=groups)

    def describe(self) -> str:
        """One line: each group's kind, block size and the parameters it sets."""
        parts = []
        for g in self.groups:
            spec = g.spec
            extra = "".join(
                f", {f.name} {getattr(spec, f.name)}"
                for f in fields(spec)
                if f.init and f.name != "block_size" and getattr(spec, f.name) != f.default
            )
            parts.append(f"{spec.kind}(bs {spec.block_size}{extra})")
        cache = "" if self.enable_caching else ", prefix caching off"
        return " + ".join(parts) + cache


def _group(spec: KVCacheSpec, layer: str) -> KVCacheGroup:
    return KVCacheGroup(spec, layer_names=(layer,))


def _full() -> KVCacheGroup:
    return _group(FullAttentionSpec(16), "full.0")


PRESETS: dict[str, Layout] = {
    "full": Layout("full", (_full(),), description="one full-attention group (Llama-style)"),
    "sliding-window": Layout(
        "sliding-window",
        (_full(), _group(SlidingWindowSpec(16, sliding_window=4096), "swa.0")),
        description="full attention + 4096-token sliding window (Gemma/GPT-OSS-style)",
    ),
    "chunked-local": Layout(
        "chunked-local",
        (_full(), _group(ChunkedLocalAttentionSpec(16, attention_chunk_size=8192), "local.0")),
        description="full attention + 8192-token chunked local attention (Llama-4-style)",
    ),
    "mamba": Layout(
        "mamba",
        (_full(), _group(MambaSpec(16), "mamba.0")),
        enable_caching=False,
        description="full attention + Mamba state (Jamba/Nemotron-H-style), prefix caching off",
    ),
    "hybrid-mamba": Layout(
        "hybrid-mamba",
        (_full(), _group(MambaSpec(16, mamba_cache_mode="align"), "mamba.0")),
        description="full attention + Mamba state cached at block boundaries "
        '(mamba_cache_mode="align", Jamba/Nemotron-H-style); prefill chunks block-aligned',
    ),
    "hybrid-mamba2": Layout(
        "hybrid-mamba2",
        (
            _full(),
            _group(
                MambaSpec(
                    16,
                    mamba_cache_mode="align",
                    num_prefill_checkpoint_blocks=1,
                    prefill_checkpoint_alignment=1,
                ),
                "mamba.0",
            ),
        ),
        description="full attention + Mamba2 state, align mode with a prefill checkpoint block "
        "(Qwen3-Next/Nemotron-H-style)",
    ),
    "mla": Layout(
        "mla",
        (_group(MLAAttentionSpec(64), "mla.0"),),
        description="multi-head latent attention, 64-token pages (DeepSeek-V3/R1-style)",
    ),
    "hybrid-swa-mla": Layout(
        "hybrid-swa-mla",
        (
            _group(MLAAttentionSpec(64), "mla.0"),
            _group(SlidingWindowMLASpec(64, sliding_window=128), "swa_mla.0"),
        ),
        description="MLA + 128-token sliding-window MLA, 64-token pages (DeepSeek-V4-style)",
    ),
    "rswa": Layout(
        "rswa",
        (_group(RSWASpec(16, rswa_window=1024), "rswa.0"),),
        enable_caching=False,
        description="reference sliding window: prompt visible, last 1024 generated tokens kept "
        "(Unlimited-OCR-style; prefix caching off as vLLM configures it)",
    ),
    "no-prefix-cache": Layout(
        "no-prefix-cache",
        (_full(),),
        enable_caching=False,
        description="one full-attention group, prefix caching off",
    ),
}


#: Most layers a layout (or a model config) may have, all groups together: beyond any
#: real model, and a bound on the layer names built.
MAX_LAYERS = 1 << 16


#: The keys of a layout file and of one of its groups.
_LAYOUT_KEYS = ("name", "enable_caching", "groups", "description")
_GROUP_KEYS = ("type", "block_size", "layers", *_OWNERS)


def _no_unknown_keys(table: dict[str, Any], known: tuple[str, ...], where: str, what: str) -> None:
    """A key ``known`` lacks is an error naming it, with the key it likely misspells."""
    for key in table:
        if key not in known:
            raise LayoutError(
                f"{where}: unknown {what} key {key!r}{did_you_mean(str(key), known)} "
                f"(the keys are {', '.join(known)})"
            )


def _pos_int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise LayoutError(f"{what} must be a positive integer, got {v!r}")
    return v


def parse_layout(data: Any, source: str = "<layout>") -> Layout:
    """Validate a layout mapping (as read from JSON or TOML)."""
    if not isinstance(data, dict):
        raise LayoutError(f"{source}: a layout must be a table/object, got {type(data).__name__}")
    _no_unknown_keys(data, _LAYOUT_KEYS, source, "layout")
    name = data.get("name", Path(source).stem)
    if not isinstance(name, str):
        raise LayoutError(f"{source}: 'name' must be a string")
    caching = data.get("enable_caching", True)
    if not isinstance(caching, bool):
        raise LayoutError(f"{source}: 'enable_caching' must be true or false, got {caching!r}")
    groups = data.get("groups")
    if not isinstance(groups, list) or not groups:
        raise LayoutError(f"{source}: 'groups' must be a non-empty list of groups")
    out = []
    total_layers = 0
    for i, g in enumerate(groups):
        where = f"{source}: groups[{i}]"
        if not isinstance(g, dict):
            raise LayoutError(f"{where} must be a table/object")
        _no_unknown_keys(g, _GROUP_KEYS, where, "group")
        kind = g.get("type")
        if not isinstance(kind, str):
            raise LayoutError(f"{where}: missing 'type' (one of {', '.join(GROUP_TYPES)})")
        kind = _group_type(kind, where)
        bs = _pos_int(g.get("block_size", 16), f"{where}.block_size")
        params: dict[str, Any] = {}
        for key in sorted(set(g) & set(_OWNERS)):
            if key not in _PARAMS[kind]:
                raise LayoutError(
                    f"{where}: {key!r} only applies to type {', '.join(_OWNERS[key])}"
                )
            params[key] = g[key]
        for key in _REQUIRED[kind]:  # token counts (windows, chunks)
            if key not in params:
                raise LayoutError(f"{where}: a {kind} group needs {key!r} (tokens)")
            params[key] = _pos_int(params[key], f"{where}.{key}")
        layers = g.get("layers", 1)
        if isinstance(layers, list):
            if not layers or not all(isinstance(x, str) and x for x in layers):
                raise LayoutError(
                    f"{where}.layers must be a positive count or a list of layer names"
                )
            count = len(layers)
        else:
            count = _pos_int(layers, f"{where}.layers")
        total_layers += count
        if total_layers > MAX_LAYERS:
            raise LayoutError(f"{where}: more than {MAX_LAYERS:,} layers in all")
        if isinstance(layers, list):
            names = tuple(layers)
        else:
            names = tuple(f"g{i}.{j}" for j in range(count))
        try:  # the library's own rules (a spec's values, distinct layer names)
            spec = _SPECS[kind](bs, **params)
            out.append(KVCacheGroup(spec, layer_names=names))
        except (ConfigError, TypeError, ValueError) as e:
            raise LayoutError(f"{where}: {e}") from None
    seen: set[str] = set()
    for g in out:
        dup = seen.intersection(g.layer_names)
        if dup:
            raise LayoutError(
                f"{source}: layer name(s) {', '.join(sorted(dup))} appear in two groups"
            )
        seen.update(g.layer_names)
    if all(isinstance(g.spec, MambaSpec) for g in out):
        raise LayoutError(f"{source}: a layout needs at least one attention group")
    if caching and any(isinstance(g.spec, MambaSpec) and not g.spec.prefix_cacheable for g in out):
        raise LayoutError(
            f'{source}: prefix caching with a mamba group needs mamba_cache_mode = "align"; '
            "or set enable_caching = false"
        )
    desc = data.get("description", "")
    return Layout(name, tuple(out), caching, desc if isinstance(desc, str) else "")


def load_layout(name_or_path: str) -> Layout:
    """A preset by name, or a layout file (``.json`` or ``.toml``) by path."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    path = Path(name_or_path)
    if path.suffix.lower() not in (".json", ".toml"):
        raise LayoutError(
            f"unknown layout {name_or_path!r}{did_you_mean(name_or_path, PRESETS)}: use a "
            f"preset ({', '.join(PRESETS)}) or a .json/.toml layout file"
        )
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise LayoutError(f"{path}: {missing_file(path, 'layout file')}") from None
    except OSError as e:
        raise LayoutError(f"{path}: cannot read layout file: {e.strerror or e}") from None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as e:  # bad UTF-8 or JSON, a giant number, nesting
            raise LayoutError(f"{path}: invalid JSON: {e}") from None
    else:
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover - Python 3.10
            try:
                import tomli as tomllib
            except ImportError:
                raise LayoutError(
                    f"{path}: TOML layouts need Python 3.11+ or the 'tomli' package; use JSON"
                ) from None
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as e:
            raise LayoutError(f"{path}: invalid TOML: {e}") from None
    return parse_layout(data, str(path))


def num_blocks_for_capacity(layout: Layout, capacity_tokens: int) -> int:
    """Pool size (blocks, null block included) that holds ``capacity_tokens`` tokens in every group.

    Every group keeps its own blocks in the shared pool, so a token of
    context costs one block slot per group: ``sum(ceil(T / block_size)) + 1``.
    """
    if capacity_tokens <= 0:
        raise LayoutError(f"capacity must be a positive number of tokens, got {capacity_tokens}")
    return sum(cdiv(capacity_tokens, g.spec.block_size) for g in layout.groups) + 1
