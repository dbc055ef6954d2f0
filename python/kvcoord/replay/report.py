"""Metrics and tables of ``kvcoord replay`` / ``kvcoord sweep`` (plots: :mod:`.plots`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from kvcoord.replay.bestcase import BestCase
from kvcoord.replay.overload import format_overload, overload_verdict
from kvcoord.replay.plan import GiB, Plan
from kvcoord.replay.scheduler import SimConfig, SimResult
from kvcoord.replay.timing import prefill_gpu_seconds_saved

__all__ = [
    "format_summary",
    "format_sweep",
    "latency_metrics",
    "occupancy_metrics",
    "summarize",
]


def _pcts(x: np.ndarray, prefix: str, out: dict[str, Any], ms: bool = False) -> None:
    """Percentiles and mean in seconds; with ``ms`` also the figures ``vllm bench
    serve`` reports, in milliseconds: mean, median, std, p90, p99."""
    x = x[~np.isnan(x)]
    for q in (50, 90, 99):
        out[f"{prefix}_p{q}_s"] = float(np.percentile(x, q)) if x.size else None
    out[f"{prefix}_mean_s"] = float(x.mean()) if x.size else None
    if ms:
        stats = (
            ("mean", np.mean),
            ("median", np.median),
            ("std", np.std),
            ("p90", lambda a: np.percentile(a, 90)),
            ("p99", lambda a: np.percentile(a, 99)),
        )
        for name, f in stats:
            out[f"{prefix}_{name}_ms"] = float(f(x)) * 1e3 if x.size else None


def _weighted_percentiles(
    values: np.ndarray, weights: np.ndarray, qs: tuple[int, ...]
) -> list[float | None]:
    """Percentiles of ``values`` each counted ``weights`` times (the lower value
    at a percentile's rank, as ``np.percentile(np.repeat(values, weights), q,
    method="lower")`` gives)."""
    keep = weights > 0
    v, w = values[keep], weights[keep]
    if not v.size:
        return [None] * len(qs)
    order = np.argsort(v, kind="stable")
    v, cum = v[order], np.cumsum(w[order])
    total = int(cum[-1])
    out: list[float | None] = []
    for q in qs:
        rank = int(np.floor(q / 100 * (total - 1)))  # 0-based, as method="lower"
        out.append(float(v[np.searchsorted(cum, rank, side="right")]))
    return out


def _arr(a: Any, dtype: Any) -> np.ndarray:
    return np.frombuffer(a, dtype=dtype) if len(a) else np.zeros(0, dtype=dtype)


def latency_metrics(res: SimResult) -> dict[str, Any]:
    """TTFT, time per output token, queueing delay and end-to-end latency
    percentiles (s; TTFT, TPOT and end-to-end also in ms), mean inter-token
    latency (mean and percentiles, ms) and throughput.

    TPOT is ``vllm bench serve``'s: per request with more than one output
    token, ``(e2e - TTFT) / (output tokens - 1)``. ITL is its per-gap
    figure: every gap between two tokens of a request. Its mean is exact (a
    request's gaps add up to ``e2e - TTFT``); its percentiles weigh each
    step's gap (``SimResult.step_itl``) by the later tokens the step sampled.
    """
    arrival = _arr(res.req_arrival, np.float64)
    admit = _arr(res.req_admit, np.float64)
    first = _arr(res.req_first, np.float64)
    finish = _arr(res.req_finish, np.float64)
    out_len = _arr(res.req_output, np.int64)
    m: dict[str, Any] = {}
    _pcts(first - arrival, "ttft", m, ms=True)
    _pcts(admit - arrival, "queue", m)
    _pcts(finish - arrival, "e2e", m, ms=True)
    multi = out_len > 1
    decode = finish[multi] - first[multi]
    _pcts(decode / (out_len[multi] - 1), "tpot", m, ms=True)
    gaps = int((out_len[multi] - 1).sum())
    m["itl_mean_ms"] = float(np.nansum(decode)) / gaps * 1e3 if gaps else None
    itl = _weighted_percentiles(
        _arr(res.step_itl, np.float64), _arr(res.step_later_tokens, np.int64), (50, 90, 99)
    )
    for q, v in zip((50, 90, 99), itl, strict=True):
        m[f"itl_p{q}_ms"] = None if v is None else v * 1e3
    span = float(np.nanmax(finish) - np.nanmin(arrival)) if finish.size else 0.0
    m["makespan_seconds"] = span
    m["requests_per_s"] = res.num_finished / span if span > 0 else 0.0
    m["output_tokens_per_s"] = res.output_tokens / span if span > 0 else 0.0
    m["request_tokens_per_s"] = (res.prompt_tokens + res.output_tokens) / span if span > 0 else 0.0
    return m


def occupancy_metrics(res: SimResult) -> dict[str, Any]:
    """Referenced / cached-but-free / empty blocks: per-step peaks and time-weighted means."""
    usable = max(1, res.num_blocks - 1)
    t = _arr(res.step_time, np.float64)
    ref = _arr(res.step_usage, np.float64)
    cached = _arr(res.step_cached, np.float64) / usable
    dt = np.diff(np.concatenate([[0.0], t])) if t.size else np.ones(1)
    if not t.size:
        ref = cached = np.zeros(1)
    w = dt / dt.sum() if dt.sum() > 0 else np.full(dt.shape, 1 / max(1, dt.size))
    samples = np.asarray(res.occupancy_samples, dtype=np.float64).reshape(-1, 4)
    m: dict[str, Any] = {
        "peak_usage": float(ref.max()),
        "mean_usage": float((ref * w).sum()),
        "occupancy_referenced_peak": float(ref.max()),
        "occupancy_referenced_mean": float((ref * w).sum()),
        "occupancy_cached_peak": float(cached.max()),
        "occupancy_cached_mean": float((cached * w).sum()),
        "occupancy_samples": int(samples.shape[0]),
    }
    if samples.shape[0]:
        m["occupancy_cached_free_mean"] = float(samples[:, 2].mean() / usable)
        m["occupancy_empty_mean"] = float(samples[:, 3].mean() / usable)
        m["occupancy_empty_min"] = float(samples[:, 3].min() / usable)
    return m


def summarize(
    res: SimResult,
    best: BestCase | None,
    cfg: SimConfig,
    workload_name: str,
    plan: Plan | None = None,
    instances: int = 1,
) -> dict[str, Any]:
    """The replay's numbers as a JSON-ready dict (the keys ``--json`` writes; docs/replay.md).

    ``instances``: engines of ``plan`` behind a router (``res`` their merged
    accounting), each with the pool of ``cfg``; totals count every GPU of every
    engine.
    """
    per_step = np.frombuffer(res.step_manager_s, dtype=np.float64)
    hit_rate = res.hit_tokens / res.prompt_tokens if res.prompt_tokens else 0.0
    host_rate = res.host_hit_tokens / res.prompt_tokens if res.prompt_tokens else 0.0
    disk_rate = res.disk_hit_tokens / res.prompt_tokens if res.prompt_tokens else 0.0
    s: dict[str, Any] = {
        "workload": workload_name,
        "layout": cfg.layout.name,
        "layout_description": cfg.layout.describe(),
        "num_blocks": cfg.num_blocks,
        "block_size": cfg.layout.block_size,
        "max_running": cfg.max_running,
        "token_budget": cfg.token_budget,
        "time_scale": cfg.time_scale,
        "max_concurrency": cfg.max_concurrency,
        "num_requests": res.num_requests,
        "num_finished": res.num_finished,
        "prompt_tokens": res.prompt_tokens,
        "output_tokens": res.output_tokens,
        "prefix_hit_tokens": res.hit_tokens,
        "prefix_hit_rate": hit_rate,
        "host_hit_tokens": res.host_hit_tokens,
        "host_hit_rate": host_rate,
        "disk_hit_tokens": res.disk_hit_tokens,
        "disk_hit_rate": disk_rate,
        "total_hit_rate": hit_rate + host_rate + disk_rate,
        "host_transfer_seconds": res.host_transfer_seconds,
        "disk_transfer_seconds": res.disk_transfer_seconds,
        "best_possible_hit_rate": best.hit_rate if best is not None else None,
        "preemptions": res.preemptions,
        "evictions": res.evictions,
        "steps": res.steps,
        "simulated_seconds": res.sim_seconds,
        "busy_seconds": res.busy_seconds,
        # what the replica sustains at this mix: tokens per simulated busy second
        # (prefix hits shorten steps, preemptions add recomputation)
        "throughput_tokens_per_s": (
            (res.prompt_tokens + res.output_tokens) / res.busy_seconds
            if res.busy_seconds > 0
            else 0.0
        ),
    }
    s.update(occupancy_metrics(res))
    s.update(latency_metrics(res))
    s["overload"] = overload_verdict(res, cfg.max_concurrency, instances, cfg.time_scale)
    if plan is not None:
        fp = plan.footprint
        step = plan.step_model
        gpu_hits = _arr(res.req_gpu_hit, np.int64)
        all_hits = gpu_hits + _arr(res.req_host_hit, np.int64) + _arr(res.req_disk_hit, np.int64)
        s.update(
            {
                "model": plan.model.name,
                "gpu": plan.gpu.name,
                "tp": plan.tp,
                "kv_dtype": plan.model.kv_dtype,
                "size_source": plan.size_note,
                "kv_bytes_per_token": fp.token_bytes,
                "kv_bytes_per_token_per_gpu": fp.token_bytes_per_gpu,
                "block_bytes_per_gpu": fp.page_bytes_per_gpu,
                "kv_memory_gib_per_gpu": plan.kv_bytes_per_gpu / GiB,
                "num_gpus": plan.tp * instances,
                "kv_memory_gib_total": plan.kv_bytes_per_gpu * plan.tp * instances / GiB,
                "pool_token_slots": plan.token_slots,
                "pool_context_tokens": plan.context_tokens,
                "host_memory_gib": plan.host_bytes / GiB,
                "disk_memory_gib": plan.disk_bytes / GiB,
                # every prompt prefilled from scratch: the same formula over whole prompts
                "prefill_gpu_seconds": prefill_gpu_seconds_saved(
                    step, _arr(res.req_prompt, np.int64)
                ),
                "prefill_gpu_seconds_saved": prefill_gpu_seconds_saved(step, all_hits),
                "prefill_gpu_seconds_saved_gpu_tier": prefill_gpu_seconds_saved(step, gpu_hits),
                "step_model": step.describe(),
                "notes": list(plan.notes),
            }
        )
    s.update(
        {
            "manager_seconds": res.manager_seconds,
            "manager_us_per_step_p50": _us_pct(per_step, 50),
            "manager_us_per_step_p99": _us_pct(per_step, 99),
            "wall_seconds": res.wall_seconds,
            "token_seconds": res.token_seconds,
            "request_seconds": res.request_seconds,
            "best_possible_seconds": res.best_seconds,
            "leaked_blocks": res.leaked_blocks,
            **_residency_keys(res),
        }
    )
    return s


def _us_pct(per_step: np.ndarray, q: float) -> float | None:
    """A percentile of the per-step manager time in microseconds (None: no steps)."""
    return float(np.percentile(per_step, q) * 1e6) if per_step.size else None


def _us(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f} us" if x >= 0.1 else f"{x * 1e3:.0f} ns"


def _residency_keys(res: SimResult) -> dict[str, Any]:
    """Block residency (simulated seconds): median and p90 of lifetime, idle
    time before eviction and reuse gap, mean hits per evicted block."""
    r = res.residency
    if r is None:
        return {}
    out: dict[str, Any] = {"residency_evicted_blocks": r.lifetime.count}
    for name, h in (
        ("lifetime", r.lifetime),
        ("idle_before_eviction", r.idle_before_eviction),
        ("reuse_gap", r.reuse_gap),
    ):
        out[f"residency_{name}_s_p50"] = h.quantile(0.5) / 1e6
        out[f"residency_{name}_s_p90"] = h.quantile(0.9) / 1e6
    out["residency_hits_per_evicted_block"] = r.hits_per_block.mean
    return out


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _secs(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:,.2f} s"


def _lat(s: dict[str, Any], key: str) -> str:
    pcts = [f"p{q} {_secs(s.get(f'{key}_p{q}_s'))}" for q in (50, 90, 99)]
    return ", ".join([*pcts, f"mean {_secs(s.get(f'{key}_mean_s'))}"])


def format_summary(s: dict[str, Any]) -> str:
    """A two-column text table of a replay summary."""
    cap = s.get("max_concurrency")
    clients = f"; at most {cap:,} in flight (--concurrency)" if cap is not None else ""
    rows: list[tuple[str, str]] = [("workload", s["workload"] + clients)]
    n = s.get("instances", 1)
    each = " per engine" if n > 1 else ""
    if "model" in s:
        engines = f" ({n} engines of TP {s['tp']})" if n > 1 else ""
        rows.append(
            (
                "model on GPUs",
                f"{s['model']} on {s['num_gpus']}x {s['gpu']}{engines}, KV {s['kv_dtype']}: "
                f"{s['kv_bytes_per_token'] / 1024:,.1f} KiB per token "
                f"({s['kv_bytes_per_token_per_gpu'] / 1024:,.1f} KiB per GPU)",
            )
        )
    rows.append(("layout", f"{s['layout']}: {s['layout_description']}"))
    if "model" in s:
        rows.append(
            (
                "KV cache",
                f"{s['kv_memory_gib_per_gpu']:,.2f} GiB per GPU ({s['kv_memory_gib_total']:,.2f} "
                f"GiB total on {s['num_gpus']} GPU{'s' if s['num_gpus'] != 1 else ''}) = "
                f"{s['num_blocks']:,} blocks of "
                f"{s['block_size']} tokens = {s['pool_token_slots']:,} token slots{each}",
            )
        )
        rows.append(("  size from", s["size_source"]))
        for tier in ("host", "disk"):
            gib = s.get(f"{tier}_memory_gib")
            if gib:
                total = f" ({gib * n:,.1f} GiB total)" if n > 1 else ""
                rows.append(
                    (f"{tier} tier", f"{gib:,.1f} GiB{each}{total} (LRU, 256-token chunks)")
                )
    else:
        rows.append(("pool", f"{s['num_blocks']:,} blocks{each}"))
    rows += [
        ("requests", f"{s['num_finished']:,} finished of {s['num_requests']:,}"),
        ("prompt tokens", f"{s['prompt_tokens']:,}"),
        ("output tokens", f"{s['output_tokens']:,}"),
    ]
    hit = f"{_pct(s['prefix_hit_rate'])} from the GPU pool"
    if s.get("host_memory_gib"):
        hit += f" + {_pct(s['host_hit_rate'])} from the host tier"
    if s.get("disk_memory_gib"):
        hit += f" + {_pct(s['disk_hit_rate'])} from the disk tier"
    if s.get("host_memory_gib") or s.get("disk_memory_gib"):
        hit += f" = {_pct(s['total_hit_rate'])}"
    hit += f"  (best possible, unbounded cache: {_pct(s['best_possible_hit_rate'])})"
    rows.append(("prefix-cache hit rate", hit))
    if s.get("host_memory_gib"):
        rows.append(("host transfers", f"{s['host_transfer_seconds']:,.2f} s charged to steps"))
    if s.get("disk_memory_gib"):
        rows.append(("disk transfers", f"{s['disk_transfer_seconds']:,.2f} s charged to steps"))
    if s.get("ttft_p50_s") is not None:
        rows += [
            ("TTFT", _lat(s, "ttft")),
            ("time per output token", _lat(s, "tpot")),
            ("queueing delay", _lat(s, "queue")),
            (
                "throughput",
                f"{s['requests_per_s']:,.3g} req/s, {s['output_tokens_per_s']:,.0f} output "
                f"tok/s, {s['request_tokens_per_s']:,.0f} prompt+output tok/s over "
                f"{s['makespan_seconds']:,.1f} s; "
                f"{s['throughput_tokens_per_s']:,.0f} tok/s per busy second",
            ),
        ]
    if "overload" in s:
        rows.append(("load", format_overload(s["overload"])))
    if "prefill_gpu_seconds_saved" in s:
        total = s["prefill_gpu_seconds"]
        saved = s["prefill_gpu_seconds_saved"]
        share = saved / total if total else 0.0
        rows.append(
            (
                "prefill compute",
                f"{saved:,.0f} GPU-s saved by cache hits of {total:,.0f} GPU-s for all "
                f"prompts ({_pct(share)})",
            )
        )
    ev = f"{s['evictions']:,}"
    rows += [
        ("evictions", ev),
        ("preemptions", f"{s['preemptions']:,}"),
        (
            "pool occupancy",
            f"referenced peak {_pct(s['occupancy_referenced_peak'])}, mean "
            f"{_pct(s['occupancy_referenced_mean'])}; cached-but-free mean "
            f"{_pct(s.get('occupancy_cached_free_mean'))}; empty mean "
            f"{_pct(s.get('occupancy_empty_mean'))}",
        ),
        ("steps", f"{s['steps']:,} ({s['simulated_seconds']:,.1f} simulated s)"),
        (
            "manager time",
            f"{s['manager_seconds']:.3f} s total; per step p50 "
            f"{_us(s['manager_us_per_step_p50'])}, p99 {_us(s['manager_us_per_step_p99'])}",
        ),
        (
            "wall time",
            f"{s['wall_seconds']:.2f} s (manager {s['manager_seconds']:.2f}, Request objects "
            f"{s['request_seconds']:.2f}, token synthesis {s['token_seconds']:.2f}, "
            f"best-possible pass {s['best_possible_seconds']:.2f}, scheduler loop the rest)",
        ),
    ]
    rows += [("note", n) for n in s.get("notes", [])]
    if s.get("residency_evicted_blocks") == 0:
        rows.append(
            (
                "block residency",
                f"no cached block evicted; reuse gap p50 {s['residency_reuse_gap_s_p50']:.2f} s",
            )
        )
    elif "residency_evicted_blocks" in s:
        rows.append(
            (
                "block residency",
                f"{s['residency_evicted_blocks']:,} evicted; lifetime p50 "
                f"{s['residency_lifetime_s_p50']:.2f} s, idle before eviction p50 "
                f"{s['residency_idle_before_eviction_s_p50']:.2f} s, reuse gap p50 "
                f"{s['residency_reuse_gap_s_p50']:.2f} s, "
                f"{s['residency_hits_per_evicted_block']:.2f} hits per evicted block "
                "(log2 buckets: upper bounds)",
            )
        )
    if s.get("leaked_blocks"):
        rows.append(("LEAKED BLOCKS", str(s["leaked_blocks"])))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def format_sweep(rows: list[dict[str, Any]]) -> str:
    """A table of sweep results, one row per variant and pool size."""
    head = (
        "variant",
        "KV GiB/GPU",
        "blocks",
        "hit rate",
        "host hit",
        "best",
        "TTFT p90",
        "load",
        "tok/s busy",
        "preempt",
        "evictions",
    )
    lines = []
    for s in rows:
        lines.append(
            (
                str(s.get("variant", s["layout"])),
                f"{s.get('kv_memory_gib_per_gpu', float('nan')):,.2f}",
                f"{s['num_blocks']:,}",
                _pct(s["prefix_hit_rate"]),
                _pct(s.get("host_hit_rate")),
                _pct(s["best_possible_hit_rate"]),
                _secs(s.get("ttft_p90_s")),
                _load_cell(s.get("overload")),
                f"{s['throughput_tokens_per_s']:,.0f}",
                f"{s['preemptions']:,}",
                f"{s['evictions']:,}",
            )
        )
    widths = [max(len(h), *(len(r[i]) for r in lines)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), *(fmt.format(*r) for r in lines)])


def _load_cell(v: dict[str, Any] | None) -> str:
    """A sweep row's verdict: ``over x4.2`` (offered / sustained) when overloaded,
    ``ok`` when it keeps up, else the regime (``closed loop``, ``burst``)."""
    if not v:
        return "n/a"
    if v["overloaded"]:
        return f"over x{v['offered_rps'] / v['sustained_rps']:.1f}"
    return "ok" if v["regime"] == "open loop" else str(v["regime"])
