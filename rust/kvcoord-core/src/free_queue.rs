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
//! both links set to `NIL`. The list is never circular; walking `next` from
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
                // `first`'s is replaced by the head below (no count wraps).
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

    /// Remove the first `out.len()` blocks, writing them to `out` in queue
    /// order and passing each to `on_pop` (which lets the pool update its
    /// metadata in the same loop).
    ///
    /// # Panics
    /// If fewer than `out.len()` blocks are queued (callers check first).
    #[inline]
    pub fn pop_front_into(&mut self, out: &mut [BlockId], mut on_pop: impl FnMut(BlockId)) {
        let n = out.len();
        assert!(
            n <= self.len,
            "pop_front_into({n}) on a queue of {}",
            self.len
        );
        let head = self.head();
        let mut cur = self.links[head as usize].next;
        for slot in out.iter_mut() {
            let next = self.links[cur as usize].next;
            self.links[cur as usize] = UNLINKED;
            *slot = BlockId(cur);
            on_pop(BlockId(cur));
            cur = next;
        }
        // One splice for the whole batch instead of one per block.
        self.links[head as usize].next = cur;
        self.links[cur as usize].prev = head;
        self.len -= n;
    }

    /// Start queueing a batch of blocks; see [`Enqueue`].
    pub fn begin_enqueue(&mut self) -> Enqueue<'_> {
        let head = self.head();
        let tail = self.tail();
        Enqueue {
            old_first: self.links[head as usize].next,
            front_last: head,
            back_last: tail,
            staged: 0,
            links: &mut self.links,
            len: &mut self.len,
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

    /// The entries either side of `block` in the queue, front side first
    /// (`None` for an end of the queue); `None` when `block` is not queued.
    pub fn neighbours(&self, block: BlockId) -> Option<(Option<BlockId>, Option<BlockId>)> {
        let Link { prev, next } = *self.links.get(block.index())?;
        if prev == NIL {
            return None;
        }
        let inner = |e: u32| (e < self.head()).then_some(BlockId(e));
        Some((inner(prev), inner(next)))
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

/// A batch of blocks being queued: some for the front, some for the back,
/// each side in the order staged. [`commit`](Self::commit) splices the batch
/// in with O(1) link writes; dropping it uncommitted unstages every block,
/// leaving the queue as it was (how `free_blocks` undoes a rejected call).
///
/// Each side grows as a detached chain hanging off a sentinel: the front
/// chain off `head.next` (whose final value is the chain's first block), the
/// back chain off `tail.next`, which is otherwise always NIL and holds the
/// back chain's first block until the commit. Staging a block costs two link
/// writes and touches neither `len` nor the old ends of the queue.
///
/// Only blocks that are not queued may be staged, each at most once (the
/// pool stages a block when its count reaches zero, which happens once).
pub struct Enqueue<'q> {
    /// The queue's links, held as a slice (not through the `FreeQueue`) so
    /// the staging loop need not reload the `Vec` header after each write.
    links: &'q mut [Link],
    /// The queue's `len`, updated once at commit.
    len: &'q mut usize,
    /// The queue's first block (or the tail) before the batch.
    old_first: u32,
    /// Last block of the front chain, or `head` while it is empty.
    front_last: u32,
    /// Last block of the back chain, or `tail` while it is empty.
    back_last: u32,
    /// Blocks staged so far.
    staged: usize,
}

impl Enqueue<'_> {
    /// Stage `block` for the back (`to_back`) or the front of the queue.
    #[inline]
    pub fn push(&mut self, block: BlockId, to_back: bool) {
        debug_assert!(
            self.links[block.index()].prev == NIL,
            "block {block} is already queued"
        );
        let last = if to_back {
            &mut self.back_last
        } else {
            &mut self.front_last
        };
        let anchor = std::mem::replace(last, block.0);
        self.links[anchor as usize].next = block.0;
        self.links[block.index()] = Link {
            prev: anchor,
            next: NIL,
        };
        self.staged += 1;
    }

    /// Splice the staged blocks in: the front chain before the old first
    /// block, the back chain after the (then) last block.
    pub fn commit(mut self) {
        let (head, tail) = self.sentinels();
        let links = &mut *self.links;
        if self.front_last != head {
            links[self.front_last as usize].next = self.old_first;
            links[self.old_first as usize].prev = self.front_last;
        }
        if self.back_last != tail {
            // Read `tail.prev` only now: on an empty queue the back chain
            // goes after the front chain just linked.
            let back_first = std::mem::replace(&mut links[tail as usize].next, NIL);
            let last = links[tail as usize].prev;
            links[last as usize].next = back_first;
            links[back_first as usize].prev = last;
            links[self.back_last as usize].next = tail;
            links[tail as usize].prev = self.back_last;
        }
        *self.len += self.staged;
        // Nothing left for `drop` to undo.
        self.front_last = head;
        self.back_last = tail;
    }

    /// The head and tail sentinels' indices.
    #[inline]
    fn sentinels(&self) -> (u32, u32) {
        let n = self.links.len() as u32;
        (n - 2, n - 1)
    }

    /// Unlink every block of the chain starting at `first` and ending at
    /// `last` (a staged chain's blocks end with a NIL `next`).
    fn unstage(links: &mut [Link], first: u32, last: u32) {
        let mut cur = first;
        loop {
            let next = links[cur as usize].next;
            links[cur as usize] = UNLINKED;
            if cur == last {
                break;
            }
            cur = next;
        }
    }
}

