"""`MultiGroupBlockTable`: one :class:`BlockTable` per KV cache group.

A manager result (:class:`~kvcoord.KVCacheBlocks`, ids per group) updates
every group's table in one call. Manager results are written as they are:
their ids were validated by the pool, so the only checks left are the ones
about the table (rows in range, rows not overflowing). Ids given as lists or
arrays are checked as for :class:`BlockTable`. Every group is checked before
any is written, so a bad call leaves all tables unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from kvcoord.block_table.ids import (
    blocks_by_group,
    check_blocks,
    check_index,
    host_rows,
)
from kvcoord.block_table.slots import prepare_slot_inputs, step_tokens
from kvcoord.block_table.table import BlockTable
from kvcoord.blocks import KVCacheBlocks
from kvcoord.errors import BlockTableError, ConfigError


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

    Row operations take a manager's result (:class:`~kvcoord.KVCacheBlocks`,
    trusted) or one id sequence per group (a tuple or list of lists / numpy
    arrays / tuples, checked). A scheduler step's results for many rows go
    in with :meth:`append_blocks` / :meth:`add_blocks`, and its slot mapping
    comes from :meth:`compute_step_slot_mapping`.
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

    # -- one row ------------------------------------------------------------

    def _per_group(self, block_ids: Any) -> list[Any]:
        if isinstance(block_ids, (str, bytes)) or not hasattr(block_ids, "__len__"):
            raise BlockTableError("block ids must be given as one id sequence per group")
        if len(block_ids) != len(self.tables):
            raise BlockTableError(
                f"got block ids for {len(block_ids)} groups, the table has {len(self.tables)}"
            )
        return list(block_ids)

    def _write(self, block_ids: Any, row: int, overwrite: bool) -> None:
        if isinstance(block_ids, KVCacheBlocks):  # a manager result: trusted ids
            arrays = check_blocks(block_ids, len(self.tables)).arrays()
            r = check_index(row, self.max_num_reqs, "row")
            prepared = [
                t._prepare_checked(ids, r, overwrite)
                for t, ids in zip(self.tables, arrays, strict=True)
            ]
        else:
            per_group = self._per_group(block_ids)
            prepared = [
                t._prepare(ids, row, overwrite)
                for t, ids in zip(self.tables, per_group, strict=True)
            ]
        for t, p in zip(self.tables, prepared, strict=True):
            t._apply(p)

    def append_row(self, block_ids: Any, row: int) -> None:
        """Append each group's new ids to ``row`` (see :meth:`BlockTable.append_row`).

        ``block_ids``: a :class:`~kvcoord.KVCacheBlocks` (e.g. what
        ``allocate_slots`` returned), or one id sequence per group.
        """
        self._write(block_ids, row, overwrite=False)

    def add_row(self, block_ids: Any, row: int) -> None:
        """Replace ``row`` in every group (see :meth:`BlockTable.add_row`);
        e.g. ``add_row(manager.get_blocks(request_id), row)`` for a resumed request."""
        self._write(block_ids, row, overwrite=True)

    # -- many rows ------------------------------------------------------------

    def _write_batch(self, block_ids: Any, rows: Any, overwrite: bool) -> None:
        per_group = self._per_group(block_ids)
        prepared = [
            t._prepare_batch(ids, rows, overwrite)
            for t, ids in zip(self.tables, per_group, strict=True)
        ]
        for t, p in zip(self.tables, prepared, strict=True):
            t._apply_batch(p)

    def append_rows(self, block_ids: Any, rows: Any) -> None:
        """Batched :meth:`append_row` from id sequences: ``block_ids[g][i]``
        goes to ``rows[i]`` of group ``g`` (see :meth:`BlockTable.append_rows`).
        For manager results use :meth:`append_blocks`."""
        self._write_batch(block_ids, rows, overwrite=False)

    def add_rows(self, block_ids: Any, rows: Any) -> None:
        """Batched :meth:`add_row` (see :meth:`append_rows`)."""
        self._write_batch(block_ids, rows, overwrite=True)

    def _write_blocks(self, blocks: Sequence[KVCacheBlocks], rows: Any, overwrite: bool) -> None:
        by_group = blocks_by_group(blocks, len(self.tables))
        rows_np = host_rows(rows, by_group[0][1].shape[0], self.max_num_reqs)
        prepared = [
            t._prepare_batch_checked(rows_np, ids, lens, overwrite)
            for t, (ids, lens) in zip(self.tables, by_group, strict=True)
        ]
        for t, p in zip(self.tables, prepared, strict=True):
            t._apply_batch(p)

    def append_blocks(self, blocks: Sequence[KVCacheBlocks], rows: Any) -> None:
        """Append a scheduler step's new blocks: ``blocks[i]`` (a manager
        result, e.g. from ``allocate_slots``) goes after the blocks already in
        ``rows[i]``, in every group.

        The ids are written as they are (the pool validated them): one read of
        ``flat``/``offsets`` per row, then a fixed number of numpy calls per
        group, whatever the number of blocks. ``rows`` (distinct, in range)
        and the row capacities are checked before anything is written.

        Raises:
            BlockTableError: an item is not a :class:`~kvcoord.KVCacheBlocks`
                of this table's group count, ``rows`` has another length or
                repeats a row, a row would overflow.
            BlockTableIndexError: a row out of range.
        """
        self._write_blocks(blocks, rows, overwrite=False)

    def add_blocks(self, blocks: Sequence[KVCacheBlocks], rows: Any) -> None:
        """Batched :meth:`add_row` from manager results (new or resumed
        requests; see :meth:`append_blocks`)."""
        self._write_blocks(blocks, rows, overwrite=True)

    # -- rows, commit, slots --------------------------------------------------

    def clear_row(self, row: int) -> None:
        """Clear ``row`` in every group."""
        check_index(row, self.max_num_reqs, "row")
        for t in self.tables:
            t.clear_row(row)

    def move_row(self, src: int, dst: int) -> None:
        """Move ``src`` to ``dst`` in every group, zeroing ``src``."""
        check_index(src, self.max_num_reqs, "src")
        check_index(dst, self.max_num_reqs, "dst")
        for t in self.tables:
            t.move_row(src, dst)

    def swap_row(self, a: int, b: int) -> None:
        """Swap rows ``a`` and ``b`` in every group."""
        check_index(a, self.max_num_reqs, "a")
        check_index(b, self.max_num_reqs, "b")
        for t in self.tables:
            t.swap_row(a, b)

    def commit(self, num_reqs: int) -> None:
        """Queue the host -> device copy of rows ``[0, num_reqs)`` for every group."""
        check_index(num_reqs, self.max_num_reqs + 1, "num_reqs")
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
        pos, rows_t = prepare_slot_inputs(
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

    def compute_step_slot_mapping(
        self, num_computed_tokens: Any, num_scheduled_tokens: Any, *, rows: Any = None
    ) -> tuple[torch.Tensor, ...]:
        """Slot mapping of every group for one scheduler step given per
        request counts (see :meth:`BlockTable.compute_step_slot_mapping`)."""
        pos, tok_rows, qsl = step_tokens(num_computed_tokens, num_scheduled_tokens, rows)
        return self.compute_slot_mapping(pos, rows=tok_rows, query_start_loc=qsl)
