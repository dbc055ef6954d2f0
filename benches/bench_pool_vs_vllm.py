"""The pool's get+free round trip beside vLLM 0.33.0's own ``BlockPool``.

    python benches/bench_pool_vs_vllm.py --vllm-python /path/to/venv/bin/python [--rounds 3]

Each round times, in turn, vLLM's ``BlockPool`` (in the interpreter given,
where ``vllm==0.33.0`` is importable: install it in its own virtualenv, never
beside kvcoord) and kvcoord's pool with numpy ids and with lists, all at
1,000,000 blocks in batches of 64. A figure is the fastest of several timeit
repeats, in ns per block; alternating the engines within a round keeps the
comparison fair on a machine whose speed drifts. This file imports kvcoord
only for the kvcoord cases, so the vLLM run needs nothing but vLLM.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import timeit
from collections.abc import Callable

NUM_BLOCKS = 1_000_000
BATCH = 64


def ns_per_block(step: Callable[[], None], number: int) -> float:
    """Fastest of 7 timeit repeats of `number` steps, per block."""
    return min(timeit.repeat(step, number=number, repeat=7)) / number * 1e9 / BATCH


def measure_vllm() -> dict[str, float]:
    from vllm.v1.core.block_pool import BlockPool  # type: ignore[import-not-found]

    pool = BlockPool(num_gpu_blocks=NUM_BLOCKS, enable_caching=True, hash_block_size=16)

    def step() -> None:
        pool.free_blocks(pool.get_new_blocks(BATCH))

    return {"vLLM 0.33.0 BlockPool": ns_per_block(step, 2_000)}


def measure_kvcoord() -> dict[str, float]:
    import kvcoord

    pool = kvcoord.BlockPool(NUM_BLOCKS)

    def step_numpy() -> None:
        pool.free_blocks(pool.get_new_blocks_array(BATCH))

    def step_lists() -> None:
        pool.free_blocks(pool.get_new_blocks(BATCH))

    return {
        "kvcoord, numpy ids": ns_per_block(step_numpy, 20_000),
        "kvcoord, lists": ns_per_block(step_lists, 20_000),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="kvcoord's pool get+free beside vLLM 0.33.0's BlockPool."
    )
    ap.add_argument("--vllm-python", help="interpreter with vllm==0.33.0 importable")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--engine", choices=["kvcoord", "vllm"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.engine:  # one measurement, as JSON (used internally)
        print(json.dumps(measure_vllm() if args.engine == "vllm" else measure_kvcoord()))
        return 0
    if not args.vllm_python:
        ap.error("--vllm-python is required (an interpreter where vllm==0.33.0 imports)")
    print(f"get+free of {BATCH} blocks, {NUM_BLOCKS:,}-block pools, ns per block (fastest repeat)")
    for r in range(1, args.rounds + 1):
        figures: dict[str, float] = {}
        for python, engine in ((args.vllm_python, "vllm"), (sys.executable, "kvcoord")):
            out = subprocess.run(
                [python, __file__, "--engine", engine],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            figures.update(json.loads(out.strip().splitlines()[-1]))
        base = figures["vLLM 0.33.0 BlockPool"]
        cells = [f"vLLM {base:6.1f}"]
        for name, ns in figures.items():
            if name.startswith("kvcoord"):
                cells.append(f"{name} {ns:5.1f} ({base / ns:4.1f}x)")
        print(f"  round {r}: " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
