"""Block tables and slot mappings: the tensors attention kernels read.

Attention kernels read a request's KV cache through a *block table* (one row
of block ids per batch row) and write the new tokens' KV through a *slot
mapping* (one physical slot per scheduled token). This module turns the block
ids a manager hands out into those two tensors.

* :class:`BlockTable` keeps one int32 table ``[max_num_reqs, width]`` on the
  host (a numpy view over a torch CPU tensor, pinned when the device is CUDA)
  and a mirror of it on the device. Row operations (:meth:`~BlockTable.add_row`,
  :meth:`~BlockTable.append_row`, :meth:`~BlockTable.clear_row`,
  :meth:`~BlockTable.move_row`, :meth:`~BlockTable.swap_row`) change the host
  side only, one vectorised copy per row (:meth:`~BlockTable.add_rows` and
  :meth:`~BlockTable.append_rows` write a whole batch with one scatter);
  :meth:`~BlockTable.commit` copies the used rows to the device with a
  non-blocking copy.
* :meth:`BlockTable.compute_slot_mapping` computes, for every scheduled token
  at position ``p`` of batch row ``r``, ``slot = table[r, p // B] * B + p % B``
  (int64, ``B`` the table's block size) from the committed device table,
  without a Python loop over tokens, and pads the rest of the
  ``[max_num_batched_tokens]`` buffer with :data:`PAD_SLOT_ID` (-1).
* :class:`MultiGroupBlockTable` holds one :class:`BlockTable` per KV cache
  group (block sizes may differ) and updates all of them from one manager
  result (block ids per group).

Rules kept by every table:

* Block id 0 is the null block; it is stored as given (sliding-window and
  Mamba rows keep their 0 entries).
* Entries past a row's block count are always 0.
* A call that raises (:class:`~kvcoord.errors.BlockTableError`, a
  ``ValueError``; :class:`~kvcoord.errors.BlockTableIndexError`, also an
  ``IndexError``; :class:`~kvcoord.errors.InvalidBlockIdError` for negative or
  over-large ids) checks everything before writing, so the table and the row
  counts are exactly as they were.
* Kernel block size: a table may be built with ``kernel_block_size`` dividing
  ``block_size``; each manager block ``b`` is then stored as the
  ``k = block_size // kernel_block_size`` kernel blocks ``b*k .. b*k+k-1``
  (null block 0 becomes kernel blocks ``0 .. k-1``, the null block's memory).
  Slots are the same either way.
* Row width is taken as given. vLLM rounds the width up so that
  ``width * block_size`` is a multiple of 128 tokens; :func:`round_row_width`
  computes that rounding for callers that want bit-equal table shapes.

Host/device hand-off: :meth:`BlockTable.commit` issues the copy and returns
at once (no stream or device synchronisation). On CUDA it records an event
after the copy; the next host-side row write waits for that event (only for
the copy, normally long finished) so that a write can never race an in-flight
copy out of pinned memory.

torch is needed by this module only (``pip install kvcoord[torch]``);
``import kvcoord`` works without it.
"""

from __future__ import annotations

import array
import itertools
import math
import operator
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "kvcoord.block_table needs PyTorch; install it with `pip install kvcoord[torch]`"
    ) from exc

from kvcoord.errors import (
    BlockTableError,
    BlockTableIndexError,
    ConfigError,
    InvalidBlockIdError,
)

__all__ = [
    "PAD_SLOT_ID",
    "BlockTable",
    "MultiGroupBlockTable",
    "round_row_width",
]

#: Slot written for padding tokens (and the tail of the slot-mapping buffer).
PAD_SLOT_ID = -1

_INT32_MAX = int(np.iinfo(np.int32).max)

_T = TypeVar("_T", bound=np.generic)


def _read_only(a: npt.NDArray[_T]) -> npt.NDArray[_T]:
    """A view of `a` that callers cannot write through."""
    v = a.view()
    v.flags.writeable = False
    return v


_EMPTY_IDS: npt.NDArray[np.int64] = _read_only(np.zeros(0, dtype=np.int64))

IntArray = npt.NDArray[np.integer[Any]]
_Index = npt.NDArray[np.int64] | torch.Tensor


# ---------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}") from None
    if v <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {v}")
    return v


