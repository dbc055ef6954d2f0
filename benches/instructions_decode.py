"""Instructions per decode step (`allocate_slots` of one token, plus the
token append a scheduler does), counted by valgrind's callgrind, for the
layouts that existed before the later kinds: the per-step cost of the old
kinds must not grow when kinds are added.

    .venv/bin/python benches/instructions_decode.py [--iterations N] [--python-path DIR]

``--python-path`` points at another build's ``python/`` folder to compare
two builds (same cargo profile for both). Each case runs the loop twice,
N times and 0 times, and divides the difference, so interpreter start-up,
imports and the set-up cancel out.
"""

from __future__ import annotations

import argparse

from callgrind import count, require_valgrind

CASES = {
    "full": "(kvcoord.FullAttentionSpec(16),)",
    "full + sliding window": "(kvcoord.FullAttentionSpec(16), kvcoord.SlidingWindowSpec(16, 64))",
}

LOOP = """
import sys, kvcoord
groups = tuple(kvcoord.KVCacheGroup(s) for s in {specs})
m = kvcoord.KVCacheManager(kvcoord.KVCacheConfig(num_blocks=8192, groups=groups),
                           max_model_len=1 << 20)
reqs = [kvcoord.Request(f"r{{i}}", list(range(i * 1000, i * 1000 + 100)), hash_block_size=16)
        for i in range(32)]
for r in reqs:
    m.allocate_slots(r, 100)
    r.num_computed_tokens = 100
alloc = m.allocate_slots
for step in range(int(sys.argv[1])):
    for r in reqs:
        r.append_output_token_ids(step)
        alloc(r, 1)
        r.num_computed_tokens += 1
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--python-path", help="another build's python/ folder")
    args = parser.parse_args()
    require_valgrind()
    print("decode step (append one token + allocate_slots), instructions per step (callgrind)")
    for name, specs in CASES.items():
        code = LOOP.format(specs=specs)
        total = count(code, args.iterations, args.python_path) - count(code, 0, args.python_path)
        print(f"  {name:24s} {total / (args.iterations * 32):9,.0f}")


if __name__ == "__main__":
    main()
