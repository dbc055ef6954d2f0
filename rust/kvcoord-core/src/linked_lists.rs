//! [`LinkedLists`]: disjoint doubly linked lists of block ids, threaded
//! through one flat array of `u32` links (eight bytes per block).
//!
//! Both free-block orders of the pool are built on it: the LRU
//! [`FreeQueue`](crate::FreeQueue) (one list) and the eviction policies'
//! [`LevelQueue`](crate::LevelQueue) (one list per level). Linking by index
//! rather than by pointer gives O(1) removal from the middle of a list (a
//! prefix hit on a free cached block) without one heap object per block,
//! and moving a whole list behind another is one splice.
//!
//! # Layout and invariants
//!
//! `links` has `capacity + 2 * lists` entries: one per block id, then a head
//! and a tail sentinel per list (list `l`'s head at `capacity + 2l`, its tail
//! right after). Between calls (no [`Batch`] open):
//!
//! * a block is in at most one list; an unlinked block has both links `NIL`,
//!   a linked block neither;
//! * for every linked entry `x` other than a tail,
//!   `links[links[x].next].prev == x`;
//! * a head's `prev` and a tail's `next` are `NIL`, and walking `next` from a
//!   list's head meets only blocks until it reaches that list's own tail (no
//!   list is circular or runs into another);
//! * `len` is the number of linked blocks over all lists.
//!
//! [`LinkedLists::check_invariants`] checks every one of these.

use crate::ids::BlockId;

/// Link value of an entry that is not linked.
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

/// A fixed number of doubly linked lists over the block ids
/// `0..capacity`, each id in at most one of them, each list ordered front
/// to back. Lists are named by their index, `0..lists()`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkedLists {
    /// One link per block id, then a head and a tail sentinel per list
    /// (see the module docs for the invariants).
    links: Vec<Link>,
    /// Number of block ids; also the index of list 0's head sentinel.
    capacity: u32,
    /// Blocks linked over all lists.
    len: usize,
}

impl LinkedLists {
    /// `lists` empty lists over the block ids `0..capacity`.
    ///
    /// # Panics
    /// If `lists` is 0, or if the sentinels' indices do not fit in a `u32`
    /// (the pool checks its size first).
    pub fn new(capacity: usize, lists: usize) -> Self {
        assert!(lists > 0, "LinkedLists needs at least one list");
        let entries = capacity + 2 * lists;
        u32::try_from(entries).expect("capacity checked by the pool");
        let capacity = capacity as u32;
        let mut links = vec![UNLINKED; entries];
        for l in 0..lists as u32 {
            let head = capacity + 2 * l;
            links[head as usize] = Link {
                prev: NIL,
                next: head + 1,
            };
            links[head as usize + 1] = Link {
                prev: head,
                next: NIL,
            };
        }
        Self {
            links,
            capacity,
            len: 0,
        }
    }

    /// Like [`Self::new`], with the blocks `first..capacity` in list 0 in
    /// ascending order.
    pub fn new_ascending(capacity: usize, lists: usize, first: u32) -> Self {
        let mut q = Self::new(capacity, lists);
        let cap = q.capacity;
        if first >= cap {
            return q;
        }
        let head = q.head(0);
        let tail = head + 1;
        // One sequential pass: this is the whole cost of constructing a
        // large pool.
        for b in first..cap {
            q.links[b as usize] = Link {
                // `first`'s is replaced by the head below (no count wraps).
                prev: b.wrapping_sub(1),
                next: b + 1,
            };
        }
        q.links[first as usize].prev = head;
        q.links[cap as usize - 1].next = tail;
        q.links[head as usize].next = first;
        q.links[tail as usize].prev = cap - 1;
        q.len = (cap - first) as usize;
        q
    }

    /// Index of `list`'s head sentinel; its tail is the next index.
    #[inline]
    fn head(&self, list: usize) -> u32 {
        debug_assert!(list < self.lists(), "list {list} of {}", self.lists());
        self.capacity + 2 * list as u32
    }

    /// Number of block ids the lists range over.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }

    /// Number of lists.
    #[inline]
    pub fn lists(&self) -> usize {
        (self.links.len() - self.capacity as usize) / 2
    }

    /// Blocks linked over all lists.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no block is linked.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `block` is in some list.
    #[inline]
    pub fn contains(&self, block: BlockId) -> bool {
        self.links[block.index()].prev != NIL
    }

