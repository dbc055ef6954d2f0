"""Block tables and slot mappings: the tensors attention kernels read.

Attention kernels read a request's KV cache through a *block table* (one row
of block ids per batch row) and write the new tokens' KV through a *slot
mapping* (one physical slot per scheduled token). This package turns the block
ids a manager hands out into those two tensors.

* :class:`BlockTable` (:mod:`~kvcoord.block_table.table`) keeps one int32
  table ``[max_num_reqs, width]`` on the host (a numpy view over a torch CPU
  tensor, pinned when the device is CUDA) and a mirror of it on the device.
  Row operations (``add_row``, ``append_row``, ``clear_row``, ``move_row``,
  ``swap_row``) change the host side only, one vectorised copy per row
  (``add_rows`` and ``append_rows`` write a whole batch with one scatter);
  ``commit`` copies the used rows to the device with a non-blocking copy.
* :class:`MultiGroupBlockTable` (:mod:`~kvcoord.block_table.multi_group`)
  holds one :class:`BlockTable` per KV cache group (block sizes may differ)
  and updates all of them from manager results: one
  :class:`~kvcoord.KVCacheBlocks` per row (``append_row``/``add_row``), or a
  whole scheduler step's results at once (``append_blocks``/``add_blocks``).
* Slot mapping (:mod:`~kvcoord.block_table.slots`): for every scheduled token
  at position ``p`` of batch row ``r``, ``slot = table[r, p // B] * B + p % B``
  (int64, ``B`` the table's block size) from the committed device table,
  without a Python loop over tokens; the rest of the
  ``[max_num_batched_tokens]`` buffer holds :data:`PAD_SLOT_ID` (-1).
  ``compute_step_slot_mapping`` takes a step's per-request counts
  (:func:`step_positions` turns them into positions).
* Input ids (:mod:`~kvcoord.block_table.ids`): ids a caller passes as lists,
  tuples, numpy arrays or tensors are checked; a manager's
  :class:`~kvcoord.KVCacheBlocks` is trusted (the pool validated its ids) and
  written straight in from its int32 arrays.

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

Host/device hand-off: ``commit`` issues the copy and returns at once (no
stream or device synchronisation). On CUDA it records an event after the
copy; the next host-side row write waits for that event (only for the copy,
normally long finished) so that a write can never race an in-flight copy out
of pinned memory.

Modules import one way only: ``ids`` <- ``slots`` <- ``table`` <-
``multi_group``. torch is needed by this package only
(``pip install kvcoord[torch]``); ``import kvcoord`` works without it.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "kvcoord.block_table needs PyTorch; install it with `pip install kvcoord[torch]`"
    ) from exc

from kvcoord.block_table.multi_group import MultiGroupBlockTable
from kvcoord.block_table.slots import PAD_SLOT_ID, step_positions
from kvcoord.block_table.table import BlockTable, round_row_width

__all__ = [
    "PAD_SLOT_ID",
    "BlockTable",
    "MultiGroupBlockTable",
    "round_row_width",
    "step_positions",
]
