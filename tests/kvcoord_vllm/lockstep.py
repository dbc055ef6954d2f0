"""Two vLLM ``Scheduler``s in lockstep: one on vLLM's own ``KVCacheManager``,
one on kvcoord's (built while ``kvcoord.vllm.enable()`` is on), fed the same
seeded operations and compared after every step (used by
``test_lockstep_fuzz.py``; import after ``pytest.importorskip`` of vLLM).

An operation is a plain tuple, so an operation list can be replayed, cut
down and printed:

* ``("add", rid, prompt, max_tokens)``: the same prompt added to both;
* ``("step", token_seed)``: ``schedule()``, a synthetic ``ModelRunnerOutput``
  (one sampled token per request whose prefill is complete, drawn from
  ``token_seed``; none for a partial prefill, as vLLM's model runner discards
  those) and ``update_from_output``;
* ``("abort", rid)`` / ``("stop", rid)``: ``finish_requests`` with
  ``FINISHED_ABORTED`` / ``FINISHED_STOPPED`` (an unknown or finished id is
  ignored by vLLM, as it is here);
* ``("reset", preempt_running)``: ``reset_prefix_cache(reset_running_requests=...)``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from vllm.config import CacheConfig, ModelConfig, ObservabilityConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

# The engine tests' tiny Llama: its config.json is the model the schedulers see.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine"))
from tiny_models import TinyLlama

import kvcoord.vllm as kv
from kvcoord.vllm.serve._versions import installed

EOS_TOKEN_ID = 50256
MAX_MODEL_LEN = 512
VOCAB = 40  # sampled tokens: a small vocabulary, so outputs repeat too

Op = tuple


@dataclass(frozen=True)
class Config:
    """One fuzzed scheduler configuration."""

    name: str
    block_size: int = 16
    num_blocks: int = 24
    enable_caching: bool = True
    #: Token budget per step (small: chunked prefill).
    max_num_batched_tokens: int = 1024
    max_num_seqs: int = 6
    #: A sliding-window group beside the full-attention group (the window in
    #: tokens), or 0 for full attention only.
    sliding_window: int = 0
    #: Longest prompt, in blocks.
    max_prompt_blocks: int = 5
    #: vLLM's KV-cache residency metrics (``kv_cache_metrics``), sampling
    #: every block, so both schedulers report the same block lives.
    kv_cache_metrics: bool = False

    def __str__(self) -> str:
        return self.name


def _kv_cache_config(cfg: Config) -> KVCacheConfig:
    full = FullAttentionSpec(
        block_size=cfg.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    groups = [KVCacheGroupSpec(["full"], full)]
    if cfg.sliding_window:
        swa = SlidingWindowSpec(
            block_size=cfg.block_size,
            num_kv_heads=1,
            head_size=1,
            dtype=torch.float32,
            sliding_window=cfg.sliding_window,
        )
        groups.append(KVCacheGroupSpec(["swa"], swa))
    return KVCacheConfig(num_blocks=cfg.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


@functools.cache
def _model_dir() -> str:
    """A local model directory holding the tiny Llama's ``config.json`` (all
    a scheduler's ``ModelConfig`` reads; no weights, no hub)."""
    directory = Path(tempfile.mkdtemp(prefix="kvcoord-lockstep-"))
    (directory / "config.json").write_text(json.dumps(TinyLlama().config()))
    return str(directory)


def _build_one(cfg: Config) -> Scheduler:
    model = ModelConfig(
        model=_model_dir(),
        dtype="float16",
        seed=0,
        max_model_len=MAX_MODEL_LEN,
        skip_tokenizer_init=True,
    )
    sched_cfg = SchedulerConfig(
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        max_model_len=MAX_MODEL_LEN,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
        watermark=0.0,
    )
    cache = CacheConfig(block_size=cfg.block_size, enable_prefix_caching=cfg.enable_caching)
    cache.prefix_caching_hash_algo = "sha256_cbor"
    cache.num_gpu_blocks = cfg.num_blocks
    observability = ObservabilityConfig(
        kv_cache_metrics=cfg.kv_cache_metrics, kv_cache_metrics_sample=1.0
    )
    vcfg = VllmConfig(
        scheduler_config=sched_cfg,
        model_config=model,
        cache_config=cache,
        observability_config=observability,
    )
    register_all_kvcache_specs(vcfg)
    return Scheduler(
        vllm_config=vcfg,
        kv_cache_config=_kv_cache_config(cfg),
        structured_output_manager=StructuredOutputManager(vcfg),
        block_size=cfg.block_size,
        log_stats=True,
    )


