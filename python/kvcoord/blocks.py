"""`KVCacheBlocks`: block ids per KV cache group, as the manager returns them.

Owns the result type of the manager (see ``CONTRACT-blocks``): ids live in one
flat, read-only ``int32`` numpy array with ``int64`` group offsets, so that a
block-table builder consumes them without a Python object per block. Lists
are a convenience view (:meth:`KVCacheBlocks.get_block_ids`), never the
storage.

NOTE: ids from the manager were validated by the pool; the public
constructors (:meth:`from_lists`, :meth:`from_arrays`) validate what users
pass (integer dtype, 1-D, non-negative, 32-bit), so any ``KVCacheBlocks`` can
be trusted by consumers without re-validation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from kvcoord.errors import InvalidBlockIdError

__all__ = ["KVCacheBlocks"]

_I32_MAX = np.iinfo(np.int32).max


def _readonly(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    a.flags.writeable = False
    return a


class KVCacheBlocks:
    """Block ids per KV cache group (``arrays()[group][position]``; 0 is the
    null block). Immutable.

    Build one with :meth:`from_lists` or :meth:`from_arrays` (both validate);
    ``KVCacheBlocks(per_group)`` is :meth:`from_lists`.
    """

    __slots__ = ("_flat", "_offsets")

    _flat: npt.NDArray[np.int32]
    _offsets: npt.NDArray[np.int64]

    def __init__(self, per_group: Iterable[Iterable[int] | npt.NDArray[Any]]) -> None:
        flat, offsets = _concat_validated(per_group)
        object.__setattr__(self, "_flat", flat)
        object.__setattr__(self, "_offsets", offsets)

    # ---- constructors ------------------------------------------------------

    @classmethod
    def from_lists(cls, per_group_lists: Iterable[Iterable[int]]) -> KVCacheBlocks:
        """One sequence of int ids per group.

        Raises:
            InvalidBlockIdError: an id is negative or does not fit in 32 bits.
            TypeError: an id is not an int.
        """
        return cls(per_group_lists)

    @classmethod
    def from_arrays(cls, per_group_arrays: Iterable[npt.NDArray[Any]]) -> KVCacheBlocks:
        """One 1-D integer numpy array per group (copied).

        Raises:
            InvalidBlockIdError: an id is negative or does not fit in 32 bits.
            TypeError: an array is not 1-D or not of an integer dtype.
        """
        arrays = list(per_group_arrays)
        for a in arrays:
            if not isinstance(a, np.ndarray):
                raise TypeError(f"from_arrays expects numpy arrays, got {type(a).__name__}")
        return cls(arrays)

    @classmethod
    def _trusted(cls, flat: npt.NDArray[np.int32], offsets: npt.NDArray[np.int64]) -> KVCacheBlocks:
        """Wrap ids the pool already validated (no checks, no copy)."""
        self = object.__new__(cls)
        object.__setattr__(self, "_flat", _readonly(flat))
        object.__setattr__(self, "_offsets", _readonly(offsets))
        return self

    @classmethod
    def empty(cls, num_groups: int) -> KVCacheBlocks:
        """No block in any of ``num_groups`` groups."""
        return cls._trusted(np.zeros(0, np.int32), np.zeros(num_groups + 1, np.int64))

    # ---- views ---------------------------------------------------------------

    @property
    def num_groups(self) -> int:
        """Number of KV cache groups."""
        return len(self._offsets) - 1

    @property
    def flat(self) -> npt.NDArray[np.int32]:
        """All groups' ids concatenated, group 0 first (read-only ``int32``)."""
        return self._flat

    @property
    def offsets(self) -> npt.NDArray[np.int64]:
        """Group ``g``'s ids are ``flat[offsets[g]:offsets[g+1]]`` (``int64``)."""
        return self._offsets

    def arrays(self) -> tuple[npt.NDArray[np.int32], ...]:
        """One read-only ``int32`` array per group (views of :attr:`flat`)."""
        o = self._offsets.tolist()
        return tuple(self._flat[o[g] : o[g + 1]] for g in range(len(o) - 1))

    def get_block_ids(self) -> tuple[list[int], ...]:
        """Fresh lists of ids per group (vLLM's shape; not for hot paths)."""
        return tuple(a.tolist() for a in self.arrays())

    def is_empty(self) -> bool:
        """Whether no group holds any block."""
        return len(self._flat) == 0

    # ---- value semantics -----------------------------------------------------

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("KVCacheBlocks is immutable")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KVCacheBlocks):
            return NotImplemented
        return np.array_equal(self._offsets, other._offsets) and np.array_equal(
            self._flat, other._flat
        )

    __hash__ = None  # type: ignore[assignment]

    def __add__(self, other: KVCacheBlocks) -> KVCacheBlocks:
        """Per-group concatenation (``self``'s ids first in each group)."""
        if not isinstance(other, KVCacheBlocks):
            return NotImplemented
        if other.num_groups != self.num_groups:
            raise ValueError(
                f"cannot add KVCacheBlocks of {self.num_groups} and {other.num_groups} groups"
            )
        a, b = self.arrays(), other.arrays()
        parts = [x for pair in zip(a, b, strict=True) for x in pair]
        flat = np.concatenate(parts) if parts else np.zeros(0, np.int32)
        offsets = self._offsets + other._offsets
        return KVCacheBlocks._trusted(flat.astype(np.int32, copy=False), offsets)

    def __repr__(self) -> str:
        return f"KVCacheBlocks({self.get_block_ids()!r})"


def _concat_validated(
    per_group: Iterable[Iterable[int] | npt.NDArray[Any]],
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64]]:
    if isinstance(per_group, str | bytes | np.ndarray):
        raise TypeError("KVCacheBlocks expects one sequence of block ids per group")
    parts: list[npt.NDArray[np.int32]] = []
    for g, ids in enumerate(per_group):
        parts.append(_group_array(g, ids))
    offsets = np.zeros(len(parts) + 1, np.int64)
    np.cumsum([len(p) for p in parts], out=offsets[1:])
    flat = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    return _readonly(flat.astype(np.int32, copy=False)), _readonly(offsets)


def _group_array(g: int, ids: Iterable[int] | npt.NDArray[Any]) -> npt.NDArray[np.int32]:
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise TypeError(
                f"group {g}: block ids must be a 1-D integer array, got {ids.dtype}[{ids.ndim}-D]"
            )
        arr = ids
    else:
        if isinstance(ids, str | bytes):
            raise TypeError(f"group {g}: block ids must be ints, not {type(ids).__name__}")
        values = ids if isinstance(ids, Sequence) else list(ids)
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int | np.integer):
                raise TypeError(f"group {g}: block id {v!r} is not an int")
        try:
            arr = np.asarray(values, dtype=np.int64)
        except OverflowError:
            raise InvalidBlockIdError(f"group {g}: a block id does not fit in 32 bits") from None
        if arr.ndim != 1:
            arr = arr.reshape(-1)
    if len(arr):
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0:
            raise InvalidBlockIdError(f"group {g}: block id {lo} is negative")
        if hi > _I32_MAX:
            raise InvalidBlockIdError(f"group {g}: block id {hi} does not fit in 32 bits")
    return arr.astype(np.int32)
