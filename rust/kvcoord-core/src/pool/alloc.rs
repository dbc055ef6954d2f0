//! Taking, freeing and touching blocks (vLLM's `get_new_blocks`,
//! `free_blocks`, `touch`), request priorities and the policies' clock.
//!
//! Invariant: a block has no references exactly when it is in the free
//! order; a refused call changes nothing.

use super::order::{Order, Ranked};
use super::{BlockMeta, BlockPool, NO_KEY};
use crate::error::{KvError, KvResult};
use crate::eviction::{with_policy, EvictionPolicy, LevelQueue};
use crate::ids::BlockId;

impl BlockPool {
    /// Take `n` blocks from the front of the free queue, append them to `out`
    /// in queue order and give each one reference. A taken block that was
    /// still cached is evicted from the prefix index.
    pub fn get_new_blocks(&mut self, n: usize, out: &mut Vec<BlockId>) -> KvResult<()> {
        if n > self.free.len() {
            return Err(KvError::OutOfBlocks {
                requested: n,
                available: self.free.len(),
            });
        }
        let start = out.len();
        out.resize(start + n, BlockId::NULL);
        let mut any_cached = false;
        // A slice local, so the loop does not reload the Vec's header.
        let meta = &mut self.meta[..];
        match &mut self.free {
            Order::Lru(q) => q.pop_front_into(&mut out[start..], |b| {
                any_cached |= Self::take(meta, b);
            }),
            Order::Ranked(r) => {
                let Ranked { queue, policy, .. } = &mut **r;
                queue.pop_front_into(&mut out[start..], |b| {
                    any_cached |= Self::take(meta, b);
                });
                with_policy!(policy, p => p.on_allocate(&out[start..], queue));
            }
        }
        if !self.watch.is_empty() {
            self.watch.on_handed_out(&out[start..]);
        }
        if let Some(s) = self.sampled.as_deref_mut() {
            s.on_allocated(&out[start..], self.config.enable_caching);
        }
        if let Some(r) = self.residency.as_deref_mut() {
            for &b in &out[start..] {
                if self.meta[b.index()].key != NO_KEY {
                    r.on_evict(b);
                }
                r.on_allocate(b);
            }
        }
        if any_cached {
            for &b in &out[start..] {
                if self.meta[b.index()].key != NO_KEY {
                    self.drop_key(b);
                    self.num_evictions += 1;
                }
            }
        }
        Ok(())
    }

    /// Give a block popped from the free queue its first reference; returns
    /// whether it is still cached.
    #[inline]
    fn take(meta: &mut [BlockMeta], b: BlockId) -> bool {
        let m = &mut meta[b.index()];
        debug_assert_eq!(m.ref_cnt, 0, "queued block {b} has owners");
        m.ref_cnt = 1;
        m.key != NO_KEY
    }

    /// Release one reference of each block, `blocks` ordered by eviction
    /// priority (first = evicted first). The null block is skipped.
    ///
    /// Blocks reaching zero are queued in the given order: uncached ones in
    /// front of the current front (reused first), cached ones behind the
    /// current back (kept longest). A block listed several times takes the
    /// place of its last occurrence.
    pub fn free_blocks(&mut self, blocks: &[BlockId]) -> KvResult<()> {
        let q = match &mut self.free {
            Order::Lru(q) => q,
            Order::Ranked(r) => {
                let Ranked {
                    queue,
                    policy,
                    released,
                } = &mut **r;
                // As below, in one pass: unhashed blocks staged for the
                // front of level 0, cached ones kept for the policy, which
                // sees them only once the whole call is accepted.
                let meta = &mut self.meta[..];
                released.clear();
                let mut front = queue.begin_prepend();
                for i in 0..blocks.len() {
                    let b = blocks[i];
                    if b.is_null() {
                        continue;
                    }
                    let err = match meta.get_mut(b.index()) {
                        Some(m) if m.ref_cnt > 0 => {
                            m.ref_cnt -= 1;
                            if m.ref_cnt == 0 {
                                if m.key == NO_KEY {
                                    front.push_front(b);
                                } else {
                                    released.push(b);
                                }
                            }
                            continue;
                        }
                        Some(_) => KvError::RefCountUnderflow(b),
                        None => KvError::BlockOutOfRange {
                            block: u64::from(b.0),
                            num_blocks: meta.len(),
                        },
                    };
                    drop(front);
                    released.clear();
                    for &undo in &blocks[..i] {
                        if !undo.is_null() {
                            meta[undo.index()].ref_cnt += 1;
                        }
                    }
                    return Err(err);
                }
                front.commit();
                let now = self.now;
                with_policy!(policy, p => Self::enqueue_cached(queue, p, released, now));
                released.clear();
                return Ok(());
            }
        };
        // One pass: decrement, and stage each block whose count reaches zero
        // (once per block, at its last occurrence) for the front or, if it
        // is cached, the back of the free queue. On the first bad id the
        // staged batch is dropped (unstaged) and the decrements undone.
        let meta = &mut self.meta[..];
        let mut batch = q.begin_enqueue();
        for i in 0..blocks.len() {
            let b = blocks[i];
            if b.is_null() {
                continue;
            }
            let err = match meta.get_mut(b.index()) {
                Some(m) if m.ref_cnt > 0 => {
                    m.ref_cnt -= 1;
                    if m.ref_cnt == 0 {
                        batch.push(b, m.key != NO_KEY);
                    }
                    continue;
                }
                Some(_) => KvError::RefCountUnderflow(b),
                None => KvError::BlockOutOfRange {
                    block: u64::from(b.0),
                    num_blocks: meta.len(),
                },
            };
            drop(batch);
            for &undo in &blocks[..i] {
                if !undo.is_null() {
                    meta[undo.index()].ref_cnt += 1;
                }
            }
            return Err(err);
        }
        batch.commit();
        Ok(())
    }

