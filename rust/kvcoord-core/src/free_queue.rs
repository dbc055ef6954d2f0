//! The free-block queue: a doubly linked list threaded through a flat array of
//! `u32` links, one per block, plus two sentinels.
//!
//! The front is handed out next; the back is kept longest. The pool decides
//! who goes where (unhashed blocks to the front, cached blocks to the back,
//! which makes the back an LRU of reusable prefixes). Linking by index rather
//! than by pointer gives O(1) removal from the middle (a prefix hit on a free
//! cached block) without one heap object per block.
//!
//! # Implementation
//!
//! `links` has `capacity + 2` entries: one per block, then the head sentinel
//! at `capacity` and the tail sentinel at `capacity + 1`. An unlinked block has
//! both links set to [`NIL`]. The list is never circular; walking `next` from
//! the head reaches the tail after exactly `len` blocks.

use crate::ids::BlockId;

/// Link value of a block that is not in the queue.
const NIL: u32 = u32::MAX;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Link {
    /// Previous entry (block or head sentinel); `NIL` iff the block is unlinked.
    prev: u32,
    /// Next entry (block or tail sentinel); `NIL` iff the block is unlinked.
    next: u32,
}

const UNLINKED: Link = Link {
    prev: NIL,
    next: NIL,
};

/// Doubly linked queue of block ids, ordered front (next to hand out) to back.
#[derive(Clone, Debug)]
pub struct FreeQueue {
    /// One link per block, then the head and tail sentinels.
    /// Invariant: `links[b].prev == NIL` iff `links[b].next == NIL` iff block
    /// `b` is not in the queue; for linked entries `links[links[x].next].prev == x`.
    links: Vec<Link>,
    /// Number of blocks in the queue. Invariant: equals the number of blocks
    /// reached by walking `next` from the head sentinel to the tail sentinel.
    len: usize,
}

impl FreeQueue {
    /// A queue over `capacity` block ids holding none of them.
    ///
    /// # Panics
    /// If `capacity + 2` does not fit in a `u32` (the pool checks this first).
    pub fn new_empty(capacity: usize) -> Self {
        let cap = u32::try_from(capacity + 2).expect("capacity checked by the pool");
        let head = cap - 2;
        let tail = cap - 1;
        let mut links = vec![UNLINKED; capacity + 2];
        links[head as usize] = Link {
            prev: NIL,
            next: tail,
        };
        links[tail as usize] = Link {
            prev: head,
            next: NIL,
        };
        Self { links, len: 0 }
    }

    /// A queue holding blocks `first .. capacity` in ascending order.
    pub fn new_ascending(capacity: usize, first: u32) -> Self {
        let mut q = Self::new_empty(capacity);
        let head = q.head();
        let tail = q.tail();
        let first = first.min(capacity as u32);
        if first as usize == capacity {
            return q;
        }
        // Build the chain in one sequential pass (this is the whole cost of
        // constructing a large pool).
        for b in first..capacity as u32 {
            q.links[b as usize] = Link {
                prev: b.wrapping_sub(1),
                next: b + 1,
            };
        }
        q.links[first as usize].prev = head;
        q.links[capacity - 1].next = tail;
        q.links[head as usize].next = first;
        q.links[tail as usize].prev = capacity as u32 - 1;
        q.len = capacity - first as usize;
        q
    }

    #[inline]
    fn head(&self) -> u32 {
        (self.links.len() - 2) as u32
    }

    #[inline]
    fn tail(&self) -> u32 {
        (self.links.len() - 1) as u32
    }

    /// Number of block ids this queue can hold (the pool size).
    pub fn capacity(&self) -> usize {
        self.links.len() - 2
    }

    /// Number of blocks in the queue.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the queue is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `block` is in the queue.
    #[inline]
    pub fn contains(&self, block: BlockId) -> bool {
        self.links[block.index()].prev != NIL
    }

    /// The block that `pop_front` would return.
    pub fn front(&self) -> Option<BlockId> {
        let first = self.links[self.head() as usize].next;
        (first != self.tail()).then_some(BlockId(first))
    }

    /// Link `block` between the adjacent entries `prev` and `next`.
    #[inline]
    fn link_between(&mut self, prev: u32, block: u32, next: u32) {
        debug_assert_eq!(
            self.links[block as usize], UNLINKED,
            "block {block} already linked"
        );
        debug_assert_eq!(self.links[prev as usize].next, next);
        self.links[block as usize] = Link { prev, next };
        self.links[prev as usize].next = block;
        self.links[next as usize].prev = block;
        self.len += 1;
    }

