"""tools/check_module_cycles.py: the crates' module graphs have no cycle, and
the check fails on one added on purpose."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "check_module_cycles.py"
CORE = ROOT / "rust" / "kvcoord-core" / "src"
BINDINGS = ROOT / "rust" / "kvcoord-py" / "src"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_module_cycles", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cycles() -> ModuleType:
    return load()


def test_the_real_crates_have_no_cycle() -> None:
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"no module cycle in {CORE}" in run.stdout
    assert f"no module cycle in {BINDINGS}" in run.stdout


@pytest.fixture
def core_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "src"
    shutil.copytree(CORE, dst)
    return dst


def add_line(path: Path, line: str) -> None:
    path.write_text(line + "\n" + path.read_text())


def test_an_upward_import_fails_and_names_the_cycle(cycles: ModuleType, core_copy: Path) -> None:
    # The coordinator uses the limits; the limits using the coordinator closes a circle.
    add_line(core_copy / "limits.rs", "use crate::coordinator::CoordinatorCore;")
    report = cycles.check(core_copy)
    assert report, "the cycle went unnoticed"
    assert report[0].startswith("cycle of ")
    assert "limits.rs" in report[0] and "coordinator/mod.rs" in report[0]
    assert any(line.strip().startswith("limits.rs:1 -> coordinator/mod.rs") for line in report), (
        report
    )
    # The command line fails on it.
    run = subprocess.run(
        [sys.executable, str(SCRIPT), str(core_copy)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 1
    assert "limits.rs" in run.stdout


def test_a_child_reaching_the_module_that_dispatches_to_it_fails(
    cycles: ModuleType, core_copy: Path
) -> None:
    # managers/mod.rs uses table.rs; table.rs using the dispatcher through
    # `super::` closes a circle (the kinds that use the table join it).
    table = core_copy / "managers" / "table.rs"
    lines = len(table.read_text().splitlines())
    table.write_text(table.read_text() + "fn probe() -> usize { super::Manager::probe() }\n")
    report = cycles.check(core_copy)
    assert report, "the cycle went unnoticed"
    assert "managers/mod.rs" in report[0] and "managers/table.rs" in report[0]
    step = f"managers/table.rs:{lines + 1} -> managers/mod.rs  (super::Manager::probe)"
    assert any(line.strip() == step for line in report), report


def test_test_code_comments_and_strings_are_not_edges(cycles: ModuleType, core_copy: Path) -> None:
    limits = core_copy / "limits.rs"
    limits.write_text(
        limits.read_text()
        + "\n#[cfg(test)]\nmod more_tests {\n    use crate::coordinator::CoordinatorCore;\n}\n"
        + "// crate::coordinator::CoordinatorCore in a comment\n"
        + 'const NOTE: &str = "crate::coordinator::CoordinatorCore";\n'
        + "#[cfg(test)]\nfn helper() { let _ = crate::pool::BlockPool::new; }\n"
    )
    assert cycles.check(core_copy) == []


def test_paths_resolve_through_use_trees_inline_modules_and_reexports(
    cycles: ModuleType, tmp_path: Path
) -> None:
    src = tmp_path / "mini"
    (src / "outer").mkdir(parents=True)
    (src / "lib.rs").write_text("mod a;\nmod b;\nmod outer;\npub use b::Thing;\n")
    (src / "a.rs").write_text("pub fn f() {}\n")
    (src / "b.rs").write_text("pub struct Thing;\n")
    (src / "outer" / "mod.rs").write_text("pub mod inner;\npub fn g() {}\n")
    (src / "outer" / "inner.rs").write_text(
        "mod nested {\n    pub fn h() { super::super::g(); }\n}\n"
    )
    assert cycles.check(src) == []
    graph = cycles.Graph(cycles.crate_files(src))
    edges = {(e.source, e.target) for e in graph.edges()}
    # `super::super` inside an inline module of inner.rs names outer/mod.rs.
    assert (("outer", "inner"), ("outer",)) in edges
    # A re-export in lib.rs leads to the file defining the item.
    (src / "a.rs").write_text("use crate::{Thing as T, outer::{self}};\npub fn f() {}\n")
    graph = cycles.Graph(cycles.crate_files(src))
    edges = {(e.source, e.target) for e in graph.edges()}
    assert (("a",), ("b",)) in edges and (("a",), ("outer",)) in edges
    assert (("a",), ()) not in edges
    # Closing a loop through a grouped use tree fails.
    (src / "b.rs").write_text("use crate::{a::{self, f}};\npub struct Thing;\n")
    report = cycles.check(src)
    assert report and "a.rs" in report[0] and "b.rs" in report[0], report


# ---- the Python package (tools/check_import_cycles.py) ----------------------

IMPORT_SCRIPT = ROOT / "tools" / "check_import_cycles.py"
PACKAGE = ROOT / "python" / "kvcoord"


@pytest.fixture(scope="module")
def imports() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_import_cycles", IMPORT_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_real_package_has_no_import_cycle() -> None:
    run = subprocess.run(
        [sys.executable, str(IMPORT_SCRIPT)], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"no import cycle in {PACKAGE}" in run.stdout


@pytest.fixture
def package_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "kvcoord"
    shutil.copytree(PACKAGE, dst, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    return dst


def test_an_upward_import_in_the_real_package_fails(
    imports: ModuleType, package_copy: Path
) -> None:
    # The manager uses the block results; the block results using the
    # manager (even from inside a function) closes a circle.
    blocks = package_copy / "vllm" / "serve" / "_blocks.py"
    blocks.write_text(
        blocks.read_text() + "\n\ndef _probe() -> object:\n"
        "    from kvcoord.vllm.serve.manager import KVCacheManager\n\n    return KVCacheManager\n"
    )
    report = imports.check(package_copy)
    assert report and report[0].startswith("cycle of "), report
    assert "vllm/serve/_blocks.py" in report[0] and "vllm/serve/manager.py" in report[0]
    run = subprocess.run(
        [sys.executable, str(IMPORT_SCRIPT), str(package_copy)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 1
    assert "vllm/serve/_blocks.py" in run.stdout


#: kvcoord.vllm's layers, lowest first: each imports only those before it
#: (the package's __init__ and its entry modules sit above all three).
VLLM_LAYERS = ("serve", "hisparse", "testing")


def layer_violations(imports: ModuleType, pkg_dir: Path) -> list[str]:
    """Each import of a kvcoord.vllm layer by a lower one."""
    rank = {("kvcoord", "vllm", name): i for i, name in enumerate(VLLM_LAYERS)}
    out = []
    for edge in imports.module_edges(imports.package_modules(pkg_dir)):
        source, target = rank.get(edge.source[:3]), rank.get(edge.target[:3])
        if source is not None and target is not None and target > source:
            out.append(f"{'.'.join(edge.source)}:{edge.line} -> {'.'.join(edge.target)}")
    return out


def test_serve_imports_neither_hisparse_nor_testing(
    imports: ModuleType, package_copy: Path
) -> None:
    assert layer_violations(imports, PACKAGE) == []
    # An import of the test stand-ins by the serving code is found.
    patch = package_copy / "vllm" / "serve" / "_patch.py"
    patch.write_text(
        patch.read_text()
        + "\n\ndef _probe() -> None:\n    from kvcoord.vllm.testing import _pool\n"
    )
    found = layer_violations(imports, package_copy)
    assert len(found) == 1 and found[0].startswith("kvcoord.vllm.serve._patch:"), found
    assert found[0].endswith("-> kvcoord.vllm.testing._pool"), found


def write_package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "pkg"
    for name, text in files.items():
        path = pkg / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return pkg


def test_an_import_cycle_fails_and_type_checking_imports_are_not_edges(
    imports: ModuleType, tmp_path: Path
) -> None:
    pkg = write_package(
        tmp_path,
        {
            "__init__.py": "from pkg._native import VERSION\n",
            "_native.pyi": "VERSION: int\n",
            "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n",
            "b.py": "from . import a\n",
            "sub/__init__.py": "",
            "sub/c.py": "from ..a import x\nfrom .d import y\n",
            "sub/d.py": "import pkg.b\n",
        },
    )
    assert imports.check(pkg) == []
    edges = {(e.source, e.target) for e in imports.module_edges(imports.package_modules(pkg))}
    assert (("pkg", "sub", "c"), ("pkg", "a")) in edges
    assert (("pkg", "sub", "c"), ("pkg", "sub", "d")) in edges
    assert (("pkg",), ("pkg", "_native")) in edges
    # An import deferred into a function closes the loop all the same.
    (pkg / "a.py").write_text("def late():\n    from pkg.sub import c\n")
    report = imports.check(pkg)
    assert report and report[0].startswith("cycle of 4 files"), report
    run = subprocess.run(
        [sys.executable, str(IMPORT_SCRIPT), str(pkg)], capture_output=True, text=True, check=False
    )
    assert run.returncode == 1 and "a.py:2 -> sub/c.py" in run.stdout, run.stdout
