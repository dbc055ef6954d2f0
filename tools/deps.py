#!/usr/bin/env python3
"""The requirements of named dependency sets, read from pyproject.toml (the one
place they are written), for the Makefile's virtualenv targets.

    python tools/deps.py build base plot          # one requirement a line
    python tools/deps.py --summary test torch     # "9 packages (pytest, ...)"

A set is ``build`` (``[build-system] requires``: maturin), ``base``
(``[project] dependencies``) or the name of an optional extra. A requirement
named by several sets is listed once.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def requirements(sets: list[str], pyproject: Path = PYPROJECT) -> list[str]:
    """The requirement strings of ``sets``, in order, each package once."""
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        sys.exit("tools/deps.py needs Python 3.11 or newer (tomllib)")
    doc = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    project = doc["project"]
    extras: dict[str, list[str]] = project.get("optional-dependencies", {})
    known = {"build": doc["build-system"]["requires"], "base": project["dependencies"], **extras}
    out: dict[str, str] = {}
    for name in sets:
        if name not in known:
            sys.exit(f"tools/deps.py: unknown set {name!r} (choose from {', '.join(known)})")
        for req in known[name]:
            out.setdefault(package(req), req)
    return list(out.values())


def package(req: str) -> str:
    """The package a requirement names (``maturin>=1.9,<2`` -> ``maturin``)."""
    m = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req.strip())
    if m is None:
        raise ValueError(f"not a requirement: {req!r}")
    return m.group(0).lower().replace("_", "-")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sets", nargs="+", help="build, base or an optional extra of pyproject.toml")
    p.add_argument("--summary", action="store_true", help="print a count and the names")
    args = p.parse_args()
    reqs = requirements(args.sets)
    if args.summary:
        names = ", ".join(package(r) for r in reqs)
        print(f"{len(reqs)} package{'s' * (len(reqs) != 1)} ({names})")
    else:
        print("\n".join(reqs))


if __name__ == "__main__":
    main()
