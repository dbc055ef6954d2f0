"""Layout presets, layout files and pool sizing (no manager needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvcoord.config import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheGroup,
    MambaSpec,
    SlidingWindowSpec,
)
from kvcoord.replay.layouts import (
    PRESETS,
    Layout,
    LayoutError,
    group_spec,
    load_layout,
    num_blocks_for_capacity,
    parse_layout,
)


def test_group_spec_reads_kinds_as_layout_files_do() -> None:
    """The one reading of kind strings (a model's layer kinds use it too):
    aliases resolved, the window set where the kind needs one."""
    assert group_spec("swa", 16, 64) == SlidingWindowSpec(16, sliding_window=64)
    assert group_spec("chunked_local", 16, 64) == ChunkedLocalAttentionSpec(16, 64)
    assert group_spec("full", 16, 64) == FullAttentionSpec(16)
    assert group_spec("mamba", 16, 64) == MambaSpec(16)
    with pytest.raises(LayoutError, match=r"unknown type 'mambo'.*mamba"):
        group_spec("mambo", 16, 64)


def test_presets() -> None:
    assert set(PRESETS) == {
        "full",
        "sliding-window",
        "chunked-local",
        "mamba",
        "no-prefix-cache",
        "hybrid-mamba",
        "hybrid-mamba2",
        "mla",
        "hybrid-swa-mla",
        "rswa",
    }
    for name, layout in PRESETS.items():
        assert load_layout(name) is layout
        assert layout.groups[0].spec.kind in ("full_attention", "mla_attention", "rswa")
        assert layout.describe()
    assert PRESETS["hybrid-mamba"].enable_caching
    assert "align" in PRESETS["hybrid-mamba2"].describe()
    assert not PRESETS["mamba"].enable_caching
    assert not PRESETS["no-prefix-cache"].enable_caching
    assert PRESETS["sliding-window"].groups[1].spec == SlidingWindowSpec(16, 4096)
    assert PRESETS["chunked-local"].groups[1].spec.attention_chunk_size == 8192  # type: ignore[union-attr]


def test_new_kinds_in_layout_files() -> None:
    layout = parse_layout(
        {
            "groups": [
                {"type": "mla", "block_size": 64},
                {"type": "sliding_window_mla", "block_size": 64, "sliding_window": 128},
                {"type": "rswa", "block_size": 64, "rswa_window": 256},
                {
                    "type": "mamba",
                    "block_size": 64,
                    "mamba_cache_mode": "align",
                    "num_prefill_checkpoint_blocks": 1,
                    "prefill_checkpoint_alignment": 1,
                },
            ]
        }
    )
    kinds = [g.spec.kind for g in layout.groups]
    assert kinds == ["mla_attention", "sliding_window_mla", "rswa", "mamba"]
    assert layout.enable_caching


def test_json_and_toml_files(tmp_path: Path) -> None:
    doc = {
        "name": "hybrid",
        "groups": [
            {"type": "full_attention", "block_size": 32, "layers": 2},
            {
                "type": "sliding_window",
                "block_size": 16,
                "sliding_window": 1024,
                "layers": ["a", "b"],
            },
        ],
    }
    j = tmp_path / "l.json"
    j.write_text(json.dumps(doc))
    t = tmp_path / "l.toml"
    t.write_text(
        'name = "hybrid"\n'
        '[[groups]]\ntype = "full_attention"\nblock_size = 32\nlayers = 2\n'
        '[[groups]]\ntype = "sliding_window"\nblock_size = 16\nsliding_window = 1024\n'
        'layers = ["a", "b"]\n'
    )
    for p in (j, t):
        lay = load_layout(str(p))
        assert lay.name == "hybrid"
        assert lay.enable_caching
        assert lay.groups[0] == KVCacheGroup(FullAttentionSpec(32), ("g0.0", "g0.1"))
        assert lay.groups[1] == KVCacheGroup(SlidingWindowSpec(16, 1024), ("a", "b"))
        assert lay.block_size == 32


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ([], "must be a table/object"),
        ({"groups": []}, "non-empty list"),
        ({"groups": [{"type": "full_attention"}], "colour": 1}, "unknown layout key 'colour'"),
        ({"groups": [{"block_size": 16}]}, "missing 'type'"),
        ({"groups": [{"type": "linear"}]}, "unknown type 'linear'"),
        ({"groups": [{"type": "cross_attention"}]}, "unknown type 'cross_attention'"),
        ({"groups": [{"type": "full", "block_size": 0}]}, "block_size must be a positive integer"),
        (
            {"groups": [{"type": "full", "block_size": True}]},
            "block_size must be a positive integer",
        ),
        ({"groups": [{"type": "sliding_window"}]}, "needs 'sliding_window'"),
        (
            {"groups": [{"type": "full", "sliding_window": 4}]},
            "only applies to type sliding_window",
        ),
        ({"groups": [{"type": "chunked_local"}]}, "needs 'attention_chunk_size'"),
        (
            {
                "groups": [
                    {"type": "sliding_window", "sliding_window": 8, "attention_chunk_size": 4}
                ]
            },
            "'attention_chunk_size' only applies to type chunked_local",
        ),
        (
            {"groups": [{"type": "chunked_local", "attention_chunk_size": 0}]},
            "attention_chunk_size must be a positive integer",
        ),
        ({"groups": [{"type": "full", "heads": 4}]}, "unknown group key 'heads'"),
        ({"groups": [{"type": "full", "layers": 0}]}, "layers must be a positive integer"),
        (
            {
                "groups": [
                    {"type": "full", "layers": ["x"]},
                    {"type": "swa", "sliding_window": 8, "layers": ["x"]},
                ]
            },
            "appear in two groups",
        ),
        ({"groups": [{"type": "mamba"}], "enable_caching": False}, "at least one attention group"),
        ({"groups": [{"type": "full"}, {"type": "mamba"}]}, "set enable_caching = false"),
        ({"groups": [{"type": "full", "rswa_window": 4}]}, "only applies to type rswa"),
        ({"groups": [{"type": "full", "mamba_cache_mode": "align"}]}, "only applies to type mamba"),
        ({"groups": [{"type": "mamba", "mamba_cache_mode": "x"}]}, "mamba_cache_mode"),
        ({"groups": [{"type": "full"}], "enable_caching": "yes"}, "must be true or false"),
    ],
)
def test_invalid_layouts(doc: object, problem: str) -> None:
    with pytest.raises(LayoutError) as ei:
        parse_layout(doc, "my.json")
    assert problem in str(ei.value)
    assert str(ei.value).startswith("my.json")


def test_layout_file_errors(tmp_path: Path) -> None:
    with pytest.raises(LayoutError, match=r"unknown layout 'nope'.*preset"):
        load_layout("nope")
    with pytest.raises(LayoutError, match="no such layout file"):
        load_layout(str(tmp_path / "x.json"))
    bad = tmp_path / "bad.toml"
    bad.write_text("groups = [")
    with pytest.raises(LayoutError, match="invalid TOML"):
        load_layout(str(bad))
    badj = tmp_path / "bad.json"
    badj.write_text("{")
    with pytest.raises(LayoutError, match="invalid JSON"):
        load_layout(str(badj))


def test_capacity_and_block_size() -> None:
    full = PRESETS["full"]
    assert num_blocks_for_capacity(full, 16) == 2
    assert num_blocks_for_capacity(full, 17) == 3
    assert num_blocks_for_capacity(PRESETS["sliding-window"], 1600) == 201
    assert num_blocks_for_capacity(full.with_block_size(32), 1600) == 51
    with pytest.raises(LayoutError):
        num_blocks_for_capacity(full, 0)
    with pytest.raises(LayoutError):
        full.with_block_size(0)
    mixed = Layout(
        "m", (KVCacheGroup(FullAttentionSpec(16)), KVCacheGroup(SlidingWindowSpec(24, 64)))
    )
    assert mixed.block_size == 48


def test_group_types_come_from_the_spec_classes() -> None:
    """Every spec kind but cross-attention is a layout type; its keys are the
    spec's own fields (no list of kinds in the layout reader)."""
    from typing import get_args

    from kvcoord.config import KVCacheSpec
    from kvcoord.replay.layouts import GROUP_TYPES

    kinds = {cls.kind for cls in get_args(KVCacheSpec)}
    assert set(GROUP_TYPES) == kinds - {"cross_attention"}
    lay = parse_layout(
        {
            "groups": [{"type": "full"}, {"type": "mamba", "num_speculative_blocks": 2}],
            "enable_caching": False,
        }
    )
    assert lay.groups[1].spec.num_speculative_blocks == 2
    assert "num_speculative_blocks 2" in lay.describe()