def round_row_width(num_blocks: int, block_size: int, align_tokens: int = 128) -> int:
    """Round a row width (in blocks) up the way vLLM's v1 worker does.

    The width becomes the smallest multiple of ``align_tokens // gcd(align_tokens,
    block_size)`` that is at least ``num_blocks``, so that ``width * block_size``
    is a multiple of ``align_tokens``. Examples: (10, 16) -> 16; (3, 48) -> 8;
    (100, 256) -> 100. Groups without a slot mapping (Mamba) are not rounded by
    vLLM; simply do not call this for them.
    """
    num_blocks = _positive_int(num_blocks, "num_blocks")
    block_size = _positive_int(block_size, "block_size")
    align_tokens = _positive_int(align_tokens, "align_tokens")
    align = align_tokens // math.gcd(align_tokens, block_size)
    return -(-num_blocks // align) * align


def _ints_from_iterable(items: Any) -> npt.NDArray[np.int64]:
    """Python ints (or numpy integer scalars) as an int64 array.

    ``array.array`` is both stricter than ``np.asarray`` (floats, strings,
    None and nested sequences raise instead of being inferred) and faster.
    """
    try:
        buf = array.array("q", items)
    except TypeError as exc:
        raise BlockTableError(f"block ids must be a flat sequence of ints: {exc}") from None
    except OverflowError:
        raise InvalidBlockIdError("a block id does not fit the int32 block table") from None
    return np.frombuffer(buf, dtype=np.int64)


def _as_block_ids(block_ids: Any) -> IntArray:
    """Block ids as a 1-D numpy integer array (no copy when already one).

    Accepts lists, tuples, ranges, numpy integer arrays (any width, signed or
    not) and CPU torch tensors. Raises before anything is written.
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
        return _EMPTY_IDS
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


def _flatten_block_ids(per_row: Any, n: int) -> tuple[IntArray, npt.NDArray[np.int64]]:
    """Concatenated ids and per-row lengths of ``n`` id sequences, checked."""
    try:
        lens = np.fromiter(map(len, per_row), dtype=np.int64, count=n)
    except TypeError:
        raise BlockTableError("each row's block ids must be a sequence of ints") from None
    if all(isinstance(x, np.ndarray) and x.ndim == 1 for x in per_row):
        # empty rows may have any dtype (np.array([]) is float), as for one row
        parts = [x for x in per_row if x.shape[0]]
        flat: Any = np.concatenate(parts) if parts else _EMPTY_IDS
    else:
        flat = _ints_from_iterable(itertools.chain.from_iterable(per_row))
    ids = _as_block_ids(flat)
    if ids.shape[0] != int(lens.sum()):
        raise BlockTableError("each row's block ids must be one-dimensional")
    return ids, lens


def _ragged_columns(starts: npt.NDArray[np.int64], lens: npt.NDArray[np.int64]) -> Any:
    """Concatenation of ``arange(s, s + l)`` for each (start, length) pair."""
    total = int(lens.sum())
    return np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lens) - lens - starts, lens)


def _check_index(value: Any, bound: int, name: str) -> int:
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


def _is_int_dtype(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def _host_or_device_ints(
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


def _to_device(arr: npt.NDArray[np.int64], device: torch.device) -> torch.Tensor:
    arr = np.ascontiguousarray(arr)
    if not arr.flags.writeable:  # torch.from_numpy warns on read-only arrays
        arr = arr.copy()
    t = torch.from_numpy(arr)
    return t if device.type == "cpu" else t.to(device, non_blocking=True)


def _prepare_slot_inputs(
    positions: Any,
    rows: Any,
    query_start_loc: Any,
    *,
    device: torch.device,
    max_num_reqs: int,
    max_num_batched_tokens: int,
    max_position: int,
    numpy_path: bool,
) -> tuple[_Index, _Index]:
    """Checked (positions, rows), one int64 entry per token: numpy arrays for a
    CPU device (numpy beats torch's CPU kernels at this size), tensors on
    ``device`` otherwise.

    Host inputs are checked fully (range of rows and positions, shape of
    ``query_start_loc``); device tensors get shape/dtype checks only.
    """
    on_cpu = numpy_path
    if (rows is None) == (query_start_loc is None):
        raise BlockTableError("pass exactly one of rows= or query_start_loc=")
    pos_np, pos_t = _host_or_device_ints(positions, "positions", device)
    num_tokens = pos_np.shape[0] if pos_np is not None else pos_t.shape[0]  # type: ignore[union-attr]
    if num_tokens > max_num_batched_tokens:
        raise BlockTableIndexError(
            f"{num_tokens} tokens exceed max_num_batched_tokens={max_num_batched_tokens}"
        )
    if pos_np is not None and num_tokens:
        lo, hi = int(pos_np.min()), int(pos_np.max())
        if lo < 0 or hi >= max_position:
            bad = lo if lo < 0 else hi
            raise BlockTableIndexError(
                f"position {bad} out of range [0, {max_position}) covered by the table rows"
            )

    if rows is not None:
        rows_np, rows_t = _host_or_device_ints(rows, "rows", device)
        n = rows_np.shape[0] if rows_np is not None else rows_t.shape[0]  # type: ignore[union-attr]
        if n != num_tokens:
            raise BlockTableError(f"rows has {n} entries, positions {num_tokens}")
        if rows_np is not None and n:
            lo, hi = int(rows_np.min()), int(rows_np.max())
            if lo < 0 or hi >= max_num_reqs:
                bad = lo if lo < 0 else hi
                raise BlockTableIndexError(f"row {bad} out of range [0, {max_num_reqs})")
        rows_out: _Index | None = rows_t
        if rows_np is not None:
            rows_out = rows_np if on_cpu else _to_device(rows_np, device)
    else:
        qsl_np, qsl_t = _host_or_device_ints(query_start_loc, "query_start_loc", device)
        n = qsl_np.shape[0] if qsl_np is not None else qsl_t.shape[0]  # type: ignore[union-attr]
        if not 1 <= n <= max_num_reqs + 1:
            raise BlockTableIndexError(
                f"query_start_loc must have 1..{max_num_reqs + 1} entries (num_reqs + 1), got {n}"
            )
        if qsl_np is not None:
            if qsl_np[0] != 0 or qsl_np[-1] != num_tokens:
                raise BlockTableError(
                    f"query_start_loc must run from 0 to the number of positions "
                    f"({num_tokens}), got {int(qsl_np[0])}..{int(qsl_np[-1])}"
                )
            lens = np.diff(qsl_np)
            if bool((lens < 0).any()):
                raise BlockTableError("query_start_loc must be non-decreasing")
            if on_cpu:
                rows_out = np.repeat(np.arange(n - 1, dtype=np.int64), lens)
            else:
                qsl_t = _to_device(qsl_np, device)
        if not on_cpu:
            assert qsl_t is not None
            # Token t belongs to the request r with qsl[r] <= t < qsl[r + 1]:
            # the number of request ends qsl[1:] that are <= t. (No sync, unlike
            # repeat_interleave without output_size.)
            token_idx = torch.arange(num_tokens, dtype=torch.int64, device=device)
            rows_out = torch.searchsorted(qsl_t[1:].contiguous(), token_idx, right=True)
    pos_out: _Index | None = pos_t
    if pos_np is not None:
        pos_out = pos_np if on_cpu else _to_device(pos_np, device)
    assert pos_out is not None and rows_out is not None
    return pos_out, rows_out


# ---------------------------------------------------------------------------
# one group
# ---------------------------------------------------------------------------


class BlockTable:
    """Block table of one KV cache group: host int32 table, device mirror,
    per-row block counts and a persistent slot-mapping buffer.

    Args:
        block_size: tokens per block as the manager counts them.
        max_num_reqs: number of rows (batch slots).
        max_num_blocks_per_req: row width in manager blocks (taken as given;
            see :func:`round_row_width` for vLLM's rounding).
        max_num_batched_tokens: length of the slot-mapping buffer.
        device: where the mirror and the slot mapping live (``"cpu"``,
            ``"cuda"``, ``"cuda:1"``, a :class:`torch.device`). A CPU device
            still gets a separate mirror, so the device side always shows the
            last :meth:`commit`.
        pin_memory: pin the host table. ``None`` (default) or ``True`` pins it
            when the device is CUDA; ``False`` never pins. Pinning is never used
            for a CPU device.
        kernel_block_size: store each manager block as
            ``block_size // kernel_block_size`` kernel blocks (must divide
            ``block_size``). Default: same as ``block_size``.
    """

    def __init__(
        self,
        block_size: int,
        max_num_reqs: int,
        max_num_blocks_per_req: int,
        max_num_batched_tokens: int,
        device: torch.device | str = "cpu",
        pin_memory: bool | None = None,
        *,
        kernel_block_size: int | None = None,
    ) -> None:
        self.block_size = _positive_int(block_size, "block_size")
        self.max_num_reqs = _positive_int(max_num_reqs, "max_num_reqs")
        self.max_num_blocks_per_req = _positive_int(
            max_num_blocks_per_req, "max_num_blocks_per_req"
        )
        self.max_num_batched_tokens = _positive_int(
            max_num_batched_tokens, "max_num_batched_tokens"
        )
        kbs = self.block_size if kernel_block_size is None else kernel_block_size
        self.kernel_block_size = _positive_int(kbs, "kernel_block_size")
        if self.block_size % self.kernel_block_size:
            raise ConfigError(
                f"kernel_block_size {self.kernel_block_size} must divide "
                f"block_size {self.block_size}"
            )
        #: kernel blocks per manager block
        self.blocks_per_manager_block = self.block_size // self.kernel_block_size
        #: table columns (kernel blocks per row)
        self.width = self.max_num_blocks_per_req * self.blocks_per_manager_block
        self.device = torch.device(device)
        self.pin_memory = self.device.type == "cuda" and pin_memory is not False

        shape = (self.max_num_reqs, self.width)
        self._host = torch.zeros(shape, dtype=torch.int32, pin_memory=self.pin_memory)
        self._np: npt.NDArray[np.int32] = self._host.numpy()
        self._dev = torch.zeros(shape, dtype=torch.int32, device=self.device)
        self._counts = np.zeros(self.max_num_reqs, dtype=np.int32)
        self._slot_mapping = torch.full(
            (self.max_num_batched_tokens,), PAD_SLOT_ID, dtype=torch.int64, device=self.device
        )
        # numpy views of the CPU-device mirror and slot buffer (the fast CPU
        # path; tests switch it off to run the torch path on the CPU)
        self._numpy_slots = self.device.type == "cpu"
        self._dev_np = self._dev.numpy() if self._numpy_slots else None
        self._slot_np = self._slot_mapping.numpy() if self._numpy_slots else None
        self._split = np.arange(self.blocks_per_manager_block, dtype=np.int64)
        self._copy_event: Any = (
            torch.cuda.Event()  # type: ignore[no-untyped-call]
            if self.device.type == "cuda"
            else None
        )
        self._copy_pending = False

    def __repr__(self) -> str:
        return (
            f"BlockTable(block_size={self.block_size}, max_num_reqs={self.max_num_reqs}, "
            f"max_num_blocks_per_req={self.max_num_blocks_per_req}, "
            f"max_num_batched_tokens={self.max_num_batched_tokens}, device={self.device}, "
            f"kernel_block_size={self.kernel_block_size})"
        )

    # -- views ------------------------------------------------------------

    @property
    def host_table(self) -> torch.Tensor:
        """The host int32 table ``[max_num_reqs, width]`` (pinned on CUDA)."""
        return self._host

    @property
    def host_np(self) -> npt.NDArray[np.int32]:
        """Read-only numpy view of the host table."""
        return _read_only(self._np)

    @property
    def device_table(self) -> torch.Tensor:
        """The device mirror ``[max_num_reqs, width]``; shows the last :meth:`commit`."""
        return self._dev

    def get_device_tensor(self, num_reqs: int | None = None) -> torch.Tensor:
        """Rows ``[0, num_reqs)`` of the device mirror (all rows when ``None``)."""
        if num_reqs is None:
            return self._dev
        n = _check_index(num_reqs, self.max_num_reqs + 1, "num_reqs")
        return self._dev[:n]

    @property
    def slot_mapping(self) -> torch.Tensor:
        """The persistent int64 slot-mapping buffer ``[max_num_batched_tokens]``."""
        return self._slot_mapping

    @property
    def num_blocks_per_row(self) -> npt.NDArray[np.int32]:
        """Read-only view of the per-row counts (in table columns, i.e. kernel blocks)."""
        return _read_only(self._counts)

    def num_blocks(self, row: int) -> int:
        """Number of used columns in ``row``."""
        return int(self._counts[_check_index(row, self.max_num_reqs, "row")])

    def row(self, row: int) -> npt.NDArray[np.int32]:
        """Copy of the used part of ``row`` on the host."""
        r = _check_index(row, self.max_num_reqs, "row")
        return self._np[r, : self._counts[r]].copy()

    # -- row writes -------------------------------------------------------

    def _prepare(self, block_ids: Any, row: Any, overwrite: bool) -> tuple[int, int, IntArray]:
        """Check a row write; return (row, start column, kernel ids). Writes nothing."""
        r = _check_index(row, self.max_num_reqs, "row")
        ids = _as_block_ids(block_ids)
        n_mgr = ids.shape[0]
        start = 0 if overwrite else int(self._counts[r])
        k = self.blocks_per_manager_block
        if start + n_mgr * k > self.width:
            have = start // k
            raise BlockTableError(
                f"row {r} holds at most {self.max_num_blocks_per_req} blocks; "
                f"{have} + {n_mgr} would not fit"
            )
        if k > 1 and n_mgr:
            if int(ids.max()) * k + k - 1 > _INT32_MAX:
                raise InvalidBlockIdError(
                    f"block id {int(ids.max())} split into {k} kernel blocks "
                    "does not fit the int32 block table"
                )
            ids = (ids.astype(np.int64)[:, None] * k + self._split).reshape(-1)
        return r, start, ids

    def _apply(self, r: int, start: int, ids: IntArray) -> None:
        """Write checked ids at ``[r, start:]``; zero the old tail; set the count."""
        self._wait_for_copy()
        end = start + ids.shape[0]
        old = int(self._counts[r])
        if end > start:
            self._np[r, start:end] = ids
        if end < old:
            self._np[r, end:old] = 0
        self._counts[r] = end

    def append_row(self, block_ids: Any, row: int) -> None:
        """Append ``block_ids`` after the blocks already in ``row``.

        ``block_ids``: list, tuple, range, numpy integer array or CPU tensor of
        manager block ids (0 = null block). Empty input is a no-op.

        Raises:
            BlockTableIndexError: ``row`` out of range.
            BlockTableError: too many blocks for the row, wrong dtype or shape.
            InvalidBlockIdError: a negative id or one that does not fit int32.
        """
        self._apply(*self._prepare(block_ids, row, overwrite=False))

    def add_row(self, block_ids: Any, row: int) -> None:
        """Replace the content of ``row`` with ``block_ids`` (new or resumed
        request). Same inputs and errors as :meth:`append_row`."""
        self._apply(*self._prepare(block_ids, row, overwrite=True))

    # -- batched row writes ------------------------------------------------

    def _prepare_batch(self, block_ids_per_row: Any, rows: Any, overwrite: bool) -> Any:
        """Check a batched write; return what :meth:`_apply_batch` needs."""
        try:
            n = len(block_ids_per_row)
        except TypeError:
            raise BlockTableError("block ids must be given as one id sequence per row") from None
        if isinstance(block_ids_per_row, (str, bytes)):
            raise BlockTableError("block ids must be given as one id sequence per row")
        if isinstance(rows, torch.Tensor) and rows.device.type != "cpu":
            raise BlockTableError(f"rows must be in host memory, got a tensor on {rows.device}")
        rows_np, _ = _host_or_device_ints(rows, "rows", torch.device("cpu"))
        assert rows_np is not None
        if rows_np.shape[0] != n:
            raise BlockTableError(f"{rows_np.shape[0]} rows but block ids for {n} rows")
        if n == 0:
            return None
        lo, hi = int(rows_np.min()), int(rows_np.max())
        if lo < 0 or hi >= self.max_num_reqs:
            bad = lo if lo < 0 else hi
            raise BlockTableIndexError(f"row {bad} out of range [0, {self.max_num_reqs})")
        if np.unique(rows_np).shape[0] != n:
            raise BlockTableError("a row appears more than once in one batched write")
        ids, lens = _flatten_block_ids(block_ids_per_row, n)
        k = self.blocks_per_manager_block
        if k > 1 and ids.shape[0]:
            if int(ids.max()) * k + k - 1 > _INT32_MAX:
                raise InvalidBlockIdError(
                    f"block id {int(ids.max())} split into {k} kernel blocks "
                    "does not fit the int32 block table"
                )
            ids = (ids.astype(np.int64)[:, None] * k + self._split).reshape(-1)
            lens = lens * k
        old = self._counts[rows_np].astype(np.int64)
        starts = np.zeros_like(old) if overwrite else old
        ends = starts + lens
        over = np.flatnonzero(ends > self.width)
        if over.size:
            i = int(over[0])
            raise BlockTableError(
                f"row {int(rows_np[i])} holds at most {self.max_num_blocks_per_req} blocks; "
                f"{int(starts[i]) // k} + {int(lens[i]) // k} would not fit"
            )
        return rows_np, starts, lens, old, ids

    def _apply_batch(self, prepared: Any) -> None:
        if prepared is None:
            return
        rows_np, starts, lens, old, ids = prepared
        self._wait_for_copy()
        ends = starts + lens
        flat = self._np.reshape(-1)  # a view: the table is C-contiguous
        # linear index of (row, col) = row * width + col; one 1-D scatter
        flat[_ragged_columns(starts + rows_np * self.width, lens)] = ids
        tail = np.maximum(old - ends, 0)
        if tail.any():  # add_rows onto longer rows: zero what is left of them
            flat[_ragged_columns(ends + rows_np * self.width, tail)] = 0
        self._counts[rows_np] = ends

    def append_rows(self, block_ids_per_row: Any, rows: Any) -> None:
        """Batched :meth:`append_row`: ``block_ids_per_row[i]`` goes to
        ``rows[i]``, with one scatter for the whole batch.

        ``block_ids_per_row``: a sequence of id sequences (lists, tuples, numpy
        arrays); ``rows``: distinct row indices (list, numpy array, CPU
        tensor). Everything is checked before anything is written.
        """
        self._apply_batch(self._prepare_batch(block_ids_per_row, rows, overwrite=False))

    def add_rows(self, block_ids_per_row: Any, rows: Any) -> None:
        """Batched :meth:`add_row` (see :meth:`append_rows`)."""
        self._apply_batch(self._prepare_batch(block_ids_per_row, rows, overwrite=True))

    def clear_row(self, row: int) -> None:
        """Zero ``row`` and set its count to 0."""
        r = _check_index(row, self.max_num_reqs, "row")
        self._wait_for_copy()
        self._np[r, : self._counts[r]] = 0
        self._counts[r] = 0

    def move_row(self, src: int, dst: int) -> None:
        """Move row ``src`` to ``dst`` (overwriting it), then zero ``src``.

        ``src == dst`` is a no-op.
        """
        s = _check_index(src, self.max_num_reqs, "src")
        d = _check_index(dst, self.max_num_reqs, "dst")
        if s == d:
            return
        self._wait_for_copy()
        n, old = int(self._counts[s]), int(self._counts[d])
        self._np[d, :n] = self._np[s, :n]
        if old > n:
            self._np[d, n:old] = 0
        self._np[s, :n] = 0
        self._counts[d] = n
        self._counts[s] = 0

    def swap_row(self, a: int, b: int) -> None:
        """Swap rows ``a`` and ``b`` and their counts."""
        ra = _check_index(a, self.max_num_reqs, "a")
        rb = _check_index(b, self.max_num_reqs, "b")
        if ra == rb:
            return
        self._wait_for_copy()
        m = int(max(self._counts[ra], self._counts[rb]))
        self._np[[ra, rb], :m] = self._np[[rb, ra], :m]
        self._counts[[ra, rb]] = self._counts[[rb, ra]]

    def clear(self) -> None:
        """Zero every row on both sides and every count."""
        self._wait_for_copy()
        self._np.fill(0)
        self._counts.fill(0)
        self._dev.zero_()

    # -- host -> device ---------------------------------------------------

    def _wait_for_copy(self) -> None:
        # Host writes must not overwrite pinned memory a pending copy still
        # reads. Waits on the commit's event only (not the stream or device).
        if self._copy_pending:
            self._copy_event.synchronize()
            self._copy_pending = False

    def commit(self, num_reqs: int) -> None:
        """Copy rows ``[0, num_reqs)`` host -> device without blocking.

        The copy is queued on the current stream (non-blocking from pinned
        memory on CUDA) and nothing waits for it here.
        """
        n = _check_index(num_reqs, self.max_num_reqs + 1, "num_reqs")
        if n == 0:
            return
        self._dev[:n].copy_(self._host[:n], non_blocking=True)
        if self._copy_event is not None:
            # the copy runs on the destination device's current stream
            self._copy_event.record(torch.cuda.current_stream(self.device))
            self._copy_pending = True

    # -- slot mapping -----------------------------------------------------

    def compute_slot_mapping(
        self,
        positions: Any,
        *,
        rows: Any = None,
        query_start_loc: Any = None,
    ) -> torch.Tensor:
        """Slot of every scheduled token, written into :attr:`slot_mapping`.

        Give the tokens either as ``rows`` (table row of each token) plus
        ``positions`` (its position in the request), or as
        ``query_start_loc`` (``[num_reqs + 1]``, request ``i`` = row ``i`` owns
        tokens ``qsl[i] .. qsl[i+1]-1``) plus ``positions``. Inputs may be
        lists, numpy integer arrays or integer tensors; host inputs are checked
        (rows in range, positions within the row width, ``qsl`` running from 0
        to ``len(positions)`` without decreasing); tensors already on the
        device are used as they are, since checking them would synchronise.

        On CUDA, pass ``positions`` and ``query_start_loc``/``rows`` as device
        tensors on the hot path (a model runner has them there already): host
        arrays are accepted but go through a pageable host -> device copy,
        which the driver may perform synchronously.

        Reads the device mirror, i.e. the table as of the last :meth:`commit`.
        Returns the whole ``[max_num_batched_tokens]`` int64 buffer on the
        device: ``slot = table[row, pos // B] * B + pos % B`` for the first
        ``len(positions)`` entries, :data:`PAD_SLOT_ID` after them. The buffer
        is reused by the next call.
        """
        pos, rows_t = _prepare_slot_inputs(
            positions,
            rows,
            query_start_loc,
            device=self.device,
            max_num_reqs=self.max_num_reqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_position=self.width * self.kernel_block_size,
            numpy_path=self._numpy_slots,
        )
        self._slot_mapping_into(pos, rows_t)
        return self._slot_mapping

    def _slot_mapping_into(self, pos: _Index, rows: _Index) -> None:
        bs = self.kernel_block_size
        n = pos.shape[0]
        if isinstance(pos, np.ndarray):  # CPU device: numpy views of the same memory
            assert self._dev_np is not None and self._slot_np is not None
            out_np = self._slot_np
            if n:
                col = pos // bs
                ids = self._dev_np[rows, col]
                np.multiply(ids, bs, out=out_np[:n], dtype=np.int64)
                out_np[:n] += pos - col * bs
            out_np[n:] = PAD_SLOT_ID
            return
        assert isinstance(rows, torch.Tensor)
        out = self._slot_mapping
        if n:
            tcol = torch.div(pos, bs, rounding_mode="floor")
            tids = self._dev[rows, tcol].to(torch.int64)
            torch.mul(tids, bs, out=out[:n])
            out[:n].add_(pos - tcol * bs)
        out[n:].fill_(PAD_SLOT_ID)


# ---------------------------------------------------------------------------
# several groups
# ---------------------------------------------------------------------------


class MultiGroupBlockTable:
    """One :class:`BlockTable` per KV cache group, updated together.

    Args:
        block_sizes: manager block size of each group (they may differ).
        max_num_reqs: rows per table.
        max_num_blocks_per_req: row width in manager blocks, one int for all
            groups or one per group.
        max_num_batched_tokens: length of each group's slot-mapping buffer.
        device, pin_memory: as for :class:`BlockTable`.
        kernel_block_sizes: optional kernel block size per group (each must
            divide the group's block size; ``None`` entries mean "same").

    Row operations take the manager's result as one id sequence per group
    (a tuple or list of lists / numpy arrays / tuples); every group is checked
    before any is written, so a bad group leaves all tables unchanged.
    """

    def __init__(
        self,
        block_sizes: Sequence[int],
        max_num_reqs: int,
        max_num_blocks_per_req: int | Sequence[int],
        max_num_batched_tokens: int,
        device: torch.device | str = "cpu",
        pin_memory: bool | None = None,
        *,
        kernel_block_sizes: Sequence[int | None] | None = None,
    ) -> None:
        sizes = list(block_sizes)
        if not sizes:
            raise ConfigError("block_sizes must name at least one group")
        g = len(sizes)
        if isinstance(max_num_blocks_per_req, Sequence):
            widths = list(max_num_blocks_per_req)
        else:
            widths = [max_num_blocks_per_req] * g
        kernels = [None] * g if kernel_block_sizes is None else list(kernel_block_sizes)
        if len(widths) != g or len(kernels) != g:
            raise ConfigError(
                f"{g} block sizes but {len(widths)} row widths and "
                f"{len(kernels)} kernel block sizes"
            )
        self.tables: tuple[BlockTable, ...] = tuple(
            BlockTable(
                bs,
                max_num_reqs,
                w,
                max_num_batched_tokens,
                device,
                pin_memory,
                kernel_block_size=kbs,
            )
            for bs, w, kbs in zip(sizes, widths, kernels, strict=True)
        )
        self.device = self.tables[0].device
        self.max_num_reqs = self.tables[0].max_num_reqs
        self.max_num_batched_tokens = self.tables[0].max_num_batched_tokens

    def __len__(self) -> int:
        return len(self.tables)

    def __getitem__(self, group: int) -> BlockTable:
        return self.tables[group]

    def __iter__(self) -> Iterator[BlockTable]:
        return iter(self.tables)

    def _per_group(self, block_ids: Any) -> list[Any]:
        if isinstance(block_ids, (str, bytes)) or not hasattr(block_ids, "__len__"):
            raise BlockTableError("block ids must be given as one id sequence per group")
        if len(block_ids) != len(self.tables):
            raise BlockTableError(
                f"got block ids for {len(block_ids)} groups, the table has {len(self.tables)}"
            )
        return list(block_ids)

    def _write(self, block_ids: Any, row: int, overwrite: bool) -> None:
        per_group = self._per_group(block_ids)
        prepared = [
            t._prepare(ids, row, overwrite) for t, ids in zip(self.tables, per_group, strict=True)
        ]
        for t, p in zip(self.tables, prepared, strict=True):
            t._apply(*p)

    def append_row(self, block_ids: Any, row: int) -> None:
        """Append each group's new ids to ``row`` (see :meth:`BlockTable.append_row`)."""
        self._write(block_ids, row, overwrite=False)

    def add_row(self, block_ids: Any, row: int) -> None:
        """Replace ``row`` in every group (see :meth:`BlockTable.add_row`)."""
        self._write(block_ids, row, overwrite=True)

    def _write_batch(self, block_ids: Any, rows: Any, overwrite: bool) -> None:
        per_group = self._per_group(block_ids)
        prepared = [
            t._prepare_batch(ids, rows, overwrite)
            for t, ids in zip(self.tables, per_group, strict=True)
        ]
        for t, p in zip(self.tables, prepared, strict=True):
            t._apply_batch(p)

    def append_rows(self, block_ids: Any, rows: Any) -> None:
        """Batched :meth:`append_row`: ``block_ids[g][i]`` goes to ``rows[i]``
        of group ``g`` (see :meth:`BlockTable.append_rows`)."""
        self._write_batch(block_ids, rows, overwrite=False)

    def add_rows(self, block_ids: Any, rows: Any) -> None:
        """Batched :meth:`add_row` (see :meth:`append_rows`)."""
        self._write_batch(block_ids, rows, overwrite=True)

    def clear_row(self, row: int) -> None:
        """Clear ``row`` in every group."""
        _check_index(row, self.max_num_reqs, "row")
        for t in self.tables:
            t.clear_row(row)

    def move_row(self, src: int, dst: int) -> None:
        """Move ``src`` to ``dst`` in every group, zeroing ``src``."""
        _check_index(src, self.max_num_reqs, "src")
        _check_index(dst, self.max_num_reqs, "dst")
        for t in self.tables:
            t.move_row(src, dst)

    def swap_row(self, a: int, b: int) -> None:
        """Swap rows ``a`` and ``b`` in every group."""
        _check_index(a, self.max_num_reqs, "a")
        _check_index(b, self.max_num_reqs, "b")
        for t in self.tables:
            t.swap_row(a, b)

    def commit(self, num_reqs: int) -> None:
        """Queue the host -> device copy of rows ``[0, num_reqs)`` for every group."""
        _check_index(num_reqs, self.max_num_reqs + 1, "num_reqs")
        for t in self.tables:
            t.commit(num_reqs)

    def clear(self) -> None:
        """Clear every group on both sides."""
        for t in self.tables:
            t.clear()

    def compute_slot_mapping(
        self,
        positions: Any,
        *,
        rows: Any = None,
        query_start_loc: Any = None,
    ) -> tuple[torch.Tensor, ...]:
        """Slot mapping of every group (see :meth:`BlockTable.compute_slot_mapping`).

        The inputs are checked and moved to the device once; positions must fit
        every group's rows. Returns one buffer per group.
        """
        pos, rows_t = _prepare_slot_inputs(
            positions,
            rows,
            query_start_loc,
            device=self.device,
            max_num_reqs=self.max_num_reqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_position=min(t.width * t.kernel_block_size for t in self.tables),
            numpy_path=all(t._numpy_slots for t in self.tables),
        )
        for t in self.tables:
            t._slot_mapping_into(pos, rows_t)
        return tuple(t.slot_mapping for t in self.tables)
