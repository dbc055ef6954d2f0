"""The KV manager's share of vLLM 0.33.0's scheduler step, by sampling the stack.

    pip install py-spy   # any virtualenv: it is a standalone binary
    VLLM_TARGET_DEVICE=cpu HF_HOME=../shared/vllm/hf HF_HUB_OFFLINE=1 \\
        .venv-vllm/bin/python benches/sample_vllm_scheduler.py --py-spy /path/to/py-spy

``bench_vllm_scheduler.py`` times the manager with a Python wrapper around
each call. The wrapper costs about as much as one of kvcoord's calls, so
its figures only mean something with the wrapper's cost subtracted (its
"net" shares). This benchmark measures the same share without touching a
call. Each engine's process runs vLLM's real ``Scheduler`` unwrapped
(built as ``bench_vllm_scheduler.py`` builds it: opt-125m config, one
full-attention group, prefix caching, ``sha256_cbor``, stats on), while
py-spy samples its stack, native frames included, ``--rate`` times a
second.

A process runs ``--cycles`` cycles: N requests sharing a long prefix are
admitted in one step, decode ``--steps`` steps, and are aborted. A sample
is a *step* sample when it was taken inside ``schedule()`` or
``update_from_output()`` of a decode step (admission, request creation and
the synthetic model output are not counted). Of those, it is the engine's
when a frame of its stack is the engine's KV-cache code: vLLM's
``kv_cache_manager``, ``block_pool``, ``kv_cache_coordinator``,
``single_type_kv_cache_manager``, ``kv_cache_utils`` and ``kv_cache_metrics``
modules, or any ``kvcoord`` module and kvcoord's extension (native frames
by symbol). It is *hashing* when that code runs below vLLM's
``Request.update_block_hashes`` (the request block hasher, called on every
token append), and *KV manager* otherwise. A share is samples over step
samples; its binomial standard error is printed with it. The work the
interpreter does to make a call before the callee's frame exists is counted
for the caller, on both engines alike.
"""

from __future__ import annotations

import argparse
import gc
import json
import linecache
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vllm_scheduler import ROOT, build_scheduler, model_output, prompt

# Files whose frames are the KV manager's, per engine (path suffixes).
VLLM_MANAGER = tuple(
    f"/vllm/v1/core/{m}.py"
    for m in (
        "kv_cache_manager",
        "block_pool",
        "kv_cache_coordinator",
        "single_type_kv_cache_manager",
        "kv_cache_utils",
        "kv_cache_metrics",
    )
)
# Frames of the decode step: the function of this file that makes the two
# calls, and the two scheduler methods it calls.
STEP_FRAME = "_decode_step"
STEP_CALLS = ("schedule", "update_from_output")
# The method of vLLM's Request that calls the request block hasher.
HASHER_CALL = "update_block_hashes"
# Source lines that call into the KV manager (or a result of it, or the
# hasher): without native frames, kvcoord's Rust time shows as these lines.
CALL_SITE = re.compile(r"kv_cache_manager\.|_block_hasher\(|\.get_block_ids\(")


def _decode_step(scheduler, output, token: int) -> None:
    scheduled = scheduler.schedule()
    outputs = output(scheduled, token)
    scheduler.update_from_output(scheduled, outputs)


