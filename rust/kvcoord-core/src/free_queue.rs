//! The free-block queue: vLLM's LRU order of the pool's free blocks, one
//! [`LinkedLists`] list.
//!
//! The front is handed out next; the back is kept longest. The pool decides
//! who goes where (unhashed blocks to the front, cached blocks to the back,
//! which makes the back an LRU of reusable prefixes). The list's links are
//! indices, so removal from the middle (a prefix hit on a free cached block)
//! is O(1) without one heap object per block; the structure and its
//! invariants are [`LinkedLists`]'s.

use crate::ids::BlockId;
use crate::linked_lists::{Batch, Iter, LinkedLists};

/// The one list of the queue's [`LinkedLists`].
const LIST: usize = 0;

/// Doubly linked queue of block ids, ordered front (next to hand out) to back.
#[derive(Clone, Debug)]
pub struct FreeQueue {
    /// One list over the pool's block ids.
    list: LinkedLists,
}

impl FreeQueue {
    /// A queue over `capacity` block ids holding none of them.
    ///
    /// # Panics
    /// If `capacity + 2` does not fit in a `u32` (the pool checks this first).
    pub fn new_empty(capacity: usize) -> Self {
        Self {
            list: LinkedLists::new(capacity, 1),
        }
    }

    /// A queue holding blocks `first .. capacity` in ascending order.
    pub fn new_ascending(capacity: usize, first: u32) -> Self {
        Self {
            list: LinkedLists::new_ascending(capacity, 1, first),
        }
    }

    /// Number of block ids this queue can hold (the pool size).
    pub fn capacity(&self) -> usize {
        self.list.capacity()
    }

    /// Number of blocks in the queue.
    #[inline]
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether the queue is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Whether `block` is in the queue.
    #[inline]
    pub fn contains(&self, block: BlockId) -> bool {
        self.list.contains(block)
    }

    /// The block that `pop_front_into` would hand out first.
    pub fn front(&self) -> Option<BlockId> {
        self.list.front(LIST)
    }

    /// Remove the first `out.len()` blocks, writing them to `out` in queue
    /// order and passing each to `on_pop` (which lets the pool update its
    /// metadata in the same loop).
    ///
    /// # Panics
    /// If fewer than `out.len()` blocks are queued (callers check first).
    #[inline]
    pub fn pop_front_into(&mut self, out: &mut [BlockId], on_pop: impl FnMut(BlockId)) {
        let n = out.len();
        assert!(
            n <= self.len(),
            "pop_front_into({n}) on a queue of {}",
            self.len()
        );
        self.list.pop_front_into(LIST, out, on_pop);
    }

    /// Start queueing a batch of blocks, each for the front or the back;
    /// see [`Batch`].
    pub fn begin_enqueue(&mut self) -> Batch<'_> {
        self.list.begin_batch(LIST)
    }

    /// Unlink `block` from wherever it is in the queue.
    ///
    /// # Panics
    /// If `block` is not in the queue (callers check with [`Self::contains`]).
    #[inline]
    pub fn remove(&mut self, block: BlockId) {
        self.list.remove(block);
    }

    /// The entries either side of `block` in the queue, front side first
    /// (`None` for an end of the queue); `None` when `block` is not queued.
    pub fn neighbours(&self, block: BlockId) -> Option<(Option<BlockId>, Option<BlockId>)> {
        self.list.neighbours(block)
    }

    /// Iterate the queue front to back.
    pub fn iter(&self) -> Iter<'_> {
        self.list.iter(LIST)
    }

    /// Check the structural invariants; returns a description of the first
    /// violation found.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.list.lists() != 1 {
            return Err(format!("a free queue of {} lists", self.list.lists()));
        }
        self.list.check_invariants()
    }

    /// Heap bytes used by the links.
    pub fn heap_bytes(&self) -> usize {
        self.list.heap_bytes()
    }
}

impl<'a> IntoIterator for &'a FreeQueue {
    type Item = BlockId;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
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

    #[test]
    fn ascending_construction() {
        let q = FreeQueue::new_ascending(5, 1);
        assert_eq!(ids(&q), vec![1, 2, 3, 4]);
        assert_eq!((q.len(), q.capacity()), (4, 5));
        assert!(!q.contains(BlockId(0)));
        q.check_invariants().unwrap();
        let empty = FreeQueue::new_ascending(1, 1);
        assert!(empty.is_empty());
        empty.check_invariants().unwrap();
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
        assert_eq!(
            q.neighbours(BlockId(5)),
            Some((Some(BlockId(2)), Some(BlockId(0))))
        );
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
}
