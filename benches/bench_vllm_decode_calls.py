"""Per-call cost of a decode step's KV-cache work, vLLM 0.33.0's manager vs kvcoord's.

    VLLM_TARGET_DEVICE=cpu .venv-vllm/bin/python benches/bench_vllm_decode_calls.py

The manager alone, driven as vLLM's scheduler drives it for running requests
(no scheduler around it): N requests with a long shared prefix are admitted,
then each decode step appends one sampled token to every request (vLLM's
``Request.append_output_token_ids``, which calls the request block hasher)
and calls ``allocate_slots(request, 1)``. Every call is timed on its own
(the clock's own cost subtracted) and the median is reported per kind of
step: *plain* (no block changes), *cache* (the step's token completes a
block, which gets cached) and *alloc* (the step needs a new block). Medians
of single calls hold up on a machine shared with other work, where the
scheduler benchmark's sums do not (bench_vllm_scheduler.py).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("plain", "cache", "alloc")


def run(engine: str, running: int, prefix: int, suffix: int, steps: int) -> dict:
    if engine == "kvcoord":
        import kvcoord.vllm

        kvcoord.vllm.enable()
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core import kv_cache_manager, kv_cache_utils
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request, RequestStatus

    bs = 16
    spec = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float32)
    num_blocks = running * ((prefix + suffix + steps) // bs + 2) + 16
    cfg = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )
    manager = kv_cache_manager.KVCacheManager(
        cfg,
        max_model_len=prefix + suffix + steps + 64,
        scheduler_block_size=bs,
        hash_block_size=bs,
        enable_caching=True,
    )
    kv_cache_utils.init_none_hash(sha256_cbor)
    hasher = kv_cache_utils.get_request_block_hasher(bs, sha256_cbor)
    params = SamplingParams(max_tokens=steps + 8, ignore_eos=True)
    shared = [(7 * i) % 50000 + 1 for i in range(prefix)]
    requests = [
        Request(
            request_id=str(i),
            prompt_token_ids=shared + [(i * 31 + j) % 50000 + 1 for j in range(suffix)],
            sampling_params=params,
            pooling_params=None,
            block_hasher=hasher,
        )
        for i in range(running)
    ]
    for r in requests:
        hit, num_hit, _ = manager.get_computed_blocks(r)
        assert manager.allocate_slots(r, r.num_tokens - num_hit, num_hit, hit) is not None
        r.num_computed_tokens = r.num_tokens
        r.status = RequestStatus.RUNNING
    gc.collect()
    gc.freeze()
    clock = time.perf_counter
    clock_cost = statistics.median(-(clock() - clock()) for _ in range(20000))
    append: dict[str, list[float]] = {k: [] for k in KINDS}
    allocate: dict[str, list[float]] = {k: [] for k in KINDS}
    for step in range(steps):
        tokens = requests[0].num_tokens + 1  # after this step's append
        kind = "cache" if tokens % bs == 0 else "alloc" if tokens % bs == 1 else "plain"
        for r in requests:
            t0 = clock()
            r.append_output_token_ids(1000 + step)
            append[kind].append(clock() - t0 - clock_cost)
        for r in requests:
            t0 = clock()
            assert manager.allocate_slots(r, 1, num_lookahead_tokens=0) is not None
            allocate[kind].append(clock() - t0 - clock_cost)
        for r in requests:
            r.num_computed_tokens += 1
    served = type(manager).__module__.startswith("kvcoord")
    out: dict = {"engine": engine, "served_by_kvcoord": served, "running": running}
    for k in KINDS:
        out[f"append_{k}_us"] = 1e6 * statistics.median(append[k])
        out[f"allocate_{k}_us"] = 1e6 * statistics.median(allocate[k])
    # A block of decode steps: bs - 2 plain steps, one cache step, one alloc step.
    for what in ("append", "allocate"):
        per = [out[f"{what}_{k}_us"] for k in KINDS]
        out[f"{what}_mean_us"] = ((bs - 2) * per[0] + per[1] + per[2]) / bs
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--running", type=int, default=256)
    ap.add_argument("--prefix", type=int, default=1792)
    ap.add_argument("--suffix", type=int, default=64)
    ap.add_argument("--steps", type=int, default=96)
    ap.add_argument("--engine", choices=["vllm", "kvcoord"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.engine:
        print(json.dumps(run(args.engine, args.running, args.prefix, args.suffix, args.steps)))
        return 0
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "python"), env.get("PYTHONPATH")]))
    for engine in ("vllm", "kvcoord"):
        cmd = [sys.executable, __file__, "--engine", engine, "--running", str(args.running)]
        cmd += ["--prefix", str(args.prefix), "--suffix", str(args.suffix)]
        cmd += ["--steps", str(args.steps)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode:
            print(proc.stderr[-3000:], file=sys.stderr)
            return proc.returncode
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        cells = " ".join(
            f"{k} {res[f'allocate_{k}_us']:6.2f}/{res[f'append_{k}_us']:5.2f}" for k in KINDS
        )
        print(
            f"{engine:8s} allocate_slots/append+hash medians, us: {cells} | per decode step "
            f"(mean over a block): allocate_slots {res['allocate_mean_us']:5.2f} us, "
            f"append+hash {res['append_mean_us']:5.2f} us",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
