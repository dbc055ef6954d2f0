//! `LevelQueue`: the free blocks of a non-default eviction policy, as up to
//! [`MAX_LEVELS`] doubly linked lists threaded through one flat array of
//! `u32` links (eight bytes per block, like [`FreeQueue`](crate::FreeQueue)).
//!
//! Level 0 is reused first; within a level the front is reused first. A
//! policy decides which level a freed cached block joins (at its back);
//! unhashed blocks always join the front of level 0, in the order vLLM
//! prepends them. Handing out takes the front of the lowest non-empty level.
//!
//! # Implementation
//!
//! `links` has one entry per block, then a head and a tail sentinel per
//! physical list (`capacity + 2p`, `capacity + 2p + 1`). `order` maps a
//! logical level to its physical list, so aging (every level moves one down,
//! level 1 merging behind level 0) is one splice and a rotation of `order`,
//! never a walk over blocks. A block's list is not stored: removal needs only
//! its neighbours.

use crate::ids::BlockId;

/// Most levels a policy may use.
pub const MAX_LEVELS: usize = 16;

/// Link value of a block that is not queued.
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

/// Free blocks in levels, level 0 reused first.
#[derive(Clone, Debug)]
pub struct LevelQueue {
    /// One link per block, then two sentinels per physical list.
    /// Invariant: a block's `prev == NIL` iff its `next == NIL` iff it is not
    /// queued; for linked entries `links[links[x].next].prev == x`.
    links: Vec<Link>,
    /// Number of block ids (the pool size).
    capacity: u32,
    /// Logical level -> physical list. Invariant: a permutation of
    /// `0..levels`.
    order: [u8; MAX_LEVELS],
    /// Number of levels in use, `1..=MAX_LEVELS`.
    levels: usize,
    /// Blocks queued over all levels. Invariant: equals the number of blocks
    /// reached by walking every list.
    len: usize,
}

impl LevelQueue {
    /// An empty queue over `capacity` block ids with `levels` levels
    /// (clamped to `1..=MAX_LEVELS`).
    ///
    /// # Panics
    /// If the sentinels' indices do not fit in a `u32` (the pool checks the
    /// size first).
    pub fn new_empty(capacity: usize, levels: usize) -> Self {
        let levels = levels.clamp(1, MAX_LEVELS);
        let cap = u32::try_from(capacity + 2 * MAX_LEVELS).expect("capacity checked by the pool");
        let capacity = cap - 2 * MAX_LEVELS as u32;
        let mut links = vec![UNLINKED; capacity as usize + 2 * levels];
        for p in 0..levels as u32 {
            let head = capacity + 2 * p;
            links[head as usize] = Link {
                prev: NIL,
                next: head + 1,
            };
            links[head as usize + 1] = Link {
                prev: head,
                next: NIL,
            };
        }
        let mut order = [0u8; MAX_LEVELS];
        for (i, o) in order.iter_mut().enumerate() {
            *o = i as u8;
        }
        Self {
            links,
            capacity,
            order,
            levels,
            len: 0,
        }
    }

    /// A queue holding blocks `first .. capacity` ascending, all at level 0.
    pub fn new_ascending(capacity: usize, first: u32, levels: usize) -> Self {
        let mut q = Self::new_empty(capacity, levels);
        let cap = q.capacity;
        if first >= cap {
            return q;
        }
        // One sequential pass, as for the LRU queue.
        let head = q.head_of(0);
        for b in first..cap {
            q.links[b as usize] = Link {
                // `first`'s is replaced by the head below (no count wraps).
                prev: b.wrapping_sub(1),
                next: b + 1,
            };
        }
        q.links[first as usize].prev = head;
        q.links[cap as usize - 1].next = head + 1;
        q.links[head as usize].next = first;
        q.links[head as usize + 1].prev = cap - 1;
        q.len = (cap - first) as usize;
        q
    }

    #[inline]
    fn head_of(&self, level: usize) -> u32 {
        self.capacity + 2 * u32::from(self.order[level])
    }

