"""vLLM 0.33.0's real Scheduler on vLLM's KV-cache manager and on kvcoord's.

    VLLM_TARGET_DEVICE=cpu HF_HOME=../shared/vllm/hf HF_HUB_OFFLINE=1 \\
        .venv-vllm/bin/python benches/bench_vllm_scheduler.py --running 256 1024

Each engine runs in its own process (kvcoord.vllm.enable() is process-wide),
engines alternating within each of ``--rounds`` rounds (3 by default; the
summary gives medians over rounds). A run builds vLLM's ``Scheduler`` the
way vLLM's scheduler tests do (opt-125m config, one full-attention group,
prefix caching on, ``sha256_cbor`` block hashes, stats logging on), admits
N requests whose prompts share a long prefix (step 0, not in the figures),
then times ``schedule()`` + ``update_from_output()`` (synthetic model
output: one sampled token per request) over decode steps. Three whole
cycles of 16 steps by default, so each kind of step (plain, a block
completes, a block is needed) weighs the same on both engines; the first
decode step also finalises prefill statistics (``estimate_cached_tokens``).

What is timed as "KV manager", by a wrapper, on each engine alike: every
public method of the manager's class (``allocate_slots``,
``get_computed_blocks``, ``free``, ``get_blocks``, the ``take_*``
hand-offs, ``record_prefix_cache_stats``...), its ``usage`` property, its
pool's ``free_blocks``, its coordinator's ``get_num_blocks_to_allocate``
and the methods the scheduler calls on the manager's results
(``get_block_ids`` of the ``KVCacheBlocks`` type, per scheduled request and
step). Only the outermost timed call counts (a method calling another is
timed once). "Hashing" is the request block hasher, which vLLM's
``Request`` calls on every token append. Request creation (where vLLM
hashes prompts) is timed separately.

As vLLM's ``EngineCore`` does, the startup heap is frozen before decode
steps. Garbage-collector pauses are timed apart (``gc.callbacks``) and left
out of the manager, hashing and share figures, whose denominator is the
step minus its pauses. "Net" figures subtract the wrapper's own cost per
call, calibrated on a wrapped no-op (``timer_floor_us``): what remains is
the time inside the callee beyond calling an empty Python function. The
wrappers also lengthen the step they run in (by the floor times the calls
of that step, alike on both engines), so net shares are of the step net of
the timer too, and ``step_net_*`` give the step without the wrappers.
``--clock cpu`` times everything in this thread's CPU time instead of wall
time: on a machine shared with other work, time spent descheduled then
counts nowhere (the timer's own cost is higher, about 0.6 us a call, and
subtracted in the net figures). The JSON output breaks the manager time
down by method (``per_name_ms_per_step``). Single-call medians:
``bench_vllm_decode_calls.py``.

The floor is calibrated in a tight loop with everything in cache, but paid
inside a step whose own work has evicted it, so the net figures understate
callees as cheap as kvcoord's. ``sample_vllm_scheduler.py`` measures the
same share without a wrapper, by sampling the stack.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_MODEL_LEN = 2048  # opt-125m's positions
# Result-object methods the scheduler calls on what the manager returns
# (``get_block_ids(allow_none=True)`` per scheduled request and step...):
# the manager's own result type on each side, so timed as manager work.
RESULT_METHODS = ("get_block_ids", "get_unhashed_block_ids", "new_empty", "__add__")


# Seconds spent in the cyclic garbage collector so far (gc.callbacks): its
# pauses land in whatever code allocates when a collection triggers, so they
# are reported apart and not counted as manager or hashing time.
_GC_PAUSE = [0.0]
_GC_START = [0.0]
# Timed calls now open: only the outermost is timed (a manager method calling
# another, or a result method, is counted once).
_DEPTH = [0]
# The clock of every figure: wall time (perf_counter) or, with --clock cpu,
# this thread's CPU time (time spent descheduled by other work not counted).
CLOCK = [time.perf_counter]
# Seconds and calls per wrapped name (the breakdown in the JSON output).
PER_NAME: dict[str, list] = {}


def _gc_callback(phase: str, info: dict) -> None:
    if phase == "start":
        _GC_START[0] = CLOCK[0]()
    else:
        _GC_PAUSE[0] += CLOCK[0]() - _GC_START[0]


def _timed(fn, acc, name="noop"):
    """``fn`` timed into ``acc`` = [seconds, calls], garbage-collector pauses
    excluded; calls made inside another timed call are not timed again."""
    clock = CLOCK[0]
    pause = _GC_PAUSE
    depth = _DEPTH
    own = PER_NAME.setdefault(name, [0.0, 0])

    def wrapper(*args, **kwargs):
        if depth[0]:
            return fn(*args, **kwargs)
        depth[0] = 1
        g0 = pause[0]
        t0 = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            spent = clock() - t0 - (pause[0] - g0)
            acc[0] += spent
            acc[1] += 1
            own[0] += spent
            own[1] += 1
            depth[0] = 0

    return wrapper


def _wrap_manager(manager, acc) -> list[str]:
    """Time every public method of ``manager`` (its class's callables), its
    ``usage`` property, its pool's ``free_blocks``, its coordinator's
    ``get_num_blocks_to_allocate`` and the result methods of its
    ``KVCacheBlocks`` type (class-level: each engine runs in its own
    process) into ``acc``; the names wrapped."""
    names = []
    cls = type(manager)
    for name in dir(cls):
        if name.startswith("_"):
            continue
        attr = getattr(cls, name)
        if isinstance(attr, property):
            if name == "usage":
                setattr(cls, name, property(_timed(attr.fget, acc, name)))
                names.append(name)
            continue
        if callable(attr) and not isinstance(attr, type):
            setattr(manager, name, _timed(getattr(manager, name), acc, name))
            names.append(name)
    for owner, name in (
        (manager.block_pool, "free_blocks"),
        (manager.coordinator, "get_num_blocks_to_allocate"),
    ):
        if hasattr(owner, name):
            label = f"{type(owner).__name__}.{name}"
            try:
                setattr(owner, name, _timed(getattr(owner, name), acc, label))
            except AttributeError:  # __slots__: wrap on the class
                setattr(type(owner), name, _timed(getattr(type(owner), name), acc, label))
            names.append(label)
    result_types = {type(manager.empty_kv_cache_blocks)}
    result_types.update(
        c for c in type(manager.empty_kv_cache_blocks).__mro__ if c.__name__ == "KVCacheBlocks"
    )
    for rt in result_types:
        for name in RESULT_METHODS:
            if name in rt.__dict__:
                label = f"{rt.__name__}.{name}"
                setattr(rt, name, _timed(rt.__dict__[name], acc, label))
                names.append(label)
    return sorted(names)


def _timer_floor(rounds: int = 7, calls: int = 20000) -> float:
    """Seconds :func:`_timed` reports for one call of a function doing nothing
    (the clock reads and the call itself; best of ``rounds``)."""
    best = float("inf")
    for _ in range(rounds):
        acc = [0.0, 0]
        noop = _timed(lambda request, *args, **kwargs: None, acc)
        for _ in range(calls):
            noop(None, 1, num_lookahead_tokens=0)
        best = min(best, acc[0] / calls)
    return best


def build_scheduler(engine: str, running: int, prompt_len: int, steps: int):
    """vLLM's ``Scheduler`` built the way its scheduler tests build one, on
    ``engine``'s KV-cache manager: (scheduler, ``ModelRunnerOutput``,
    ``Request``, the block size). Sized for ``running`` requests of
    ``prompt_len`` tokens decoding ``steps`` more, all admitted in one step."""
    if engine == "kvcoord":
        import kvcoord.vllm

        kvcoord.vllm.enable()
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    block_size = 16
    max_len = prompt_len + steps + 64
    if max_len > MAX_MODEL_LEN:
        raise SystemExit(f"prompt + decode steps + 64 must stay within {MAX_MODEL_LEN} tokens")
    num_blocks = running * (max_len // block_size + 2) + 16
    model = ModelConfig(model="facebook/opt-125m", dtype="float16", seed=0, max_model_len=max_len)
    sched_cfg = SchedulerConfig(
        max_num_seqs=running,
        max_num_batched_tokens=running * prompt_len,
        max_model_len=max_len,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
    )
    cache = CacheConfig(block_size=block_size, enable_prefix_caching=True)
    cache.prefix_caching_hash_algo = "sha256_cbor"
    vcfg = VllmConfig(scheduler_config=sched_cfg, model_config=model, cache_config=cache)
    spec = FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    kv_cfg = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )
    cache.num_gpu_blocks = num_blocks
    register_all_kvcache_specs(vcfg)
    scheduler = Scheduler(
        vllm_config=vcfg,
        kv_cache_config=kv_cfg,
        block_size=block_size,
        log_stats=True,
        structured_output_manager=StructuredOutputManager(vcfg),
    )
    return scheduler, ModelRunnerOutput, Request, block_size


def model_output(model_runner_output, scheduled, token: int):
    """A synthetic model output: one sampled ``token`` per scheduled request."""
    ids = list(scheduled.num_scheduled_tokens)
    return model_runner_output(
        req_ids=ids,
        req_id_to_index={r: i for i, r in enumerate(ids)},
        sampled_token_ids=[[token] for _ in ids],
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=[],
    )


def prompt(prefix: int, suffix: int, i: int) -> list[int]:
    """Request ``i``'s prompt: the shared prefix, then its own suffix."""
    return [(7 * t) % 50000 + 1 for t in range(prefix)] + [
        (i * 31 + j) % 50000 + 1 for j in range(suffix)
    ]