    /// Remove and return the front block.
    #[inline]
    pub fn pop_front(&mut self) -> Option<BlockId> {
        let block = self.front()?;
        self.remove(block);
        Some(block)
    }

    /// Remove the first `n` blocks, calling `each` on them in queue order.
    ///
    /// # Panics
    /// If fewer than `n` blocks are queued (callers check first).
    #[inline]
    pub fn pop_front_n_with(&mut self, n: usize, mut each: impl FnMut(BlockId)) {
        assert!(n <= self.len, "pop_front_n({n}) on a queue of {}", self.len);
        if n == 0 {
            return;
        }
        let head = self.head();
        let mut cur = self.links[head as usize].next;
        for _ in 0..n {
            let next = self.links[cur as usize].next;
            self.links[cur as usize] = UNLINKED;
            each(BlockId(cur));
            cur = next;
        }
        self.links[head as usize].next = cur;
        self.links[cur as usize].prev = head;
        self.len -= n;
    }

    /// Remove the first `n` blocks and append them, in queue order, to `out`.
    ///
    /// # Panics
    /// If fewer than `n` blocks are queued (callers check first).
    pub fn pop_front_n(&mut self, n: usize, out: &mut Vec<BlockId>) {
        assert!(n <= self.len, "pop_front_n({n}) on a queue of {}", self.len);
        if n == 0 {
            return;
        }
        let head = self.head();
        let mut cur = self.links[head as usize].next;
        out.reserve(n);
        for _ in 0..n {
            let next = self.links[cur as usize].next;
            self.links[cur as usize] = UNLINKED;
            out.push(BlockId(cur));
            cur = next;
        }
        self.links[head as usize].next = cur;
        self.links[cur as usize].prev = head;
        self.len -= n;
    }

    /// Put `block` at the back (kept longest).
    #[inline]
    pub fn push_back(&mut self, block: BlockId) {
        let tail = self.tail();
        let last = self.links[tail as usize].prev;
        self.link_between(last, block.0, tail);
    }

    /// Put `block` at the front (handed out next).
    #[inline]
    pub fn push_front(&mut self, block: BlockId) {
        let head = self.head();
        let first = self.links[head as usize].next;
        self.link_between(head, block.0, first);
    }

    /// Link `block` immediately before `anchor`, which must be queued.
    ///
    /// # Panics
    /// If `anchor` is not in the queue.
    #[inline]
    pub fn insert_before(&mut self, anchor: BlockId, block: BlockId) {
        let prev = self.links[anchor.index()].prev;
        assert!(prev != NIL, "insert_before an unqueued anchor {anchor}");
        self.link_between(prev, block.0, anchor.0);
    }

    /// Put `blocks`, in the given order, in front of the current front.
    pub fn prepend_all(&mut self, blocks: &[BlockId]) {
        for &b in blocks.iter().rev() {
            self.push_front(b);
        }
    }

    /// Put `blocks`, in the given order, behind the current back.
    pub fn append_all(&mut self, blocks: &[BlockId]) {
        for &b in blocks {
            self.push_back(b);
        }
    }

    /// Unlink `block` from wherever it is in the queue.
    ///
    /// # Panics
    /// If `block` is not in the queue (callers check with [`Self::contains`]).
    #[inline]
    pub fn remove(&mut self, block: BlockId) {
        let Link { prev, next } = self.links[block.index()];
        assert!(
            prev != NIL,
            "remove of block {block}, which is not in the free queue"
        );
        self.links[prev as usize].next = next;
        self.links[next as usize].prev = prev;
        self.links[block.index()] = UNLINKED;
        self.len -= 1;
    }

