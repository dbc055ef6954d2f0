"""Did-you-mean for a misspelt name: the one rule every name kvcoord knows uses
(model, GPU, layout, router and eviction-policy presets, dtypes, trace fields and
formats, command-line flags, file names)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path

__all__ = ["close_match", "did_you_mean", "missing_file", "unknown_name"]

#: How alike a known name must be (difflib's ratio) to be suggested.
_CUTOFF = 0.6


def close_match(word: str, known: Iterable[str]) -> str | None:
    """The known name ``word`` most likely misspells (case-insensitive), or None:
    the only name it is a prefix of, else the closest one by difflib's ratio."""
    names = list(dict.fromkeys(known))
    by_lower = {n.lower(): n for n in names}
    w = word.lower()
    if not w:
        return None
    starts = [n for n in by_lower if n.startswith(w) and n != w]
    if len(starts) == 1:
        return by_lower[starts[0]]
    found = difflib.get_close_matches(w, list(by_lower), n=1, cutoff=_CUTOFF)
    return by_lower[found[0]] if found else None


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest known name, or ``""``."""
    m = close_match(word, known)
    return f" (did you mean {m!r}?)" if m is not None else ""


def unknown_name(kind: str, word: str, known: Iterable[str]) -> str:
    """``unknown KIND 'word' (did you mean 'x'?): one of a, b, c`` -- the one wording
    of an unknown preset name."""
    names = list(known)
    return f"unknown {kind} {word!r}{did_you_mean(word, names)}: one of {', '.join(names)}"


def missing_file(path: str | Path, what: str = "file") -> str:
    """``no such file``, with the closest name in its directory when one is close."""
    p = Path(path)
    try:
        names = [q.name for q in p.parent.iterdir()] if p.name else []
    except OSError:  # the directory is missing or unreadable: nothing to suggest
        names = []
    return f"no such {what}{did_you_mean(p.name, names)}"