def run_engine(
    engine: str,
    running: int,
    prefix: int,
    suffix: int,
    steps: int,
    profile: Path | None = None,
    clock_name: str = "wall",
) -> dict:
    CLOCK[0] = time.thread_time if clock_name == "cpu" else time.perf_counter
    clock = CLOCK[0]
    scheduler, model_runner_output, request_type, block_size = build_scheduler(
        engine, running, prefix + suffix, steps
    )
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core import kv_cache_utils

    manager = scheduler.kv_cache_manager
    served = type(manager).__module__.startswith("kvcoord")
    kv_time = [0.0, 0]
    wrapped = _wrap_manager(manager, kv_time)

    kv_cache_utils.init_none_hash(sha256_cbor)
    hash_time = [0.0, 0]
    hasher = _timed(
        kv_cache_utils.get_request_block_hasher(block_size, sha256_cbor), hash_time, "hasher"
    )
    params = SamplingParams(max_tokens=steps + 8, ignore_eos=True)
    params.update_from_generation_config({}, 50256)
    prompts = [prompt(prefix, suffix, i) for i in range(running)]
    t0 = time.perf_counter()
    requests = [
        request_type(
            request_id=str(i),
            prompt_token_ids=prompts[i],
            sampling_params=params,
            pooling_params=None,
            block_hasher=hasher,
        )
        for i in range(running)
    ]
    creation = time.perf_counter() - t0
    creation_hash = hash_time[0]
    for r in requests:
        scheduler.add_request(r)

    # As vLLM's EngineCore does once built: the startup heap is frozen so
    # that collections skip it.
    gc_utils = importlib.import_module("vllm.utils.gc_utils")
    gc_utils.freeze_gc_heap()
    gc.callbacks.append(_gc_callback)
    floor = _timer_floor()
    step_times, kv_times, hash_times, gc_times, call_counts = [], [], [], [], []
    kv_calls = hash_calls = 0
    profiler = None
    for step in range(steps + 1):
        if step == 1 and profile is not None:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        kv0, h0, g0 = kv_time[0], hash_time[0], _GC_PAUSE[0]
        kc0, hc0 = kv_time[1], hash_time[1]
        t0 = clock()
        out = scheduler.schedule()
        t1 = clock()
        mro = model_output(model_runner_output, out, 1000 + step)
        t2 = clock()
        scheduler.update_from_output(out, mro)
        t3 = clock()
        if step == 0:
            for acc in PER_NAME.values():
                acc[:] = [0.0, 0]
            admit = {"admit_step_s": (t1 - t0) + (t3 - t2), "admitted": len(mro.req_ids)}
            admit["admit_kv_s"] = kv_time[0] - kv0
            continue
        step_times.append((t1 - t0) + (t3 - t2))
        kv_times.append(kv_time[0] - kv0)
        hash_times.append(hash_time[0] - h0)
        gc_times.append(_GC_PAUSE[0] - g0)
        kv_calls += kv_time[1] - kc0
        hash_calls += hash_time[1] - hc0
        call_counts.append(kv_time[1] - kc0 + hash_time[1] - hc0)

    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(str(profile))

    def pct(xs: list[float], q: float) -> float:
        s = sorted(xs)
        return s[min(len(s) - 1, int(q * len(s)))]

    # Shares are of the step's own work: garbage-collector pauses (reported
    # apart) are left out of the step as they are of the manager and hashing.
    work = sum(step_times) - sum(gc_times)
    n = len(step_times)
    kv_net = sum(kv_times) - floor * kv_calls
    hash_net = sum(hash_times) - floor * hash_calls
    # The step as it would run unwrapped: each timed call's floor removed
    # from the step it lengthened (same calls, same cost on both engines).
    work_net = work - floor * (kv_calls + hash_calls)
    step_net = [t - floor * c for t, c in zip(step_times, call_counts, strict=True)]
    return {
        "engine": engine,
        "served_by_kvcoord": served,
        "running": running,
        "prefix_tokens": prefix,
        "suffix_tokens": suffix,
        "decode_steps": len(step_times),
        "step_p50_ms": 1e3 * pct(step_times, 0.5),
        "step_p99_ms": 1e3 * pct(step_times, 0.99),
        "step_net_p50_ms": 1e3 * pct(step_net, 0.5),
        "step_net_p99_ms": 1e3 * pct(step_net, 0.99),
        "gc_ms_per_step": 1e3 * sum(gc_times) / n,
        "kv_share": sum(kv_times) / work,
        "hash_share": sum(hash_times) / work,
        "kv_ms_per_step": 1e3 * sum(kv_times) / n,
        "hash_ms_per_step": 1e3 * sum(hash_times) / n,
        "kv_calls_per_step": kv_calls / n,
        "hash_calls_per_step": hash_calls / n,
        "timer_floor_us": 1e6 * floor,
        "kv_net_share": kv_net / work_net,
        "hash_net_share": hash_net / work_net,
        "kv_net_ms_per_step": 1e3 * kv_net / n,
        "hash_net_ms_per_step": 1e3 * hash_net / n,
        "creation_s": creation,
        "wrapped": wrapped,
        "clock": clock_name,
        "per_name_ms_per_step": {
            k: round(1e3 * v[0] / n, 4) for k, v in PER_NAME.items() if v[1] and k != "noop"
        },
        "per_name_calls_per_step": {
            k: v[1] / n for k, v in PER_NAME.items() if v[1] and k != "noop"
        },
        "creation_hash_s": creation_hash,
        **admit,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--running", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--prefix", type=int, default=1792)
    ap.add_argument("--suffix", type=int, default=64)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--engine", choices=["vllm", "kvcoord"], help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="wall time, or this thread's CPU time (steadier on a machine shared with other work)",
    )
    ap.add_argument(
        "--profile",
        type=Path,
        help="with --engine: cProfile the decode steps into this file (figures then mean little)",
    )
    args = ap.parse_args()
    if args.engine:
        res = run_engine(
            args.engine,
            args.running[0],
            args.prefix,
            args.suffix,
            args.steps,
            args.profile,
            args.clock,
        )
        print(json.dumps(res))
        return 0
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "python"), env.get("PYTHONPATH")]))
    results = []
    for n in args.running:
        for _ in range(args.rounds):
            for engine in ("vllm", "kvcoord"):
                cmd = [sys.executable, __file__, "--engine", engine, "--running", str(n)]
                cmd += ["--prefix", str(args.prefix), "--suffix", str(args.suffix)]
                cmd += ["--steps", str(args.steps), "--clock", args.clock]
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if proc.returncode:
                    print(proc.stderr[-3000:], file=sys.stderr)
                    return proc.returncode
                res = json.loads(proc.stdout.strip().splitlines()[-1])
                res["load_average"] = os.getloadavg()[0]
                results.append(res)
                print(
                    f"N={n:5d} {engine:8s} step p50 {res['step_p50_ms']:8.2f} ms "
                    f"p99 {res['step_p99_ms']:8.2f} ms (net of the timer "
                    f"{res['step_net_p50_ms']:.2f}/{res['step_net_p99_ms']:.2f} ms;"
                    f" GC {res['gc_ms_per_step']:.2f} ms)"
                    f" | KV manager {res['kv_ms_per_step']:7.2f} ms"
                    f" ({100 * res['kv_share']:4.1f}%; net {100 * res['kv_net_share']:4.1f}%)"
                    f" hashing {res['hash_ms_per_step']:6.3f} ms"
                    f" ({100 * res['hash_share']:4.1f}%; net {100 * res['hash_net_share']:4.1f}%)"
                    f" timer {res['timer_floor_us']:.2f} us/call"
                    f" | admission step {res['admit_step_s']:.2f} s (KV {res['admit_kv_s']:.2f} s)"
                    f" | request creation {res['creation_s']:.2f} s"
                    f" (hashing {res['creation_hash_s']:.2f} s)",
                    flush=True,
                )
    _summary(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


def _summary(results: list[dict]) -> None:
    """Per size: medians over rounds, and vLLM's figure over kvcoord's."""

    def med(xs: list[float]) -> float:
        s = sorted(xs)
        return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2

    for n in sorted({r["running"] for r in results}):
        row = {}
        for engine in ("vllm", "kvcoord"):
            rs = [r for r in results if r["running"] == n and r["engine"] == engine]
            row[engine] = {
                "step": med([r["step_p50_ms"] for r in rs]),
                "step_net": med([r["step_net_p50_ms"] for r in rs]),
                "work_net": med([r["kv_net_ms_per_step"] + r["hash_net_ms_per_step"] for r in rs]),
                "work": med([r["kv_ms_per_step"] + r["hash_ms_per_step"] for r in rs]),
                "share": med([r["kv_share"] + r["hash_share"] for r in rs]),
                "net": med([r["kv_net_share"] + r["hash_net_share"] for r in rs]),
            }
        v, k = row["vllm"], row["kvcoord"]
        print(
            f"N={n:5d} medians of {len(rs)} round(s): step p50 {v['step']:.2f} vs "
            f"{k['step']:.2f} ms ({v['step'] / k['step']:.2f}x); KV manager + hashing "
            f"{v['work']:.3f} vs {k['work']:.3f} ms/step ({v['work'] / k['work']:.1f}x), "
            f"share {100 * v['share']:.1f}% vs {100 * k['share']:.1f}% "
            f"({v['share'] / k['share']:.1f}x smaller), net of the timer "
            f"{100 * v['net']:.1f}% vs {100 * k['net']:.1f}% ({v['net'] / k['net']:.1f}x smaller; "
            f"{v['work_net']:.3f} vs {k['work_net']:.3f} ms/step, step p50 "
            f"{v['step_net']:.2f} vs {k['step_net']:.2f} ms)",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
