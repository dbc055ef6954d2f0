//! `LevelQueue`: the free blocks of a non-default eviction policy, as up to
//! [`MAX_LEVELS`] lists of one [`LinkedLists`] (eight bytes per block, like
//! [`FreeQueue`](crate::FreeQueue)).
//!
//! Level 0 is reused first; within a level the front is reused first. A
//! policy decides which level a freed cached block joins (at its back);
//! unhashed blocks always join the front of level 0, in the order vLLM
//! prepends them. Handing out takes the front of the lowest non-empty level.
//!
//! # Implementation
//!
//! `order` maps a logical level to its list, so aging (every level moves one
//! down, level 1 merging behind level 0) is one splice and a rotation of
//! `order`, never a walk over blocks. A block's level is not stored: removal
//! needs only its neighbours.

use crate::ids::BlockId;
use crate::linked_lists::{Batch, LinkedLists};

/// Most levels a policy may use.
pub const MAX_LEVELS: usize = 16;

/// Free blocks in levels, level 0 reused first.
#[derive(Clone, Debug)]
pub struct LevelQueue {
    /// One list per level.
    lists: LinkedLists,
    /// Logical level -> list. Invariant: a permutation of `0..levels()`
    /// (entries past `levels()` unused).
    order: [u8; MAX_LEVELS],
}

impl LevelQueue {
    /// An empty queue over `capacity` block ids with `levels` levels
    /// (clamped to `1..=MAX_LEVELS`).
    ///
    /// # Panics
    /// If the sentinels' indices do not fit in a `u32` (the pool checks the
    /// size first).
    pub fn new_empty(capacity: usize, levels: usize) -> Self {
        Self::with_lists(LinkedLists::new(capacity, levels.clamp(1, MAX_LEVELS)))
    }

    /// A queue holding blocks `first .. capacity` ascending, all at level 0.
    pub fn new_ascending(capacity: usize, first: u32, levels: usize) -> Self {
        Self::with_lists(LinkedLists::new_ascending(
            capacity,
            levels.clamp(1, MAX_LEVELS),
            first,
        ))
    }

    fn with_lists(lists: LinkedLists) -> Self {
        let mut order = [0u8; MAX_LEVELS];
        for (i, o) in order.iter_mut().enumerate() {
            *o = i as u8;
        }
        Self { lists, order }
    }

    /// The list holding `level`.
    #[inline]
    fn list(&self, level: usize) -> usize {
        usize::from(self.order[level])
    }

    /// Number of levels.
    pub fn levels(&self) -> usize {
        self.lists.lists()
    }

    /// Number of block ids this queue can hold (the pool size).
    pub fn capacity(&self) -> usize {
        self.lists.capacity()
    }

    /// Blocks queued.
    #[inline]
    pub fn len(&self) -> usize {
        self.lists.len()
    }

