"""Block ids and indices coming into a block table: conversion and checks.

Two kinds of input arrive here:

* **Ids a caller typed or computed** (lists, tuples, ranges, numpy integer
  arrays, CPU tensors): converted to a 1-D numpy integer array and checked
  (integers, one-dimensional, non-negative, fit int32) before anything is
  written.
* **A manager's results** (:class:`~kvcoord.blocks.KVCacheBlocks`): their ids
  were validated by the pool that handed them out (and the class's own
  constructors validate user-built ones), so they are taken as they are: the
  per-group int32 arrays are sliced out of ``flat`` with ``offsets``, with no
  per-block Python work and no second check.

Row indices, request counts and token positions are checked here too (they
are always the caller's).
"""

from __future__ import annotations

import array
import itertools
import operator
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import torch

from kvcoord.blocks import KVCacheBlocks
from kvcoord.errors import (
    BlockTableError,
    BlockTableIndexError,
    ConfigError,
    InvalidBlockIdError,
)

INT32_MAX = int(np.iinfo(np.int32).max)

IntArray = npt.NDArray[np.integer[Any]]

_T = TypeVar("_T", bound=np.generic)


def read_only(a: npt.NDArray[_T]) -> npt.NDArray[_T]:
    """A view of `a` that callers cannot write through."""
    v = a.view()
    v.flags.writeable = False
    return v


EMPTY_IDS: npt.NDArray[np.int64] = read_only(np.zeros(0, dtype=np.int64))


def positive_int(value: Any, name: str) -> int:
    """``value`` as an int > 0 (bools refused), else :class:`ConfigError`."""
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}") from None
    if v <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {v}")
    return v


#: Exclusive bound of a table's entries (rows times columns) and of a
#: slot-mapping buffer's length: far beyond any batch, small enough that a
#: table (host and device copies) never takes more than a few GiB.
MAX_TABLE_ENTRIES = 1 << 28


def check_table_size(entries: int, what: str) -> None:
    """:class:`ConfigError` unless ``entries < MAX_TABLE_ENTRIES``: a size
    that would exhaust memory is refused before anything is allocated."""
    if entries >= MAX_TABLE_ENTRIES:
        raise ConfigError(f"{what}: {entries} entries is beyond the supported maximum of 2^28 - 1")