def _hasher(block_size: int) -> Callable[[Any], Any]:
    """The request block hasher that ``kv_cache_utils`` hands out now (vLLM's,
    or kvcoord's while enabled)."""
    make = kv_cache_utils.get_request_block_hasher
    if installed().hasher_takes_lookahead:
        return make(block_size, sha256_cbor, 0)
    return make(block_size, sha256_cbor)


@dataclass
class Pair:
    """Scheduler A (vLLM's manager) and B (kvcoord's), with their hashers."""

    a: Scheduler
    b: Scheduler
    hash_a: Callable[[Any], Any]
    hash_b: Callable[[Any], Any]


def build_pair(cfg: Config) -> Pair:
    """A on vLLM's manager; B built while kvcoord is enabled (strict: a
    fallback to vLLM's manager raises), then kvcoord is disabled again."""
    assert not kv.is_enabled(), "kvcoord must be off while scheduler A is built"
    kv_cache_utils.init_none_hash(sha256_cbor)
    a = _build_one(cfg)
    hash_a = _hasher(cfg.block_size)
    kv.enable(strict=True)
    try:
        b = _build_one(cfg)
        hash_b = _hasher(cfg.block_size)
    finally:
        kv.disable()
    assert type(a.kv_cache_manager) is kv.original_manager_class()
    assert type(b.kv_cache_manager) is kv.KVCacheManager, type(b.kv_cache_manager)
    return Pair(a, b, hash_a, hash_b)


# ---------------------------------------------------------------- operations


def generate_ops(cfg: Config, seed: int, n_ops: int) -> list[Op]:
    """A seeded operation list. Prompts are cut from a few shared stems (a
    random number of their tokens, often a whole number of blocks, then a
    short own suffix), sometimes an earlier prompt repeated exactly."""
    rng = random.Random(seed)
    bs = cfg.block_size
    longest = cfg.max_prompt_blocks * bs
    stems = [[rng.randrange(1, 30000) for _ in range(longest)] for _ in range(3)]
    prompts: list[list[int]] = []
    rids: list[str] = []
    ops: list[Op] = []
    weights = {"add": 22, "step": 60, "abort": 6, "stop": 4, "reset": 3, "reset_all": 1}
    kinds = list(weights)
    for _ in range(n_ops):
        kind = rng.choices(kinds, [weights[k] for k in kinds])[0]
        if kind == "add":
            if prompts and rng.random() < 0.15:
                prompt = list(rng.choice(prompts))
            else:
                stem = rng.choice(stems)
                if rng.random() < 0.5:
                    shared = bs * rng.randrange(0, cfg.max_prompt_blocks)
                else:
                    shared = rng.randrange(0, longest - bs)
                own = rng.randrange(1 if shared else 2, bs + bs // 2)
                prompt = stem[:shared] + [rng.randrange(30000, 40000) for _ in range(own)]
                prompt = prompt[:longest]
            prompts.append(prompt)
            rid = f"r{len(rids)}"
            rids.append(rid)
            ops.append(("add", rid, tuple(prompt), rng.randrange(1, 3 * bs)))
        elif kind == "step":
            ops.append(("step", rng.randrange(1 << 30)))
        elif kind in ("abort", "stop"):
            if rids:
                ops.append((kind, rng.choice(rids[-8:])))
        elif kind == "reset":
            ops.append(("reset", False))
        else:
            ops.append(("reset", True))
    # Drain: enough steps for most requests to run to their end.
    ops.extend(("step", rng.randrange(1 << 30)) for _ in range(12))
    return ops


def _request(rid: str, prompt: Sequence[int], max_tokens: int, hasher: Any) -> Request:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=False)
    params.update_from_generation_config({}, EOS_TOKEN_ID)
    return Request(
        request_id=rid,
        prompt_token_ids=list(prompt),
        sampling_params=params,
        pooling_params=None,
        block_hasher=hasher,
    )


