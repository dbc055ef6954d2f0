"""`BlockTable`: the block table of one KV cache group.

One int32 table ``[max_num_reqs, width]`` on the host (a numpy view over a
torch CPU tensor, pinned when the device is CUDA), its mirror on the device,
the per-row block counts and a persistent slot-mapping buffer. Row writes
change the host side only; :meth:`BlockTable.commit` copies the used rows to
the device without blocking. The rules every table keeps are in the package
docstring (:mod:`kvcoord.block_table`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import torch

from kvcoord._arith import cdiv
from kvcoord.block_table.ids import (
    INT32_MAX,
    IntArray,
    as_block_ids,
    blocks_by_group,
    check_blocks,
    check_index,
    check_table_size,
    flatten_block_ids,
    host_rows,
    positive_int,
    ragged_columns,
    read_only,
)
from kvcoord.block_table.slots import (
    PAD_SLOT_ID,
    Index,
    prepare_slot_inputs,
    slot_mapping_into,
    step_tokens,
)
from kvcoord.blocks import KVCacheBlocks
from kvcoord.errors import BlockTableError, ConfigError, InvalidBlockIdError, OutOfMemoryError


def round_row_width(num_blocks: int, block_size: int, align_tokens: int = 128) -> int:
    """Round a row width (in blocks) up the way vLLM's v1 worker does.

    The width becomes the smallest multiple of ``align_tokens // gcd(align_tokens,
    block_size)`` that is at least ``num_blocks``, so that ``width * block_size``
    is a multiple of ``align_tokens``. Examples: (10, 16) -> 16; (3, 48) -> 8;
    (100, 256) -> 100. Groups without a slot mapping (Mamba) are not rounded by
    vLLM; simply do not call this for them.
    """
    num_blocks = positive_int(num_blocks, "num_blocks")
    block_size = positive_int(block_size, "block_size")
    align_tokens = positive_int(align_tokens, "align_tokens")
    align = align_tokens // math.gcd(align_tokens, block_size)
    return cdiv(num_blocks, align) * align


class RowWrite(NamedTuple):
    """A checked one-row write: row, first column, kernel ids."""

    row: int
    start: int
    ids: IntArray


class BatchWrite(NamedTuple):
    """A checked batched write (see :meth:`BlockTable._apply_batch`)."""

    rows: npt.NDArray[np.int64]
    starts: npt.NDArray[np.int64]
    lens: npt.NDArray[np.int64]  # in table columns (kernel blocks)
    old: npt.NDArray[np.int64]  # counts before the write
    ids: IntArray  # kernel ids, all rows concatenated


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
        self.block_size = positive_int(block_size, "block_size")
        self.max_num_reqs = positive_int(max_num_reqs, "max_num_reqs")
        self.max_num_blocks_per_req = positive_int(max_num_blocks_per_req, "max_num_blocks_per_req")
        self.max_num_batched_tokens = positive_int(max_num_batched_tokens, "max_num_batched_tokens")
        kbs = self.block_size if kernel_block_size is None else kernel_block_size
        self.kernel_block_size = positive_int(kbs, "kernel_block_size")
        if self.block_size % self.kernel_block_size:
            raise ConfigError(
                f"kernel_block_size {self.kernel_block_size} must divide "
                f"block_size {self.block_size}"
            )
        #: kernel blocks per manager block
        self.blocks_per_manager_block = self.block_size // self.kernel_block_size
        #: table columns (kernel blocks per row)
        self.width = self.max_num_blocks_per_req * self.blocks_per_manager_block
        check_table_size(self.max_num_reqs * self.width, "max_num_reqs * row width")
        check_table_size(self.max_num_batched_tokens, "max_num_batched_tokens")
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ConfigError(f"invalid device {device!r}: {exc}") from None
        self.pin_memory = self.device.type == "cuda" and pin_memory is not False

        shape = (self.max_num_reqs, self.width)
        try:
            self._host = torch.zeros(shape, dtype=torch.int32, pin_memory=self.pin_memory)
            self._dev = torch.zeros(shape, dtype=torch.int32, device=self.device)
            self._slot_mapping = torch.full(
                (self.max_num_batched_tokens,), PAD_SLOT_ID, dtype=torch.int64, device=self.device
            )
        except (MemoryError, RuntimeError, AssertionError) as exc:
            # torch reports a refused allocation as a RuntimeError (on the
            # CPU) or torch.OutOfMemoryError; a missing device (no CUDA) as
            # a RuntimeError or AssertionError.
            if isinstance(exc, MemoryError | torch.OutOfMemoryError) or "allocate" in str(exc):
                msg = f"out of memory: cannot allocate the block table: {exc}"
                raise OutOfMemoryError(msg) from None
            raise ConfigError(f"cannot allocate the block table on {self.device}: {exc}") from None
        self._np: npt.NDArray[np.int32] = self._host.numpy()
        self._counts = np.zeros(self.max_num_reqs, dtype=np.int32)
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
        return read_only(self._np)

    @property
    def device_table(self) -> torch.Tensor:
        """The device mirror ``[max_num_reqs, width]``; shows the last :meth:`commit`."""
        return self._dev

    def get_device_tensor(self, num_reqs: int | None = None) -> torch.Tensor:
        """Rows ``[0, num_reqs)`` of the device mirror (all rows when ``None``)."""
        if num_reqs is None:
            return self._dev
        n = check_index(num_reqs, self.max_num_reqs + 1, "num_reqs")
        return self._dev[:n]

    @property
    def slot_mapping(self) -> torch.Tensor:
        """The persistent int64 slot-mapping buffer ``[max_num_batched_tokens]``."""
        return self._slot_mapping

    @property
    def num_blocks_per_row(self) -> npt.NDArray[np.int32]:
        """Read-only view of the per-row counts (in table columns, i.e. kernel blocks)."""
        return read_only(self._counts)

    def num_blocks(self, row: int) -> int:
        """Number of used columns in ``row``."""
        return int(self._counts[check_index(row, self.max_num_reqs, "row")])

    def row(self, row: int) -> npt.NDArray[np.int32]:
        """Copy of the used part of ``row`` on the host."""
        r = check_index(row, self.max_num_reqs, "row")
        return self._np[r, : self._counts[r]].copy()

    # -- row writes -------------------------------------------------------

    def _kernel_ids(self, ids: IntArray) -> IntArray:
        """Manager ids -> kernel ids (``b -> b*k .. b*k+k-1``); checks that they fit."""
        k = self.blocks_per_manager_block
        if k == 1 or ids.shape[0] == 0:
            return ids
        if int(ids.max()) * k + k - 1 > INT32_MAX:
            raise InvalidBlockIdError(
                f"block id {int(ids.max())} split into {k} kernel blocks "
                "does not fit the int32 block table"
            )
        return (ids.astype(np.int64)[:, None] * k + self._split).reshape(-1)

    def _prepare_checked(self, ids: IntArray, r: int, overwrite: bool) -> RowWrite:
        """Check that ids already known good fit row ``r`` (already checked).
        Writes nothing."""
        n_mgr = ids.shape[0]
        start = 0 if overwrite else int(self._counts[r])
        k = self.blocks_per_manager_block
        if start + n_mgr * k > self.width:
            raise BlockTableError(
                f"row {r} holds at most {self.max_num_blocks_per_req} blocks; "
                f"{start // k} + {n_mgr} would not fit"
            )
        return RowWrite(r, start, self._kernel_ids(ids))

    def _prepare(self, block_ids: Any, row: Any, overwrite: bool) -> RowWrite:
        """Check a row write from any accepted input. Writes nothing."""
        r = check_index(row, self.max_num_reqs, "row")
        if isinstance(block_ids, KVCacheBlocks):  # a manager result: trusted ids
            ids: IntArray = check_blocks(block_ids, 1).flat
        else:
            ids = as_block_ids(block_ids)
        return self._prepare_checked(ids, r, overwrite)

    def _apply(self, w: RowWrite) -> None:
        """Write checked ids at ``[row, start:]``; zero the old tail; set the count."""
        self._wait_for_copy()
        r, start, ids = w
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
        manager block ids (0 = null block), checked; or a one-group
        :class:`~kvcoord.KVCacheBlocks` from a manager, taken as it is (the
        pool validated its ids). Empty input is a no-op.

        Raises:
            BlockTableIndexError: ``row`` out of range.
            BlockTableError: too many blocks for the row, wrong dtype or shape.
            InvalidBlockIdError: a negative id or one that does not fit int32.
        """
        self._apply(self._prepare(block_ids, row, overwrite=False))

    def add_row(self, block_ids: Any, row: int) -> None:
        """Replace the content of ``row`` with ``block_ids`` (new or resumed
        request). Same inputs and errors as :meth:`append_row`."""
        self._apply(self._prepare(block_ids, row, overwrite=True))

    # -- batched row writes ------------------------------------------------

    def _prepare_batch_checked(
        self,
        rows: npt.NDArray[np.int64],
        ids: IntArray,
        lens: npt.NDArray[np.int64],
        overwrite: bool,
    ) -> BatchWrite | None:
        """Check that ids already known good (``lens[i]`` of them for
        ``rows[i]``, distinct rows in range) fit their rows. Writes nothing."""
        if rows.shape[0] == 0:
            return None
        k = self.blocks_per_manager_block
        ids = self._kernel_ids(ids)
        if k > 1:
            lens = lens * k
        old = self._counts[rows].astype(np.int64)
        starts = np.zeros_like(old) if overwrite else old
        ends = starts + lens
        over = np.flatnonzero(ends > self.width)
        if over.size:
            i = int(over[0])
            raise BlockTableError(
                f"row {int(rows[i])} holds at most {self.max_num_blocks_per_req} blocks; "
                f"{int(starts[i]) // k} + {int(lens[i]) // k} would not fit"
            )
        return BatchWrite(rows, starts, lens, old, ids)

    def _prepare_batch(self, block_ids_per_row: Any, rows: Any, overwrite: bool) -> Any:
        """Check a batched write of user ids; return what :meth:`_apply_batch` needs."""
        try:
            n = len(block_ids_per_row)
        except TypeError:
            raise BlockTableError("block ids must be given as one id sequence per row") from None
        if isinstance(block_ids_per_row, (str, bytes)):
            raise BlockTableError("block ids must be given as one id sequence per row")
        rows_np = host_rows(rows, n, self.max_num_reqs)
        if n == 0:
            return None
        ids, lens = flatten_block_ids(block_ids_per_row, n)
        return self._prepare_batch_checked(rows_np, ids, lens, overwrite)

    def _apply_batch(self, w: BatchWrite | None) -> None:
        if w is None:
            return
        rows, starts, lens, old, ids = w
        self._wait_for_copy()
        ends = starts + lens
        flat = self._np.reshape(-1)  # a view: the table is C-contiguous
        # linear index of (row, col) = row * width + col; one 1-D scatter
        flat[ragged_columns(starts + rows * self.width, lens)] = ids
        tail = np.maximum(old - ends, 0)
        if tail.any():  # add_rows onto longer rows: zero what is left of them
            flat[ragged_columns(ends + rows * self.width, tail)] = 0
        self._counts[rows] = ends

    def append_rows(self, block_ids_per_row: Any, rows: Any) -> None:
        """Batched :meth:`append_row`: ``block_ids_per_row[i]`` goes to
        ``rows[i]``, with one scatter for the whole batch.

        ``block_ids_per_row``: a sequence of id sequences (lists, tuples, numpy
        arrays); ``rows``: distinct row indices (list, numpy array, CPU
        tensor). Everything is checked before anything is written. (Manager
        results go to :meth:`append_blocks`.)
        """
        self._apply_batch(self._prepare_batch(block_ids_per_row, rows, overwrite=False))

    def add_rows(self, block_ids_per_row: Any, rows: Any) -> None:
        """Batched :meth:`add_row` (see :meth:`append_rows`)."""
        self._apply_batch(self._prepare_batch(block_ids_per_row, rows, overwrite=True))

    def _prepare_blocks(self, blocks: Any, rows: Any, overwrite: bool) -> BatchWrite | None:
        """Check a batched write of manager results (trusted ids)."""
        ((ids, lens),) = blocks_by_group(blocks, 1)
        rows_np = host_rows(rows, lens.shape[0], self.max_num_reqs)
        return self._prepare_batch_checked(rows_np, ids, lens, overwrite)

    def append_blocks(self, blocks: Sequence[KVCacheBlocks], rows: Any) -> None:
        """Batched :meth:`append_row` from one-group manager results:
        ``blocks[i]`` goes after the blocks in ``rows[i]``, written as it is
        (see :meth:`MultiGroupBlockTable.append_blocks`)."""
        self._apply_batch(self._prepare_blocks(blocks, rows, overwrite=False))

    def add_blocks(self, blocks: Sequence[KVCacheBlocks], rows: Any) -> None:
        """Batched :meth:`add_row` from one-group manager results (see
        :meth:`append_blocks`)."""
        self._apply_batch(self._prepare_blocks(blocks, rows, overwrite=True))

    def clear_row(self, row: int) -> None:
        """Zero ``row`` and set its count to 0."""
        r = check_index(row, self.max_num_reqs, "row")
        self._wait_for_copy()
        self._np[r, : self._counts[r]] = 0
        self._counts[r] = 0

    def move_row(self, src: int, dst: int) -> None:
        """Move row ``src`` to ``dst`` (overwriting it), then zero ``src``.

        ``src == dst`` is a no-op.
        """
        s = check_index(src, self.max_num_reqs, "src")
        d = check_index(dst, self.max_num_reqs, "dst")
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
        ra = check_index(a, self.max_num_reqs, "a")
        rb = check_index(b, self.max_num_reqs, "b")
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
        n = check_index(num_reqs, self.max_num_reqs + 1, "num_reqs")
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
        pos, rows_t = prepare_slot_inputs(
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

    def compute_step_slot_mapping(
        self, num_computed_tokens: Any, num_scheduled_tokens: Any, *, rows: Any = None
    ) -> torch.Tensor:
        """Slot mapping of one scheduler step given per request counts.

        Request ``i`` (in row ``rows[i]``, or row ``i`` when ``rows`` is None)
        runs ``num_scheduled_tokens[i]`` tokens from position
        ``num_computed_tokens[i]`` on. Same result and checks as
        :meth:`compute_slot_mapping` on the positions of
        :func:`~kvcoord.block_table.step_positions`.
        """
        pos, tok_rows, qsl = step_tokens(num_computed_tokens, num_scheduled_tokens, rows)
        return self.compute_slot_mapping(pos, rows=tok_rows, query_start_loc=qsl)

    def _slot_mapping_into(self, pos: Index, rows: Index) -> None:
        slot_mapping_into(
            pos,
            rows,
            block_size=self.kernel_block_size,
            table=self._dev,
            out=self._slot_mapping,
            table_np=self._dev_np,
            out_np=self._slot_np,
        )
