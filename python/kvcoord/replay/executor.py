"""Where a sweep's replays run: this process, local worker processes, or a
Ray cluster (``kvcoord sweep --executor``).

The interface is one call: :meth:`Executor.map` runs ``fn(shared, item)``
for every item and returns the results in the items' order, calling
``done(result)`` as each comes back (in order). With ``until``, it stops at
the first result (in order) for which ``until(result)`` is true: the results
up to that one are returned and the items after it are cancelled, those
already running stopped (``kvcoord plan`` replays candidates cheapest first
and stops at the first that meets its targets). ``shared`` (the workload,
large) goes to each worker once; each item (one sweep point, small) travels
alone. ``fn`` must be a module-level function so that it pickles.

* :class:`InlineExecutor`: in this process, one after another.
* :class:`LocalExecutor`: a pool of spawned processes
  (``concurrent.futures``); Ctrl-C stops every worker.
* :class:`RayExecutor`: Ray tasks (``pip install 'kvcoord[ray]'``), on the
  cluster at ``address`` (``ray.init(address=...)``: ``"auto"`` for the
  cluster this machine belongs to, ``ray://host:10001`` for a remote one,
  None for a fresh local instance, with ``--jobs`` CPUs). ``shared`` is put in Ray's object store
  once; each task resolves it. The workers need kvcoord installed (same
  version).
"""

from __future__ import annotations

import importlib
import multiprocessing
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, Protocol, TypeVar

from kvcoord._cli_base import _sigint_ignored

__all__ = [
    "EXECUTORS",
    "Executor",
    "ExecutorUnavailable",
    "InlineExecutor",
    "LocalExecutor",
    "RayExecutor",
    "make_executor",
]

S = TypeVar("S")
T = TypeVar("T")
R = TypeVar("R")

#: ``--executor`` names.
EXECUTORS: tuple[str, ...] = ("local", "ray")


class ExecutorUnavailable(RuntimeError):
    """The executor cannot start here (Ray not installed, no cluster at the address)."""


class Executor(Protocol):
    """Runs ``fn(shared, item)`` for each item; results in the items' order."""

    name: str

    def map(
        self,
        fn: Callable[[S, T], R],
        shared: S,
        items: Sequence[T],
        done: Callable[[R], None] | None = None,
        until: Callable[[R], bool] | None = None,
    ) -> list[R]: ...


class InlineExecutor:
    """In this process, one item after another."""

    name = "inline"

    def map(
        self,
        fn: Callable[[S, T], R],
        shared: S,
        items: Sequence[T],
        done: Callable[[R], None] | None = None,
        until: Callable[[R], bool] | None = None,
    ) -> list[R]:
        out = []
        for it in items:
            r = fn(shared, it)
            out.append(r)
            if done is not None:
                done(r)
            if until is not None and until(r):
                break
        return out


_SHARED: Any = None


def _init_worker(shared: Any) -> None:
    """A local worker: keeps ``shared`` for every task; Ctrl-C is the parent's."""
    global _SHARED
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _SHARED = shared


def _call(fn: Callable[[Any, T], R], item: T) -> R:
    return fn(_SHARED, item)


class LocalExecutor:
    """``jobs`` spawned worker processes on this machine (1: in this process)."""

    name = "local"

    def __init__(self, jobs: int) -> None:
        if jobs < 1:
            raise ValueError(f"jobs must be positive, got {jobs}")
        self.jobs = jobs

    def map(
        self,
        fn: Callable[[S, T], R],
        shared: S,
        items: Sequence[T],
        done: Callable[[R], None] | None = None,
        until: Callable[[R], bool] | None = None,
    ) -> list[R]:
        jobs = min(self.jobs, len(items))
        if jobs <= 1:
            return InlineExecutor().map(fn, shared, items, done, until)
        ctx = multiprocessing.get_context("spawn")
        # workers start with Ctrl-C ignored (inherited), so only this process reports it
        with _sigint_ignored():
            ex = ProcessPoolExecutor(
                max_workers=jobs, mp_context=ctx, initializer=_init_worker, initargs=(shared,)
            )
            futs: list[Future[R]] = [ex.submit(_call, fn, it) for it in items]
        out: list[R] = []
        try:
            for f in futs:
                r = f.result()
                out.append(r)
                if done is not None:
                    done(r)
                if until is not None and until(r):
                    break
        except BaseException:
            _stop(ex)
            raise
        if len(out) < len(futs):  # stopped early: the rest is not needed
            _stop(ex)
        else:
            ex.shutdown()
        return out


def _stop(ex: ProcessPoolExecutor) -> None:
    with _sigint_ignored():
        ex.shutdown(wait=False, cancel_futures=True)
        children = multiprocessing.active_children()
        for proc in children:
            proc.terminate()
        for proc in children:
            proc.join(5)


def _ray_call(fn: Callable[[Any, T], R], shared: Any, item: T) -> R:
    return fn(shared, item)


class RayExecutor:
    """Ray tasks on the cluster at ``address`` (None: start a local instance)."""

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None) -> None:
        try:
            # by name: Ray is an optional extra, absent where mypy runs in CI
            ray = importlib.import_module("ray")
        except ImportError:
            raise ExecutorUnavailable(
                "--executor ray needs Ray: pip install 'kvcoord[ray]'"
            ) from None
        self._ray = ray
        self.address = address
        self.num_cpus = num_cpus
        self._started = False

    def _init(self) -> None:
        ray = self._ray
        if ray.is_initialized():
            return
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if self.address is None and self.num_cpus is not None:
            kwargs["num_cpus"] = self.num_cpus
        try:
            ray.init(address=self.address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise ExecutorUnavailable(f"cannot join the Ray cluster at {self.address}: {e}") from e
        self._started = True

    def map(
        self,
        fn: Callable[[S, T], R],
        shared: S,
        items: Sequence[T],
        done: Callable[[R], None] | None = None,
        until: Callable[[R], bool] | None = None,
    ) -> list[R]:
        ray = self._ray
        self._init()
        try:
            task = ray.remote(_ray_call)
            ref = ray.put(shared)
            refs = [task.remote(fn, ref, it) for it in items]
            out: list[R] = []
            try:
                for r in refs:
                    try:
                        v = ray.get(r)
                    except ray.exceptions.RayTaskError as e:
                        raise e.as_instanceof_cause() from None
                    out.append(v)
                    if done is not None:
                        done(v)
                    if until is not None and until(v):
                        break
            except BaseException:
                for r in refs:
                    ray.cancel(r, force=True)
                raise
            for r in refs[len(out) :]:  # stopped early: the rest is not needed
                ray.cancel(r, force=True)
            return out
        finally:
            if self._started:
                ray.shutdown()
                self._started = False


def make_executor(name: str, *, jobs: int = 1, address: str | None = None) -> Executor:
    """The executor ``--executor NAME`` asks for.

    Raises:
        ValueError: unknown name.
        ExecutorUnavailable: ``ray`` without Ray installed.
    """
    if name == "local":
        if address is not None:
            raise ValueError("--address is for --executor ray")
        return LocalExecutor(jobs)
    if name == "ray":
        # a fresh local instance gets ``jobs`` CPUs; a cluster's own CPUs are its own
        return RayExecutor(address, num_cpus=jobs if address is None else None)
    raise ValueError(f"unknown executor {name!r}; expected one of {', '.join(EXECUTORS)}")
