"""`KVCacheBlocks`: block ids per KV cache group, as the manager returns them.

The type is built in Rust (:class:`kvcoord._core.KVCacheBlocks`) straight
from the core's output, so no block id becomes a Python int on the hot path.
Its contract:

* immutable; ``num_groups``;
* ``arrays()``: one read-only ``int32`` array per group (views of ``flat``);
  0 is the null block;
* ``flat`` (read-only ``int32``, group 0 first) and ``offsets`` (``int64``,
  ``num_groups + 1`` entries): group ``g`` is ``flat[offsets[g]:offsets[g+1]]``;
* ``get_block_ids()``: fresh Python lists per group (vLLM's shape, a
  convenience view: not for hot paths);
* ``is_empty()``, ``==``, ``+`` (per-group concatenation), ``repr``; no
  ``len`` (ambiguous);
* ``KVCacheBlocks.from_lists(...)`` / ``KVCacheBlocks.from_arrays(...)``
  validate (integer dtype, 1-D, non-negative, 32-bit), so any instance can
  be trusted by a consumer without re-validation; ``KVCacheBlocks(per_group)``
  accepts either form; ``KVCacheBlocks.gather(...)`` assembles a result from
  groups of other results (no validation needed).

NOTE: the numpy arrays are made on first access and cached, so a result that
is never read (the common decode step) costs no numpy object.
"""

from __future__ import annotations

from kvcoord._core import KVCacheBlocks

__all__ = ["KVCacheBlocks"]
