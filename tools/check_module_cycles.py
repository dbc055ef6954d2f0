#!/usr/bin/env python3
"""Fail when a crate's module graph has a cycle.

    python3 tools/check_module_cycles.py [CRATE_SRC ...]

With no argument it checks both crates, ``rust/kvcoord-core/src`` and
``rust/kvcoord-py/src``. Standard library only.

The graph: one node per source file (``lib.rs``, ``foo.rs``, ``foo/mod.rs``,
``foo/bar.rs``; an inline ``mod name { ... }`` belongs to its file). The
``mod`` declarations build the module tree and say which file is which
module; they are ownership, not dependencies. An edge ``a -> b`` is a path in
``a`` that names an item of ``b``: every ``use`` tree and every path in the
code that starts with ``crate``, ``self``, ``super`` or the name of a child
module (``crate::pool::BlockPool``, ``super::cdiv``, ``full_attention::X``).
Comments and string literals are skipped, and so is test code (items
under ``#[cfg(test)]``, test modules inline or in files of their own):
tests may use any layer, as the crate's integration tests do. A name that the target module
itself imports (``pub use crate::x::Y`` in ``lib.rs``, a private ``use`` a
child reaches through ``super::Y``) is followed to the module that imported
it from, so a re-export does not make a cycle and does not hide one. Paths
into other crates (``kvcoord_core::...``, ``std::...``) are not edges.

A strongly connected component of more than one file is a cycle: each one is
printed as a closed walk through its files with the line of each step, and
the exit status is 1.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CRATES = ("rust/kvcoord-core/src", "rust/kvcoord-py/src")

Module = tuple[str, ...]  # path from the crate root, () is the crate root


RAW_STRING = re.compile(r'b?r(#*)"')
CHAR_LITERAL = re.compile(r"'(\\(u\{[0-9a-fA-F]*\}|x..|.)|[^\\'])'")


def strip_comments_and_strings(text: str) -> str:
    """Blank out comments, string and char literals, keeping every newline.

    Line numbers stay valid, and a path inside a doc comment or a message
    (``"see crate::x"``) is not taken for code.
    """
    out: list[str] = []
    i, n = 0, len(text)

    def blank(j: int, k: int) -> None:
        out.append("".join(c if c == "\n" else " " for c in text[j:k]))

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(i, j)
            i = j
        elif c in "br" and (raw := RAW_STRING.match(text, i)) and not _ident_before(text, i):
            end = '"' + raw.group(1)
            j = text.find(end, raw.end())
            j = n if j < 0 else j + len(end)
            blank(i, j)
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            blank(i, j + 1)
            i = j + 1
        elif c == "'":
            # A char literal ('x', '\n', '\u{1F600}') or a lifetime ('a).
            m = CHAR_LITERAL.match(text, i)
            if m:
                blank(i, m.end())
                i = m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _ident_before(text: str, i: int) -> bool:
    return i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")


TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|::|\S")


@dataclass
class Token:
    text: str
    line: int


def tokens(code: str) -> list[Token]:
    found: list[Token] = []
    line, last = 1, 0
    for m in TOKEN.finditer(code):
        line += code.count("\n", last, m.start())
        last = m.start()
        found.append(Token(m.group(), line))
    return found


@dataclass
class Ref:
    """A path written in ``scope`` (the module it is written in, inline mods included)."""

    scope: Module
    segments: list[str]
    line: int


@dataclass
class SourceFile:
    path: Path
    module: Module
    # Inline modules (`mod tests { ... }`) written in this file, as full paths.
    inline: set[Module] = field(default_factory=set)
    # `mod name;` declarations: child module -> line.
    children: dict[Module, int] = field(default_factory=dict)
    refs: list[Ref] = field(default_factory=list)
    # Names brought in by `use` in each scope of this file: name -> full path.
    imports: dict[Module, dict[str, list[str]]] = field(default_factory=dict)


def parse_use_tree(toks: list[Token], i: int, prefix: list[str]) -> tuple[list[list[str]], int]:
    """Parse a use tree from ``toks[i]``; return the leaf paths and the index after it.

    A leaf is the full path with its bound name last: ``a::b::{c, d as e, *}``
    gives ``[a,b,c]``, ``[a,b,d,=e]`` (the alias marked with ``=``) and
    ``[a,b,*]``; ``self`` inside braces names the prefix itself.
    """
    path = list(prefix)
    leaves: list[list[str]] = []
    while i < len(toks):
        t = toks[i].text
        if t == "::":
            i += 1
        elif t == "{":
            i += 1
            while toks[i].text != "}":
                sub, i = parse_use_tree(toks, i, path)
                leaves.extend(sub)
                if toks[i].text == ",":
                    i += 1
            return leaves, i + 1
        elif t == "*":
            leaves.append([*path, "*"])
            return leaves, i + 1
        elif t == "as":
            leaves.append([*path, "=" + toks[i + 1].text])
            return leaves, i + 2
        elif t in (",", "}", ";"):
            if path != prefix:
                leaves.append(path)
            elif path and t != ";":
                leaves.append([*path, "self"])
            return leaves, i
        elif re.fullmatch(r"[A-Za-z_]\w*", t):
            path.append(t)
            i += 1
        else:
            raise SyntaxError(f"unexpected {t!r} in a use tree on line {toks[i].line}")
    return leaves, i


def parse_file(path: Path, module: Module) -> SourceFile:
    src = SourceFile(path, module)
    toks = tokens(strip_comments_and_strings(path.read_text()))
    # Scope stack: (module path, brace depth at which it closes).
    scopes: list[tuple[Module, int]] = [(module, -1)]
    depth = 0
    i = 0
    while i < len(toks):
        t = toks[i].text
        scope = scopes[-1][0]
        prev = toks[i - 1].text if i else ""
        if t == "#" and i + 1 < len(toks) and toks[i + 1].text in ("[", "!"):
            end = matching(toks, i + (1 if toks[i + 1].text == "[" else 2))
            words = [tok.text for tok in toks[i:end]]
            i = end + 1
            if words[2:4] == ["cfg", "("] and "test" in words and "not" not in words:
                # Test code is left out of the graph: tests may use any layer.
                i = skip_item(toks, i)
        elif t == "{":
            depth += 1
            i += 1
        elif t == "}":
            depth -= 1
            if scopes[-1][1] == depth:
                scopes.pop()
            i += 1
        elif t == "mod" and prev != "::" and i + 2 < len(toks) and toks[i + 2].text in ";{":
            child = (*scope, toks[i + 1].text)
            if toks[i + 2].text == ";":
                src.children[child] = toks[i].line
                i += 3
            else:
                src.inline.add(child)
                scopes.append((child, depth))
                depth += 1
                i += 3
        elif t == "use" and prev != "::":
            leaves, i = parse_use_tree(toks, i + 1, [])
            line = toks[i - 1].line if i < len(toks) else 0
            names = src.imports.setdefault(scope, {})
            for leaf in leaves:
                target = [s for s in leaf if not s.startswith("=")]
                if target[-1] == "self":
                    target.pop()
                bound = leaf[-1][1:] if leaf[-1].startswith("=") else target[-1]
                if bound not in ("*", "_"):
                    names[bound] = target
                src.refs.append(Ref(scope, target, line))
        elif t == "in" and prev == "(" and i >= 2 and toks[i - 2].text == "pub":
            # `pub(in crate::a)` names where an item is visible, not a dependency.
            while toks[i].text != ")":
                i += 1
        elif re.fullmatch(r"[A-Za-z_]\w*", t) and prev != "::" and toks[i + 1 : i + 2]:
            if toks[i + 1].text != "::":
                i += 1
                continue
            segs, line = [t], toks[i].line
            i += 1
            while i + 1 < len(toks) and toks[i].text == "::":
                nxt = toks[i + 1].text
                if not re.fullmatch(r"[A-Za-z_]\w*", nxt):
                    break  # `x::<T>` or `x::{..}` in an expression
                segs.append(nxt)
                i += 2
            src.refs.append(Ref(scope, segs, line))
        else:
            i += 1
    return src


def matching(toks: list[Token], i: int) -> int:
    """The index of the bracket closing the one at ``toks[i]``."""
    pairs = {"[": "]", "(": ")", "{": "}"}
    stack = [pairs[toks[i].text]]
    i += 1
    while stack:
        t = toks[i].text
        if t in pairs:
            stack.append(pairs[t])
        elif t == stack[-1]:
            stack.pop()
        i += 1
    return i - 1


def skip_item(toks: list[Token], i: int) -> int:
    """The index after the item starting at ``toks[i]`` (its attributes, then
    up to its `;` or the end of its first braced block)."""
    while toks[i].text == "#":
        i = matching(toks, i + (1 if toks[i + 1].text == "[" else 2)) + 1
    while i < len(toks):
        t = toks[i].text
        if t == ";":
            return i + 1
        if t in "([":
            i = matching(toks, i) + 1
        elif t == "{":
            return matching(toks, i) + 1
        else:
            i += 1
    return i


def crate_files(src_dir: Path) -> dict[Module, SourceFile]:
    """Every file reachable from ``lib.rs`` through `mod name;`, by module path."""
    files: dict[Module, SourceFile] = {}
    todo: list[tuple[Path, Module]] = [(src_dir / "lib.rs", ())]
    while todo:
        path, module = todo.pop()
        parsed = parse_file(path, module)
        files[module] = parsed
        # `lib.rs` and `mod.rs` own the folder they sit in; `foo.rs` owns `foo/`.
        own_dir = path.parent if path.name in ("lib.rs", "mod.rs") else path.with_suffix("")
        for child in parsed.children:
            rel = child[len(module) :]
            base = own_dir.joinpath(*rel[:-1])
            flat, nested = base / f"{rel[-1]}.rs", base / rel[-1] / "mod.rs"
            found = [p for p in (flat, nested) if p.exists()]
            if len(found) != 1:
                raise FileNotFoundError(f"{path}: `mod {rel[-1]};` matches {found or 'no file'}")
            todo.append((found[0], child))
    return files


@dataclass
class Edge:
    source: Module
    target: Module
    line: int
    path: str


class Graph:
    def __init__(self, files: dict[Module, SourceFile]) -> None:
        self.files = files
        self.modules: dict[Module, Module] = {}  # every module -> the file module holding it
        self.imports: dict[Module, dict[str, list[str]]] = {}
        for module, f in files.items():
            self.modules[module] = module
            for inner in f.inline:
                self.modules[inner] = module
            for scope, names in f.imports.items():
                self.imports[scope] = names
        self.children: dict[Module, set[str]] = {m: set() for m in self.modules}
        for m in self.modules:
            if m:
                self.children[m[:-1]].add(m[-1])

    def start(self, scope: Module, first: str) -> Module | None:
        """The module a path's first segment names, seen from ``scope``.

        None when the segment names nothing of this crate.
        """
        if first == "crate":
            return ()
        if first == "self":
            return scope
        if first == "super":
            return scope[:-1]
        if first in self.children.get(scope, ()):
            return (*scope, first)
        return None

    def resolve(self, scope: Module, segs: list[str], seen: int = 0) -> Module | None:
        """The file that defines what ``segs`` names, or None if it is outside the crate."""
        module = self.start(scope, segs[0])
        if module is None:
            name = segs[0]
            imported = self.imports.get(scope, {}).get(name)
            if imported is None or seen > 16:
                return None
            # A name imported here: its path is written from this scope.
            return self.resolve(scope, imported + segs[1:], seen + 1)
        rest = segs[1:]
        while rest and rest[0] == "super":
            module, rest = module[:-1], rest[1:]
        while rest and (*module, rest[0]) in self.modules:
            module, rest = (*module, rest[0]), rest[1:]
        if rest and rest[0] != "*" and seen <= 16:
            imported = self.imports.get(module, {}).get(rest[0])
            if imported is not None:
                return self.resolve(module, imported + rest[1:], seen + 1)
        return self.modules.get(module)

    def edges(self) -> Iterator[Edge]:
        for module, f in self.files.items():
            for ref in f.refs:
                target = self.resolve(ref.scope, ref.segments)
                if target is not None and target != module:
                    yield Edge(module, target, ref.line, "::".join(ref.segments))


def strongly_connected(nodes: list[Module], adj: dict[Module, list[Module]]) -> list[list[Module]]:
    """Tarjan's algorithm, iterative; components in discovery order."""
    index: dict[Module, int] = {}
    low: dict[Module, int] = {}
    stack: list[Module] = []
    on_stack: set[Module] = set()
    out: list[list[Module]] = []
    for root in nodes:
        if root in index:
            continue
        work: list[tuple[Module, Iterator[Module]]] = [(root, iter(adj[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp: list[Module] = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        comp.append(top)
                        if top == node:
                            break
                    out.append(comp)
            elif nxt not in index:
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                on_stack.add(nxt)
                work.append((nxt, iter(adj[nxt])))
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
    return out


def closed_walk(comp: list[Module], first_edge: dict[tuple[Module, Module], Edge]) -> list[Edge]:
    """A walk from the component's first file back to it that visits every file of the component."""
    inside = set(comp)

    def path(a: Module, b: Module) -> list[Edge]:
        # Breadth-first inside the component: shortest a -> b (a == b allowed).
        prev: dict[Module, Edge] = {}
        frontier = [a]
        while frontier:
            nxt: list[Module] = []
            for u in frontier:
                for (s, t), e in first_edge.items():
                    if s == u and t in inside and t not in prev and t != a:
                        prev[t] = e
                        nxt.append(t)
                    elif s == u and t == a == b and b not in prev:
                        prev[b] = e
            if b in prev:
                break
            frontier = nxt
        walk: list[Edge] = []
        node = b
        while True:
            e = prev[node]
            walk.append(e)
            node = e.source
            if node == a:
                break
        return walk[::-1]

    start = min(comp)
    walk: list[Edge] = []
    at = start
    for target in sorted(comp):
        if target != start and all(e.target != target for e in walk):
            walk += path(at, target)
            at = target
    return walk + path(at, start)


def check(src_dir: Path) -> list[str]:
    """The report lines of every cycle in the crate at ``src_dir``; empty when there is none."""
    files = crate_files(src_dir)
    paths = {module: f.path for module, f in files.items()}
    return report_cycles(src_dir, paths, Graph(files).edges())


def report_cycles(root: Path, paths: dict[Module, Path], edges: Iterable[Edge]) -> list[str]:
    """The report lines of every cycle of the graph of ``paths`` (one file per
    module) and ``edges``, file names relative to ``root``; empty without one."""
    first_edge: dict[tuple[Module, Module], Edge] = {}
    for e in edges:
        first_edge.setdefault((e.source, e.target), e)
    nodes = sorted(paths)
    adj: dict[Module, list[Module]] = {m: [] for m in nodes}
    for s, t in first_edge:
        adj[s].append(t)
    report: list[str] = []
    for comp in strongly_connected(nodes, adj):
        if len(comp) < 2:
            continue
        names = sorted(_rel(root, paths[m]) for m in comp)
        report.append(f"cycle of {len(comp)} files in {root}: {', '.join(names)}")
        for e in closed_walk(comp, first_edge):
            report.append(
                f"  {_rel(root, paths[e.source])}:{e.line} -> "
                f"{_rel(root, paths[e.target])}  ({e.path})"
            )
    return report


def _rel(src_dir: Path, path: Path) -> str:
    return str(path.relative_to(src_dir))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("crates", nargs="*", help="crate source folders (holding lib.rs)")
    args = parser.parse_args(argv)
    crates = [Path(c) for c in args.crates] or [ROOT / c for c in DEFAULT_CRATES]
    failed = False
    for src_dir in crates:
        report = check(src_dir)
        if report:
            failed = True
            print("\n".join(report))
        else:
            count = len(crate_files(src_dir))
            print(f"no module cycle in {src_dir} ({count} files)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
