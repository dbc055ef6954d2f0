"""The running requests of the simulated scheduler, as arrays: one step's bookkeeping in the core.

A replay at a realistic load keeps hundreds of requests decoding for
thousands of steps. :class:`RunningBatch` holds the progress of the running
requests in arrays, in admission order, next to their :class:`Live`
objects, and does a step for all of them in two calls into the core
(``kvcoord_core::running_batch``): :func:`kvcoord._core.batch_plan` gives
each request its tokens (first come first served under the budget) and
lists the requests whose ``allocate_slots`` call can change the pool (see
:func:`kvcoord.replay.pool.steady_block_size`), which the scheduler makes
one by one, in admission order; :func:`kvcoord._core.batch_step` then
advances every request (its arrays and its ``Request``) and returns the
step-time model's sums. A layout with a chunk rule (Mamba "align" groups)
plans its tokens request by request here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvcoord._core import batch_plan, batch_step
from kvcoord.replay.workloads import WorkloadRequest

__all__ = ["Live", "RunningBatch", "StepPlan"]


class Live:
    """Scheduler-side state of one request while it is waiting (in the running
    batch, its progress lives in the batch's arrays)."""

    __slots__ = (
        "computed",
        "counted",
        "host_keys",
        "idx",
        "num_tokens",
        "out",
        "out_base",
        "out_len",
        "out_pos",
        "req",
        "wr",
    )

    def __init__(self, wr: WorkloadRequest, idx: int) -> None:
        self.wr = wr
        self.req: Any = None
        self.out: list[int] = []
        #: Where its output tokens start in the batch's token buffer.
        self.out_base = 0
        self.out_pos = 0
        self.out_len = wr.output_len
        self.num_tokens = wr.prompt_len
        self.computed = 0
        self.counted = False
        self.host_keys: Any = None
        self.idx = idx  # position in arrival order (per-request result arrays)

    def advance(self, computed: int) -> bool:
        """The step ran: ``computed`` tokens now have KV. A request whose known
        tokens are all computed samples its next output token. True when that
        was its last output token (the request is finished)."""
        self.computed = computed
        req = self.req
        req.num_computed_tokens = computed
        if computed < self.num_tokens:
            return False
        req.append_output_token_ids(self.out[self.out_pos])
        self.out_pos += 1
        self.num_tokens += 1
        return self.out_pos >= self.out_len


class StepPlan:
    """Tokens each running request is given this step, before allocation."""

    __slots__ = ("count", "events", "n")

    def __init__(self, n: np.ndarray, count: int, events: list[int]) -> None:
        #: Tokens per running request (admission order); requests from ``count`` on get none.
        self.n = n
        self.count = count
        #: Indices (ascending) whose ``allocate_slots`` call is needed.
        self.events = events


class RunningBatch:
    """The running requests in admission order, their progress in arrays.

    ``out_tokens`` holds every admitted request's output tokens, request
    after request (:meth:`store_output`; each request's slice starts at its
    :attr:`Live.out_base`), so a step's sampled tokens are one gather.
    """

    _ARRAYS = ("computed", "num_tokens", "out_pos", "out_len", "out_base", "step_tokens")

    def __init__(self, capacity: int) -> None:
        self.lives: list[Live] = []
        #: ``live.req`` of each of :attr:`lives` (the list a step hands to
        #: ``advance_requests``, kept rather than rebuilt every step).
        self.reqs: list[Any] = []
        self.out_tokens = np.zeros(1024, dtype=np.int64)
        self._out_used = 0
        #: Tokens after a request's first that the last :meth:`run_step` sampled.
        self.later_tokens = 0
        cap = max(1, capacity)
        self.computed = np.zeros(cap, dtype=np.int64)
        self.num_tokens = np.zeros(cap, dtype=np.int64)
        self.out_pos = np.zeros(cap, dtype=np.int64)
        self.out_len = np.zeros(cap, dtype=np.int64)
        self.out_base = np.zeros(cap, dtype=np.int64)
        #: The tokens :meth:`plan` gives each request (its buffer, reused every step).
        self.step_tokens = np.zeros(cap, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.lives)

    def __bool__(self) -> bool:
        return bool(self.lives)

    def store_output(self, tokens: list[int]) -> int:
        """Append a request's output tokens to ``out_tokens``; returns where they start."""
        base = self._out_used
        end = base + len(tokens)
        if end > self.out_tokens.shape[0]:
            size = self.out_tokens.shape[0]
            while size < end:
                size *= 2
            grown = np.zeros(size, dtype=np.int64)
            grown[:base] = self.out_tokens[:base]
            self.out_tokens = grown
        self.out_tokens[base:end] = tokens
        self._out_used = end
        return base

    def _grow(self) -> None:
        for name in self._ARRAYS:
            a = getattr(self, name)
            setattr(self, name, np.concatenate([a, np.zeros_like(a)]))

    def append(self, live: Live) -> None:
        """``live`` joins the batch (its progress moves into the arrays)."""
        k = len(self.lives)
        if k == self.computed.shape[0]:
            self._grow()
        self.lives.append(live)
        self.reqs.append(live.req)
        self.computed[k] = live.computed
        self.num_tokens[k] = live.num_tokens
        self.out_pos[k] = live.out_pos
        self.out_len[k] = live.out_len
        self.out_base[k] = live.out_base

    def pop(self) -> Live:
        """Remove the most recently admitted request; its progress goes back to it."""
        live = self.lives.pop()
        self.reqs.pop()
        k = len(self.lives)
        live.computed = int(self.computed[k])
        live.num_tokens = int(self.num_tokens[k])
        live.out_pos = int(self.out_pos[k])
        return live

    def plan(self, budget: int, steady_bs: int, split: Any, token_budget: int) -> StepPlan:
        """Tokens per request in admission order, FCFS under ``budget``.

        Without a chunk rule (``split``) every request gets ``min(tokens left,
        budget left)`` (vectorised); ``events`` are the requests whose
        allocation may change the pool: all of them unless ``steady_bs``
        (then only chunks of more than one token and single tokens at a
        block edge). With a chunk rule the tokens are clipped request by
        request, as the loop did, and every scheduled request is an event.
        """
        k = len(self.lives)
        if split is None:
            n = self.step_tokens[:k]
            count, events = batch_plan(
                self.computed[:k], self.num_tokens[:k], budget, steady_bs or 0, n
            )
            return StepPlan(n, count, events)
        c = self.computed[:k]
        rem = self.num_tokens[:k] - c
        n = np.zeros(k, dtype=np.int64)
        events = []
        count = 0
        for i, live in enumerate(self.lives):
            if budget <= 0:
                break
            count = i + 1
            ci = int(c[i])
            ni = min(int(rem[i]), budget)
            req = live.req
            ni = split(
                ni,
                start=ci,
                num_tokens=int(self.num_tokens[i]),
                num_prompt_tokens=req.num_prompt_tokens,
                shared_prefix_boundary=req.shared_prefix_boundary,
                max_chunk_tokens=token_budget,
            )
            if ni == 0:
                continue
            n[i] = ni
            budget -= ni
            events.append(i)
        return StepPlan(n, count, events)

    def run_step(
        self, n: np.ndarray, count: int, window: int
    ) -> tuple[int, int, int, int, int, int, list[Live], list[Live], list[int]]:
        """Apply the step to the first ``count`` requests (``n[i]`` tokens each; 0: not
        scheduled): progress advances, a request whose tokens are all computed
        samples its next output token (the ``Request`` objects are advanced in
        one call).

        Returns the step-cost sums (tokens, full pairs, window pairs, full KV,
        window KV, sequences), the requests that produced their first token,
        the finished ones (admission order) and the finished indices.
        """
        self.later_tokens = 0
        if count == 0:
            return 0, 0, 0, 0, 0, 0, [], [], []
        reqs = self.reqs
        sums, self.later_tokens, first, fin = batch_step(
            n, count, window, self.computed, self.num_tokens, self.out_pos, self.out_len,
            self.out_base, self.out_tokens, reqs,
        )  # fmt: skip
        lives = self.lives
        return (*sums, [lives[i] for i in first], [lives[i] for i in fin], fin)

    def remove(self, indices: list[int]) -> None:
        """Drop the requests at ``indices`` (finished), keeping the others' order."""
        if not indices:
            return
        k = len(self.lives)
        keep = np.ones(k, dtype=bool)
        keep[indices] = False
        idx = np.flatnonzero(keep)
        m = idx.shape[0]
        for name in self._ARRAYS:
            a = getattr(self, name)
            a[:m] = a[idx]
        kept = idx.tolist()
        self.lives = [self.lives[i] for i in kept]
        self.reqs = [self.reqs[i] for i in kept]