    /// The front block of `list`, if any.
    #[inline]
    pub fn front(&self, list: usize) -> Option<BlockId> {
        let head = self.head(list);
        let first = self.links[head as usize].next;
        (first != head + 1).then_some(BlockId(first))
    }

    /// Link an unlinked `block` between the entries `prev` and `next`.
    #[inline]
    fn link(&mut self, block: BlockId, prev: u32, next: u32) {
        debug_assert!(!self.contains(block), "block {block} is already linked");
        self.links[block.index()] = Link { prev, next };
        self.links[prev as usize].next = block.0;
        self.links[next as usize].prev = block.0;
        self.len += 1;
    }

    /// Link the unlinked `block` at the back of `list`.
    #[inline]
    pub fn push_back(&mut self, list: usize, block: BlockId) {
        let tail = self.head(list) + 1;
        let prev = self.links[tail as usize].prev;
        self.link(block, prev, tail);
    }

    /// Link the unlinked `block` at the front of `list`.
    #[inline]
    pub fn push_front(&mut self, list: usize, block: BlockId) {
        let head = self.head(list);
        let next = self.links[head as usize].next;
        self.link(block, head, next);
    }

    /// Unlink `block` from whichever list holds it.
    ///
    /// # Panics
    /// If `block` is not linked (callers check with [`Self::contains`]).
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

    /// Unlink up to `out.len()` blocks from the front of `list`, writing them
    /// to the start of `out` in list order and passing each to `on_pop`
    /// (which lets the pool update its metadata in the same loop). Returns
    /// how many were taken: fewer than `out.len()` only when `list` ran out.
    #[inline]
    pub fn pop_front_into(
        &mut self,
        list: usize,
        out: &mut [BlockId],
        mut on_pop: impl FnMut(BlockId),
    ) -> usize {
        let head = self.head(list);
        let tail = head + 1;
        // A slice local, so the loop does not reload the Vec's header.
        let links = &mut self.links[..];
        let mut cur = links[head as usize].next;
        let mut taken = 0;
        for slot in out.iter_mut() {
            if cur == tail {
                break;
            }
            let next = links[cur as usize].next;
            links[cur as usize] = UNLINKED;
            *slot = BlockId(cur);
            on_pop(BlockId(cur));
            cur = next;
            taken += 1;
        }
        // One splice for the whole run instead of one per block.
        links[head as usize].next = cur;
        links[cur as usize].prev = head;
        self.len -= taken;
        taken
    }

    /// Move every block of list `from` to the back of list `to`, keeping
    /// their order; `from` ends empty. O(1).
    ///
    /// # Panics
    /// If `to == from`.
    pub fn append(&mut self, to: usize, from: usize) {
        assert_ne!(to, from, "append of list {to} to itself");
        let (h_from, h_to) = (self.head(from), self.head(to));
        let (t_from, t_to) = (h_from + 1, h_to + 1);
        let first = self.links[h_from as usize].next;
        if first == t_from {
            return;
        }
        let last = self.links[t_from as usize].prev;
        let before = self.links[t_to as usize].prev;
        self.links[before as usize].next = first;
        self.links[first as usize].prev = before;
        self.links[last as usize].next = t_to;
        self.links[t_to as usize].prev = last;
        self.links[h_from as usize].next = t_from;
        self.links[t_from as usize].prev = h_from;
    }

    /// The blocks either side of `block` in its list, front side first
    /// (`None` for an end of the list); `None` when `block` is not linked
    /// or out of range.
    pub fn neighbours(&self, block: BlockId) -> Option<(Option<BlockId>, Option<BlockId>)> {
        let Link { prev, next } = *self.links.get(block.index())?;
        if prev == NIL || block.0 >= self.capacity {
            return None;
        }
        let inner = |e: u32| (e < self.capacity).then_some(BlockId(e));
        Some((inner(prev), inner(next)))
    }

