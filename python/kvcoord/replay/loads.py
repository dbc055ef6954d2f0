"""Synthetic loads for ``kvcoord replay``: random prompts of given lengths,
the way ``vllm bench serve``'s random dataset drives an engine.

:func:`random_load` makes ``num_requests`` requests whose prompt and output
lengths are drawn from :class:`LengthDist` distributions (one grammar,
:func:`parse_lengths`, for every length flag). Prompts are random tokens, so
two requests share nothing unless a shared prefix is asked for
(``prefix_len``, like vLLM's ``--random-prefix-len``: the same tokens before
every prompt, the drawn length after them). Each request samples exactly its
output length (vLLM's ``ignore_eos``). Arrivals are a Poisson process at
``request_rate`` per second (exponential gaps, the first request at 0) or,
with an infinite rate, all at 0; a closed loop is that load with
:attr:`kvcoord.replay.sim.SimConfig.max_concurrency` set, which the
scheduler applies as completions free slots.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from kvcoord._suggest import unknown_name
from kvcoord.errors import InvalidArgumentError
from kvcoord.replay.workloads import (
    MAX_REQUEST_TOKENS,
    Workload,
    WorkloadRequest,
    _derived_tokens,
)

__all__ = [
    "DEFAULT_INPUT_LEN",
    "DEFAULT_NUM_REQUESTS",
    "DEFAULT_OUTPUT_LEN",
    "LENGTH_GRAMMAR",
    "LengthDist",
    "parse_lengths",
    "random_load",
]

#: vLLM's random dataset defaults (``--random-input-len``,
#: ``--random-output-len``, ``--num-prompts``).
DEFAULT_INPUT_LEN = 1024
DEFAULT_OUTPUT_LEN = 128
DEFAULT_NUM_REQUESTS = 1000
#: How a length is written (the flags' help and every parse error quote it).
LENGTH_GRAMMAR = "a token count (1024), uniform:LO:HI (integers, both included) or normal:MEAN:STD"
_KINDS = ("uniform", "normal")


@dataclass(frozen=True)
class LengthDist:
    """A distribution of token counts: ``fixed`` (``a``), ``uniform`` integers in
    ``[a, b]``, or ``normal`` with mean ``a`` and standard deviation ``b``
    (rounded to integers and clipped to ``[minimum, MAX_REQUEST_TOKENS]``)."""

    kind: str
    a: float
    b: float = 0.0
    minimum: int = 1

    def __post_init__(self) -> None:
        lo, top = self.minimum, MAX_REQUEST_TOKENS
        a, b = self.a, self.b
        if self.kind not in ("fixed", *_KINDS):
            raise InvalidArgumentError(unknown_name("length distribution", self.kind, _KINDS))
        if not (math.isfinite(a) and math.isfinite(b)):
            raise InvalidArgumentError(f"{self.describe()}: lengths must be finite")
        if self.kind == "normal":
            if not lo <= a <= top:
                raise InvalidArgumentError(
                    f"{self.describe()}: the mean must be in [{lo}, {top:,}] tokens"
                )
            if b < 0:
                raise InvalidArgumentError(
                    f"{self.describe()}: the standard deviation must be >= 0"
                )
            return
        if a != int(a) or b != int(b):
            raise InvalidArgumentError(f"{self.describe()}: token counts are integers")
        hi = a if self.kind == "fixed" else b
        if not lo <= a <= top or not a <= hi <= top:
            what = "a length" if self.kind == "fixed" else "LO <= HI, both"
            raise InvalidArgumentError(
                f"{self.describe()}: expected {what} in [{lo}, {top:,}] tokens"
            )

    @property
    def high(self) -> int:
        """The largest count :meth:`sample` can return."""
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return int(self.b)
        return int(min(MAX_REQUEST_TOKENS, max(self.minimum, round(self.a + 40 * self.b))))

    @property
    def mean(self) -> float:
        """The nominal mean (before a normal's clipping)."""
        return self.a if self.kind != "uniform" else (self.a + self.b) / 2

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` counts (int64)."""
        if self.kind == "fixed":
            return np.full(n, int(self.a), dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(int(self.a), int(self.b) + 1, size=n, dtype=np.int64)
        x = np.rint(rng.normal(self.a, self.b, size=n))
        return np.clip(x, self.minimum, self.high).astype(np.int64)

    def describe(self) -> str:
        """The spec this distribution parses from (``1024``, ``uniform:512:1536``)."""
        if self.kind == "fixed":
            return _num(self.a)
        return f"{self.kind}:{_num(self.a)}:{_num(self.b)}"


def _num(x: float) -> str:
    return str(int(x)) if x == int(x) and abs(x) < 1e15 else f"{x:g}"


def parse_lengths(text: str, minimum: int = 1) -> LengthDist:
    """A :class:`LengthDist` from ``1024``, ``uniform:LO:HI`` or ``normal:MEAN:STD``
    (case-insensitive kind); :class:`~kvcoord.errors.InvalidArgumentError` (a
    ``ValueError``) naming what is wrong otherwise."""
    spec = text.strip()
    parts = [p.strip() for p in spec.split(":")]
    bad = InvalidArgumentError(f"expected {LENGTH_GRAMMAR}, got {spec!r}")
    if len(parts) == 1:
        return LengthDist("fixed", _int(parts[0], bad), minimum=minimum)
    kind = parts[0].lower()
    if kind not in _KINDS:
        if not kind or kind.lstrip("+-").isdigit():
            raise bad
        raise InvalidArgumentError(
            f"{unknown_name('length distribution', parts[0], _KINDS)} ({LENGTH_GRAMMAR})"
        )
    if len(parts) != 3:
        raise InvalidArgumentError(f"{kind} takes two numbers ({LENGTH_GRAMMAR}), got {spec!r}")
    if kind == "uniform":
        return LengthDist(kind, _int(parts[1], bad), _int(parts[2], bad), minimum=minimum)
    return LengthDist(kind, _float(parts[1], bad), _float(parts[2], bad), minimum=minimum)


def _int(text: str, bad: Exception) -> int:
    try:
        return int(text)
    except ValueError:  # also thousands of digits
        raise bad from None


def _float(text: str, bad: Exception) -> float:
    try:
        v = float(text)
    except ValueError:
        raise bad from None
    if not math.isfinite(v):
        raise bad
    return v


def _prompt(seed: int, prefix_len: int, index: int, length: int) -> np.ndarray:
    """Request ``index``'s prompt: the load's shared prefix, then its own tokens."""
    own = _derived_tokens(_stream(seed, index + 1), length)
    if not prefix_len:
        return own
    return np.concatenate([_derived_tokens(_stream(seed, 0), prefix_len), own])


def _stream(seed: int, k: int) -> int:
    """Token stream ``k`` of the load seeded ``seed`` (0: the shared prefix)."""
    return (seed * 0x100000001B3 + k * 0x9E3779B97F4A7C15 + 0x5A17) & 0xFFFFFFFFFFFFFFFF


def _dist(value: LengthDist | int | str | None, default: int, name: str) -> LengthDist:
    """A length argument: a distribution, a fixed count or a spec string."""
    if value is None:
        return LengthDist("fixed", default)
    if isinstance(value, LengthDist):
        if value.minimum < 1:
            raise InvalidArgumentError(f"{name}: lengths are at least 1 token")
        return value
    if isinstance(value, str):
        return parse_lengths(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(
            f"{name} must be a LengthDist, a token count or a spec string, got {value!r}"
        )
    return LengthDist("fixed", value)


def random_load(
    *,
    num_requests: int = DEFAULT_NUM_REQUESTS,
    input_len: LengthDist | int | str | None = None,
    output_len: LengthDist | int | str | None = None,
    prefix_len: int = 0,
    request_rate: float = math.inf,
    seed: int = 0,
) -> Workload:
    """``num_requests`` random prompts (see the module docstring). Same seed, same load.

    ``input_len`` is the drawn part after the ``prefix_len`` shared tokens
    (defaults: vLLM's 1024 in, 128 out); each length is a :class:`LengthDist`,
    a fixed count or a spec for :func:`parse_lengths`. A request longer than
    :data:`~kvcoord.replay.workloads.MAX_REQUEST_TOKENS` (prefix, prompt and
    output) is refused before anything is drawn.
    """
    inp = _dist(input_len, DEFAULT_INPUT_LEN, "input_len")
    out = _dist(output_len, DEFAULT_OUTPUT_LEN, "output_len")
    if isinstance(num_requests, bool) or not isinstance(num_requests, int) or num_requests < 1:
        raise InvalidArgumentError(f"num_requests must be a positive integer, got {num_requests!r}")
    if isinstance(prefix_len, bool) or not isinstance(prefix_len, int) or prefix_len < 0:
        raise InvalidArgumentError(f"prefix_len must be an integer >= 0, got {prefix_len!r}")
    if (
        isinstance(request_rate, bool)
        or not isinstance(request_rate, (int, float))
        or not request_rate > 0  # NaN too
    ):
        raise InvalidArgumentError(
            f"request_rate must be a number > 0 (inf: all at once), got {request_rate!r}"
        )
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 1 << 63:
        raise InvalidArgumentError(f"seed must be an integer in [0, 2**63), got {seed!r}")
    longest = prefix_len + inp.high + out.high
    if longest > MAX_REQUEST_TOKENS:
        raise InvalidArgumentError(
            f"a request may reach {longest:,} tokens (prefix {prefix_len:,} + input up to "
            f"{inp.high:,} + output up to {out.high:,}); at most {MAX_REQUEST_TOKENS:,} fit one "
            "request"
        )
    rng = np.random.default_rng(seed)
    n_in = inp.sample(rng, num_requests)
    n_out = out.sample(rng, num_requests)
    if math.isinf(request_rate):
        arrivals = np.zeros(num_requests)
    else:
        gaps = rng.exponential(1.0 / request_rate, size=num_requests)
        gaps[0] = 0.0
        arrivals = np.cumsum(gaps)
    if not math.isfinite(float(arrivals[-1])):
        raise InvalidArgumentError(
            f"request_rate {request_rate:g} spreads the load beyond any time"
        )
    reqs = [
        WorkloadRequest(
            request_id=f"rand-{i}",
            arrival_s=a,
            prompt_len=prefix_len + li,
            output_len=lo,
            make_prompt=functools.partial(_prompt, seed, prefix_len, i, li),
        )
        for i, (a, li, lo) in enumerate(
            zip(arrivals.tolist(), n_in.tolist(), n_out.tolist(), strict=True)
        )
    ]
    rate = "all at once" if math.isinf(request_rate) else f"Poisson {request_rate:g} req/s"
    prefix = f", shared prefix {prefix_len:,}" if prefix_len else ""
    name = (
        f"random({num_requests:,} requests, input {inp.describe()}{prefix}, "
        f"output {out.describe()}, {rate}, seed {seed})"
    )
    return Workload(name, reqs)
