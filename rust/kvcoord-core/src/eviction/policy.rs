//! What every ranked eviction policy is: the [`EvictionPolicy`] hooks the
//! pool calls. (What the half-life policies share is in `aging.rs`.)
//!
//! Invariant of every implementation: a policy only orders reuse, through
//! the levels of the pool's [`LevelQueue`]; it never decides whether a free
//! block is reusable.

use std::fmt;

use super::level_queue::LevelQueue;
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
