"""Reading the conformance traces recorded from vLLM 0.33.0 (see
``tests/data/conformance/README.md`` for the format)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data" / "conformance"


def trace_files(pattern: str) -> list[Path]:
    files = sorted(DATA.glob(pattern))
    if not files:
        raise FileNotFoundError(f"no conformance traces match {pattern!r} in {DATA}")
    return files


def read_trace(path: Path) -> tuple[dict[str, Any], Iterator[tuple[int, dict[str, Any]]]]:
    """The header and an iterator of (line number, op) pairs."""
    with gzip.open(path, "rt") as f:
        lines = f.readlines()
    header = json.loads(lines[0])

    def ops() -> Iterator[tuple[int, dict[str, Any]]]:
        for lineno, line in enumerate(lines[1:], start=2):
            yield lineno, json.loads(line)

    return header, ops()
