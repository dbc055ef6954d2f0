"""`KVCacheBlocks`: block ids per KV cache group, as the manager returns them."""

from __future__ import annotations

__all__ = ["KVCacheBlocks"]


class KVCacheBlocks:
    """Block ids per KV cache group (``blocks[group][position]``; 0 is the
    null block). Treat as immutable; a plain slotted class because one is
    made per scheduled request per step."""

    __slots__ = ("blocks",)

    def __init__(self, blocks: tuple[list[int], ...]) -> None:
        self.blocks = blocks

    def __repr__(self) -> str:
        return f"KVCacheBlocks({self.blocks!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KVCacheBlocks) and self.blocks == other.blocks

    __hash__ = None  # type: ignore[assignment]

    def get_block_ids(self) -> tuple[list[int], ...]:
        """The ids per group (the lists themselves; do not mutate)."""
        return self.blocks

    @property
    def num_groups(self) -> int:
        return len(self.blocks)

    def is_empty(self) -> bool:
        return not any(self.blocks)

    def __add__(self, other: KVCacheBlocks) -> KVCacheBlocks:
        return KVCacheBlocks(tuple(a + b for a, b in zip(self.blocks, other.blocks, strict=True)))
