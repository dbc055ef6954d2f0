"""Schema of the shipped published-vLLM-measurements file (``replay/data/``)."""

from __future__ import annotations

import csv
import math
import re
from importlib.resources import files

import pytest

from kvcoord.replay.hardware import GPUS
from kvcoord.replay.models import DTYPE_BYTES, MODELS

DATA = files("kvcoord.replay").joinpath("data")

COLUMNS = [
    "id",
    "model",
    "hf_id",
    "weight_dtype",
    "kv_dtype",
    "gpu",
    "tp",
    "replicas",
    "input_len",
    "output_len",
    "dataset",
    "load_kind",
    "load_value",
    "num_prompts",
    "vllm_version",
    "ttft_mean_ms",
    "ttft_median_ms",
    "ttft_p99_ms",
    "tpot_mean_ms",
    "tpot_median_ms",
    "tpot_p99_ms",
    "itl_median_ms",
    "output_tok_s",
    "request_s",
    "kv_cache_gib",
    "kv_cache_tokens",
    "gpu_memory_utilization",
    "source_url",
    "source_title",
    "notes",
]
INTS = ("tp", "replicas", "input_len", "output_len", "num_prompts", "kv_cache_tokens")
TIMING = tuple(c for c in COLUMNS if c.endswith("_ms"))
THROUGHPUT = ("output_tok_s", "request_s")
KV = ("kv_cache_gib", "kv_cache_tokens")
FLOATS = (*TIMING, *THROUGHPUT, "kv_cache_gib", "gpu_memory_utilization")
LOAD_KINDS = ("concurrency", "rate", "offline")


def _rows() -> list[dict[str, str]]:
    with DATA.joinpath("vllm_measurements.csv").open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == COLUMNS
        return list(reader)


ROWS = _rows()


def _not_modelled_gpus() -> set[str]:
    """The GPU names the data README lists as outside the presets."""
    text = DATA.joinpath("README.md").read_text(encoding="utf-8")
    line = next(ln for ln in text.splitlines() if ln.startswith("GPUs outside the presets"))
    return set(re.findall(r"`([^`]+)`", line))


def test_file_has_rows_from_several_sources() -> None:
    assert len(ROWS) >= 30
    assert len({r["source_url"] for r in ROWS}) >= 5
    assert len({r["id"] for r in ROWS}) == len(ROWS), "row ids must be unique"


def test_not_modelled_gpus_are_not_presets() -> None:
    extra = _not_modelled_gpus()
    assert extra and not extra & set(GPUS)


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_row_schema(row: dict[str, str]) -> None:
    assert None not in row.values(), "a row has more or fewer cells than the header"
    assert row["source_url"].startswith("https://")
    assert row["source_title"] and row["notes"]
    assert row["gpu"] in GPUS or row["gpu"] in _not_modelled_gpus()
    assert row["model"] in MODELS or row["hf_id"], "a non-preset model needs its checkpoint"
    for col in ("weight_dtype", "kv_dtype"):
        assert row[col] == "" or row[col] in DTYPE_BYTES, f"{col}={row[col]!r}"
    assert row["weight_dtype"]
    for col in INTS:
        if row[col]:
            assert int(row[col]) > 0, col
    assert int(row["tp"]) >= 1 and int(row["replicas"]) >= 1
    for col in FLOATS:
        if row[col]:
            v = float(row[col])
            assert math.isfinite(v) and v > 0, col
    if row["gpu_memory_utilization"]:
        assert float(row["gpu_memory_utilization"]) <= 1.0

    measured = [c for c in (*TIMING, *THROUGHPUT, *KV) if row[c]]
    assert measured, "a row needs at least one TTFT/TPOT/throughput/KV figure"

    kind, value = row["load_kind"], row["load_value"]
    if any(row[c] for c in (*TIMING, *THROUGHPUT)):
        assert kind in LOAD_KINDS, f"load_kind={kind!r}"
    else:
        assert kind == "", "a memory-only row has no load"
    if kind in ("concurrency", "rate"):
        v = float(value)
        assert v > 0
        if kind == "concurrency":
            assert v == int(v)
    else:
        assert value == "", "only concurrency and rate take a load_value"
    if row["input_len"] or row["output_len"]:
        assert row["input_len"] and row["output_len"]
