//! [`PrefixDepth`]: shallow prefix blocks are protected.

use super::config::EvictionConfig;
use super::level_queue::LevelQueue;
use super::policy::{ilog2_level, AgingClock, EvictionPolicy};
use crate::ids::BlockId;

/// Levels: chain depths `>= 2^15`, ..., `4..=7`, `2..=3`, `1` (level 15).
const LEVELS: usize = 16;

/// Shallow prefix blocks are kept longest.
///
/// Rule: a cached block's *depth* is its position in its hash chain (1 for a
/// prompt's first block). The shallower a block, the more requests can share
/// it (a system prompt is depth 1..k of every conversation), so a released
/// cached block waits at level `15 - floor(log2(depth))` (clamped at 0):
/// depth 1 at level 15, depths 2-3 at level 14, 4-7 at 13, ... The lowest
/// level is reused first, least recently released first within a level, so
/// deep blocks (the private tails of long conversations) are evicted before
/// shallow shared ones. Protection decays: every `half_life` blocks handed
/// out, every free block moves one level down (level 1 joining the back of
/// level 0), so a stale prefix is eventually evicted; a block regains its
/// full level each time it is released again after use.
///
/// State: one `u8` level per block.
#[derive(Clone, Debug)]
pub struct PrefixDepth {
    /// Level a block takes when released, set when it is cached.
    level: Vec<u8>,
    clock: AgingClock,
    /// The configured half-life (0 = one pool turnover), for `name`.
    configured: u32,
}

impl PrefixDepth {
    /// State for `num_blocks` blocks, decaying every `half_life` blocks
    /// handed out.
    pub fn new(num_blocks: usize, half_life: u32, configured: u32) -> Self {
        Self {
            level: vec![0; num_blocks],
            clock: AgingClock::new(half_life),
            configured,
        }
    }

    /// The level of a block cached at chain depth `depth` (1-based).
    pub fn level_of_depth(depth: u32) -> usize {
        LEVELS - 1 - ilog2_level(depth, LEVELS)
    }
}

impl EvictionPolicy for PrefixDepth {
    fn name(&self) -> String {
        EvictionConfig::PrefixDepth {
            half_life: self.configured,
        }
        .to_string()
    }

    fn num_levels(&self) -> usize {
        LEVELS
    }

    #[inline]
    fn on_allocate(&mut self, blocks: &[BlockId], queue: &mut LevelQueue) {
        self.clock.advance(blocks.len(), queue);
    }

    fn on_cache(&mut self, block: BlockId, depth: u32) {
        self.level[block.index()] = Self::level_of_depth(depth) as u8;
    }

    #[inline]
    fn free_level(&mut self, block: BlockId, _now: u32) -> usize {
        usize::from(self.level[block.index()])
    }

    fn check_invariants(&self, queue: &LevelQueue, _now: u32) -> Result<(), String> {
        self.clock.check()?;
        if self.level.len() != queue.capacity() {
            return Err("prefix-depth: state slab differs from the pool size".into());
        }
        Ok(())
    }

    fn heap_bytes(&self) -> usize {
        self.level.capacity()
    }

    fn clone_box(&self) -> Box<dyn EvictionPolicy> {
        Box::new(self.clone())
    }
}
