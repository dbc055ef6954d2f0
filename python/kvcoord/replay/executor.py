"""Where a sweep's or a plan's replays run: this process, local worker
processes, or a Ray cluster (``kvcoord sweep --executor``, ``kvcoord plan``).

Each executor opens a :class:`Session` for one task function and one shared
value (the workload, large: it goes to each worker once): items are
submitted one at a time (each small, travelling alone) and the results come
back as they finish, with the key they were submitted under; closing the
session stops what is still running. :attr:`Session.slots` is how many run
at once. ``fn`` must be a module-level function so that it pickles.

:func:`map_items` is the one ordered map on top of a session: it runs
``fn(shared, item)`` for every item and returns the results in the items'
order, calling ``done(result)`` as each comes back (in order). With
``until``, it stops at the first result (in order) for which
``until(result)`` is true: the results up to that one are returned and the
items after it are not run, those already running stopped. ``kvcoord plan``
drives a session itself (:mod:`kvcoord.planner.search`: replays ahead of
the one it waits for, in cost order).

* :class:`InlineExecutor`: in this process, one item at a time, in the
  order submitted.
* :class:`LocalExecutor`: a pool of spawned processes
  (``concurrent.futures``), kept for the whole session; Ctrl-C stops every
  worker.
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
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, Generic, Protocol, TypeVar

from kvcoord._cli_base import _sigint_ignored

__all__ = [
    "EXECUTORS",
    "Executor",
    "ExecutorUnavailable",
    "InlineExecutor",
    "LocalExecutor",
    "RayExecutor",
    "Session",
    "make_executor",
    "map_items",
]

S = TypeVar("S")
T = TypeVar("T")
R = TypeVar("R")
T_contra = TypeVar("T_contra", contravariant=True)
R_co = TypeVar("R_co", covariant=True)

#: ``--executor`` names.
EXECUTORS: tuple[str, ...] = ("local", "ray")


class ExecutorUnavailable(RuntimeError):
    """The executor cannot start here (Ray not installed, no cluster at the address)."""


class Session(Protocol[T_contra, R_co]):
    """Submitted items run ``slots`` at a time; results come back as they finish."""

    slots: int

    def submit(self, key: int, item: T_contra) -> None:
        """Start (or queue) ``fn(shared, item)``; its result comes back with ``key``."""

    def wait(self) -> tuple[int, R_co]:
        """A finished item's key and result (blocks; re-raises the task's error)."""

    def close(self) -> None:
        """Stop whatever is still running or queued."""


class Executor(Protocol):
    """Opens sessions; ``map`` runs items in order (:func:`map_items`)."""

    name: str

    def session(self, fn: Callable[[S, T], R], shared: S) -> Session[T, R]: ...

    def map(
        self,
        fn: Callable[[S, T], R],
        shared: S,
        items: Sequence[T],
        done: Callable[[R], None] | None = None,
        until: Callable[[R], bool] | None = None,
    ) -> list[R]: ...


def map_items(
    session: Session[T, R],
    items: Sequence[T],
    done: Callable[[R], None] | None = None,
    until: Callable[[R], bool] | None = None,
) -> list[R]:
    """The results of ``items`` in order, at most ``session.slots`` running at
    once, up to the first ``until`` accepts (see the module docstring); the
    session is closed."""
    out: list[R] = []
    finished: dict[int, R] = {}
    submitted = running = 0
    try:
        while len(out) < len(items):
            while running < max(1, session.slots) and submitted < len(items):
                session.submit(submitted, items[submitted])
                submitted += 1
                running += 1
            key, r = session.wait()
            running -= 1
            finished[key] = r
            while len(out) in finished:
                r = finished.pop(len(out))
                out.append(r)
                if done is not None:
                    done(r)
                if until is not None and until(r):
                    return out
        return out
    finally:
        session.close()


class _MapMixin:
    """``map`` as :func:`map_items` over a fresh session."""

    def session(self, fn: Callable[[S, T], R], shared: S) -> Session[T, R]:
        raise NotImplementedError

    def map(
        self,
        fn: Callable[[S, T], R],
        shared: S,
        items: Sequence[T],
        done: Callable[[R], None] | None = None,
        until: Callable[[R], bool] | None = None,
    ) -> list[R]:
        if not items:
            return []
        return map_items(self.session(fn, shared), items, done, until)


class _InlineSession(Generic[S, T, R]):
    slots = 1

    def __init__(self, fn: Callable[[S, T], R], shared: S) -> None:
        self._fn, self._shared = fn, shared
        self._queue: deque[tuple[int, T]] = deque()

    def submit(self, key: int, item: T) -> None:
        self._queue.append((key, item))

    def wait(self) -> tuple[int, R]:
        key, item = self._queue.popleft()
        return key, self._fn(self._shared, item)

    def close(self) -> None:
        self._queue.clear()


class InlineExecutor(_MapMixin):
    """In this process, one item after another."""

    name = "inline"

    def session(self, fn: Callable[[S, T], R], shared: S) -> Session[T, R]:
        return _InlineSession(fn, shared)


_SHARED: Any = None


def _init_worker(shared: Any) -> None:
    """A local worker: keeps ``shared`` for every task; Ctrl-C is the parent's."""
    global _SHARED
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _SHARED = shared


