"""Slot mappings: the physical KV slot of every scheduled token.

For a token at position ``p`` of batch row ``r`` and a table of block size
``B``: ``slot = table[r, p // B] * B + p % B`` (int64), read from the table's
device mirror (the last commit) without a Python loop over tokens. The rest of
the ``[max_num_batched_tokens]`` buffer holds :data:`PAD_SLOT_ID`.

This module checks the token inputs once per step (shared by every group of a
multi-group table), turns a scheduler step's per-request counts into token
positions, and fills one table's buffer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from kvcoord._core import MAX_TOKENS
from kvcoord.block_table.ids import MAX_TABLE_ENTRIES, host_or_device_ints, ragged_columns
from kvcoord.errors import BlockTableError, BlockTableIndexError

#: Slot written for padding tokens (and the tail of the slot-mapping buffer).
PAD_SLOT_ID = -1

#: Exclusive bound of a token position: the core's token-count limit
#: (README, "Bad input and limits").
MAX_TOKEN_POSITION: int = MAX_TOKENS

Index = npt.NDArray[np.int64] | torch.Tensor


def step_positions(
    num_computed_tokens: Any, num_scheduled_tokens: Any
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Token positions and ``query_start_loc`` of one scheduler step.

    Request ``i`` runs tokens ``num_computed_tokens[i] ..
    num_computed_tokens[i] + num_scheduled_tokens[i] - 1``. Returns
    ``(positions, query_start_loc)`` as int64 arrays (``len(positions) ==
    sum(num_scheduled_tokens)``, ``query_start_loc`` of length ``n + 1``),
    built with a few numpy calls whatever the number of tokens.

    Raises:
        BlockTableError: the two inputs differ in length, are not 1-D
            integers, or hold a negative count.
    """
    cpu = torch.device("cpu")
    comp, _ = host_or_device_ints(num_computed_tokens, "num_computed_tokens", cpu)
    sched, _ = host_or_device_ints(num_scheduled_tokens, "num_scheduled_tokens", cpu)
    assert comp is not None and sched is not None
    if comp.shape != sched.shape:
        raise BlockTableError(
            f"num_computed_tokens has {comp.shape[0]} entries, "
            f"num_scheduled_tokens {sched.shape[0]}"
        )
    if comp.shape[0] and (int(comp.min()) < 0 or int(sched.min()) < 0):
        raise BlockTableError("token counts must be non-negative")
    # Checked before anything is summed or allocated: a step's tokens fit
    # a slot-mapping buffer, a position the supported token range.
    if comp.shape[0] and int(comp.max()) >= MAX_TOKEN_POSITION:
        raise BlockTableError(
            f"num_computed_tokens {int(comp.max())} is beyond the supported maximum of 2^48 - 1"
        )
    if comp.shape[0] and int(sched.max()) >= MAX_TABLE_ENTRIES:
        raise BlockTableError(
            f"num_scheduled_tokens {int(sched.max())} is beyond the supported maximum of 2^28 - 1"
        )
    qsl = np.zeros(sched.shape[0] + 1, dtype=np.int64)
    np.cumsum(sched, out=qsl[1:])
    if int(qsl[-1]) >= MAX_TABLE_ENTRIES:
        raise BlockTableError(
            f"a step of {int(qsl[-1])} tokens is beyond the supported maximum of 2^28 - 1"
        )
    return ragged_columns(comp, sched), qsl


def _to_device(arr: npt.NDArray[np.int64], device: torch.device) -> torch.Tensor:
    arr = np.ascontiguousarray(arr)
    if not arr.flags.writeable:  # torch.from_numpy warns on read-only arrays
        arr = arr.copy()
    t = torch.from_numpy(arr)
    return t if device.type == "cpu" else t.to(device, non_blocking=True)