    /// Iterate `list` front to back.
    pub fn iter(&self, list: usize) -> Iter<'_> {
        let head = self.head(list);
        Iter {
            links: &self.links,
            cur: self.links[head as usize].next,
            tail: head + 1,
        }
    }

    /// Start linking a batch of blocks into `list`; see [`Batch`].
    pub fn begin_batch(&mut self, list: usize) -> Batch<'_> {
        let head = self.head(list);
        Batch {
            old_first: self.links[head as usize].next,
            head,
            front_last: head,
            back_last: head + 1,
            staged: 0,
            links: &mut self.links,
            len: &mut self.len,
        }
    }

    /// Check the invariants of the module docs; returns a description of
    /// the first violation found.
    pub fn check_invariants(&self) -> Result<(), String> {
        let cap = self.capacity as usize;
        if self.links.len() < cap + 2 || (self.links.len() - cap) % 2 != 0 {
            return Err(format!(
                "{} links for {cap} blocks: not one pair of sentinels per list",
                self.links.len()
            ));
        }
        let mut walked = 0usize;
        for list in 0..self.lists() {
            let head = self.head(list);
            let tail = head + 1;
            if self.links[head as usize].prev != NIL || self.links[tail as usize].next != NIL {
                return Err(format!("list {list}: a sentinel has an outer link"));
            }
            let mut prev = head;
            let mut cur = self.links[head as usize].next;
            while cur != tail {
                if cur == NIL || cur >= self.capacity {
                    return Err(format!("list {list}: broken next link after entry {prev}"));
                }
                if self.links[cur as usize].prev != prev {
                    return Err(format!(
                        "block {cur}: prev link {} != {prev}",
                        self.links[cur as usize].prev
                    ));
                }
                // No cycle can pass the check above: a block visited twice
                // would need the same predecessor both times, and so on
                // back to the head, which no block's next link reaches.
                walked += 1;
                prev = cur;
                cur = self.links[cur as usize].next;
            }
            if self.links[tail as usize].prev != prev {
                return Err(format!("list {list}: the tail's prev link is stale"));
            }
        }
        if walked != self.len {
            return Err(format!("walked {walked} blocks but len is {}", self.len));
        }
        let half_linked = self.links[..cap]
            .iter()
            .position(|l| (l.prev == NIL) != (l.next == NIL));
        if let Some(b) = half_linked {
            return Err(format!("block {b} has one link set and one NIL"));
        }
        let linked = self.links[..cap].iter().filter(|l| l.prev != NIL).count();
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

/// A batch of blocks being linked into one list: some for its front, some
/// for its back, each side in the order staged. [`commit`](Self::commit)
/// splices the batch in with O(1) link writes; dropping it uncommitted
/// unlinks every staged block again, leaving the lists as they were (how
/// the pool's `free_blocks` undoes a refused call).
///
/// Each side grows as a detached chain hanging off a sentinel: the front
/// chain off `head.next` (whose final value is the chain's first block), the
/// back chain off `tail.next`, which is otherwise always `NIL` and holds the
/// back chain's first block until the commit. Staging a block costs two link
/// writes and touches neither `len` nor the list's old ends.
///
/// Only unlinked blocks may be staged, each at most once (the pool stages a
/// block when its count reaches zero, which happens once per call).
pub struct Batch<'q> {
    /// The links, held as a slice (not through the `LinkedLists`) so the
    /// staging loop need not reload the `Vec` header after each write.
    links: &'q mut [Link],
    /// The lists' `len`, updated once at commit.
    len: &'q mut usize,
    /// The list's head sentinel; its tail is `head + 1`.
    head: u32,
    /// The list's first block (or its tail) before the batch.
    old_first: u32,
    /// Last block of the front chain, or `head` while it is empty.
    front_last: u32,
    /// Last block of the back chain, or the tail while it is empty.
    back_last: u32,
    /// Blocks staged so far.
    staged: usize,
}

