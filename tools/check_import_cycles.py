#!/usr/bin/env python3
"""Fail when a Python package's import graph has a cycle.

    python3 tools/check_import_cycles.py [PACKAGE_DIR ...]

With no argument it checks ``python/kvcoord``. Standard library only; the
graph and the report are those of ``check_module_cycles.py`` (the crates'
check).

The graph: one node per module file (a package is its ``__init__.py``; a
compiled extension, or its ``.pyi`` stub, is a leaf). An
edge ``a -> b`` is an import in ``a`` of ``b`` or of a name ``b`` defines,
wherever it is written (at the top, in a function: an import deferred to
break a cycle is still one). ``import p.q`` names ``p.q``; ``from p import
q`` names ``p.q`` when that is a module, else ``p``; relative imports are
resolved against the importing module. Imports under ``if TYPE_CHECKING:``
are left out (they never run), and so are imports of other packages.

A strongly connected component of more than one file is a cycle: each one
is printed as a closed walk through its files with the line of each step,
and the exit status is 1.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_module_cycles import ROOT, Edge, Module, report_cycles

DEFAULT_PACKAGES = ("python/kvcoord",)


def package_modules(pkg_dir: Path) -> dict[Module, Path]:
    """Every module file of the package at ``pkg_dir``, by dotted name as a tuple."""
    top = pkg_dir.name
    modules: dict[Module, Path] = {}
    for path in sorted(pkg_dir.rglob("*.py")):
        rel = path.relative_to(pkg_dir).with_suffix("").parts
        if any(part == "__pycache__" for part in rel):
            continue
        # Only folders that are packages hold modules of this package.
        if not all((pkg_dir.joinpath(*rel[:i]) / "__init__.py").exists() for i in range(len(rel))):
            continue
        name = (top, *rel[:-1]) if rel[-1] == "__init__" else (top, *rel)
        modules[name] = path
    # Compiled extensions (`_core.cpython-311-x86_64-linux-gnu.so`, or its
    # stub where it is not built) are modules too: leaves of the graph.
    for pattern in ("*.so", "*.pyd", "*.pyi"):
        for path in sorted(pkg_dir.rglob(pattern)):
            rel = path.relative_to(pkg_dir).parts
            name = (top, *rel[:-1], rel[-1].split(".")[0])
            modules.setdefault(name, path)
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of ``tree``, those under ``if TYPE_CHECKING:`` left out."""
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        todo.extend(ast.iter_child_nodes(node))


def module_edges(modules: dict[Module, Path]) -> Iterator[Edge]:
    """One edge per import of one of ``modules`` by another."""

    def known(name: Module) -> Module | None:
        # The longest prefix that is a module of the package.
        while name and name not in modules:
            name = name[:-1]
        return name or None

    for module, path in modules.items():
        if path.suffix != ".py":
            continue
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in _imports(tree):
            targets: list[tuple[Module, str]] = []
            if isinstance(node, ast.Import):
                targets = [(tuple(a.name.split(".")), a.name) for a in node.names]
            else:
                if node.level:
                    # `from .x import y` in a package's __init__ is relative to the package.
                    base = module if is_package else module[:-1]
                    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                else:
                    base = ()
                head = (*base, *(node.module.split(".") if node.module else ()))
                dots = "." * node.level + (node.module or "")
                for alias in node.names:
                    full = (*head, alias.name)
                    targets.append(
                        (full if full in modules else head, f"from {dots} import {alias.name}")
                    )
            for name, shown in targets:
                target = known(name)
                if target is not None and target != module:
                    yield Edge(module, target, node.lineno, shown)


def check(pkg_dir: Path) -> list[str]:
    """The report lines of every cycle in the package at ``pkg_dir``; empty without one."""
    modules = package_modules(pkg_dir)
    return report_cycles(pkg_dir, modules, module_edges(modules))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("packages", nargs="*", help="package folders (holding __init__.py)")
    args = parser.parse_args(argv)
    packages = [Path(p) for p in args.packages] or [ROOT / p for p in DEFAULT_PACKAGES]
    failed = False
    for pkg_dir in packages:
        report = check(pkg_dir)
        if report:
            failed = True
            print("\n".join(report))
        else:
            print(f"no import cycle in {pkg_dir} ({len(package_modules(pkg_dir))} files)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
