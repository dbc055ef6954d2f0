#!/usr/bin/env python3
"""Run vLLM 0.33.0's own KV-cache and scheduler tests on vLLM and on kvcoord.

    python3 tools/test_vllm.py [--venv .venv-vllm] [--files ...]

1. Creates (or reuses) a virtualenv with ``vllm==0.33.0`` and pytest
   (``VLLM_TARGET_DEVICE=cpu``; the wheel imports without a GPU).
2. Fetches ``vllm-0.33.0.tar.gz`` from the package index's simple API
   (checking the index's sha256) and extracts its ``tests/`` only: the wheel
   ships no tests, and an extracted ``vllm/`` source tree would shadow the
   installed package.
3. Runs each test file twice, on plain vLLM and with
   ``-p kvcoord.vllm.pytest_plugin``, kvcoord taken from ``python/`` of this
   repository (build the extension first: ``make build-dev``), and prints a
   pass table. The scheduler tests need only facebook/opt-125m's
   ``config.json``: ``--hf-home`` points at an offline cache holding it
   (``HF_HUB_OFFLINE=1``).

4. Runs this repository's ``tests/kvcoord_vllm`` (kvcoord beside vLLM's own manager)
   in the same virtualenv.

Exit status: that of step 4 (vLLM's own test failures are reported in the
table, not fatal: the table is the result).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import ssl
import subprocess
import sys
import tarfile
import urllib.request
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

VLLM = "0.33.0"
SDIST = f"vllm-{VLLM}.tar.gz"
ROOT = Path(__file__).resolve().parent.parent
FILES = (
    "tests/v1/core/test_prefix_caching.py",
    "tests/v1/core/test_scheduler.py",
    "tests/v1/core/test_single_type_kv_cache_manager.py",
    "tests/v1/core/test_kv_cache_utils.py",
)


def default_hf_home() -> Path:
    """The project's offline HF cache: ``shared/vllm/hf`` next to the checkout.

    Searched upward, so a git worktree nested deeper than the main checkout
    (``/work/wt/<name>``) finds the same cache as ``/work/main`` does.
    """
    for parent in ROOT.parents:
        candidate = parent / "shared" / "vllm" / "hf"
        if candidate.is_dir():
            return candidate
    return ROOT.parent / "shared" / "vllm" / "hf"


def ensure_venv(venv: Path, python: str) -> Path:
    py = venv / "bin" / "python"
    stamp = venv / ".vllm-stamp"
    if not stamp.exists():
        if not py.exists():
            subprocess.run([python, "-m", "venv", str(venv)], check=True)
        env = dict(os.environ, VLLM_TARGET_DEVICE="cpu")
        subprocess.run(
            [
                str(py),
                "-m",
                "pip",
                "install",
                "-q",
                f"vllm=={VLLM}",
                "pytest",
                "numpy",
                "tblib",
                "xxhash",
                "pytest-benchmark",
                "hypothesis",
            ],
            check=True,
            env=env,
        )
        stamp.write_text(VLLM)
    return py


def _index_url(py: Path) -> str:
    out = subprocess.run(
        [str(py), "-c", "from pip._internal.models.index import PyPI; print(PyPI.simple_url)"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().rstrip("/")


def fetch_tests(py: Path, cache: Path) -> Path:
    """The sdist's tests/ (and pyproject.toml for pytest's settings) under cache."""
    root = cache / f"vllm-{VLLM}"
    if (root / "tests" / "v1" / "core").is_dir():
        return root
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / SDIST
    cafile = os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt"
    ctx = ssl.create_default_context(cafile=cafile if Path(cafile).exists() else None)
    if not archive.exists():
        req = urllib.request.Request(
            f"{_index_url(py)}/vllm/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
        )
        with urllib.request.urlopen(req, context=ctx) as resp:
            files = json.load(resp)["files"]
        entry = next(f for f in files if f["filename"] == SDIST)
        with urllib.request.urlopen(entry["url"], context=ctx) as resp:
            data = resp.read()
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry["hashes"]["sha256"]:
            raise SystemExit(f"{SDIST}: sha256 {digest} does not match the index")
        archive.write_bytes(data)
    prefix = f"vllm-{VLLM}/"
    with tarfile.open(archive) as tar:
        members = [
            m
            for m in tar.getmembers()
            if m.name.startswith(prefix + "tests/") or m.name == prefix + "pyproject.toml"
        ]
        tar.extractall(cache, members=members, filter="data")
    return root


def run_file(py: Path, root: Path, test_file: str, kvcoord: bool, env: dict[str, str]) -> dict:
    report = root / f".junit-{Path(test_file).stem}-{'kvcoord' if kvcoord else 'vllm'}.xml"
    cmd = [str(py), "-m", "pytest", test_file, "-q", "-p", "no:cacheprovider"]
    cmd += ["--junitxml", str(report), "-o", "junit_family=xunit1"]
    if kvcoord:
        cmd += ["-p", "kvcoord.vllm.pytest_plugin"]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    log = root / f".log-{Path(test_file).stem}-{'kvcoord' if kvcoord else 'vllm'}.txt"
    log.write_text(proc.stdout + proc.stderr)
    counts: dict = {"passed": 0, "failed": 0, "skipped": 0, "total": 0, "pure": 0}
    why: Counter[str] = Counter()  # tests passing on vLLM's machinery only, by reason
    if report.exists():
        for case in ET.parse(report).getroot().iter("testcase"):
            counts["total"] += 1
            if case.find("skipped") is not None:
                counts["skipped"] += 1
            elif case.find("failure") is not None or case.find("error") is not None:
                counts["failed"] += 1
            else:
                counts["passed"] += 1
                props = {p.get("name"): p.get("value") for p in case.iter("property")}
                counts["pure"] += props.get("kvcoord_pure") == "1"
                if kvcoord and props.get("kvcoord_pure") == "0":
                    why[props.get("kvcoord_fallbacks") or "the test builds vLLM's BlockPool"] += 1
    counts["why"] = dict(why.most_common())
    kv_lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("kvcoord.vllm:")]
    counts["note"] = kv_lines[-1] if kv_lines else ""
    counts["log"] = str(log)
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", type=Path, default=ROOT / ".venv-vllm")
    ap.add_argument("--python", default="python3.11", help="interpreter for a new venv")
    ap.add_argument("--cache", type=Path, default=ROOT / ".vllm-sdist")
    ap.add_argument(
        "--hf-home",
        type=Path,
        default=default_hf_home(),
        help="offline Hugging Face cache with facebook/opt-125m's config.json "
        "(default: the first shared/vllm/hf beside this checkout or above it)",
    )
    ap.add_argument("--files", nargs="*", default=list(FILES))
    ap.add_argument("--json", type=Path, help="also write the table as JSON")
    args = ap.parse_args()

    py = ensure_venv(args.venv.resolve(), args.python)
    root = fetch_tests(py, args.cache.resolve())
    env = dict(os.environ)
    env.update(
        VLLM_TARGET_DEVICE="cpu",
        HF_HOME=str(args.hf_home.resolve()),
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "python"), env.get("PYTHONPATH")])),
    )
    rows = []
    for test_file in args.files:
        on_vllm = run_file(py, root, test_file, False, env)
        on_kv = run_file(py, root, test_file, True, env)
        rows.append((test_file, on_vllm, on_kv))
        print(
            f"{test_file}: vLLM {on_vllm['passed']}/{on_vllm['total']}, "
            f"kvcoord {on_kv['pure']}/{on_kv['total']}  {on_kv['note']}",
            flush=True,
        )
        for reason, n in on_kv["why"].items():
            print(f"    {n:4d} passed only through vLLM's own: {reason}", flush=True)
    print()
    # "pass on kvcoord" counts only tests during which vLLM's own BlockPool
    # was never built and no manager fell back (see kvcoord.vllm.pytest_plugin).
    print("| vLLM test file | pass on vLLM | pass on kvcoord | + passes through vLLM's own pool |")
    print("|---|---|---|---|")
    for test_file, v, k in rows:
        print(
            f"| `{test_file}` | {v['passed']} / {v['total']} | {k['pure']} / {k['total']} "
            f"| {k['passed'] - k['pure']} |"
        )
    # kvcoord's own tests against vLLM's manager (skipped by `make test`).
    own = subprocess.run(
        [str(py), "-m", "pytest", "tests/kvcoord_vllm", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    print()
    print(
        "kvcoord's tests/kvcoord_vllm in the vLLM venv:",
        (own.stdout.strip().splitlines() or [""])[-1],
    )
    if args.json:
        args.json.write_text(json.dumps([{"file": f, "vllm": v, "kvcoord": k} for f, v, k in rows]))
    return own.returncode


if __name__ == "__main__":
    sys.exit(main())
