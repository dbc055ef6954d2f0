"""Instruction counts under valgrind's callgrind, shared by the
``instructions_*.py`` scripts (run them as ``python benches/<script>.py``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys


def require_valgrind() -> None:
    """Exit with a one-line message when valgrind is missing."""
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (Debian: apt-get install valgrind)")


def count(code: str, iterations: int, python_path: str | None = None) -> int:
    """Instructions executed by ``python -c code iterations`` under callgrind
    (``python_path``: another build's ``python/`` folder, put first on the path)."""
    # No spinning BLAS threads; one string-hash seed (0 unless the caller
    # sets one): the seed moves the interpreter's attribute-cache
    # collisions, about 5% of a decode step from seed to seed, so two builds
    # compare only under the same seed.
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    env.setdefault("PYTHONHASHSEED", "0")
    if python_path:
        env["PYTHONPATH"] = python_path
    out = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            "-c",
            code,
            str(iterations),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    match = re.search(r"refs:\s+([\d,]+)", out.stderr)
    if match is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{out.stderr}")
    return int(match.group(1).replace(",", ""))