def prepare_slot_inputs(
    positions: Any,
    rows: Any,
    query_start_loc: Any,
    *,
    device: torch.device,
    max_num_reqs: int,
    max_num_batched_tokens: int,
    max_position: int,
    numpy_path: bool,
) -> tuple[Index, Index]:
    """Checked (positions, rows), one int64 entry per token: numpy arrays for a
    CPU device (numpy beats torch's CPU kernels at this size), tensors on
    ``device`` otherwise.

    Host inputs are checked fully (range of rows and positions, shape of
    ``query_start_loc``); device tensors get shape/dtype checks only.
    """
    on_cpu = numpy_path
    if (rows is None) == (query_start_loc is None):
        raise BlockTableError("pass exactly one of rows= or query_start_loc=")
    pos_np, pos_t = host_or_device_ints(positions, "positions", device)
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
        rows_np, rows_t = host_or_device_ints(rows, "rows", device)
        n = rows_np.shape[0] if rows_np is not None else rows_t.shape[0]  # type: ignore[union-attr]
        if n != num_tokens:
            raise BlockTableError(f"rows has {n} entries, positions {num_tokens}")
        if rows_np is not None and n:
            lo, hi = int(rows_np.min()), int(rows_np.max())
            if lo < 0 or hi >= max_num_reqs:
                bad = lo if lo < 0 else hi
                raise BlockTableIndexError(f"row {bad} out of range [0, {max_num_reqs})")
        rows_out: Index | None = rows_t
        if rows_np is not None:
            rows_out = rows_np if on_cpu else _to_device(rows_np, device)
    else:
        qsl_np, qsl_t = host_or_device_ints(query_start_loc, "query_start_loc", device)
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
    pos_out: Index | None = pos_t
    if pos_np is not None:
        pos_out = pos_np if on_cpu else _to_device(pos_np, device)
    assert pos_out is not None and rows_out is not None
    return pos_out, rows_out


def slot_mapping_into(
    pos: Index,
    rows: Index,
    *,
    block_size: int,
    table: torch.Tensor,
    out: torch.Tensor,
    table_np: npt.NDArray[np.int32] | None,
    out_np: npt.NDArray[np.int64] | None,
) -> None:
    """Write the slots of the tokens ``(rows, pos)`` into ``out`` and pad the
    rest of it. ``table``/``out`` are the device mirror and buffer; on the CPU
    numpy path (``pos`` a numpy array), ``table_np``/``out_np`` are numpy views
    of the same memory."""
    bs = block_size
    n = pos.shape[0]
    if isinstance(pos, np.ndarray):  # CPU device: numpy views of the same memory
        assert table_np is not None and out_np is not None
        if n:
            col = pos // bs
            ids = table_np[rows, col]
            np.multiply(ids, bs, out=out_np[:n], dtype=np.int64)
            out_np[:n] += pos - col * bs
        out_np[n:] = PAD_SLOT_ID
        return
    assert isinstance(rows, torch.Tensor)
    if n:
        tcol = torch.div(pos, bs, rounding_mode="floor")
        tids = table[rows, tcol].to(torch.int64)
        torch.mul(tids, bs, out=out[:n])
        out[:n].add_(pos - tcol * bs)
    out[n:].fill_(PAD_SLOT_ID)


def step_tokens(
    num_computed_tokens: Any, num_scheduled_tokens: Any, rows: Any
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64] | None, npt.NDArray[np.int64] | None]:
    """``(positions, rows, query_start_loc)`` for ``compute_slot_mapping`` from
    a step's per-request counts: per-token ``rows`` when the requests' rows are
    given (``query_start_loc`` None), else ``query_start_loc`` (request ``i`` in
    row ``i``; ``rows`` None). Row values are checked by the slot mapping."""
    positions, qsl = step_positions(num_computed_tokens, num_scheduled_tokens)
    if rows is None:
        return positions, None, qsl
    rows_np, _ = host_or_device_ints(rows, "rows", torch.device("cpu"))
    assert rows_np is not None
    if rows_np.shape[0] != qsl.shape[0] - 1:
        raise BlockTableError(
            f"rows has {rows_np.shape[0]} entries, num_scheduled_tokens {qsl.shape[0] - 1}"
        )
    return positions, np.repeat(rows_np, np.diff(qsl)), None
