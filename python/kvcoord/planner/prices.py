"""Prices per GPU-hour: the shipped table (``kvcoord/replay/data/gpu_prices.csv``,
each row with its source and date) or a user's file of the same columns."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from kvcoord._suggest import missing_file, unknown_name
from kvcoord.replay.hardware import GPUS

__all__ = ["COLUMNS", "GpuPrice", "PriceError", "load_prices", "price_of"]

#: Columns every price file has (``notes`` optional).
COLUMNS = ("gpu", "usd_per_gpu_hour", "source", "date")


class PriceError(ValueError):
    """A price file that cannot be read, or a GPU it has no price for."""


@dataclass(frozen=True)
class GpuPrice:
    gpu: str
    usd_per_gpu_hour: float
    source: str
    date: str


def _shipped() -> Path:
    return Path(str(resources.files("kvcoord.replay") / "data" / "gpu_prices.csv"))


def load_prices(path: str | Path | None = None) -> tuple[str, dict[str, GpuPrice]]:
    """``(where, prices by GPU preset)`` from ``path`` (None: the shipped file).
    Every problem names the file and line."""
    p = Path(path) if path is not None else _shipped()
    where = str(p) if path is not None else "the shipped gpu_prices.csv"
    if not p.is_file():
        raise PriceError(f"{p}: {missing_file(p, 'price file')}")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PriceError(f"{p}: cannot read it: {e}") from None
    rows = csv.DictReader(text.splitlines())
    missing = [c for c in COLUMNS if c not in (rows.fieldnames or [])]
    if missing:
        raise PriceError(
            f"{p}:1: missing column{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
            f"(a price file has the columns {', '.join(COLUMNS)})"
        )
    out: dict[str, GpuPrice] = {}
    for line, row in enumerate(rows, start=2):
        name = (row.get("gpu") or "").strip().lower()
        if name not in GPUS:
            raise PriceError(f"{p}:{line}: {unknown_name('GPU', name, GPUS)}")
        text_price = (row.get("usd_per_gpu_hour") or "").strip()
        try:
            usd = float(text_price)
        except ValueError:
            usd = math.nan
        if not (usd > 0 and math.isfinite(usd)):
            raise PriceError(
                f"{p}:{line}: usd_per_gpu_hour {text_price!r} for {name}: expected a positive "
                "number of dollars per GPU-hour"
            )
        if name in out:
            raise PriceError(f"{p}:{line}: a second price for {name}")
        out[name] = GpuPrice(name, usd, (row.get("source") or "").strip(), row["date"] or "")
    if not out:
        raise PriceError(f"{p}: no prices")
    return where, out


def price_of(prices: dict[str, GpuPrice], gpu: str, where: str) -> GpuPrice:
    """The price of ``gpu``, or a :class:`PriceError` that names it and the fix."""
    if gpu not in prices:
        raise PriceError(
            f"no price for GPU {gpu!r} in {where} (it prices {', '.join(prices)}): "
            "give --prices FILE with a row for it, or leave it out of --gpus"
        )
    return prices[gpu]
