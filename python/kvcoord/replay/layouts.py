"""KV-cache layouts for ``kvcoord replay``: named presets and layout files.

A :class:`Layout` is a manager-independent description (kinds, block sizes,
window sizes, whether prefix caching is on); ``scheduler.build_config`` turns
it into a ``kvcoord.KVCacheConfig``.

Layout file (JSON or TOML)::

    name = "my-model"            # optional
    enable_caching = true        # optional, default true
    [[groups]]
    type = "full_attention"      # full_attention | sliding_window | chunked_local | mamba
    block_size = 16
    layers = 24                  # optional: number of layers, or a list of names
    [[groups]]
    type = "sliding_window"
    block_size = 16
    sliding_window = 4096

JSON: ``{"name": ..., "enable_caching": ..., "groups": [{...}, ...]}``.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

__all__ = [
    "GROUP_TYPES",
    "PRESETS",
    "GroupSpec",
    "Layout",
    "LayoutError",
    "load_layout",
    "num_blocks_for_capacity",
    "parse_layout",
]

GROUP_TYPES = ("full_attention", "sliding_window", "chunked_local", "mamba")
_ALIASES = {
    "full": "full_attention",
    "swa": "sliding_window",
    "chunked_local_attention": "chunked_local",
    "local": "chunked_local",
}


class LayoutError(ValueError):
    """A layout name or file is invalid; the message says where and why."""


@dataclass(frozen=True)
class GroupSpec:
    """One KV-cache group: a kind of attention shared by some layers."""

    type: str
    block_size: int = 16
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    layer_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Layout:
    name: str
    groups: tuple[GroupSpec, ...]
    enable_caching: bool = True
    description: str = ""

    @property
    def block_size(self) -> int:
        """Granularity of a prefix hit: the lcm of the attention groups' block sizes."""
        sizes = [g.block_size for g in self.groups if g.type != "mamba"] or [
            g.block_size for g in self.groups
        ]
        return math.lcm(*sizes)

    def with_block_size(self, block_size: int) -> Layout:
        """The same layout with every group's block size set to ``block_size``."""
        if block_size <= 0:
            raise LayoutError(f"block size must be positive, got {block_size}")
        return replace(self, groups=tuple(replace(g, block_size=block_size) for g in self.groups))

    def describe(self) -> str:
        parts = []
        for g in self.groups:
            extra = ""
            if g.sliding_window is not None:
                extra = f", window {g.sliding_window}"
            elif g.attention_chunk_size is not None:
                extra = f", chunk {g.attention_chunk_size}"
            parts.append(f"{g.type}(bs {g.block_size}{extra})")
        cache = "" if self.enable_caching else ", prefix caching off"
        return " + ".join(parts) + cache


def _full(bs: int = 16, layer: str = "full.0") -> GroupSpec:
    return GroupSpec("full_attention", bs, layer_names=(layer,))


PRESETS: dict[str, Layout] = {
    "full": Layout("full", (_full(),), description="one full-attention group (Llama-style)"),
    "sliding-window": Layout(
        "sliding-window",
        (_full(), GroupSpec("sliding_window", 16, sliding_window=4096, layer_names=("swa.0",))),
        description="full attention + 4096-token sliding window (Gemma/GPT-OSS-style)",
    ),
    "chunked-local": Layout(
        "chunked-local",
        (
            _full(),
            GroupSpec("chunked_local", 16, attention_chunk_size=8192, layer_names=("local.0",)),
        ),
        description="full attention + 8192-token chunked local attention (Llama-4-style)",
    ),
    "mamba": Layout(
        "mamba",
        (_full(), GroupSpec("mamba", 16, layer_names=("mamba.0",))),
        enable_caching=False,
        description="full attention + Mamba state (Jamba/Nemotron-H-style), prefix caching off",
    ),
    "no-prefix-cache": Layout(
        "no-prefix-cache",
        (_full(),),
        enable_caching=False,
        description="one full-attention group, prefix caching off",
    ),
}


def _pos_int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise LayoutError(f"{what} must be a positive integer, got {v!r}")
    return v