def child(engine: str, running: int, prefix: int, suffix: int, steps: int, cycles: int) -> dict:
    """Run ``cycles`` cycles on ``engine`` (the process py-spy samples)."""
    scheduler, runner_output, request_type, block_size = build_scheduler(
        engine, running, prefix + suffix, steps
    )
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.request import RequestStatus

    kv_cache_utils.init_none_hash(sha256_cbor)
    hasher = kv_cache_utils.get_request_block_hasher(block_size, sha256_cbor)
    params = SamplingParams(max_tokens=steps + 8, ignore_eos=True)
    params.update_from_generation_config({}, 50256)
    prompts = [prompt(prefix, suffix, i) for i in range(running)]

    def output(scheduled, token):
        return model_output(runner_output, scheduled, token)

    step_seconds = []
    for cycle in range(cycles + 1):
        if cycle == 1:
            # The first cycle warms up; the parent attaches py-spy now.
            step_seconds.clear()
            print("ready", flush=True)
        ids = [f"{cycle}-{i}" for i in range(running)]
        for rid, tokens in zip(ids, prompts, strict=True):
            scheduler.add_request(
                request_type(
                    request_id=rid,
                    prompt_token_ids=tokens,
                    sampling_params=params,
                    pooling_params=None,
                    block_hasher=hasher,
                )
            )
        admitted = scheduler.schedule()  # admission: not a decode step
        scheduler.update_from_output(admitted, output(admitted, 999))
        # As vLLM's EngineCore does once built: collections skip what exists.
        gc.collect()
        gc.freeze()
        for step in range(steps):
            t0 = time.perf_counter()
            _decode_step(scheduler, output, 1000 + step)
            step_seconds.append(time.perf_counter() - t0)
        scheduler.finish_requests(ids, RequestStatus.FINISHED_ABORTED)
    step_seconds.sort()
    return {
        "engine": engine,
        "served_by_kvcoord": type(scheduler.kv_cache_manager).__module__.startswith("kvcoord"),
        "decode_steps": len(step_seconds),
        "step_p50_ms": 1e3 * step_seconds[len(step_seconds) // 2],
    }


def _file_line(frame: str) -> tuple[str, str]:
    """The file (or native module) and line of a py-spy frame
    ``name (file:line)`` (line: empty for a native frame)."""
    inside = frame[frame.rfind("(") + 1 : -1] if frame.endswith(")") else ""
    path, _, line = inside.rpartition(":")
    return (path, line) if line.isdigit() else (inside, "")


def _file(frame: str) -> str:
    return _file_line(frame)[0]


def _is_engine(engine: str, frame: str) -> bool:
    """Whether ``frame`` is the engine's KV-cache code (its hasher included)."""
    path = _file(frame)
    if engine == "vllm":
        return path.endswith(VLLM_MANAGER)
    # kvcoord's Python modules and its extension (kvcoord/_core...so; other
    # packages' extensions are called _core too).
    return "/kvcoord/" in path


def _calls_engine(frame: str) -> bool:
    """Whether ``frame`` stands at a line that calls into the KV manager, its
    results or the hasher (without native frames, the time inside a native
    callee is the calling line's)."""
    path, line = _file_line(frame)
    return bool(line and CALL_SITE.search(linecache.getline(path, int(line))))


def classify(engine: str, raw: str, native: bool = True) -> Counter:
    """Step, KV-manager and hashing sample counts of py-spy's raw output
    (``native``: recorded with native frames; without them, a sample whose
    innermost frame stands at a call into the manager is the manager's)."""
    counts: Counter = Counter()
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = stack.split(";")
        # Function names as py-spy writes them (methods: Class.method).
        names = [f.split(" (", 1)[0].rsplit(".", 1)[-1] for f in frames]
        try:
            at = names.index(STEP_FRAME)
        except ValueError:
            continue
        inner = frames[at + 1 :]
        if not inner or names[at + 1] not in STEP_CALLS:
            continue
        counts["step"] += int(n)
        ours = next((i for i, f in enumerate(inner) if _is_engine(engine, f)), None)
        if ours is None and not native and _calls_engine(inner[-1]):
            ours = len(inner) - 1
        if ours is None:
            continue
        # Hashing: the engine's code as vLLM's Request calls it on an append
        # (its hasher, and on kvcoord whatever that calls natively).
        hashing = HASHER_CALL in names[at + 1 : at + 2 + ours]
        counts["hashing" if hashing else "kv"] += int(n)
    return counts


def sample(args: argparse.Namespace, engine: str, running: int) -> dict:
    """One sampled run of ``engine``: py-spy attaches once the child's first
    cycle (imports, warm-up) is done and samples until the child exits."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "python"), env.get("PYTHONPATH")]))
    cmd = [sys.executable, __file__, "--child", engine, "--running", str(running)]
    cmd += ["--prefix", str(args.prefix), "--suffix", str(args.suffix)]
    cmd += ["--steps", str(args.steps), "--cycles", str(args.cycles)]
    with tempfile.TemporaryDirectory() as tmp, open(Path(tmp) / "child.log", "w+") as log:
        raw_path = Path(tmp) / "stacks.txt"
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            proc.wait()
            log.seek(0)
            raise SystemExit(f"{engine} run failed:\n{log.read()[-3000:]}")
        spy = [args.py_spy, "record", "--full-filenames", "-r", str(args.rate)]
        spy += ["--native"] if args.native else []
        spy += ["-f", "raw", "-o", str(raw_path), "-p", str(proc.pid)]
        sampler = subprocess.run(spy, capture_output=True, text=True)
        out = proc.stdout.read()
        if proc.wait() or sampler.returncode:
            log.seek(0)
            raise SystemExit(f"{engine} run failed:\n{log.read()[-2000:]}{sampler.stderr[-1000:]}")
        res = json.loads(out.strip().splitlines()[-1])
        raw = raw_path.read_text()
        if args.raw_dir:
            args.raw_dir.mkdir(parents=True, exist_ok=True)
            (args.raw_dir / f"{engine}-{running}.txt").write_text(raw)
        counts = classify(engine, raw, args.native)
        errors = re.search(r"Errors: (\d+)", sampler.stdout + sampler.stderr)
        res["sampler_errors"] = int(errors.group(1)) if errors else None
    steps = counts["step"]
    if not steps:
        raise SystemExit(
            f"{engine}: no step samples (py-spy could not attach, or the run ended"
            " before it sampled a decode step: give it more --cycles)"
        )
    res.update(running=running, rate_hz=args.rate, step_samples=steps)
    for what in ("kv", "hashing"):
        share = counts[what] / steps
        res[f"{what}_samples"] = counts[what]
        res[f"{what}_share"] = share
        res[f"{what}_share_se"] = math.sqrt(share * (1 - share) / steps)
    both = (counts["kv"] + counts["hashing"]) / steps
    res["kv_hashing_share"] = both
    res["kv_hashing_share_se"] = math.sqrt(both * (1 - both) / steps)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--py-spy", default="py-spy", help="the py-spy binary")
    ap.add_argument("--running", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--prefix", type=int, default=1792)
    ap.add_argument("--suffix", type=int, default=64)
    ap.add_argument("--steps", type=int, default=96, help="decode steps per cycle")
    ap.add_argument("--cycles", type=int, default=120, help="admit/decode/abort cycles per run")
    ap.add_argument("--rate", type=int, default=250, help="samples per second")
    ap.add_argument(
        "--no-native",
        dest="native",
        action="store_false",
        help="sample Python frames only (a native callee's time is its calling line's)",
    )
    ap.add_argument("--json", type=Path)
    ap.add_argument("--raw-dir", type=Path, help="keep py-spy's raw stacks here")
    ap.add_argument("--child", choices=["vllm", "kvcoord"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        res = child(args.child, args.running[0], args.prefix, args.suffix, args.steps, args.cycles)
        print(json.dumps(res))
        return 0
    results = []
    for n in args.running:
        row = {}
        for engine in ("vllm", "kvcoord"):
            res = row[engine] = sample(args, engine, n)
            results.append(res)
            print(
                f"N={n:5d} {engine:8s} {res['decode_steps']} decode steps,"
                f" p50 {res['step_p50_ms']:.2f} ms under sampling"
                f" | {res['step_samples']} step samples:"
                f" KV manager {100 * res['kv_share']:.1f}% ± {100 * res['kv_share_se']:.1f},"
                f" hashing {100 * res['hashing_share']:.1f}% ± {100 * res['hashing_share_se']:.1f}"
                f" (py-spy errors: {res['sampler_errors']})",
                flush=True,
            )
        ratio = row["vllm"]["kv_hashing_share"] / max(row["kvcoord"]["kv_hashing_share"], 1e-9)
        print(
            f"N={n:5d} KV manager + hashing share {100 * row['vllm']['kv_hashing_share']:.1f}%"
            f" vs {100 * row['kvcoord']['kv_hashing_share']:.1f}% ({ratio:.1f}x smaller);"
            f" step p50 {row['vllm']['step_p50_ms']:.2f} vs {row['kvcoord']['step_p50_ms']:.2f} ms",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
