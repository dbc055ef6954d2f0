//! [`Lfu`]: least frequently used first, with aging.

use super::config::EvictionConfig;
use super::level_queue::LevelQueue;
use super::policy::{ilog2_level, AgingClock, EvictionPolicy};
use crate::ids::BlockId;

/// Levels: frequencies `1`, `2..=3`, `4..=7`, ..., `128..=255`.
const LEVELS: usize = 8;

/// Least frequently used first, with aging.
///
/// Rule: a block's *use count* is 1 when it is handed out for new data and
/// grows by one with every prefix-cache hit on it (`touch`), saturating at
/// 255. A released cached block waits at level `floor(log2(count))`, so
/// blocks used 1, 2-3, 4-7, ... times form levels 0, 1, 2, ...; the lowest
/// level is reused first and, within a level, the least recently released
/// block. Every `half_life` blocks handed out, all counts halve (aging): free
/// blocks move one level down, level 1 joining the back of level 0, so a
/// block that was popular long ago is eventually evicted like any other.
/// Without hits every count is 1 and the order is exactly LRU.
///
/// State: one `u32` per block, the count (low 8 bits) as of an aging stamp
/// (high 24 bits, the epoch modulo 2^24); its current value is
/// `count >> (epoch - stamp)`, 0 from 8 agings on. (A block held through a
/// multiple of 2^24 agings would read its old count again.)
#[derive(Clone, Debug)]
pub struct Lfu {
    /// Per block: `stamp << 8 | count`.
    state: Vec<u32>,
    clock: AgingClock,
    /// The configured half-life (0 = one pool turnover), for `name`.
    configured: u32,
}

/// Stamps are epochs modulo 2^24.
const STAMP_MASK: u32 = (1 << 24) - 1;

impl Lfu {
    /// State for `num_blocks` blocks, aging every `half_life` blocks handed
    /// out.
    pub fn new(num_blocks: usize, half_life: u32, configured: u32) -> Self {
        Self {
            state: vec![0; num_blocks],
            clock: AgingClock::new(half_life),
            configured,
        }
    }

    /// `block`'s use count now (after aging).
    #[inline]
    pub fn count(&self, block: BlockId) -> u8 {
        let s = self.state[block.index()];
        let age = self.clock.epoch.wrapping_sub(s >> 8) & STAMP_MASK;
        if age >= 8 {
            0
        } else {
            (s as u8) >> age
        }
    }

    /// Store `count` as of the current epoch.
    #[inline]
    fn store(&mut self, block: BlockId, count: u8) {
        self.state[block.index()] = ((self.clock.epoch & STAMP_MASK) << 8) | u32::from(count);
    }
}

impl EvictionPolicy for Lfu {
    fn name(&self) -> String {
        EvictionConfig::Lfu {
            half_life: self.configured,
        }
        .to_string()
    }

    fn num_levels(&self) -> usize {
        LEVELS
    }

    #[inline]
    fn on_allocate(&mut self, blocks: &[BlockId], queue: &mut LevelQueue) {
        let fresh = ((self.clock.epoch & STAMP_MASK) << 8) | 1;
        let state = &mut self.state[..];
        for &b in blocks {
            state[b.index()] = fresh;
        }
        self.clock.advance(blocks.len(), queue);
    }

    #[inline]
    fn on_hit(&mut self, block: BlockId) {
        let c = self.count(block).saturating_add(1);
        self.store(block, c);
    }

    #[inline]
    fn free_level(&mut self, block: BlockId, _now: u32) -> usize {
        let c = self.count(block);
        self.store(block, c);
        ilog2_level(u32::from(c), LEVELS)
    }

    fn check_invariants(&self, queue: &LevelQueue, _now: u32) -> Result<(), String> {
        self.clock.check()?;
        if self.state.len() != queue.capacity() {
            return Err("lfu: state slab differs from the pool size".into());
        }
        // A block waiting at level l >= 1 has a count in 2^l..2^(l+1): aging
        // moves it down one level exactly when its count halves.
        for level in 1..LEVELS {
            for b in queue.iter_level(level) {
                if ilog2_level(u32::from(self.count(b)), LEVELS) != level {
                    return Err(format!(
                        "lfu: block {b} at level {level} with count {}",
                        self.count(b)
                    ));
                }
            }
        }
        Ok(())
    }

    fn heap_bytes(&self) -> usize {
        self.state.capacity() * 4
    }

    fn clone_box(&self) -> Box<dyn EvictionPolicy> {
        Box::new(self.clone())
    }
}