impl Drop for Enqueue<'_> {
    /// Without a commit, put the queue back exactly as it was.
    fn drop(&mut self) {
        let (head, tail) = self.sentinels();
        let links = &mut *self.links;
        if self.front_last != head {
            let first = links[head as usize].next;
            Self::unstage(links, first, self.front_last);
            links[head as usize].next = self.old_first;
        }
        if self.back_last != tail {
            let first = std::mem::replace(&mut links[tail as usize].next, NIL);
            Self::unstage(links, first, self.back_last);
        }
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

    /// Stage `(block, to_back)` pairs and commit.
    fn enqueue(q: &mut FreeQueue, staged: &[(u32, bool)]) {
        let mut batch = q.begin_enqueue();
        for &(b, to_back) in staged {
            batch.push(BlockId(b), to_back);
        }
        batch.commit();
    }

    /// A batch to stage: `(block, to_back)` pairs.
    type Staged<'a> = &'a [(u32, bool)];

    /// The order `enqueue` must produce, on a plain `Vec`.
    fn model(queued: &[u32], staged: &[(u32, bool)]) -> Vec<u32> {
        let front = staged.iter().filter(|s| !s.1).map(|s| s.0);
        let back = staged.iter().filter(|s| s.1).map(|s| s.0);
        front.chain(queued.iter().copied()).chain(back).collect()
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
    fn neighbours_follow_the_links() {
        let mut q = FreeQueue::new_ascending(5, 1);
        let b = BlockId;
        assert_eq!(q.neighbours(b(1)), Some((None, Some(b(2)))));
        assert_eq!(q.neighbours(b(3)), Some((Some(b(2)), Some(b(4)))));
        assert_eq!(q.neighbours(b(4)), Some((Some(b(3)), None)));
        assert_eq!(q.neighbours(b(0)), None); // never queued
        assert_eq!(q.neighbours(b(9)), None); // out of range
        q.remove(b(2));
        assert_eq!(q.neighbours(b(2)), None);
        assert_eq!(q.neighbours(b(3)), Some((Some(b(1)), Some(b(4)))));
        let single = FreeQueue::new_ascending(2, 1);
        assert_eq!(single.neighbours(b(1)), Some((None, None)));
    }

    #[test]
    fn batch_keeps_order_on_each_side() {
        let cases: &[(&[u32], Staged)] = &[
            // Empty queue: the back chain must land after the front chain.
            (&[], &[(4, false), (5, true), (1, false), (2, true)]),
            (&[], &[(4, false), (5, false)]),
            (&[], &[(4, true), (5, true)]),
            (&[], &[]),
            // Non-empty queue: fronts before the old front, backs after the
            // old back.
            (&[7, 3], &[(4, false), (5, true), (1, false), (2, true)]),
            (&[7, 3], &[(9, false)]),
            (&[7, 3], &[(9, true)]),
            (&[0], &[(15, false), (14, true), (13, false)]),
        ];
        for &(queued, staged) in cases {
            let mut q = FreeQueue::new_empty(16);
            enqueue(
                &mut q,
                &queued.iter().map(|&b| (b, true)).collect::<Vec<_>>(),
            );
            enqueue(&mut q, staged);
            q.check_invariants().unwrap();
            assert_eq!(ids(&q), model(queued, staged), "{queued:?} {staged:?}");
        }
    }

    #[test]
    fn dropped_batch_leaves_the_queue_as_it_was() {
        for queued in [&[][..], &[7, 3][..]] {
            let mut q = FreeQueue::new_empty(16);
            enqueue(
                &mut q,
                &queued.iter().map(|&b| (b, true)).collect::<Vec<_>>(),
            );
            let before = q.clone();
            for staged in [
                &[(4, false), (5, true), (1, false)][..],
                &[(2, true)],
                &[(2, false)],
            ] {
                let mut batch = q.begin_enqueue();
                for &(b, to_back) in staged {
                    batch.push(BlockId(b), to_back);
                }
                drop(batch);
                assert_eq!(q.links, before.links, "{queued:?} {staged:?}");
                assert_eq!(q.len(), before.len());
                q.check_invariants().unwrap();
            }
        }
    }

    #[test]
    fn queue_surgery() {
        let mut q = FreeQueue::new_empty(6);
        enqueue(&mut q, &[(0, true)]);
        enqueue(&mut q, &[(4, false), (5, false)]);
        enqueue(&mut q, &[(1, false), (2, false)]);
        assert_eq!(ids(&q), vec![1, 2, 4, 5, 0]);
        enqueue(&mut q, &[(3, true)]);
        assert_eq!(ids(&q), vec![1, 2, 4, 5, 0, 3]);
        q.remove(BlockId(4));
        q.remove(BlockId(3));
        assert_eq!(ids(&q), vec![1, 2, 5, 0]);
        assert!(!q.contains(BlockId(4)));
        enqueue(&mut q, &[(4, true), (3, false)]);
        assert_eq!(ids(&q), vec![3, 1, 2, 5, 0, 4]);
        q.check_invariants().unwrap();
    }

    #[test]
    fn pop_front_into_in_order() {
        let mut q = FreeQueue::new_empty(6);
        enqueue(&mut q, &[1, 3, 5, 4, 0, 2].map(|b| (b, true)));
        let mut out = [BlockId::NULL; 6];
        q.pop_front_into(&mut out[..0], |_| {});
        q.check_invariants().unwrap();
        q.pop_front_into(&mut out[..1], |_| {});
        q.pop_front_into(&mut out[1..3], |_| {});
        assert_eq!(out[..3], [1, 3, 5].map(BlockId));
        assert_eq!(q.front(), Some(BlockId(4)));
        q.check_invariants().unwrap();
        q.pop_front_into(&mut out[3..], |_| {});
        assert_eq!(out, [1, 3, 5, 4, 0, 2].map(BlockId));
        assert!(q.is_empty());
        assert!(!q.contains(BlockId(4)));
        q.check_invariants().unwrap();
    }

    #[test]
    #[should_panic(expected = "pop_front_into(2) on a queue of 1")]
    fn pop_front_into_past_the_end_panics() {
        let mut q = FreeQueue::new_ascending(2, 1);
        q.pop_front_into(&mut [BlockId::NULL; 2], |_| {});
    }

    #[test]
    #[should_panic(expected = "not in the free queue")]
    fn remove_unlinked_panics() {
        let mut q = FreeQueue::new_empty(3);
        q.remove(BlockId(1));
    }
}