    /// Number of levels.
    pub fn levels(&self) -> usize {
        self.levels
    }

    /// Number of block ids this queue can hold (the pool size).
    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }

    /// Blocks queued.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no block is queued.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `block` is queued.
    #[inline]
    pub fn contains(&self, block: BlockId) -> bool {
        self.links[block.index()].prev != NIL
    }

    /// The front block of `level`, if any.
    pub fn front(&self, level: usize) -> Option<BlockId> {
        let head = self.head_of(level);
        let first = self.links[head as usize].next;
        (first != head + 1).then_some(BlockId(first))
    }

    /// Link an unqueued `block` between `prev` and `next`.
    #[inline]
    fn link(&mut self, block: BlockId, prev: u32, next: u32) {
        debug_assert!(!self.contains(block), "block {block} is already queued");
        self.links[block.index()] = Link { prev, next };
        self.links[prev as usize].next = block.0;
        self.links[next as usize].prev = block.0;
        self.len += 1;
    }

    /// Queue `block` at the back of `level` (reused last within it).
    #[inline]
    pub fn push_back(&mut self, block: BlockId, level: usize) {
        let tail = self.head_of(level) + 1;
        let prev = self.links[tail as usize].prev;
        self.link(block, prev, tail);
    }

    /// Queue `block` at the front of `level` (reused first within it).
    #[inline]
    pub fn push_front(&mut self, block: BlockId, level: usize) {
        let head = self.head_of(level);
        let next = self.links[head as usize].next;
        self.link(block, head, next);
    }

    /// Start staging blocks for the front of level 0; see [`Prepend`].
    pub fn begin_prepend(&mut self) -> Prepend<'_> {
        let head = self.head_of(0);
        Prepend {
            old_first: self.links[head as usize].next,
            head,
            last: head,
            staged: 0,
            links: &mut self.links,
            len: &mut self.len,
        }
    }

    /// Unlink `block` from wherever it is.
    ///
    /// # Panics
    /// If `block` is not queued (callers check with [`Self::contains`]).
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
            n <= self.len,
            "pop_front_into({n}) on a queue of {}",
            self.len
        );
        let mut level = 0;
        let mut i = 0;
        while i < n {
            let head = self.head_of(level);
            let tail = head + 1;
            let mut cur = self.links[head as usize].next;
            while i < n && cur != tail {
                let next = self.links[cur as usize].next;
                self.links[cur as usize] = UNLINKED;
                out[i] = BlockId(cur);
                on_pop(BlockId(cur));
                cur = next;
                i += 1;
            }
            // One splice per level instead of one per block.
            self.links[head as usize].next = cur;
            self.links[cur as usize].prev = head;
            level += 1;
        }
        self.len -= n;
    }

    /// Age the levels: every block moves one level down; level 1's blocks
    /// join the back of level 0 (behind its current members). O(levels).
    pub fn age(&mut self) {
        if self.levels < 2 {
            return;
        }
        let (h0, h1) = (self.head_of(0), self.head_of(1));
        let (t0, t1) = (h0 + 1, h1 + 1);
        let first = self.links[h1 as usize].next;
        if first != t1 {
            let last = self.links[t1 as usize].prev;
            let before = self.links[t0 as usize].prev;
            self.links[before as usize].next = first;
            self.links[first as usize].prev = before;
            self.links[last as usize].next = t0;
            self.links[t0 as usize].prev = last;
            self.links[h1 as usize].next = t1;
            self.links[t1 as usize].prev = h1;
        }
        // The emptied list becomes the top level.
        let emptied = self.order[1];
        self.order.copy_within(2..self.levels, 1);
        self.order[self.levels - 1] = emptied;
    }

    /// Iterate in reuse order: level 0 front to back, then level 1, ...
    pub fn iter(&self) -> impl Iterator<Item = BlockId> + '_ {
        (0..self.levels).flat_map(move |l| self.iter_level(l))
    }

    /// Iterate one level front to back.
    pub fn iter_level(&self, level: usize) -> impl Iterator<Item = BlockId> + '_ {
        let head = self.head_of(level);
        let tail = head + 1;
        let mut cur = self.links[head as usize].next;
        std::iter::from_fn(move || {
            if cur == tail {
                return None;
            }
            let b = cur;
            cur = self.links[b as usize].next;
            Some(BlockId(b))
        })
    }

    /// Check the structural invariants; returns the first violation found.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut seen = [false; MAX_LEVELS];
        for &p in &self.order[..self.levels] {
            if p as usize >= self.levels || std::mem::replace(&mut seen[p as usize], true) {
                return Err(format!("level order {:?} is not a permutation", self.order));
            }
        }
        let mut walked = 0usize;
        for level in 0..self.levels {
            let head = self.head_of(level);
            let tail = head + 1;
            if self.links[head as usize].prev != NIL || self.links[tail as usize].next != NIL {
                return Err(format!("level {level}: sentinel has an outer link"));
            }
            let mut prev = head;
            let mut cur = self.links[head as usize].next;
            while cur != tail {
                if cur == NIL || cur >= self.capacity {
                    return Err(format!("level {level}: broken next link after {prev}"));
                }
                if self.links[cur as usize].prev != prev {
                    return Err(format!("block {cur}: stale prev link"));
                }
                walked += 1;
                if walked > self.capacity as usize {
                    return Err("cycle in the level queue".into());
                }
                prev = cur;
                cur = self.links[cur as usize].next;
            }
            if self.links[tail as usize].prev != prev {
                return Err(format!("level {level}: tail's prev link is stale"));
            }
        }
        if walked != self.len {
            return Err(format!("walked {walked} blocks but len is {}", self.len));
        }
        let linked = self.links[..self.capacity as usize]
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

