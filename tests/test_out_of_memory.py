"""Output buffers under a memory limit: the arrays and lists read out of a
big pool or request are sized by the caller, so an allocation that fails is
``OutOfMemoryError`` (a ``MemoryError``), never an abort, and the object is
unchanged and usable once memory is back.

Run in a subprocess: the address-space limit (``RLIMIT_AS``) is set just
above what the process uses after building a pool of 2^25 blocks and a
request of 2^23 one-token hash units, so each read-out (at least 32 MiB),
and the pool's residency state, fails while the rest of the process runs
on."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_SCRIPT = r"""
import resource
import numpy as np
import kvcoord
from kvcoord import _core

NUM_BLOCKS, NUM_TOKENS = 2**25, 2**23
pool = _core.BlockPool(NUM_BLOCKS)
tokens = np.arange(NUM_TOKENS, dtype=np.uint32)
req = _core.Request("r", tokens, hash_block_size=1, hash_algo="xxh3_native", hash_seed="s")
del tokens

def state():
    return (
        pool.num_free_blocks, pool.num_cached_blocks, pool.free_neighbours(1),
        pool.free_neighbours(NUM_BLOCKS - 1), req.num_tokens, req.num_block_hashes,
        req.block_hashes[0], req.block_hashes[-1], req.num_computed_tokens,
        pool.residency_enabled,
    )

def address_space():
    with open("/proc/self/status") as f:
        line = next(l for l in f if l.startswith("VmSize:"))
    return int(line.split()[1]) * 1024

reads = {
    "free_block_ids": pool.free_block_ids,
    "ref_counts": pool.ref_counts,
    "cached_mask": pool.cached_mask,
    "block_hashes_array": req.block_hashes_array,
    "block_hashes_bytes": req.block_hashes_bytes,
    "token_ids_array": req.token_ids_array,
    "all_token_ids": lambda: req.all_token_ids,
    "block_hashes list": lambda: req.block_hashes[:],
    "enable_residency": pool.enable_residency,  # pool-sized state, not a read
}
before = state()
resource.setrlimit(resource.RLIMIT_AS, (address_space() + 24 * 2**20, resource.RLIM_INFINITY))
for name, read in reads.items():
    try:
        read()
    except MemoryError as e:
        assert isinstance(e, kvcoord.OutOfMemoryError), (name, repr(e))
        print("MemoryError:", name, flush=True)
    else:
        raise SystemExit(f"{name}: no MemoryError under the limit")
    assert state() == before, name
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
assert state() == before
ids = pool.free_block_ids()
assert ids.shape == (NUM_BLOCKS - 1,) and ids[0] == 1 and ids[-1] == NUM_BLOCKS - 1
assert not pool.ref_counts().any() and not pool.cached_mask().any()
hashes = req.block_hashes_array()
assert hashes.shape == (NUM_TOKENS, 16) and bytes(hashes[-1]) == req.block_hashes[-1]
assert req.token_ids_array()[-1] == NUM_TOKENS - 1
assert pool.get_new_blocks(2) == [1, 2]
pool.enable_residency()
assert pool.residency_enabled
pool.check_invariants()
print("ok", flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_read_outs_of_big_objects_are_memory_errors_under_a_limit() -> None:
    pytest.importorskip("resource")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("MemoryError:") == 9, out.stdout
    assert out.stdout.endswith("ok\n"), out.stdout