def _call(fn: Callable[[Any, T], R], item: T) -> R:
    return fn(_SHARED, item)


class _LocalSession(Generic[S, T, R]):
    """One pool of ``slots`` spawned workers for the whole session."""

    def __init__(self, fn: Callable[[S, T], R], shared: S, jobs: int) -> None:
        self.slots = jobs
        self._fn = fn
        ctx = multiprocessing.get_context("spawn")
        # workers start with Ctrl-C ignored (inherited), so only this process reports it
        with _sigint_ignored():
            self._ex = ProcessPoolExecutor(
                max_workers=jobs, mp_context=ctx, initializer=_init_worker, initargs=(shared,)
            )
        self._futs: dict[Future[R], int] = {}

    def submit(self, key: int, item: T) -> None:
        with _sigint_ignored():
            self._futs[self._ex.submit(_call, self._fn, item)] = key

    def wait(self) -> tuple[int, R]:
        try:
            done, _ = wait(self._futs, return_when=FIRST_COMPLETED)
            fut = min(done, key=self._futs.__getitem__)
            key = self._futs.pop(fut)
            return key, fut.result()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._futs:  # stopped early: the rest is not needed
            self._futs.clear()
            _stop(self._ex)
        else:
            self._ex.shutdown()


class LocalExecutor(_MapMixin):
    """``jobs`` spawned worker processes on this machine (1: in this process)."""

    name = "local"

    def __init__(self, jobs: int) -> None:
        if jobs < 1:
            raise ValueError(f"jobs must be positive, got {jobs}")
        self.jobs = jobs

    def session(self, fn: Callable[[S, T], R], shared: S) -> Session[T, R]:
        if self.jobs <= 1:
            return _InlineSession(fn, shared)
        return _LocalSession(fn, shared, self.jobs)

    def map(
        self,
        fn: Callable[[S, T], R],
        shared: S,
        items: Sequence[T],
        done: Callable[[R], None] | None = None,
        until: Callable[[R], bool] | None = None,
    ) -> list[R]:
        if len(items) <= 1:  # one item: no worker worth starting
            return InlineExecutor().map(fn, shared, items, done, until)
        ex = LocalExecutor(min(self.jobs, len(items)))
        return map_items(ex.session(fn, shared), items, done, until)


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


class _RaySession(Generic[S, T, R]):
    def __init__(self, owner: RayExecutor, fn: Callable[[S, T], R], shared: S) -> None:
        self._owner = owner
        ray = self._ray = owner._ray
        owner._init()
        try:
            self.slots = max(1, int(ray.cluster_resources().get("CPU", 1)))
            self._task = ray.remote(_ray_call)
            self._fn = fn
            self._ref = ray.put(shared)
        except BaseException:
            owner._shutdown()
            raise
        self._refs: dict[Any, int] = {}

    def submit(self, key: int, item: T) -> None:
        self._refs[self._task.remote(self._fn, self._ref, item)] = key

    def wait(self) -> tuple[int, R]:
        ray = self._ray
        try:
            ready, _ = ray.wait(list(self._refs), num_returns=1)
            key = self._refs.pop(ready[0])
            try:
                return key, ray.get(ready[0])
            except ray.exceptions.RayTaskError as e:
                raise e.as_instanceof_cause() from None
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for r in self._refs:  # stopped early: the rest is not needed
            self._ray.cancel(r, force=True)
        self._refs.clear()
        self._owner._shutdown()


class RayExecutor(_MapMixin):
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

    def _shutdown(self) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False

    def session(self, fn: Callable[[S, T], R], shared: S) -> Session[T, R]:
        return _RaySession(self, fn, shared)


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
