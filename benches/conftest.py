"""pytest-benchmark suites (run with `make bench`; they are skipped as timing
in the normal test run, which passes --benchmark-disable).

After the runs, prints the pool's ns per block for get+free and the hashing
throughput in tokens/s, each with its ratio to the Python baseline."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    _pool_summary(terminalreporter)
    _hashing_summary(terminalreporter)


def _pool_summary(tr: Any) -> None:
    try:
        from test_bench_pool import BATCH, PER_BLOCK_NS
    except ImportError:
        return
    if not PER_BLOCK_NS:
        return
    tr.section(f"pool get+free in batches of {BATCH} (median ns per block; target < 15)")
    base = PER_BLOCK_NS.get("vLLM-style Python pool")
    for case, ns in PER_BLOCK_NS.items():
        ratio = ""
        if base and ns != base:
            ratio = f"  {base / ns:5.1f}x faster than the vLLM-style pool"
        tr.write_line(f"{case:24s} {ns:8.1f} ns/block{ratio}")


def _hashing_summary(tr: Any) -> None:
    try:
        from test_bench_hashing import RESULTS
    except ImportError:
        return
    if not RESULTS:
        return
    tr.section("hashing throughput (32k-token prompt, 16-token blocks; fastest round)")
    base_sha = RESULTS.get("python/sha256_cbor")
    for case, tps in sorted(RESULTS.items()):
        algo = case.split("/")[1]
        base_name = "sha256_cbor" if algo == "sha256_cbor" else "xxhash_cbor"
        base = RESULTS.get(f"python/{base_name}")
        ratio = f"{tps / base:7.1f}x vs python/{base_name}" if base else ""
        extra = ""
        if algo == "xxh3_native" and base_sha:
            extra = f"  ({tps / base_sha:.1f}x vs python/sha256_cbor)"
        tr.write_line(f"{case:28s} {tps / 1e6:9.1f} M tokens/s  {ratio}{extra}")