def check_index(value: Any, bound: int, name: str) -> int:
    """An int in ``[0, bound)``; negative values do not wrap around."""
    if isinstance(value, bool):
        raise BlockTableError(f"{name} must be an integer, got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise BlockTableError(f"{name} must be an integer, got {value!r}") from None
    if not 0 <= v < bound:
        raise BlockTableIndexError(f"{name} {v} out of range [0, {bound})")
    return v


# ---------------------------------------------------------------------------
# user-supplied block ids (checked)
# ---------------------------------------------------------------------------


def _ints_from_iterable(items: Any) -> npt.NDArray[np.int64]:
    """Python ints (or numpy integer scalars) as an int64 array.

    ``array.array`` is both stricter than ``np.asarray`` (floats, strings,
    None and nested sequences raise instead of being inferred) and faster.
    """
    if isinstance(items, (list, tuple)) and bool in map(type, items):
        raise BlockTableError("block ids must be ints, not bools")
    try:
        buf = array.array("q", items)
    except TypeError as exc:
        raise BlockTableError(f"block ids must be a flat sequence of ints: {exc}") from None
    except OverflowError:
        raise InvalidBlockIdError("a block id does not fit the int32 block table") from None
    return np.frombuffer(buf, dtype=np.int64)


def as_block_ids(block_ids: Any) -> IntArray:
    """Block ids as a 1-D numpy integer array (no copy when already one).

    Accepts lists, tuples, ranges, numpy integer arrays (any width, signed or
    not) and CPU torch tensors, and checks them. Raises before anything is
    written.
    """
    if isinstance(block_ids, np.ndarray):
        arr = block_ids
    elif isinstance(block_ids, (list, tuple, range)):
        arr = _ints_from_iterable(block_ids)
    elif isinstance(block_ids, torch.Tensor):
        if block_ids.device.type != "cpu":
            raise BlockTableError(
                f"block ids must live in host memory, got a tensor on {block_ids.device}"
            )
        arr = block_ids.numpy()
    else:
        try:
            arr = np.asarray(block_ids)
        except (TypeError, ValueError) as exc:
            raise BlockTableError(f"block ids must be a flat sequence of ints: {exc}") from None
    if arr.ndim != 1:
        raise BlockTableError(f"block ids must be one-dimensional, got shape {arr.shape}")
    if arr.shape[0] == 0:
        return EMPTY_IDS
    if arr.dtype.kind not in "iu":
        raise BlockTableError(f"block ids must be integers, got dtype {arr.dtype}")
    # One reduction checks both bounds: the OR of all ids has a bit >= 31 set
    # (or is negative) iff some id is negative or does not fit int32.
    if int(np.bitwise_or.reduce(arr)) >> 31:
        lo = int(arr.min())
        if lo < 0:
            raise InvalidBlockIdError(f"block ids must be non-negative, got {lo}")
        raise InvalidBlockIdError(f"block id {int(arr.max())} does not fit the int32 block table")
    return arr


def flatten_block_ids(per_row: Any, n: int) -> tuple[IntArray, npt.NDArray[np.int64]]:
    """Concatenated ids and per-row lengths of ``n`` id sequences, checked."""
    try:
        lens = np.fromiter(map(len, per_row), dtype=np.int64, count=n)
    except TypeError:
        raise BlockTableError("each row's block ids must be a sequence of ints") from None
    if all(isinstance(x, np.ndarray) and x.ndim == 1 for x in per_row):
        # empty rows may have any dtype (np.array([]) is float), as for one row
        parts = [x for x in per_row if x.shape[0]]
        flat: Any = np.concatenate(parts) if parts else EMPTY_IDS
    else:
        if any(isinstance(r, (list, tuple)) and bool in map(type, r) for r in per_row):
            raise BlockTableError("block ids must be ints, not bools")
        flat = _ints_from_iterable(itertools.chain.from_iterable(per_row))
    ids = as_block_ids(flat)
    if ids.shape[0] != int(lens.sum()):
        raise BlockTableError("each row's block ids must be one-dimensional")
    return ids, lens


# ---------------------------------------------------------------------------
# manager results (trusted)
# ---------------------------------------------------------------------------


def check_blocks(blocks: Any, num_groups: int) -> KVCacheBlocks:
    """``blocks`` itself if it is a :class:`KVCacheBlocks` of ``num_groups``
    groups; a :class:`BlockTableError` otherwise. Its ids are not looked at."""
    if not isinstance(blocks, KVCacheBlocks):
        raise BlockTableError(
            f"expected a KVCacheBlocks (a manager result), got {type(blocks).__name__}"
        )
    if blocks.num_groups != num_groups:
        raise BlockTableError(
            f"got block ids for {blocks.num_groups} groups, the table has {num_groups}"
        )
    return blocks


_FLAT = operator.attrgetter("flat")
_OFFSETS = operator.attrgetter("offsets")
_NUM_GROUPS = operator.attrgetter("num_groups")
_IS_EMPTY = operator.methodcaller("is_empty")


def blocks_by_group(
    blocks_per_row: Any, num_groups: int
) -> list[tuple[npt.NDArray[np.int32], npt.NDArray[np.int64]]]:
    """For a batch of manager results (one :class:`KVCacheBlocks` per row),
    each group's ids of all rows concatenated in row order, with the per-row
    counts: ``[(ids, lens)] * num_groups``.

    Per step, not per block: a few C-level ``map`` passes over the rows (no
    Python frame per row), then a fixed number of numpy calls per group over
    the rows that got blocks; empty results (most rows of a decode step) are
    never asked for arrays. The ids are trusted (see the module docstring);
    the type and group count of every item are checked.
    """
    if isinstance(blocks_per_row, (str, bytes, KVCacheBlocks)) or not hasattr(
        blocks_per_row, "__len__"
    ):
        raise BlockTableError("blocks must be a sequence of KVCacheBlocks, one per row")
    items = list(blocks_per_row)
    n = len(items)
    if set(map(type, items)) - {KVCacheBlocks} or set(map(_NUM_GROUPS, items)) - {num_groups}:
        for b in items:  # a subclass is fine; anything else is named
            check_blocks(b, num_groups)
    nz = np.flatnonzero(~np.fromiter(map(_IS_EMPTY, items), dtype=np.bool_, count=n))
    if nz.shape[0] == 0:
        empty = np.zeros(0, dtype=np.int32), np.zeros(n, dtype=np.int64)
        return [empty] * num_groups
    chosen = [items[i] for i in nz.tolist()]
    flats = list(map(_FLAT, chosen))
    flat_nz: npt.NDArray[np.int32] = np.concatenate(flats)
    if num_groups == 1:  # lengths without building `offsets` arrays
        lens = np.zeros(n, dtype=np.int64)
        lens[nz] = np.fromiter(map(len, flats), dtype=np.int64, count=len(flats))
        return [(flat_nz, lens)]
    off_nz = np.concatenate(list(map(_OFFSETS, chosen))).reshape(len(chosen), num_groups + 1)
    base = np.cumsum(off_nz[:, -1]) - off_nz[:, -1]  # where each row's ids start in flat_nz
    out = []
    for g in range(num_groups):
        lens_nz = off_nz[:, g + 1] - off_nz[:, g]
        lens = np.zeros(n, dtype=np.int64)
        lens[nz] = lens_nz
        out.append((flat_nz[ragged_columns(base + off_nz[:, g], lens_nz)], lens))
    return out


def ragged_columns(starts: npt.NDArray[np.int64], lens: npt.NDArray[np.int64]) -> Any:
    """Concatenation of ``arange(s, s + l)`` for each (start, length) pair."""
    total = int(lens.sum())
    return np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lens) - lens - starts, lens)


