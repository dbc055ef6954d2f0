"""Prints tokens/s and ratios to the Python baseline after the hashing
benchmarks."""

from __future__ import annotations

from typing import Any


def pytest_terminal_summary(terminalreporter: Any) -> None:
    try:
        from test_bench_hashing import RESULTS
    except ImportError:
        return
    if not RESULTS:
        return
    tr = terminalreporter
    tr.section("hashing throughput (32k-token prompt, 16-token blocks)")
    base_sha = RESULTS.get("python/sha256_cbor")
    base_xxh = RESULTS.get("python/xxhash_cbor")
    for case, tps in sorted(RESULTS.items()):
        algo = case.split("/")[1]
        base = base_sha if algo == "sha256_cbor" else base_xxh
        ratio = f"{tps / base:7.1f}x vs python/{'sha256_cbor' if base is base_sha else 'xxhash_cbor'}"
        extra = ""
        if algo == "xxh3_native" and base_sha:
            extra = f"  ({tps / base_sha:.1f}x vs python/sha256_cbor)"
        tr.write_line(f"{case:28s} {tps / 1e6:9.1f} M tokens/s  {ratio if base else ''}{extra}")
