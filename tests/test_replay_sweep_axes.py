"""The sweep's variant axes (kvcoord.replay.sweep): products, names, conflicts."""

from __future__ import annotations

import pytest

from kvcoord.replay.sweep import (
    Axis,
    AxisValue,
    SweepError,
    host_axis,
    layout_axis,
    model_axis,
    variants,
)

GiB = float(1 << 30)


def test_product_order_names_and_options() -> None:
    vs = variants(
        [
            model_axis(["llama-3.1-8b", None], "default-model"),
            host_axis([0.0, 256 * GiB]),
        ]
    )
    assert [v.name for v in vs] == [
        "llama-3.1-8b",
        "llama-3.1-8b + host 256 GiB",
        "default-model",
        "default-model + host 256 GiB",
    ]
    assert dict(vs[1].plan) == {"model": "llama-3.1-8b", "host_memory": 256 * GiB}
    # 0 means "no tier": the plan gets None, the label is omitted
    assert vs[2].plan["host_memory"] is None and vs[2].plan["model"] is None
    assert dict(vs[3].labels) == {"model": "default-model", "host_memory": "host 256 GiB"}


def test_layout_axis_labels_files_by_stem() -> None:
    ax = layout_axis([None, "sliding-window", "/tmp/x/my-model.toml"])
    assert [v.label for v in ax.values] == ["", "sliding-window", "my-model"]
    assert ax.values[2].plan == {"layout": "/tmp/x/my-model.toml"}


def test_run_options_and_custom_axis() -> None:
    budget = Axis("token_budget", (AxisValue("8k", run={"token_budget": 8192}),
                                   AxisValue("16k", run={"token_budget": 16384})))  # fmt: skip
    vs = variants([model_axis(["m"], "m"), budget])
    assert [v.name for v in vs] == ["m + 8k", "m + 16k"]
    assert [v.run["token_budget"] for v in vs] == [8192, 16384]
    assert all(v.plan == {"model": "m"} for v in vs)


def test_all_labels_empty_names_default() -> None:
    (v,) = variants([layout_axis([None])])
    assert v.name == "default"


def test_conflicts_and_empty_axes_refused() -> None:
    with pytest.raises(SweepError, match="both set plan 'model'"):
        variants([model_axis(["a"], "a"), Axis("other", (AxisValue("b", {"model": "b"}),))])
    with pytest.raises(SweepError, match="no values"):
        variants([Axis("empty", ())])
    with pytest.raises(SweepError, match="distinct names"):
        variants([host_axis([0.0]), host_axis([1.0])])
    with pytest.raises(ValueError):  # SweepError is a ValueError
        variants([Axis("empty", ())])


def test_sweep_cli_over_layouts_and_tiers(tmp_path: object) -> None:
    """`kvcoord sweep --layouts ... --host-memories ...`: one row per variant and
    size, each with its axis labels, a table and a plot with a line per variant."""
    import json
    from pathlib import Path

    from kvcoord.cli import main

    tmp = Path(str(tmp_path))
    trace = str(Path(__file__).parent / "data" / "mooncake_small.jsonl")
    out, png = tmp / "s.json", tmp / "s.png"
    argv = ["sweep", "--trace", trace, "--layouts", "full,sliding-window"]
    argv += ["--host-memories", "0,1GiB", "--kv-memories", "256MiB,1GiB", "--jobs", "1"]
    assert main([*argv, "--no-progress", "--json", str(out), "--plot", str(png)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 * 2 * 2
    assert {r["variant"] for r in rows} == {
        "llama-3.1-8b + full",
        "llama-3.1-8b + full + host 1 GiB",
        "llama-3.1-8b + sliding-window",
        "llama-3.1-8b + sliding-window + host 1 GiB",
    }
    assert {r["axes"]["layout"] for r in rows} == {"full", "sliding-window"}
    assert {r["layout"] for r in rows} == {
        "full (llama-3.1-8b dims)",
        "sliding-window (llama-3.1-8b dims)",
    }
    assert png.stat().st_size > 0