    /// Queue released cached blocks at the back of the level the policy
    /// picks for each, in the given order.
    #[inline]
    fn enqueue_cached<P: EvictionPolicy + ?Sized>(
        queue: &mut LevelQueue,
        policy: &mut P,
        released: &[BlockId],
        now: u32,
    ) {
        let top = queue.levels() - 1;
        for &b in released {
            let level = policy.free_level(b, now).min(top);
            queue.push_back(b, level);
        }
    }

    /// How many of `blocks` are non-null and unreferenced: a prefix hit on
    /// them pulls them out of the free queue, so they consume free capacity
    /// just like fresh blocks. Out-of-range ids count as 0 (callers validate).
    pub fn num_unreferenced(&self, blocks: &[BlockId]) -> usize {
        blocks
            .iter()
            .filter(|b| !b.is_null() && self.meta.get(b.index()).is_some_and(|m| m.ref_cnt == 0))
            .count()
    }

    /// Whether every id is below the pool size.
    pub fn ids_in_range(&self, blocks: &[BlockId]) -> bool {
        self.check_ids(blocks).is_ok()
    }

    /// Add one reference to each block; a block with no owner leaves the free
    /// queue (a prefix hit on an evictable block). The null block is skipped.
    pub fn touch(&mut self, blocks: &[BlockId]) -> KvResult<()> {
        self.check_ids(blocks)?;
        // Even if every entry named the same block, no count may overflow:
        // checking that up front lets the one real pass below not fail.
        let headroom = u32::MAX - u32::try_from(blocks.len()).unwrap_or(u32::MAX);
        if let Some(&b) = blocks
            .iter()
            .find(|b| self.meta[b.index()].ref_cnt > headroom)
        {
            return Err(KvError::RefCountOverflow(b));
        }
        match &mut self.free {
            Order::Lru(q) => {
                for &b in blocks {
                    if b.is_null() {
                        continue;
                    }
                    let m = &mut self.meta[b.index()];
                    if m.ref_cnt == 0 {
                        // An evictable (cached, free) block is now in use.
                        q.remove(b);
                    }
                    m.ref_cnt += 1;
                }
            }
            Order::Ranked(r) => {
                let Ranked { queue, policy, .. } = &mut **r;
                let meta = &mut self.meta[..];
                with_policy!(policy, p => {
                    for &b in blocks {
                        if b.is_null() {
                            continue;
                        }
                        let m = &mut meta[b.index()];
                        if m.ref_cnt == 0 {
                            queue.remove(b);
                        }
                        m.ref_cnt += 1;
                        p.on_hit(b);
                    }
                });
            }
        }
        if let Some(r) = self.residency.as_deref_mut() {
            for &b in blocks.iter().filter(|b| !b.is_null()) {
                r.on_hit(b);
            }
        }
        if let Some(s) = self.sampled.as_deref_mut() {
            s.on_accessed(blocks);
        }
        Ok(())
    }

    /// Mark `blocks` as held by a request of priority `priority` (0, the
    /// default, to [`MAX_PRIORITY`](crate::eviction::MAX_PRIORITY)). Only the
    /// [`Priority`](crate::eviction::Priority) policy acts on it; the others
    /// accept and ignore it, so a scheduler can pass priorities whatever the
    /// policy. The null block is skipped.
    pub fn set_priority(&mut self, blocks: &[BlockId], priority: i64) -> KvResult<()> {
        self.check_ids(blocks)?;
        let priority = u8::try_from(priority)
            .ok()
            .filter(|&p| p <= crate::eviction::MAX_PRIORITY)
            .ok_or_else(|| KvError::InvalidArgument {
                name: "priority",
                detail: format!(
                    "must be 0 to {}, got {priority}",
                    crate::eviction::MAX_PRIORITY
                ),
            })?;
        if let Order::Ranked(r) = &mut self.free {
            let policy = r.policy.as_dyn_mut();
            for &b in blocks.iter().filter(|b| !b.is_null()) {
                policy.set_priority(b, priority);
            }
        }
        Ok(())
    }

    /// Advance the clock of time-based policies by `ticks` (for example one
    /// per scheduler step); retentions that expire are applied now.
    pub fn advance_clock(&mut self, ticks: i64) -> KvResult<()> {
        let ticks = u32::try_from(ticks)
            .ok()
            .filter(|&t| i32::try_from(t).is_ok())
            .ok_or_else(|| KvError::InvalidArgument {
                name: "ticks",
                detail: format!("must be 0 to {} per call, got {ticks}", i32::MAX),
            })?;
        // A modular clock, not a count: policies compare its readings in
        // serial-number order (`eviction::priority`), so it wraps by design.
        self.now = self.now.wrapping_add(ticks);
        if let Order::Ranked(r) = &mut self.free {
            let Ranked { queue, policy, .. } = &mut **r;
            policy.as_dyn_mut().on_clock(self.now, queue);
        }
        Ok(())
    }

    /// The clock (wrapping at 2^32 ticks).
    pub fn clock(&self) -> u32 {
        self.now
    }
}
