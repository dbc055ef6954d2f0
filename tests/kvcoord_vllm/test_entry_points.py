"""kvcoord.vllm's entry points resolve, and an engine loads nothing of
``kvcoord.vllm.testing``: switching kvcoord on and building managers (served
and fallen back) imports ``serve/`` and ``hisparse/`` only; the test
stand-ins load when they are read."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

pytest.importorskip("vllm.v1.core.kv_cache_manager", reason="needs vLLM (kvcoord[vllm])")

import kvcoord

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def _env() -> dict[str, str]:
    """This process's environment, its kvcoord (whichever this test imported)
    and the test helpers first on the path, from any working directory."""
    env = dict(os.environ)
    ours = Path(kvcoord.__file__).resolve().parent.parent
    rest = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(ours), str(HERE), *rest])
    return env


LOADED = "print(sorted(m for m in sys.modules if m.startswith('kvcoord.')))"

ENGINE = f"""
import sys
import kvcoord.vllm as kv
from vllm_helpers import BS, config, full_spec, unserved_manager
kv.enable()
args = dict(max_model_len=64, scheduler_block_size=BS, hash_block_size=BS)
assert isinstance(kv.KVCacheManager(config(16, [full_spec()]), **args), kv.KVCacheManager)
fallen = unserved_manager()
assert type(fallen) is kv.original_manager_class()
{LOADED}
kv.BlockPool
{LOADED}
"""


def test_an_engine_loads_nothing_of_the_testing_package() -> None:
    run = subprocess.run(
        [sys.executable, "-c", ENGINE], env=_env(), capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    engine, after = (ast.literal_eval(line) for line in run.stdout.strip().splitlines()[-2:])
    assert "kvcoord.vllm.serve.manager" in engine and "kvcoord.vllm.hisparse._manager" in engine
    assert [m for m in engine if m.startswith("kvcoord.vllm.testing")] == []
    # Reading the BlockPool stand-in loads it (the check above can see it).
    assert "kvcoord.vllm.testing._pool" in after


def test_vllms_general_plugin_entry_point_resolves() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    target = project["project"]["entry-points"]["vllm.general_plugins"]["kvcoord"]
    module, _, name = target.partition(":")
    assert callable(getattr(importlib.import_module(module), name))


def test_the_pytest_plugin_loads_by_its_documented_name(tmp_path: Path) -> None:
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts="]
    plain = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True)
    assert "managers served by kvcoord" not in plain.stdout
    run = subprocess.run(
        [*cmd, "-p", "kvcoord.vllm.pytest_plugin"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "kvcoord.vllm: 1 passed on kvcoord alone" in run.stdout, run.stdout
