"""Baseline for the benchmarks: a small pure-Python block pool written the
way vLLM 0.33.0 writes its own (one slotted object per block, free-queue
links as object pointers, a dict from salted hash to block). Our own code,
kept only to measure kvcoord against the cost model it replaces.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, eq=False)
class Block:
    block_id: int
    ref_cnt: int = 0
    key: bytes | None = None
    prev: Block | None = None
    next: Block | None = None


class FreeList:
    def __init__(self, blocks: list[Block]) -> None:
        self.head = Block(-1)
        self.tail = Block(-1)
        self.size = len(blocks)
        prev = self.head
        for b in blocks:
            prev.next = b
            b.prev = prev
            prev = b
        prev.next = self.tail
        self.tail.prev = prev

    def popleft_n(self, n: int) -> list[Block]:
        out = []
        cur = self.head.next
        for _ in range(n):
            assert cur is not None
            nxt = cur.next
            cur.prev = cur.next = None
            out.append(cur)
            cur = nxt
        self.head.next = cur
        assert cur is not None
        cur.prev = self.head
        self.size -= n
        return out

    def remove(self, b: Block) -> None:
        assert b.prev is not None and b.next is not None
        b.prev.next = b.next
        b.next.prev = b.prev
        b.prev = b.next = None
        self.size -= 1

    def _link_before(self, anchor: Block, blocks: list[Block]) -> None:
        prev = anchor.prev
        assert prev is not None
        for b in blocks:
            prev.next = b
            b.prev = prev
            prev = b
        prev.next = anchor
        anchor.prev = prev
        self.size += len(blocks)

    def append_n(self, blocks: list[Block]) -> None:
        if blocks:
            self._link_before(self.tail, blocks)

    def prepend_n(self, blocks: list[Block]) -> None:
        if blocks:
            first = self.head.next
            assert first is not None
            self._link_before(first, blocks)


class VllmStylePool:
    def __init__(self, num_blocks: int) -> None:
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free = FreeList(self.blocks)
        self.cached: dict[bytes, Block] = {}
        self.free.remove(self.blocks[0])  # null block

    def get_new_blocks(self, n: int) -> list[Block]:
        if n > self.free.size:
            raise ValueError(f"Cannot get {n} free blocks from the pool")
        out = self.free.popleft_n(n)
        for b in out:
            if b.key is not None:
                self.cached.pop(b.key, None)
                b.key = None
            b.ref_cnt += 1
        return out

    def free_blocks(self, blocks: list[Block]) -> None:
        front, back = [], []
        for b in blocks:
            if b.block_id == 0:
                continue
            b.ref_cnt -= 1
            if b.ref_cnt == 0:
                (back if b.key is not None else front).append(b)
        self.free.prepend_n(front)
        self.free.append_n(back)

    def touch(self, blocks: list[Block]) -> None:
        for b in blocks:
            if b.ref_cnt == 0 and b.block_id != 0:
                self.free.remove(b)
            b.ref_cnt += 1

    def cache_full_blocks(self, blocks: list[Block], hashes: list[bytes], group: int) -> None:
        suffix = group.to_bytes(4, "big")
        for b, h in zip(blocks, hashes, strict=True):
            key = h + suffix
            b.key = key
            self.cached.setdefault(key, b)

    def get_cached_block(self, h: bytes, groups: list[int]) -> list[Block] | None:
        out = []
        for g in groups:
            b = self.cached.get(h + g.to_bytes(4, "big"))
            if b is None:
                return None
            out.append(b)
        return out