def _model_output(sched: Scheduler, out: Any, token_seed: int) -> ModelRunnerOutput:
    """One sampled token per scheduled request whose prefill is complete
    (after ``schedule()``, ``num_computed_tokens`` counts the scheduled
    tokens), none for a partial prefill; tokens drawn from ``token_seed``
    and the request id, so both schedulers get the same."""
    ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        req = sched.requests[rid]
        if req.num_computed_tokens < req.num_tokens:
            sampled.append([])
        else:
            r = random.Random(f"{token_seed}/{rid}")
            sampled.append([r.randrange(1, VOCAB)])
    return ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={r: i for i, r in enumerate(ids)},
        sampled_token_ids=sampled,
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=[],
    )


# ---------------------------------------------------------------- comparison


def _blocks(ids: Any) -> Any:
    return None if ids is None else tuple(tuple(g) for g in ids)


def schedule_view(out: Any) -> dict[str, Any]:
    """What a ``SchedulerOutput`` decided, as comparable plain values."""
    view: dict[str, Any] = {
        "num_scheduled_tokens": dict(out.num_scheduled_tokens),
        "total_num_scheduled_tokens": out.total_num_scheduled_tokens,
        "new_reqs": {
            r.req_id: {
                "block_ids": _blocks(r.block_ids),
                "num_computed_tokens": r.num_computed_tokens,
            }
            for r in out.scheduled_new_reqs
        },
        "preempted_req_ids": sorted(out.preempted_req_ids or ()),
        "finished_req_ids": sorted(out.finished_req_ids),
        "num_common_prefix_blocks": list(out.num_common_prefix_blocks),
        "new_block_ids_to_zero": getattr(out, "new_block_ids_to_zero", None),
    }
    c = out.scheduled_cached_reqs
    view["cached_reqs"] = {
        rid: {
            "new_block_ids": _blocks(c.new_block_ids[i]),
            "num_computed_tokens": c.num_computed_tokens[i],
            "num_output_tokens": c.num_output_tokens[i],
            "resumed": rid in c.resumed_req_ids,
        }
        for i, rid in enumerate(c.req_ids)
    }
    return view


def _stats(stats: Any) -> dict[str, Any]:
    """A ``SchedulerStats``' KV-cache side."""
    pc = stats.prefix_cache_stats
    return {
        "prefix_cache_stats": {f.name: getattr(pc, f.name) for f in dataclasses.fields(pc)},
        "kv_cache_usage": round(stats.kv_cache_usage, 9),
        "num_running_reqs": stats.num_running_reqs,
        "num_waiting_reqs": stats.num_waiting_reqs,
        # The residency metrics' block lives that ended (their times are the
        # clock's, so what is compared is their shape): per life, whether it
        # was ever hit and how many reuse gaps it reports.
        "kv_cache_evictions": [
            (e.idle_seconds < e.lifetime_seconds, len(e.reuse_gaps_seconds))
            for e in stats.kv_cache_eviction_events
        ],
    }


def stats_view(sched: Scheduler) -> dict[str, Any]:
    """``make_stats()`` now (it drains the prefix-cache stats)."""
    stats = sched.make_stats()
    assert stats is not None
    return _stats(stats)


def _plain(value: Any) -> Any:
    if value is None:
        return None
    if dataclasses.is_dataclass(value):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    fields = getattr(value, "__struct_fields__", None)
    if fields is not None:
        return {f: getattr(value, f) for f in fields}
    return repr(value)