impl Batch<'_> {
    /// Stage `block` for the back (`to_back`) or the front of the list.
    #[inline]
    pub fn push(&mut self, block: BlockId, to_back: bool) {
        debug_assert!(
            self.links[block.index()].prev == NIL,
            "block {block} is already linked"
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

    /// Stage `block` for the front of the list, after the front blocks
    /// staged so far.
    #[inline]
    pub fn push_front(&mut self, block: BlockId) {
        self.push(block, false);
    }

    /// Splice the staged blocks in: the front chain before the old first
    /// block, the back chain after the (then) last block.
    pub fn commit(mut self) {
        let (head, tail) = (self.head, self.head + 1);
        let links = &mut *self.links;
        if self.front_last != head {
            links[self.front_last as usize].next = self.old_first;
            links[self.old_first as usize].prev = self.front_last;
        }
        if self.back_last != tail {
            // Read `tail.prev` only now: on an empty list the back chain
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

    /// Unlink every block of the chain from `first` to `last` (a staged
    /// chain's blocks end with a `NIL` next).
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

impl Drop for Batch<'_> {
    /// Without a commit, put the lists back exactly as they were.
    fn drop(&mut self) {
        let (head, tail) = (self.head, self.head + 1);
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

/// Front-to-back iterator over one list of a [`LinkedLists`].
pub struct Iter<'a> {
    links: &'a [Link],
    cur: u32,
    tail: u32,
}

impl Iterator for Iter<'_> {
    type Item = BlockId;

    #[inline]
    fn next(&mut self) -> Option<BlockId> {
        if self.cur == self.tail {
            return None;
        }
        let b = self.cur;
        self.cur = self.links[b as usize].next;
        Some(BlockId(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    fn ids(q: &LinkedLists, list: usize) -> Vec<u32> {
        q.iter(list).map(|b| b.0).collect()
    }

    /// Stage `(block, to_back)` pairs into `list` and commit.
    fn stage(q: &mut LinkedLists, list: usize, staged: &[(u32, bool)]) {
        let mut batch = q.begin_batch(list);
        for &(b, to_back) in staged {
            batch.push(BlockId(b), to_back);
        }
        batch.commit();
    }

    /// A batch to stage: `(block, to_back)` pairs.
    type Staged<'a> = &'a [(u32, bool)];

    /// The order a committed batch must produce, on a plain `Vec`.
    fn batch_model(queued: &[u32], staged: Staged) -> Vec<u32> {
        let front = staged.iter().filter(|s| !s.1).map(|s| s.0);
        let back = staged.iter().filter(|s| s.1).map(|s| s.0);
        front.chain(queued.iter().copied()).chain(back).collect()
    }

    #[test]
    fn ascending_construction() {
        let q = LinkedLists::new_ascending(5, 2, 1);
        assert_eq!(ids(&q, 0), vec![1, 2, 3, 4]);
        assert!(ids(&q, 1).is_empty());
        assert_eq!((q.len(), q.lists(), q.capacity()), (4, 2, 5));
        assert!(!q.contains(BlockId(0)));
        q.check_invariants().unwrap();
        let empty = LinkedLists::new_ascending(1, 1, 1);
        assert!(empty.is_empty());
        empty.check_invariants().unwrap();
    }

    #[test]
    fn neighbours_follow_the_links() {
        let mut q = LinkedLists::new_ascending(5, 1, 1);
        let b = BlockId;
        assert_eq!(q.neighbours(b(1)), Some((None, Some(b(2)))));
        assert_eq!(q.neighbours(b(3)), Some((Some(b(2)), Some(b(4)))));
        assert_eq!(q.neighbours(b(4)), Some((Some(b(3)), None)));
        assert_eq!(q.neighbours(b(0)), None); // never linked
        assert_eq!(q.neighbours(b(5)), None); // a sentinel, not a block
        assert_eq!(q.neighbours(b(9)), None); // out of range
        q.remove(b(2));
        assert_eq!(q.neighbours(b(2)), None);
        assert_eq!(q.neighbours(b(3)), Some((Some(b(1)), Some(b(4)))));
        let single = LinkedLists::new_ascending(2, 1, 1);
        assert_eq!(single.neighbours(b(1)), Some((None, None)));
    }

    #[test]
    fn batch_keeps_order_on_each_side() {
        let cases: &[(&[u32], Staged)] = &[
            // Empty list: the back chain must land after the front chain.
            (&[], &[(4, false), (5, true), (1, false), (2, true)]),
            (&[], &[(4, false), (5, false)]),
            (&[], &[(4, true), (5, true)]),
            (&[], &[]),
            // Non-empty list: fronts before the old front, backs after the
            // old back.
            (&[7, 3], &[(4, false), (5, true), (1, false), (2, true)]),
            (&[7, 3], &[(9, false)]),
            (&[7, 3], &[(9, true)]),
            (&[0], &[(15, false), (14, true), (13, false)]),
        ];
        for &(queued, staged) in cases {
            // The batch goes into the middle list; its neighbours' blocks
            // must not move.
            let mut q = LinkedLists::new(20, 3);
            q.push_back(0, BlockId(16));
            q.push_back(2, BlockId(17));
            stage(
                &mut q,
                1,
                &queued.iter().map(|&b| (b, true)).collect::<Vec<_>>(),
            );
            stage(&mut q, 1, staged);
            q.check_invariants().unwrap();
            assert_eq!(
                ids(&q, 1),
                batch_model(queued, staged),
                "{queued:?} {staged:?}"
            );
            assert_eq!((ids(&q, 0), ids(&q, 2)), (vec![16], vec![17]));
            assert_eq!(q.len(), 2 + queued.len() + staged.len());
        }
    }

    #[test]
    fn dropped_batch_leaves_the_lists_as_they_were() {
        for queued in [&[][..], &[7, 3][..]] {
            let mut q = LinkedLists::new(16, 2);
            stage(
                &mut q,
                1,
                &queued.iter().map(|&b| (b, true)).collect::<Vec<_>>(),
            );
            q.push_back(0, BlockId(11));
            let before = q.clone();
            for staged in [
                &[(4, false), (5, true), (1, false)][..],
                &[(2, true)],
                &[(2, false)],
            ] {
                let mut batch = q.begin_batch(1);
                for &(b, to_back) in staged {
                    batch.push(BlockId(b), to_back);
                }
                drop(batch);
                assert_eq!(q, before, "{queued:?} {staged:?}");
                q.check_invariants().unwrap();
            }
        }
    }

    #[test]
    fn pop_front_into_stops_at_the_end_of_its_list() {
        let mut q = LinkedLists::new(8, 2);
        for b in [1, 3, 5] {
            q.push_back(0, BlockId(b));
        }
        q.push_back(1, BlockId(6));
        let mut out = [BlockId::NULL; 5];
        assert_eq!(q.pop_front_into(0, &mut out[..0], |_| {}), 0);
        let mut seen = Vec::new();
        assert_eq!(q.pop_front_into(0, &mut out[..1], |b| seen.push(b.0)), 1);
        assert_eq!(q.front(0), Some(BlockId(3)));
        assert_eq!(q.pop_front_into(0, &mut out[1..], |b| seen.push(b.0)), 2);
        assert_eq!(out[..3], [1, 3, 5].map(BlockId));
        assert_eq!(out[3], BlockId::NULL);
        assert_eq!(seen, [1, 3, 5]);
        assert_eq!((q.front(0), q.len()), (None, 1));
        assert!(!q.contains(BlockId(3)));
        assert_eq!(ids(&q, 1), vec![6]);
        q.check_invariants().unwrap();
    }

    #[test]
    fn append_moves_a_whole_list_behind_another() {
        let mut q = LinkedLists::new(10, 3);
        q.push_back(0, BlockId(1));
        q.push_back(1, BlockId(2));
        q.push_back(1, BlockId(4));
        q.append(0, 1);
        q.check_invariants().unwrap();
        assert_eq!((ids(&q, 0), ids(&q, 1)), (vec![1, 2, 4], vec![]));
        // Onto an empty list, and from an empty one.
        q.append(2, 0);
        assert_eq!(ids(&q, 2), vec![1, 2, 4]);
        q.append(2, 1);
        assert_eq!(ids(&q, 2), vec![1, 2, 4]);
        assert_eq!(q.len(), 3);
        q.check_invariants().unwrap();
        // The moved blocks are ordinary members of their new list.
        q.remove(BlockId(2));
        q.push_front(2, BlockId(7));
        assert_eq!(ids(&q, 2), vec![7, 1, 4]);
        q.check_invariants().unwrap();
    }

    #[test]
    #[should_panic(expected = "not in the free queue")]
    fn remove_unlinked_panics() {
        let mut q = LinkedLists::new(3, 1);
        q.remove(BlockId(1));
    }

    /// Negative controls: each kind of corruption is reported.
    #[test]
    fn check_invariants_reports_corruption() {
        let good = {
            let mut q = LinkedLists::new_ascending(6, 2, 1);
            q.remove(BlockId(3));
            q.push_back(1, BlockId(3));
            q
        };
        good.check_invariants().unwrap();
        let corrupt = |f: &dyn Fn(&mut LinkedLists), want: &str| {
            let mut q = good.clone();
            f(&mut q);
            let err = q.check_invariants().unwrap_err();
            assert!(err.contains(want), "{err:?} lacks {want:?}");
        };
        corrupt(&|q| q.len += 1, "but len is");
        corrupt(&|q| q.links[2].prev = 4, "prev link");
        corrupt(&|q| q.links[4].next = 1, "prev link 6 != 4");
        corrupt(&|q| q.links[7].prev = 4, "tail's prev link is stale");
        // A block linking into list 1's tail from list 0.
        corrupt(&|q| q.links[5].next = 9, "broken next link");
        corrupt(&|q| q.links[6].prev = 0, "outer link");
        corrupt(&|q| q.links[0].next = 2, "one link set");
        corrupt(&|q| q.links[0] = Link { prev: 6, next: 7 }, "carry links");
        corrupt(&|q| q.links.push(UNLINKED), "one pair of sentinels");
    }

    /// One operation on three lists over 12 block ids.
    #[derive(Clone, Debug)]
    enum Op {
        PushBack(usize, u32),
        PushFront(usize, u32),
        Remove(u32),
        Pop(usize, usize),
        Append(usize, usize),
        /// `(list, (block, to_back) pairs, commit)`.
        Batch(usize, Vec<(u32, bool)>, bool),
    }

    fn op() -> impl Strategy<Value = Op> {
        let list = 0..3usize;
        let block = 0..12u32;
        prop_oneof![
            (list.clone(), block.clone()).prop_map(|(l, b)| Op::PushBack(l, b)),
            (list.clone(), block.clone()).prop_map(|(l, b)| Op::PushFront(l, b)),
            block.clone().prop_map(Op::Remove),
            (list.clone(), 0..5usize).prop_map(|(l, n)| Op::Pop(l, n)),
            (list.clone(), list.clone()).prop_map(|(a, b)| Op::Append(a, b)),
            (
                list,
                proptest::collection::vec((block, any::<bool>()), 0..6),
                any::<bool>()
            )
                .prop_map(|(l, s, c)| Op::Batch(l, s, c)),
        ]
    }

    proptest! {
        /// Every operation matches a model of one `VecDeque` per list, and
        /// the invariants hold after each (operations a caller may not make,
        /// such as linking a linked block, are skipped).
        #[test]
        fn matches_a_deque_model(ops in proptest::collection::vec(op(), 0..60)) {
            let mut q = LinkedLists::new(12, 3);
            let mut model: [VecDeque<u32>; 3] = Default::default();
            let holder = |m: &[VecDeque<u32>; 3], b: u32| m.iter().position(|l| l.contains(&b));
            for op in ops {
                match op {
                    Op::PushBack(l, b) if holder(&model, b).is_none() => {
                        q.push_back(l, BlockId(b));
                        model[l].push_back(b);
                    }
                    Op::PushFront(l, b) if holder(&model, b).is_none() => {
                        q.push_front(l, BlockId(b));
                        model[l].push_front(b);
                    }
                    Op::Remove(b) => {
                        if let Some(l) = holder(&model, b) {
                            q.remove(BlockId(b));
                            model[l].retain(|&x| x != b);
                        }
                        prop_assert!(!q.contains(BlockId(b)));
                    }
                    Op::Pop(l, n) => {
                        let mut out = vec![BlockId::NULL; n];
                        let taken = q.pop_front_into(l, &mut out, |_| {});
                        let want: Vec<u32> = (0..n).map_while(|_| model[l].pop_front()).collect();
                        prop_assert_eq!(out[..taken].iter().map(|b| b.0).collect::<Vec<_>>(), want);
                    }
                    Op::Append(to, from) if to != from => {
                        q.append(to, from);
                        let moved = std::mem::take(&mut model[from]);
                        model[to].extend(moved);
                    }
                    Op::Batch(l, staged, commit) => {
                        let mut seen = Vec::new();
                        let staged: Vec<(u32, bool)> = staged
                            .into_iter()
                            .filter(|&(b, _)| holder(&model, b).is_none() && !seen.contains(&b) && {
                                seen.push(b);
                                true
                            })
                            .collect();
                        let mut batch = q.begin_batch(l);
                        for &(b, to_back) in &staged {
                            batch.push(BlockId(b), to_back);
                        }
                        if commit {
                            batch.commit();
                            let old: Vec<u32> = model[l].iter().copied().collect();
                            model[l] = batch_model(&old, &staged).into();
                        }
                    }
                    _ => {}
                }
                q.check_invariants().map_err(TestCaseError::fail)?;
                for (l, want) in model.iter().enumerate() {
                    prop_assert_eq!(ids(&q, l), want.iter().copied().collect::<Vec<_>>());
                    prop_assert_eq!(q.front(l).map(|b| b.0), want.front().copied());
                }
                prop_assert_eq!(q.len(), model.iter().map(VecDeque::len).sum::<usize>());
            }
        }
    }
}
