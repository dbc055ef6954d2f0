"""The ``kvcoord`` command's plumbing: argument types, the one-line failure
contract and output files (see :mod:`kvcoord.cli`)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, NoReturn

from kvcoord._suggest import did_you_mean

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_USAGE",
    "MAX_POOL_BLOCKS",
    "CliError",
    "UsageError",
]

#: Largest pool (blocks) the CLI builds: 16M blocks, beyond any real GPU's cache.
MAX_POOL_BLOCKS = 1 << 24
#: Exit statuses.
EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


class UsageError(Exception):
    """A flag combination or value the CLI rejects (exit status 2)."""


class CliError(Exception):
    """A failure already described in one line (exit status 1); picklable, so a
    ``sweep --jobs`` worker can hand it back."""


@contextmanager
def _usage_errors() -> Iterator[None]:
    """The set-up before a run: whatever bad value it meets (a ``ValueError``,
    the project's errors included) is a usage error (exit 2), not a failure."""
    try:
        yield
    except ValueError as e:
        raise UsageError(_describe(e)) from None


def _shown(text: str) -> str:
    r = repr(text)
    return r if len(r) <= 40 else f"{r[:37]}..."


def _bounded(maximum: int) -> Callable[[str], int]:
    """An argparse type: an integer in ``[1, maximum]``."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:  # also an integer string of thousands of digits
            raise argparse.ArgumentTypeError(
                f"expected a positive integer, got {_shown(text)}"
            ) from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
        if v > maximum:
            raise argparse.ArgumentTypeError(f"expected at most {maximum:,}, got {_shown(text)}")
        return v

    return parse


_pos_int = _bounded(1 << 62)
_pool_blocks = _bounded(MAX_POOL_BLOCKS)


def _nonneg_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {_shown(text)}") from None
    if not v >= 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text}")
    return v


def _int_list(text: str, parse: Callable[[str], int] = _pos_int) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if part:
            out.append(parse(part))
    if not out:
        raise argparse.ArgumentTypeError("expected a comma-separated list of positive integers")
    return sorted(set(out))


def _block_list(text: str) -> list[int]:
    return _int_list(text, _pool_blocks)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, an option is spelt out (no
    abbreviations: ``--kv-mem`` is no flag, so errors name what was typed), and a
    bad choice or option name gets a did-you-mean (the sub-commands' parsers are
    this class too)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        #: The sub-commands' parsers by name (on the top-level parser).
        self.commands: dict[str, _Parser] = {}

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {' '.join(message.split())}\n")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        choices = action.choices
        if choices is not None and value not in choices:
            names = [str(c) for c in choices]
            raise argparse.ArgumentError(
                action,
                f"invalid choice: {value!r}{did_you_mean(str(value), names)} "
                f"(choose from {', '.join(names)})",
            )

    def unrecognized(self, extra: list[str]) -> str:
        """The error for arguments no flag takes, with the flag a misspelt one means."""
        flags = [o for a in self._actions for o in a.option_strings]
        odd = next((x.split("=", 1)[0] for x in extra if x.startswith("-")), None)
        hint = did_you_mean(odd, flags) if odd is not None else ""
        return f"unrecognized arguments: {' '.join(extra)}{hint}"


# --------------------------------------------------------------------------- errors


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= 2000 else f"{line[:1997]}..."


def _describe(e: BaseException) -> str:
    """The one line a failure is reported as (the only place that words failures)."""
    from kvcoord.errors import KvCoordError
    from kvcoord.replay.scheduler import SimulationError

    if isinstance(e, (CliError, UsageError, KvCoordError, SimulationError)):
        text = str(e)
    elif isinstance(e, MemoryError):
        text = f"out of memory{': ' + str(e) if str(e) else ''}"
    elif isinstance(e, BrokenProcessPool):
        text = "a sweep worker process died (killed, or out of memory?)"
    elif isinstance(e, OSError) and e.strerror:
        text = f"{e.filename}: {e.strerror}" if e.filename else e.strerror
    else:
        text = f"unexpected {type(e).__name__}: {e} (KVCOORD_TRACEBACK=1 shows where)"
    return _one_line(text)


def _say(line: str) -> None:
    with suppress(OSError):  # stderr closed: nothing more to _say
        print(line, file=sys.stderr, flush=True)


@contextmanager
def _sigint_ignored() -> Iterator[None]:
    """Ctrl-C held off meanwhile (main thread only; elsewhere a no-op)."""
    try:
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


# --------------------------------------------------------------------------- outputs


def _check_output(path: str | None, flag: str, png: bool = False) -> None:
    """Refuse an output path that cannot be written, before the replay runs."""
    if path is None:
        return
    if png and not path.lower().endswith(".png"):
        raise UsageError(f"{flag} {path!r}: the plot is a PNG, the file name must end in .png")
    try:
        _check_writable(path, flag)
    except (OSError, ValueError) as e:  # a name too long, a NUL byte, a loop of links
        raise UsageError(f"{flag} {path!r}: {getattr(e, 'strerror', None) or e}") from None
    if png:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError(f"{flag} needs matplotlib: pip install 'kvcoord[plot]'") from None


def _check_writable(path: str, flag: str) -> None:
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {path!r} is a directory")
    if p.exists() and not p.is_file():  # a device or a pipe (/dev/stdout): written in place
        if not os.access(p, os.W_OK):
            raise UsageError(f"{flag} {path!r} is not writable")
    else:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            what = "is not a directory" if os.path.exists(parent) else "does not exist"
            raise UsageError(f"{flag} {path!r}: directory {parent!r} {what}")
        if p.exists() and not os.access(p, os.W_OK):
            raise UsageError(f"{flag} {path!r} is not writable")
        try:
            fd, probe = tempfile.mkstemp(dir=parent, prefix=".kvcoord-probe-")
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            raise UsageError(f"{flag} {path!r}: cannot write in {parent!r}: {e.strerror}") from None


def _check_outputs(args: argparse.Namespace) -> None:
    _check_output(args.json, "--json")
    _check_output(args.plot, "--plot", png=True)
    if args.json and args.plot and os.path.abspath(args.json) == os.path.abspath(args.plot):
        raise UsageError(f"--json and --plot name the same file {args.plot!r}")
    inputs = [(f, getattr(args, f[2:].replace("-", "_"), None)) for f in _INPUT_FLAGS]
    for out_flag, out in (("--json", args.json), ("--plot", args.plot)):
        for in_flag, path in inputs:
            if out and path and _same_file(out, path):
                raise UsageError(
                    f"{out_flag} {out!r} is the {in_flag} file: it would be overwritten"
                )


#: Flags naming files the command reads (an output may not overwrite one).
_INPUT_FLAGS = ("--trace", "--model-config", "--layout", "--prices")


def _same_file(a: str, b: str) -> bool:
    """Whether the regular file ``a`` is ``b`` (a device or a pipe is written in place)."""
    try:
        return os.path.isfile(a) and os.path.samefile(a, b)
    except (OSError, ValueError):  # either does not exist (or cannot be looked at)
        return False


def _new_file_mode(path: Path) -> int:
    if path.exists():
        return path.stat().st_mode & 0o7777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _write_output(path: str, write: Callable[[str], object]) -> None:
    """``write(name)`` into a temporary file beside ``path``, renamed over ``path`` once
    complete: an interrupted or failed write leaves no partial file."""
    try:
        _write_whole(path, write)
    except OSError as e:  # a full disk, a quota, an I/O error: the output is the file named
        if e.filename is None:
            e.filename = path
        raise


def _write_whole(path: str, write: Callable[[str], object]) -> None:
    p = Path(path)
    if p.exists() and not p.is_file():
        write(path)
        return
    fd, tmp = tempfile.mkstemp(
        dir=os.path.dirname(os.path.abspath(path)),
        prefix=f".{p.name[:64]}.",  # stays short however long the name
        suffix=f".tmp{p.suffix[:16]}",
    )
    try:
        os.close(fd)
        os.chmod(tmp, _new_file_mode(p))
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise


def _write_json(path: str, doc: dict[str, Any]) -> None:
    text = json.dumps(doc, indent=2, allow_nan=False) + "\n"  # never Infinity/NaN
    _write_output(path, lambda name: Path(name).write_text(text, encoding="utf-8"))