def engine_outputs_view(outputs: dict) -> dict[str, Any]:
    """``update_from_output``'s result: per request its new tokens, finish
    reason and prefill statistics (cached tokens), the finished set, and the
    step's scheduler stats (``make_stats()``, prefix-cache stats included)."""
    view: dict[str, Any] = {}
    for client, eco in outputs.items():
        view[client] = {
            o.request_id: {
                "new_token_ids": list(o.new_token_ids),
                "finish_reason": None if o.finish_reason is None else str(o.finish_reason),
                "num_cached_tokens": getattr(o, "num_cached_tokens", None),
                "prefill_stats": _plain(getattr(o, "prefill_stats", None)),
            }
            for o in eco.outputs
        }
        view[client]["finished_requests"] = sorted(eco.finished_requests or ())
        stats = getattr(eco, "scheduler_stats", None)
        view[client]["scheduler_stats"] = None if stats is None else _stats(stats)
    return view


def requests_view(sched: Scheduler) -> dict[str, Any]:
    return {
        rid: (str(r.status), r.num_computed_tokens, r.num_tokens, r.num_preemptions)
        for rid, r in sorted(sched.requests.items())
    }


def diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Readable differences between two nested plain values."""
    if isinstance(a, dict) and isinstance(b, dict):
        lines = []
        for k in sorted(set(a) | set(b), key=str):
            if k not in a:
                lines.append(f"{path}.{k}: only kvcoord has it: {b[k]!r}")
            elif k not in b:
                lines.append(f"{path}.{k}: only vLLM has it: {a[k]!r}")
            else:
                lines.extend(diff(a[k], b[k], f"{path}.{k}"))
        return lines
    if a != b:
        return [f"{path}: vLLM {a!r} != kvcoord {b!r}"]
    return []


@dataclass
class Divergence:
    """The first step where B differed from A."""

    step: int
    op: Op
    what: str
    lines: list[str]

    @property
    def first_field(self) -> str:
        return self.lines[0].split(":", 1)[0] if self.lines else self.what

    def __str__(self) -> str:
        body = "\n  ".join(self.lines[:30])
        more = f"\n  ... {len(self.lines) - 30} more" if len(self.lines) > 30 else ""
        return f"step {self.step} {self.op[:2]!r} ({self.what}):\n  {body}{more}"


Inject = Callable[[Scheduler], None]


def _kvcoord_hashed() -> int:
    """Requests kvcoord's block hasher has hashed in this process."""
    return int(kv.status()["hashing"].get("kvcoord_requests", 0))


def run(
    cfg: Config,
    ops: Sequence[Op],
    inject: Inject | None = None,
    coverage: Counter[str] | None = None,
) -> Divergence | None:
    """Replay ``ops`` on a fresh pair; the first divergence, or None.
    ``inject`` edits scheduler B after it is built (negative controls);
    ``coverage`` counts what the run exercised (scheduler A's side)."""
    cov: Counter[str] = Counter() if coverage is None else coverage
    hashed_before = _kvcoord_hashed()
    try:
        return _run(cfg, ops, inject, cov)
    finally:
        # B's requests hashed by kvcoord's hasher (not handed to vLLM's).
        cov["kvcoord_hashed"] += _kvcoord_hashed() - hashed_before


