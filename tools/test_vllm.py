#!/usr/bin/env python3
"""Run vLLM's own KV-cache and scheduler tests on vLLM and on kvcoord.

    python3 tools/test_vllm.py [--vllm 0.33.0] [--venv .venv-vllm] [--files ...]

``--vllm`` names the release (0.32.0 or 0.33.0, those kvcoord.vllm serves):
its tests run against the same release installed.

1. Creates (or reuses) a virtualenv with ``vllm==<release>`` and pytest
   (``VLLM_TARGET_DEVICE=cpu``; the wheel imports without a GPU). A venv
   that already has vLLM (``--venv /work/main/.venv-engine-0.33``) is used
   as it is: vLLM is not installed, only the test dependencies it lacks (with
   ``uv pip`` when the venv has no pip); its vLLM must be the ``--vllm``
   release.
2. Fetches ``vllm-<release>.tar.gz`` from the package index's simple API
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
import shutil
import ssl
import subprocess
import sys
import tarfile
import urllib.request
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

#: The releases whose tests this runs (kvcoord.vllm serves them); the default first.
RELEASES = ("0.33.0", "0.32.0")
#: Test dependencies of vLLM's tests and kvcoord's: (import name, package).
TEST_DEPS = (
    ("pytest", "pytest"),
    ("pluggy", "pluggy"),
    ("iniconfig", "iniconfig"),
    ("numpy", "numpy"),
    ("tblib", "tblib"),
    ("xxhash", "xxhash"),
    ("pytest_benchmark", "pytest-benchmark"),
    ("hypothesis", "hypothesis"),
    ("cbor2", "cbor2"),
)
DOWNLOAD_TIMEOUT = 600  # seconds, for the sdist
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


_ENV = dict(os.environ, VLLM_TARGET_DEVICE="cpu")


def installed_vllm(py: Path) -> str | None:
    """The vLLM version ``py`` imports, or None."""
    out = subprocess.run(
        [str(py), "-c", "import vllm; print(vllm.__version__)"],
        capture_output=True,
        text=True,
        env=_ENV,
    )
    lines = out.stdout.strip().splitlines()
    return lines[-1].strip() if out.returncode == 0 and lines else None


def _missing(py: Path, modules: list[str]) -> list[str]:
    code = (
        "import importlib.util, sys\n"
        "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))"
    )
    out = subprocess.run(
        [str(py), "-c", code, *modules], check=True, capture_output=True, text=True, env=_ENV
    )
    return out.stdout.split()


def _install(py: Path, packages: list[str]) -> None:
    """``pip install`` into ``py``'s venv; ``uv pip`` when it has no pip."""
    if not packages:
        return
    print(f"installing into {py.parent.parent}: {' '.join(packages)}", flush=True)
    if not _missing(py, ["pip"]):
        cmd = [str(py), "-m", "pip", "install", "-q", *packages]
    elif shutil.which("uv"):
        cmd = ["uv", "pip", "install", "-q", "--python", str(py), *packages]
    else:
        raise SystemExit(f"{py}: no pip and no uv to install {' '.join(packages)}")
    subprocess.run(cmd, check=True, env=_ENV)


def ensure_venv(venv: Path, python: str, release: str) -> Path:
    """``venv``'s python with vLLM ``release`` and the test dependencies. A
    venv that has vLLM keeps it (it must be ``release``): only missing test
    dependencies are installed."""
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
    have = installed_vllm(py)
    if have is None:
        _install(py, [f"vllm=={release}"])
        have = installed_vllm(py)
    if have is None or have.split("+")[0] != release:
        raise SystemExit(
            f"{venv}: vLLM {have} installed, not {release} (pass --vllm {have} or another --venv)"
        )
    names = dict(TEST_DEPS)
    _install(py, [names[m] for m in _missing(py, list(names))])
    return py


def _index_url(py: Path) -> str:
    """The simple API root: $PIP_INDEX_URL / $UV_INDEX_URL, else pip's
    default (from the venv's pip or this interpreter's), else PyPI's."""
    for var in ("PIP_INDEX_URL", "UV_INDEX_URL", "UV_DEFAULT_INDEX"):
        if os.environ.get(var):
            return os.environ[var].rstrip("/")
    code = "from pip._internal.models.index import PyPI; print(PyPI.simple_url)"
    for interpreter in (str(py), sys.executable):
        out = subprocess.run([interpreter, "-c", code], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().rstrip("/")
    return "https://pypi.org/simple"


def fetch_tests(py: Path, cache: Path, release: str, timeout: float = DOWNLOAD_TIMEOUT) -> Path:
    """The sdist's tests/ (and pyproject.toml for pytest's settings) under
    cache; the download gives up after ``timeout`` seconds without data."""
    sdist = f"vllm-{release}.tar.gz"
    root = cache / f"vllm-{release}"
    if (root / "tests" / "v1" / "core").is_dir():
        return root
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / sdist
    cafile = os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt"
    ctx = ssl.create_default_context(cafile=cafile if Path(cafile).exists() else None)
    if not archive.exists():
        req = urllib.request.Request(
            f"{_index_url(py)}/vllm/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
        )
        with urllib.request.urlopen(req, context=ctx, timeout=timeout) as resp:
            files = json.load(resp)["files"]
        entry = next((f for f in files if f["filename"] == sdist), None)
        if entry is None:
            raise SystemExit(f"{sdist}: not on the index")
        print(f"fetching {sdist} ({entry.get('size', '?')} bytes)", flush=True)
        with urllib.request.urlopen(entry["url"], context=ctx, timeout=timeout) as resp:
            data = resp.read()
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry["hashes"]["sha256"]:
            raise SystemExit(f"{sdist}: sha256 {digest} does not match the index")
        archive.write_bytes(data)
    prefix = f"vllm-{release}/"
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
    ap.add_argument(
        "--vllm", choices=RELEASES, default=RELEASES[0], help="the release whose tests run"
    )
    ap.add_argument(
        "--venv",
        type=Path,
        default=None,
        help="virtualenv to run in: created when missing; one that has vLLM is used as it is "
        "(default: .venv-vllm, .venv-vllm-<release> for other releases)",
    )
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
    ap.add_argument(
        "--download-timeout", type=float, default=DOWNLOAD_TIMEOUT, help="seconds, for the sdist"
    )
    args = ap.parse_args()
    if args.venv is None:
        suffix = "" if args.vllm == RELEASES[0] else f"-{args.vllm}"
        args.venv = ROOT / f".venv-vllm{suffix}"

    py = ensure_venv(args.venv.resolve(), args.python, args.vllm)
    root = fetch_tests(py, args.cache.resolve(), args.vllm, args.download_timeout)
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
    print(f"vLLM {args.vllm} ({args.venv}):")
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
        args.json.write_text(
            json.dumps(
                [{"release": args.vllm, "file": f, "vllm": v, "kvcoord": k} for f, v, k in rows]
            )
        )
    return own.returncode


if __name__ == "__main__":
    sys.exit(main())
