"""pytest-benchmark suites (run with `make bench`; they are skipped as timing
in the normal test run, which passes --benchmark-disable).

After the hashing benchmarks, prints tokens/s and the ratios to the Python
baseline."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    try:
        from test_bench_hashing import RESULTS
    except ImportError:
        return
    if not RESULTS:
        return
    tr = terminalreporter
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