# ---------------------------------------------------------------------------
# row indices and token positions
# ---------------------------------------------------------------------------


def _is_int_dtype(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def host_or_device_ints(
    x: Any, name: str, device: torch.device
) -> tuple[npt.NDArray[np.int64] | None, torch.Tensor | None]:
    """Split an index input into a host numpy int64 array (to be checked) or a
    tensor already on ``device`` (taken as is: checking its values would need a
    device synchronisation)."""
    if isinstance(x, torch.Tensor):
        if x.dim() != 1 or not _is_int_dtype(x.dtype):
            raise BlockTableError(
                f"{name} must be a 1-D integer tensor, got shape {tuple(x.shape)} "
                f"and dtype {x.dtype}"
            )
        if x.device.type == "cpu":  # host tensor: checked like a numpy array
            return x.numpy().astype(np.int64, copy=False), None
        if x.device != device:
            raise BlockTableError(f"{name} is on {x.device}, the table on {device}")
        return None, x.to(torch.int64)
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError) as exc:
        raise BlockTableError(f"{name} must be a flat sequence of ints: {exc}") from None
    if arr.ndim != 1:
        raise BlockTableError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.shape[0] and arr.dtype.kind not in "iu":
        raise BlockTableError(f"{name} must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False), None


def host_rows(rows: Any, n: int, max_num_reqs: int) -> npt.NDArray[np.int64]:
    """``n`` distinct row indices in ``[0, max_num_reqs)`` as a host int64 array."""
    if isinstance(rows, torch.Tensor) and rows.device.type != "cpu":
        raise BlockTableError(f"rows must be in host memory, got a tensor on {rows.device}")
    rows_np, _ = host_or_device_ints(rows, "rows", torch.device("cpu"))
    assert rows_np is not None
    if rows_np.shape[0] != n:
        raise BlockTableError(f"{rows_np.shape[0]} rows but block ids for {n} rows")
    if n == 0:
        return rows_np
    lo, hi = int(rows_np.min()), int(rows_np.max())
    if lo < 0 or hi >= max_num_reqs:
        bad = lo if lo < 0 else hi
        raise BlockTableIndexError(f"row {bad} out of range [0, {max_num_reqs})")
    seen = np.zeros(max_num_reqs, dtype=np.bool_)
    seen[rows_np] = True
    if int(np.count_nonzero(seen)) != n:
        raise BlockTableError("a row appears more than once in one batched write")
    return rows_np
