"""Engine tests: real vLLM engines on kvcoord (``make test-engine``).

They run only in an engine virtualenv (``tools/engine_env.py``: vLLM with CPU
kernels and kvcoord installed from a wheel); elsewhere this folder is not
collected. Each engine runs in a process of its own (``engine_run.py``), so
the test process never imports vLLM.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]

from engine_run import run_engine  # noqa: E402  (tests/engine on sys.path)

EngineResult = dict[str, Any]


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The tiny seeded checkpoints, by layout name."""
    from tiny_hybrid import write_hybrid_checkpoint
    from tiny_models import TinyLlama, write_checkpoint

    root = tmp_path_factory.mktemp("checkpoints")
    paths = {
        layout: str(write_checkpoint(root / layout, TinyLlama(layout=layout)))
        for layout in ("llama", "llama-swa")
    }
    paths["hybrid"] = str(write_hybrid_checkpoint(root / "hybrid"))
    return paths


@pytest.fixture(scope="session")
def engine() -> Iterator[Callable[..., EngineResult]]:
    """``engine(settings, kvcoord=...)``: a run, memoised for the session
    (references are shared between tests)."""
    done: dict[tuple[str, bool], EngineResult] = {}

    def get(settings: Any, *, kvcoord: bool) -> EngineResult:
        key = (settings.to_json(), kvcoord)
        if key not in done:
            done[key] = run_engine(settings, kvcoord)
        return done[key]

    yield get