def _run(
    cfg: Config, ops: Sequence[Op], inject: Inject | None, cov: Counter[str]
) -> Divergence | None:
    pair = build_pair(cfg)
    a, b = pair.a, pair.b
    if inject is not None:
        inject(b)

    def check(step: int, op: Op, what: str, va: Any, vb: Any) -> Divergence | None:
        lines = diff(va, vb)
        return Divergence(step, op, what, lines) if lines else None

    for step, op in enumerate(ops):
        kind = op[0]
        found = None
        if kind == "add":
            _, rid, prompt, max_tokens = op
            a.add_request(_request(rid, prompt, max_tokens, pair.hash_a))
            b.add_request(_request(rid, prompt, max_tokens, pair.hash_b))
        elif kind == "step":
            out_a = a.schedule()
            try:
                out_b = b.schedule()
            except Exception as e:  # kvcoord failed where vLLM did not
                return Divergence(step, op, "schedule", [f"kvcoord raised {e!r}"])
            found = check(step, op, "SchedulerOutput", schedule_view(out_a), schedule_view(out_b))
            if found:
                return found
            cov["steps"] += 1
            cov["scheduled_tokens"] += out_a.total_num_scheduled_tokens
            cov["preemptions"] += len(out_a.preempted_req_ids or ())
            cov["resumed"] += len(out_a.scheduled_cached_reqs.resumed_req_ids)
            cov["partial_prefills"] += sum(
                a.requests[r].num_computed_tokens < a.requests[r].num_tokens
                for r in out_a.num_scheduled_tokens
            )
            mro_a = _model_output(a, out_a, op[1])
            mro_b = _model_output(b, out_b, op[1])
            eo_a = a.update_from_output(out_a, mro_a)
            try:
                eo_b = b.update_from_output(out_b, mro_b)
            except Exception as e:
                return Divergence(step, op, "update_from_output", [f"kvcoord raised {e!r}"])
            cov["finished"] += len(out_a.finished_req_ids)
            found = check(
                step, op, "EngineCoreOutputs", engine_outputs_view(eo_a), engine_outputs_view(eo_b)
            )
        elif kind in ("abort", "stop"):
            status = (
                RequestStatus.FINISHED_ABORTED
                if kind == "abort"
                else RequestStatus.FINISHED_STOPPED
            )
            ra = [r.request_id for r in a.finish_requests(op[1], status)]
            rb = [r.request_id for r in b.finish_requests(op[1], status)]
            found = check(step, op, "finish_requests", ra, rb)
        elif kind == "reset":
            ok_a = a.reset_prefix_cache(reset_running_requests=op[1])
            ok_b = b.reset_prefix_cache(reset_running_requests=op[1])
            found = check(step, op, "reset_prefix_cache", ok_a, ok_b)
            cov["resets_done"] += bool(ok_a)
        else:
            raise ValueError(op)
        if kind == "step" and not found:
            for eco in eo_a.values():
                if eco.scheduler_stats is not None:
                    pcs = eco.scheduler_stats.prefix_cache_stats
                    cov["hit_tokens"] += pcs.hits + pcs.preempted_hits
                    cov["queried_tokens"] += pcs.queries + pcs.preempted_queries
                    for event in eco.scheduler_stats.kv_cache_eviction_events:
                        cov["lives_ended"] += 1
                        cov["lives_with_reuse_gaps"] += bool(event.reuse_gaps_seconds)
        sa, sb = stats_view(a), stats_view(b)
        found = (
            found
            or check(step, op, "requests", requests_view(a), requests_view(b))
            or check(step, op, "make_stats", sa, sb)
        )
        if found:
            return found
    return None


def shrink(
    cfg: Config, ops: list[Op], inject: Inject | None = None, budget: int = 120
) -> tuple[list[Op], Divergence]:
    """The shortest failing operation list found by delta debugging (ddmin
    over operations, after cutting the list at its first failing step), at
    most ``budget`` replays; and its divergence."""
    first = run(cfg, ops, inject)
    assert first is not None, "shrink needs a failing operation list"
    best, best_div = list(ops[: first.step + 1]), first
    replays = 1
    n = 2
    while len(best) >= 2 and replays < budget:
        chunk = max(1, len(best) // n)
        reduced = False
        for start in range(0, len(best), chunk):
            candidate = best[:start] + best[start + chunk :]
            if not candidate:
                continue
            replays += 1
            found = run(cfg, candidate, inject)
            if found is not None:
                best, best_div = candidate[: found.step + 1], found
                n = max(n - 1, 2)
                reduced = True
                break
            if replays >= budget:
                break
        if not reduced:
            if chunk == 1:
                break
            n = min(n * 2, len(best))
    return best, best_div


def report(
    cfg: Config, seed: int, ops: list[Op], first: Divergence, minimal: list[Op], div: Divergence
) -> str:
    """The failure message: config, seed, the first difference of the full
    run, and the shortest failing operation list with its difference."""
    listing = "\n".join(f"  {i:3d} {op!r}" for i, op in enumerate(minimal))
    return (
        f"lockstep divergence: config {cfg.name} {cfg!r}, seed {seed}, {len(ops)} ops\n"
        f"first difference at {first}\n"
        f"shortest failing operation list ({len(minimal)} ops):\n{listing}\n"
        f"its difference at {div}"
    )
