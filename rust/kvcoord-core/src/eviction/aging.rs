//! [`Aging`]: the shape the half-life policies share. A policy of this shape
//! keeps one value per block (an [`AgingRule::Slot`]) from which a released
//! cached block's level follows, and ages the queue every `half_life` blocks
//! handed out ([`AgingClock`]): every free block moves one level down, level
//! 1 joining the back of level 0. The rules that differ live in the rule
//! types, one file each: [`UseCount`](super::lfu::UseCount) ([`Lfu`]) and
//! [`ChainDepth`](super::depth::ChainDepth) ([`PrefixDepth`]).
//!
//! Invariants (checked by [`EvictionPolicy::check_invariants`]): one slot per
//! pool block, and the clock's count since the last aging step below its
//! half-life.
//!
//! [`Lfu`]: super::Lfu
//! [`PrefixDepth`]: super::PrefixDepth

use std::fmt;

use super::config::EvictionConfig;
use super::level_queue::{LevelQueue, MAX_LEVELS};
use super::policy::EvictionPolicy;
use crate::ids::BlockId;

/// What one half-life policy keeps per block and how a released cached
/// block's level follows from it. Every hook receives the clock's aging
/// epoch (aging steps so far, wrapping), so a slot can hold values as of an
/// epoch and read them aged.
pub trait AgingRule: Clone + fmt::Debug + Send + Sync + 'static {
    /// The per-block value.
    type Slot: Copy + Default + fmt::Debug + Send + Sync + 'static;

    /// Number of levels of the queue, `1..=MAX_LEVELS`.
    const LEVELS: usize;

    /// The policy's config with this configured half-life (0 = one pool
    /// turnover): what its name prints.
    fn config(half_life: u32) -> EvictionConfig;

    /// `blocks` were handed out for new data (each lost its cache key).
    #[inline]
    fn on_allocate(_slots: &mut [Self::Slot], _blocks: &[BlockId], _epoch: u32) {}

    /// The block of `slot` gained a reference through a prefix-cache hit.
    #[inline]
    fn on_hit(_slot: &mut Self::Slot, _epoch: u32) {}

    /// The block of `slot` was cached as block `depth` (1-based) of its
    /// hash chain.
    #[inline]
    fn on_cache(_slot: &mut Self::Slot, _depth: u32) {}

    /// The cached block of `slot` lost its last reference: the level it
    /// waits in, below [`Self::LEVELS`].
    fn free_level(slot: &mut Self::Slot, epoch: u32) -> usize;

    /// Check the slot of `block`, waiting at `level` (at least 1) now.
    fn check_waiting(
        _block: BlockId,
        _slot: Self::Slot,
        _level: usize,
        _epoch: u32,
    ) -> Result<(), String> {
        Ok(())
    }
}

/// A half-life policy: one [`AgingRule::Slot`] per block and an
/// [`AgingClock`].
#[derive(Clone, Debug)]
pub struct Aging<R: AgingRule> {
    /// One slot per pool block, by [`BlockId::index`].
    pub(super) slots: Vec<R::Slot>,
    pub(super) clock: AgingClock,
    /// The configured half-life (0 = one pool turnover), for `name`.
    configured: u32,
}

impl<R: AgingRule> Aging<R> {
    /// State for `num_blocks` blocks, aging every `half_life` blocks handed
    /// out; `configured` is the half-life as the config spelt it.
    pub fn new(num_blocks: usize, half_life: u32, configured: u32) -> Self {
        Self {
            slots: vec![R::Slot::default(); num_blocks],
            clock: AgingClock::new(half_life),
            configured,
        }
    }
}

impl<R: AgingRule> EvictionPolicy for Aging<R> {
    fn name(&self) -> String {
        R::config(self.configured).to_string()
    }

    fn num_levels(&self) -> usize {
        R::LEVELS
    }

    #[inline]
    fn on_allocate(&mut self, blocks: &[BlockId], queue: &mut LevelQueue) {
        R::on_allocate(&mut self.slots, blocks, self.clock.epoch);
        self.clock.advance(blocks.len(), queue);
    }

    #[inline]
    fn on_hit(&mut self, block: BlockId) {
        R::on_hit(&mut self.slots[block.index()], self.clock.epoch);
    }

    fn on_cache(&mut self, block: BlockId, depth: u32) {
        R::on_cache(&mut self.slots[block.index()], depth);
    }

    #[inline]
    fn free_level(&mut self, block: BlockId, _now: u32) -> usize {
        R::free_level(&mut self.slots[block.index()], self.clock.epoch)
    }

    fn check_invariants(&self, queue: &LevelQueue, _now: u32) -> Result<(), String> {
        self.clock.check()?;
        if self.slots.len() != queue.capacity() {
            return Err(format!(
                "{}: state slab of {} blocks, pool of {}",
                self.name(),
                self.slots.len(),
                queue.capacity()
            ));
        }
        for level in 1..queue.levels() {
            for b in queue.iter_level(level) {
                R::check_waiting(b, self.slots[b.index()], level, self.clock.epoch)?;
            }
        }
        Ok(())
    }

    fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<R::Slot>()
    }

    fn clone_box(&self) -> Box<dyn EvictionPolicy> {
        Box::new(self.clone())
    }
}

/// `floor(log2(x))` clamped to `0..levels` (0 for `x == 0`).
pub(super) fn ilog2_level(x: u32, levels: usize) -> usize {
    if x == 0 {
        0
    } else {
        (x.ilog2() as usize).min(levels - 1)
    }
}

/// A counter of blocks handed out that ages a [`LevelQueue`] every
/// `half_life` blocks.
#[derive(Clone, Debug)]
pub(super) struct AgingClock {
    /// Blocks handed out per aging step. Invariant: positive.
    pub(super) half_life: u32,
    /// Blocks handed out since the last aging step. Invariant: below
    /// `half_life`.
    pub(super) since: u32,
    /// Aging steps so far (wrapping).
    pub(super) epoch: u32,
}

impl AgingClock {
    pub(super) fn new(half_life: u32) -> Self {
        Self {
            half_life: half_life.max(1),
            since: 0,
            epoch: 0,
        }
    }

    /// Count `n` blocks handed out, aging `queue` once per completed
    /// half-life.
    #[inline]
    pub(super) fn advance(&mut self, n: usize, queue: &mut LevelQueue) {
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

    pub(super) fn check(&self) -> Result<(), String> {
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
    use crate::eviction::{Lfu, PrefixDepth};

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

    /// The shared checks report a wrong slab and a broken clock (negative
    /// controls), for either rule.
    #[test]
    fn check_invariants_reports_slab_and_clock() {
        let q = LevelQueue::new_ascending(8, 1, 16);
        let mut depth = PrefixDepth::new(8, 4, 0);
        depth.check_invariants(&q, 0).unwrap();
        depth.clock.since = 4;
        assert!(depth
            .check_invariants(&q, 0)
            .unwrap_err()
            .contains("aging clock"));
        let lfu = Lfu::new(7, 4, 0);
        let q8 = LevelQueue::new_ascending(8, 1, 8);
        let err = lfu.check_invariants(&q8, 0).unwrap_err();
        assert!(err.contains("state slab of 7 blocks, pool of 8"), "{err}");
        assert_eq!(lfu.heap_bytes(), 7 * 4);
        assert_eq!(depth.heap_bytes(), 8);
    }
}