    /// Whether no block is queued.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.lists.is_empty()
    }

    /// Whether `block` is queued.
    #[inline]
    pub fn contains(&self, block: BlockId) -> bool {
        self.lists.contains(block)
    }

    /// The front block of `level`, if any.
    pub fn front(&self, level: usize) -> Option<BlockId> {
        self.lists.front(self.list(level))
    }

    /// Queue `block` at the back of `level` (reused last within it).
    #[inline]
    pub fn push_back(&mut self, block: BlockId, level: usize) {
        self.lists.push_back(self.list(level), block);
    }

    /// Queue `block` at the front of `level` (reused first within it).
    #[inline]
    pub fn push_front(&mut self, block: BlockId, level: usize) {
        self.lists.push_front(self.list(level), block);
    }

    /// Start staging blocks for the front of level 0 (with
    /// [`Batch::push_front`], the first staged reused first); see [`Batch`].
    pub fn begin_prepend(&mut self) -> Batch<'_> {
        let list = self.list(0);
        self.lists.begin_batch(list)
    }

    /// Unlink `block` from wherever it is.
    ///
    /// # Panics
    /// If `block` is not queued (callers check with [`Self::contains`]).
    #[inline]
    pub fn remove(&mut self, block: BlockId) {
        self.lists.remove(block);
    }

    /// Remove the first `out.len()` blocks in reuse order (lowest level
    /// first, front first), writing them to `out` and passing each to
    /// `on_pop`.
    ///
    /// # Panics
    /// If fewer than `out.len()` blocks are queued (callers check first).
    #[inline]
    pub fn pop_front_into(&mut self, out: &mut [BlockId], mut on_pop: impl FnMut(BlockId)) {
        let n = out.len();
        assert!(
            n <= self.len(),
            "pop_front_into({n}) on a queue of {}",
            self.len()
        );
        let mut taken = 0;
        let mut level = 0;
        while taken < n {
            let list = self.list(level);
            taken += self
                .lists
                .pop_front_into(list, &mut out[taken..], &mut on_pop);
            level += 1;
        }
    }

    /// Age the levels: every block moves one level down; level 1's blocks
    /// join the back of level 0 (behind its current members). O(levels).
    pub fn age(&mut self) {
        let levels = self.levels();
        if levels < 2 {
            return;
        }
        self.lists.append(self.list(0), self.list(1));
        // The emptied list becomes the top level.
        let emptied = self.order[1];
        self.order.copy_within(2..levels, 1);
        self.order[levels - 1] = emptied;
    }

    /// Iterate in reuse order: level 0 front to back, then level 1, ...
    pub fn iter(&self) -> impl Iterator<Item = BlockId> + '_ {
        (0..self.levels()).flat_map(move |l| self.iter_level(l))
    }

    /// Iterate one level front to back.
    pub fn iter_level(&self, level: usize) -> impl Iterator<Item = BlockId> + '_ {
        self.lists.iter(self.list(level))
    }

    /// Check the structural invariants; returns the first violation found.
    pub fn check_invariants(&self) -> Result<(), String> {
        let levels = self.levels();
        if levels > MAX_LEVELS {
            return Err(format!("{levels} levels, more than {MAX_LEVELS}"));
        }
        let mut seen = [false; MAX_LEVELS];
        for &p in &self.order[..levels] {
            if p as usize >= levels || std::mem::replace(&mut seen[p as usize], true) {
                return Err(format!("level order {:?} is not a permutation", self.order));
            }
        }
        self.lists.check_invariants()
    }

    /// Heap bytes used by the links.
    pub fn heap_bytes(&self) -> usize {
        self.lists.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(q: &LevelQueue) -> Vec<u32> {
        q.iter().map(|b| b.0).collect()
    }

    fn level(q: &LevelQueue, l: usize) -> Vec<u32> {
        q.iter_level(l).map(|b| b.0).collect()
    }

    #[test]
    fn levels_order_reuse() {
        let mut q = LevelQueue::new_ascending(8, 1, 3);
        assert_eq!(ids(&q), vec![1, 2, 3, 4, 5, 6, 7]);
        let mut out = [BlockId::NULL; 7];
        q.pop_front_into(&mut out, |_| {});
        assert!(q.is_empty());
        q.push_back(BlockId(5), 2);
        q.push_back(BlockId(3), 1);
        q.push_back(BlockId(4), 1);
        q.push_back(BlockId(1), 0);
        q.push_front(BlockId(7), 0);
        q.check_invariants().unwrap();
        assert_eq!(ids(&q), vec![7, 1, 3, 4, 5]);
        let mut batch = q.begin_prepend();
        batch.push_front(BlockId(2));
        batch.push_front(BlockId(6));
        batch.commit();
        q.begin_prepend().commit();
        q.check_invariants().unwrap();
        assert_eq!(ids(&q), vec![2, 6, 7, 1, 3, 4, 5]);
        let before = q.clone();
        let mut batch = q.begin_prepend();
        batch.push_front(BlockId(0));
        drop(batch);
        assert_eq!(q.lists, before.lists);
        q.check_invariants().unwrap();
        q.remove(BlockId(2));
        q.remove(BlockId(6));
        assert_eq!(q.front(1), Some(BlockId(3)));
        q.remove(BlockId(3));
        let mut out = [BlockId::NULL; 3];
        q.pop_front_into(&mut out, |_| {});
        assert_eq!(out, [7, 1, 4].map(BlockId));
        assert_eq!(ids(&q), vec![5]);
        assert_eq!(q.front(1), None);
        q.check_invariants().unwrap();
    }

    #[test]
    fn aging_merges_level_one_behind_level_zero() {
        let mut q = LevelQueue::new_empty(10, 3);
        q.push_back(BlockId(1), 0);
        q.push_back(BlockId(2), 1);
        q.push_back(BlockId(3), 2);
        q.push_back(BlockId(4), 1);
        q.age();
        q.check_invariants().unwrap();
        assert_eq!(level(&q, 0), vec![1, 2, 4]);
        assert_eq!(level(&q, 1), vec![3]);
        assert!(level(&q, 2).is_empty());
        q.push_back(BlockId(5), 2);
        q.age();
        q.age();
        assert_eq!(level(&q, 0), vec![1, 2, 4, 3, 5]);
        q.check_invariants().unwrap();
        // Aging an empty level 1, and a one-level queue, changes nothing.
        let mut one = LevelQueue::new_ascending(4, 1, 1);
        one.age();
        assert_eq!(ids(&one), vec![1, 2, 3]);
        q.age();
        assert_eq!(ids(&q), vec![1, 2, 4, 3, 5]);
        q.check_invariants().unwrap();
    }
}
