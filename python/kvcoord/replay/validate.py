"""The replay's models against published vLLM measurements.

``python -m kvcoord.replay.validate`` runs both checks: the step-time
model's TTFT and TPOT (:mod:`kvcoord.replay.latency_check`, table and
targets in :mod:`kvcoord.replay.latency_report`; ``--latency`` alone) and
the KV pool. ``--memory`` alone prints, for every row of
``kvcoord/replay/data/vllm_measurements.csv`` with a measured KV pool, the
pool :func:`kvcoord.replay.memory.vllm_kv_memory` predicts beside the one
vLLM logged ("Available KV cache memory", "GPU KV cache size"), and exits 1
when a row the model covers misses :data:`KV_POOL_TOLERANCE`.

A row is

* ``calibration``: one of :data:`~kvcoord.replay.memory.CALIBRATION_ROWS`,
  which set the model's constants;
* ``held out``: predicted with nothing fitted to it;
* ``excluded``: its ``notes`` say ``KV pool excluded: <reason>``, a setting
  the model cannot know (reported, not checked);
* ``not covered``: its model or GPU is not a preset, or a figure the
  prediction needs is missing (reported, not checked).

Each row is predicted at ``vllm serve``'s default batch for its GPU
(:func:`~kvcoord.replay.memory.vllm_serve_batch`): the sources ran the server
without ``--max-num-seqs`` or ``--max-num-batched-tokens``.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

from kvcoord.replay.hardware import GPUS, load_gpu
from kvcoord.replay.hf_config import load_model
from kvcoord.replay.memory import CALIBRATION_ROWS, vllm_kv_memory, vllm_serve_batch
from kvcoord.replay.models import MODELS, model_layout

__all__ = [
    "EXCLUDED_MARK",
    "KV_POOL_TOLERANCE",
    "PoolRow",
    "format_pool_table",
    "kv_pool_rows",
    "main",
    "measurement_rows",
]

#: Largest relative error of a predicted KV pool (GiB and tokens), issue 31's target.
KV_POOL_TOLERANCE = 0.03
#: What a row's notes say to keep it out of the KV-pool check; the reason follows.
EXCLUDED_MARK = "KV pool excluded:"

_GiB = float(1 << 30)


def measurement_rows() -> list[dict[str, str]]:
    """The rows of the shipped ``vllm_measurements.csv``."""
    text = (resources.files("kvcoord.replay") / "data" / "vllm_measurements.csv").read_text(
        encoding="utf-8"
    )
    return list(csv.DictReader(io.StringIO(text)))


@dataclass(frozen=True)
class PoolRow:
    """One measured KV pool and its prediction (None where none is made)."""

    id: str
    model: str
    gpu: str
    tp: int
    weight_dtype: str
    kv_dtype: str
    utilization: float | None
    measured_gib: float
    measured_tokens: int | None
    predicted_gib: float | None
    predicted_tokens: int | None
    status: str
    reason: str = ""

    @property
    def error(self) -> float | None:
        """Relative error of the predicted GiB."""
        if self.predicted_gib is None:
            return None
        return self.predicted_gib / self.measured_gib - 1

    @property
    def tokens_error(self) -> float | None:
        if self.predicted_tokens is None or not self.measured_tokens:
            return None
        return self.predicted_tokens / self.measured_tokens - 1

    @property
    def checked(self) -> bool:
        return self.status in ("calibration", "held out")

    @property
    def within_tolerance(self) -> bool:
        errs = [e for e in (self.error, self.tokens_error) if e is not None]
        return bool(errs) and all(abs(e) <= KV_POOL_TOLERANCE for e in errs)


def _status(row: dict[str, str]) -> tuple[str, str]:
    notes = row["notes"]
    if EXCLUDED_MARK in notes:
        return "excluded", notes.split(EXCLUDED_MARK, 1)[1].strip()
    if row["model"] not in MODELS:
        return "not covered", f"model {row['model']!r} is not a preset"
    if row["gpu"] not in GPUS:
        return "not covered", f"GPU {row['gpu']!r} is not a preset"
    if not row["gpu_memory_utilization"]:
        return "not covered", "gpu_memory_utilization not stated"
    return ("calibration" if row["id"] in CALIBRATION_ROWS else "held out"), ""


def _predict(row: dict[str, str]) -> tuple[float, int]:
    """(GiB, tokens) of the KV pool vLLM would log for ``row``."""
    spec = load_model(row["model"], row["kv_dtype"] or None, row["weight_dtype"])
    gpu, tp = load_gpu(row["gpu"]), int(row["tp"])
    seqs, tokens = vllm_serve_batch(gpu)
    budget = vllm_kv_memory(
        spec,
        gpu,
        tp,
        gpu_memory_utilization=float(row["gpu_memory_utilization"]),
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
    )
    layout, fp = model_layout(spec, tp)
    blocks = fp.blocks_for_memory(budget.kv_bytes)
    # vLLM's "GPU KV cache size": blocks shared among the groups, in tokens
    # (_report_kv_cache_config in vllm/v1/core/kv_cache_utils.py)
    return budget.kv_bytes / _GiB, blocks // len(layout.groups) * fp.block_size


def kv_pool_rows(rows: Sequence[dict[str, str]] | None = None) -> list[PoolRow]:
    """Every row with a measured KV pool, predicted where the model covers it."""
    out = []
    for row in measurement_rows() if rows is None else rows:
        if not row["kv_cache_gib"]:
            continue
        status, reason = _status(row)
        gib: float | None = None
        tokens: int | None = None
        if status != "not covered":
            try:
                gib, tokens = _predict(row)
            except ValueError as e:  # e.g. a dtype the model refuses
                status, reason = "not covered", str(e)
        util = row["gpu_memory_utilization"]
        out.append(
            PoolRow(
                id=row["id"],
                model=row["model"],
                gpu=row["gpu"],
                tp=int(row["tp"]),
                weight_dtype=row["weight_dtype"],
                kv_dtype=row["kv_dtype"] or "auto",
                utilization=float(util) if util else None,
                measured_gib=float(row["kv_cache_gib"]),
                measured_tokens=int(row["kv_cache_tokens"]) if row["kv_cache_tokens"] else None,
                predicted_gib=gib,
                predicted_tokens=tokens,
                status=status,
                reason=reason,
            )
        )
    return out


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:+.2f}%"


def format_pool_table(rows: Sequence[PoolRow]) -> str:
    """Predicted against measured, one line per row, reasons below the table."""
    head = (
        "row",
        "model",
        "gpu",
        "tp",
        "weights",
        "kv",
        "util",
        "measured GiB",
        "predicted GiB",
        "error",
        "measured tokens",
        "predicted tokens",
        "error",
        "status",
    )
    body = []
    for r in rows:
        body.append(
            (
                r.id,
                r.model,
                r.gpu,
                str(r.tp),
                r.weight_dtype,
                r.kv_dtype,
                "" if r.utilization is None else f"{r.utilization:g}",
                f"{r.measured_gib:.2f}",
                "" if r.predicted_gib is None else f"{r.predicted_gib:.2f}",
                _pct(r.error),
                "" if r.measured_tokens is None else f"{r.measured_tokens:,}",
                "" if r.predicted_tokens is None else f"{r.predicted_tokens:,}",
                _pct(r.tokens_error),
                r.status,
            )
        )
    widths = [max(len(line[i]) for line in (head, *body)) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in (head, *body)
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    checked = [r for r in rows if r.checked]
    errs = sorted(abs(r.error) for r in checked if r.error is not None)
    if errs:
        lines.append(
            f"\n{len(checked)} rows checked: max |error| {100 * errs[-1]:.2f}%, "
            f"median {100 * errs[len(errs) // 2]:.2f}% (tolerance {100 * KV_POOL_TOLERANCE:g}%)"
        )
    lines.extend(f"{r.id}: {r.status}: {r.reason}" for r in rows if r.reason)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the checks asked for (all by default); 1 when one misses its target."""
    from kvcoord.replay.latency_check import MAX_REQUESTS
    from kvcoord.replay.latency_report import latency_check_main

    p = argparse.ArgumentParser(
        prog="python -m kvcoord.replay.validate",
        description="Check the replay's models against published vLLM measurements "
        "(both checks unless one is named).",
    )
    p.add_argument("--memory", action="store_true", help="only the KV pool vLLM allocates")
    p.add_argument("--latency", action="store_true", help="only TTFT and TPOT")
    p.add_argument(
        "--max-requests",
        type=int,
        default=MAX_REQUESTS,
        metavar="N",
        help=f"requests replayed at most per closed-loop or finite-rate row ({MAX_REQUESTS})",
    )
    p.add_argument("--markdown", action="store_true", help="the latency table as Markdown")
    p.add_argument("--plot", metavar="PNG", help="write the predicted-vs-measured plot here")
    args = p.parse_args(argv)
    if args.max_requests < 1:
        p.error("--max-requests must be at least 1")
    both = not (args.memory or args.latency)
    ok = True
    if args.memory or both:
        rows = kv_pool_rows()
        print(format_pool_table(rows))
        ok = all(r.within_tolerance for r in rows if r.checked)
    if args.latency or both:
        if both:
            print()
        rows_ok = latency_check_main(
            measurement_rows(), args.max_requests, args.markdown, args.plot
        )
        ok = rows_ok and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
