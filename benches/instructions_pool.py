"""Instructions per block of the pool's get+free round trip from Python,
counted by valgrind's callgrind: a figure that, unlike wall time on a shared
VM, repeats exactly for the same build.

    .venv/bin/python benches/instructions_pool.py [--iterations N]

Each case runs the loop twice under callgrind, N times and 0 times, and
divides the difference, so interpreter start-up and imports cancel out.
"""

from __future__ import annotations

import argparse

from callgrind import count, require_valgrind

BATCH = 64

# One case per way of handing ids across the boundary. `fr(f(B))` is the
# whole round trip: allocate B blocks, then free them.
CASES = {
    "numpy arrays": "pool.get_new_blocks_array",
    "lists": "pool.get_new_blocks",
}

LOOP = """
import sys, numpy, kvcoord
pool = kvcoord.BlockPool(1_000_000)
f, fr, B = {getter}, pool.free_blocks, {batch}
fr(f(B))  # first call: lazy imports and one-time setup
for _ in range(int(sys.argv[1])):
    fr(f(B))
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Instructions per block of the pool's get+free round trip (callgrind)."
    )
    parser.add_argument("--iterations", type=int, default=20_000)
    args = parser.parse_args()
    require_valgrind()
    print(f"get+free of {BATCH} blocks from Python, instructions per block (callgrind)")
    for name, getter in CASES.items():
        code = LOOP.format(getter=getter, batch=BATCH)
        total = count(code, args.iterations) - count(code, 0)
        per_pair = total / args.iterations
        print(f"  {name:14s} {per_pair / BATCH:7.1f} per block  ({per_pair:,.0f} per get+free)")


if __name__ == "__main__":
    main()