def parse_layout(data: Any, source: str = "<layout>") -> Layout:
    """Validate a layout mapping (as read from JSON or TOML)."""
    if not isinstance(data, dict):
        raise LayoutError(f"{source}: a layout must be a table/object, got {type(data).__name__}")
    unknown = set(data) - {"name", "enable_caching", "groups", "description"}
    if unknown:
        raise LayoutError(f"{source}: unknown layout key(s) {', '.join(sorted(unknown))}")
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
    for i, g in enumerate(groups):
        where = f"{source}: groups[{i}]"
        if not isinstance(g, dict):
            raise LayoutError(f"{where} must be a table/object")
        unknown = set(g) - {
            "type",
            "block_size",
            "sliding_window",
            "attention_chunk_size",
            "layers",
        }
        if unknown:
            raise LayoutError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        kind = g.get("type")
        if not isinstance(kind, str):
            raise LayoutError(f"{where}: missing 'type' (one of {', '.join(GROUP_TYPES)})")
        kind = _ALIASES.get(kind, kind)
        if kind not in GROUP_TYPES:
            raise LayoutError(
                f"{where}: unknown type {g['type']!r} (one of {', '.join(GROUP_TYPES)})"
            )
        bs = _pos_int(g.get("block_size", 16), f"{where}.block_size")
        window = chunk = None
        if kind == "sliding_window":
            if "sliding_window" not in g:
                raise LayoutError(
                    f"{where}: a sliding_window group needs 'sliding_window' (tokens)"
                )
            window = _pos_int(g["sliding_window"], f"{where}.sliding_window")
        elif "sliding_window" in g:
            raise LayoutError(f"{where}: 'sliding_window' only applies to type sliding_window")
        if kind == "chunked_local":
            if "attention_chunk_size" not in g:
                raise LayoutError(
                    f"{where}: a chunked_local group needs 'attention_chunk_size' (tokens)"
                )
            chunk = _pos_int(g["attention_chunk_size"], f"{where}.attention_chunk_size")
        elif "attention_chunk_size" in g:
            raise LayoutError(f"{where}: 'attention_chunk_size' only applies to type chunked_local")
        layers = g.get("layers", 1)
        if isinstance(layers, list):
            if not layers or not all(isinstance(x, str) and x for x in layers):
                raise LayoutError(
                    f"{where}.layers must be a positive count or a list of layer names"
                )
            names = tuple(layers)
        else:
            count = _pos_int(layers, f"{where}.layers")
            names = tuple(f"g{i}.{j}" for j in range(count))
        out.append(GroupSpec(kind, bs, window, chunk, names))
    seen: set[str] = set()
    for g in out:
        dup = seen.intersection(g.layer_names)
        if dup:
            raise LayoutError(
                f"{source}: layer name(s) {', '.join(sorted(dup))} appear in two groups"
            )
        seen.update(g.layer_names)
    if all(g.type == "mamba" for g in out):
        raise LayoutError(f"{source}: a layout needs at least one attention group")
    if caching and any(g.type == "mamba" for g in out):
        raise LayoutError(
            f"{source}: prefix caching with a mamba group is not supported; "
            "set enable_caching = false"
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
            f"unknown layout {name_or_path!r}: use a preset ({', '.join(PRESETS)}) "
            "or a .json/.toml layout file"
        )
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise LayoutError(f"{path}: no such layout file") from None
    except OSError as e:
        raise LayoutError(f"{path}: cannot read layout file: {e.strerror or e}") from None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
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
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise LayoutError(f"{path}: invalid TOML: {e}") from None
    return parse_layout(data, str(path))


def num_blocks_for_capacity(layout: Layout, capacity_tokens: int) -> int:
    """Pool size (blocks, null block included) that holds ``capacity_tokens`` tokens in every group.

    Every group keeps its own blocks in the shared pool, so a token of
    context costs one block slot per group: ``sum(ceil(T / block_size)) + 1``.
    """
    if capacity_tokens <= 0:
        raise LayoutError(f"capacity must be a positive number of tokens, got {capacity_tokens}")
    return sum(-(-capacity_tokens // g.block_size) for g in layout.groups) + 1
