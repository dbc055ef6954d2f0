//! What every ranked eviction policy is: the [`EvictionPolicy`] hooks the
//! pool calls, and the pieces the built-in policies share (the
//! [`AgingClock`], [`ilog2_level`]).
//!
//! Invariant of every implementation: a policy only orders reuse, through
//! the levels of the pool's [`LevelQueue`]; it never decides whether a free
//! block is reusable.

use std::fmt;

use super::level_queue::{LevelQueue, MAX_LEVELS};
use crate::ids::BlockId;

/// Highest request priority [`BlockPool::set_priority`](crate::BlockPool::set_priority)
/// accepts (0 is ordinary).
pub const MAX_PRIORITY: u8 = 7;

/// A reuse order for the pool's cached free blocks.
///
/// The pool calls the hooks after validating each operation, so a refused
/// call never reaches the policy. Per-block state belongs in flat slabs
/// indexed by [`BlockId::index`], a few bytes per block.
pub trait EvictionPolicy: fmt::Debug + Send + Sync {
    /// The policy's spec string (what [`EvictionConfig`](super::EvictionConfig)
    /// parses).
    fn name(&self) -> String;

    /// Number of levels in the queue, `1..=MAX_LEVELS`.
    fn num_levels(&self) -> usize;

    /// `blocks` were handed out for new data (each lost its cache key, if it
    /// had one). The policy may age `queue` here.
    fn on_allocate(&mut self, _blocks: &[BlockId], _queue: &mut LevelQueue) {}

    /// `block` gained a reference through `touch` (a prefix-cache hit).
    fn on_hit(&mut self, _block: BlockId) {}

    /// `block` was cached as block number `depth` (1-based) of its hash
    /// chain.
    fn on_cache(&mut self, _block: BlockId, _depth: u32) {}

    /// The cached `block` lost its last reference at clock `now`: the level
    /// it waits in (its back), below [`num_levels`](Self::num_levels).
    fn free_level(&mut self, block: BlockId, now: u32) -> usize;

    /// A request of priority `priority` (at most [`MAX_PRIORITY`]) holds
    /// `block`.
    fn set_priority(&mut self, _block: BlockId, _priority: u8) {}

    /// The pool's clock moved to `now`. The policy may move blocks in
    /// `queue`.
    fn on_clock(&mut self, _now: u32, _queue: &mut LevelQueue) {}

    /// Check the policy's own invariants against the queue.
    fn check_invariants(&self, _queue: &LevelQueue, _now: u32) -> Result<(), String> {
        Ok(())
    }

    /// Heap bytes of per-block state.
    fn heap_bytes(&self) -> usize {
        0
    }

    /// A boxed copy (pools are `Clone`).
    fn clone_box(&self) -> Box<dyn EvictionPolicy>;
}

impl Clone for Box<dyn EvictionPolicy> {
    fn clone(&self) -> Self {
        self.clone_box()
    }
}

/// `floor(log2(x))` clamped to `0..levels` (0 for `x == 0`).
pub(crate) fn ilog2_level(x: u32, levels: usize) -> usize {
    if x == 0 {
        0
    } else {
        (x.ilog2() as usize).min(levels - 1)
    }
}

/// A counter of blocks handed out that ages a [`LevelQueue`] every
/// `half_life` blocks (shared by [`Lfu`] and [`PrefixDepth`]).
#[derive(Clone, Debug)]
pub(crate) struct AgingClock {
    /// Blocks handed out per aging step. Invariant: positive.
    pub(crate) half_life: u32,
    /// Blocks handed out since the last aging step. Invariant: below
    /// `half_life`.
    pub(crate) since: u32,
    /// Aging steps so far (wrapping).
    pub(crate) epoch: u32,
}

impl AgingClock {
    pub(crate) fn new(half_life: u32) -> Self {
        Self {
            half_life: half_life.max(1),
            since: 0,
            epoch: 0,
        }
    }

    /// Count `n` blocks handed out, aging `queue` once per completed
    /// half-life.
    #[inline]
    pub(crate) fn advance(&mut self, n: usize, queue: &mut LevelQueue) {
        let total = u64::from(self.since) + n as u64;
        let steps = total / u64::from(self.half_life);
        self.since = (total % u64::from(self.half_life)) as u32;
        // More steps than levels empty every level above 0 all the same.
        for _ in 0..steps.min(MAX_LEVELS as u64) {
            queue.age();
        }
        // A modular epoch (LFU stamps compare it modulo their width).
        self.epoch = self.epoch.wrapping_add(steps as u32);
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        if self.half_life == 0 || self.since >= self.half_life {
            return Err(format!(
                "aging clock: {} blocks since the last step, half-life {}",
                self.since, self.half_life
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aging_clock_counts_half_lives() {
        let mut q = LevelQueue::new_empty(8, 3);
        q.push_back(BlockId(1), 2);
        let mut c = AgingClock::new(4);
        c.advance(3, &mut q);
        assert_eq!(q.front(2), Some(BlockId(1)));
        c.advance(1, &mut q);
        assert_eq!((c.epoch, c.since), (1, 0));
        assert_eq!(q.front(1), Some(BlockId(1)));
        c.advance(1000, &mut q);
        assert_eq!(q.front(0), Some(BlockId(1)));
        assert_eq!(c.epoch, 251);
        c.check().unwrap();
    }
}