    /// Iterate the queue front to back.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            queue: self,
            cur: self.links[self.head() as usize].next,
        }
    }

    /// Check the structural invariants; returns a description of the first
    /// violation found.
    pub fn check_invariants(&self) -> Result<(), String> {
        let head = self.head();
        let tail = self.tail();
        if self.links[head as usize].prev != NIL || self.links[tail as usize].next != NIL {
            return Err("sentinel has an outer link".into());
        }
        let mut prev = head;
        let mut cur = self.links[head as usize].next;
        let mut walked = 0usize;
        while cur != tail {
            if cur == NIL || cur >= head {
                return Err(format!("broken next link after entry {prev}"));
            }
            if self.links[cur as usize].prev != prev {
                return Err(format!(
                    "block {cur}: prev link {} != {prev}",
                    self.links[cur as usize].prev
                ));
            }
            walked += 1;
            if walked > self.capacity() {
                return Err("cycle in the free queue".into());
            }
            prev = cur;
            cur = self.links[cur as usize].next;
        }
        if self.links[tail as usize].prev != prev {
            return Err("tail sentinel's prev link is stale".into());
        }
        if walked != self.len {
            return Err(format!("walked {walked} blocks but len is {}", self.len));
        }
        let linked = self.links[..self.capacity()]
            .iter()
            .filter(|l| l.prev != NIL)
            .count();
        if linked != self.len {
            return Err(format!(
                "{linked} blocks carry links but len is {}",
                self.len
            ));
        }
        Ok(())
    }

    /// Heap bytes used by the links.
    pub fn heap_bytes(&self) -> usize {
        self.links.capacity() * std::mem::size_of::<Link>()
    }
}

impl<'a> IntoIterator for &'a FreeQueue {
    type Item = BlockId;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

/// Front-to-back iterator over a [`FreeQueue`].
pub struct Iter<'a> {
    queue: &'a FreeQueue,
    cur: u32,
}

impl Iterator for Iter<'_> {
    type Item = BlockId;

    fn next(&mut self) -> Option<BlockId> {
        if self.cur == self.queue.tail() {
            return None;
        }
        let b = self.cur;
        self.cur = self.queue.links[b as usize].next;
        Some(BlockId(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(q: &FreeQueue) -> Vec<u32> {
        q.iter().map(|b| b.0).collect()
    }

    #[test]
    fn ascending_construction() {
        let q = FreeQueue::new_ascending(5, 1);
        assert_eq!(ids(&q), vec![1, 2, 3, 4]);
        assert_eq!(q.len(), 4);
        assert!(!q.contains(BlockId(0)));
        q.check_invariants().unwrap();
        let empty = FreeQueue::new_ascending(1, 1);
        assert!(empty.is_empty());
        empty.check_invariants().unwrap();
    }

    #[test]
    fn pop_remove_append() {
        // Queue surgery scenario: pop, remove from the middle, append, drain.
        let mut q = FreeQueue::new_ascending(5, 0);
        assert_eq!(q.pop_front(), Some(BlockId(0)));
        q.remove(BlockId(2));
        assert_eq!(ids(&q), vec![1, 3, 4]);
        q.push_back(BlockId(2));
        assert_eq!(ids(&q), vec![1, 3, 4, 2]);
        q.check_invariants().unwrap();
        for expect in [1, 3, 4, 2] {
            assert_eq!(q.pop_front(), Some(BlockId(expect)));
        }
        assert_eq!(q.pop_front(), None);
        q.check_invariants().unwrap();
    }

    #[test]
    fn batch_prepend_keeps_order() {
        let mut q = FreeQueue::new_empty(6);
        q.push_back(BlockId(0));
        q.prepend_all(&[BlockId(4), BlockId(5)]);
        q.prepend_all(&[BlockId(1), BlockId(2)]);
        assert_eq!(ids(&q), vec![1, 2, 4, 5, 0]);
        q.append_all(&[BlockId(3)]);
        assert_eq!(ids(&q), vec![1, 2, 4, 5, 0, 3]);
        q.remove(BlockId(4));
        q.insert_before(BlockId(0), BlockId(4));
        assert_eq!(ids(&q), vec![1, 2, 5, 4, 0, 3]);
        q.check_invariants().unwrap();
    }

    #[test]
    fn pop_front_n_in_order() {
        let mut q = FreeQueue::new_empty(6);
        q.append_all(&[1, 3, 5, 4, 0, 2].map(BlockId));
        let mut out = Vec::new();
        q.pop_front_n(0, &mut out);
        assert!(out.is_empty());
        q.pop_front_n(1, &mut out);
        q.pop_front_n(2, &mut out);
        assert_eq!(out, [1, 3, 5].map(BlockId));
        q.pop_front_n(3, &mut out);
        assert_eq!(out.len(), 6);
        assert!(q.is_empty());
        assert!(!q.contains(BlockId(4)));
        q.check_invariants().unwrap();
    }

    #[test]
    #[should_panic(expected = "not in the free queue")]
    fn remove_unlinked_panics() {
        let mut q = FreeQueue::new_empty(3);
        q.remove(BlockId(1));
    }
}
