//! [`Lfu`]: least frequently used first, with aging.

use super::{ilog2_level, AgingClock, EvictionConfig, EvictionPolicy, LevelQueue};
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
/// Without hits every block has count 1 and the order is exactly LRU.
///
/// State: a `u8` count and a `u32` aging stamp per block (the count is
/// stored as of the stamp; its current value is `count >> (epoch - stamp)`).
#[derive(Clone, Debug)]
pub struct Lfu {
    /// Use count per block as of `stamp`.
    count: Vec<u8>,
    /// Aging epoch at which `count` was last written, per block.
    stamp: Vec<u32>,
    clock: AgingClock,
    /// The configured half-life (0 = one pool turnover), for `name`.
    configured: u32,
}

impl Lfu {
    /// State for `num_blocks` blocks, aging every `half_life` blocks handed
    /// out.
    pub fn new(num_blocks: usize, half_life: u32, configured: u32) -> Self {
        Self {
            count: vec![0; num_blocks],
            stamp: vec![0; num_blocks],
            clock: AgingClock::new(half_life),
            configured,
        }
    }

    /// `block`'s use count now (after aging).
    pub fn count(&self, block: BlockId) -> u8 {
        let i = block.index();
        let age = self.clock.epoch.wrapping_sub(self.stamp[i]);
        if age >= 8 {
            0
        } else {
            self.count[i] >> age
        }
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
        let epoch = self.clock.epoch;
        for &b in blocks {
            self.count[b.index()] = 1;
            self.stamp[b.index()] = epoch;
        }
        self.clock.advance(blocks.len(), queue);
    }

    #[inline]
    fn on_hit(&mut self, block: BlockId) {
        let c = self.count(block).saturating_add(1);
        self.count[block.index()] = c;
        self.stamp[block.index()] = self.clock.epoch;
    }

    #[inline]
    fn free_level(&mut self, block: BlockId, _now: u32) -> usize {
        let c = self.count(block);
        self.count[block.index()] = c;
        self.stamp[block.index()] = self.clock.epoch;
        ilog2_level(u32::from(c), LEVELS)
    }

    fn check_invariants(&self, queue: &LevelQueue, _now: u32) -> Result<(), String> {
        self.clock.check()?;
        if self.count.len() != queue.capacity() || self.stamp.len() != queue.capacity() {
            return Err("lfu: state slabs differ from the pool size".into());
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
        self.count.capacity() + self.stamp.capacity() * 4
    }

    fn clone_box(&self) -> Box<dyn EvictionPolicy> {
        Box::new(self.clone())
    }
}