/// Blocks being queued in front of level 0, in the order staged (the first
/// reused first): two link writes per block, one splice at
/// [`commit`](Self::commit). Dropped uncommitted, it unstages every block and
/// leaves the queue as it was (how `free_blocks` undoes a refused call).
/// Only unqueued blocks may be staged, each once.
pub struct Prepend<'q> {
    links: &'q mut [Link],
    len: &'q mut usize,
    /// Level 0's head sentinel.
    head: u32,
    /// Level 0's first block (or its tail) before the batch.
    old_first: u32,
    /// Last staged block, or `head` while none is.
    last: u32,
    staged: usize,
}

impl Prepend<'_> {
    /// Stage `block` after the ones already staged.
    #[inline]
    pub fn push(&mut self, block: BlockId) {
        debug_assert!(
            self.links[block.index()].prev == NIL,
            "block {block} is already queued"
        );
        self.links[self.last as usize].next = block.0;
        self.links[block.index()] = Link {
            prev: self.last,
            next: NIL,
        };
        self.last = block.0;
        self.staged += 1;
    }

    /// Splice the staged blocks in before level 0's old first block.
    pub fn commit(mut self) {
        let links = &mut *self.links;
        links[self.last as usize].next = self.old_first;
        links[self.old_first as usize].prev = self.last;
        *self.len += self.staged;
        // Nothing left for `drop` to undo.
        self.last = self.head;
    }
}

impl Drop for Prepend<'_> {
    /// Without a commit, put the queue back exactly as it was.
    fn drop(&mut self) {
        if self.last == self.head {
            return;
        }
        let links = &mut *self.links;
        let mut cur = links[self.head as usize].next;
        loop {
            let next = links[cur as usize].next;
            links[cur as usize] = UNLINKED;
            if cur == self.last {
                break;
            }
            cur = next;
        }
        links[self.head as usize].next = self.old_first;
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
        batch.push(BlockId(2));
        batch.push(BlockId(6));
        batch.commit();
        q.begin_prepend().commit();
        q.check_invariants().unwrap();
        assert_eq!(ids(&q), vec![2, 6, 7, 1, 3, 4, 5]);
        let before = q.clone();
        let mut batch = q.begin_prepend();
        batch.push(BlockId(0));
        drop(batch);
        assert_eq!(q.links, before.links);
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
