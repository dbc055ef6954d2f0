//! [`Lfu`]: least frequently used first, with aging.

use super::aging::{ilog2_level, Aging, AgingRule};
use super::config::EvictionConfig;
use crate::ids::BlockId;

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
/// State: one `u32` per block (see [`UseCount`]).
pub type Lfu = Aging<UseCount>;

/// [`Lfu`]'s rule. A block's slot is its use count (low 8 bits) as of an
/// aging stamp (high 24 bits, the epoch modulo 2^24); its current value is
/// `count >> (epoch - stamp)`, 0 from 8 agings on. (A block held through a
/// multiple of 2^24 agings would read its old count again.)
#[derive(Copy, Clone, Debug)]
pub struct UseCount;

/// Stamps are epochs modulo 2^24.
const STAMP_MASK: u32 = (1 << 24) - 1;

impl UseCount {
    /// The count held in `slot`, aged to `epoch`.
    #[inline]
    fn read(slot: u32, epoch: u32) -> u8 {
        let age = epoch.wrapping_sub(slot >> 8) & STAMP_MASK;
        if age >= 8 {
            0
        } else {
            (slot as u8) >> age
        }
    }

    /// `count` as of `epoch`.
    #[inline]
    fn slot(count: u8, epoch: u32) -> u32 {
        ((epoch & STAMP_MASK) << 8) | u32::from(count)
    }
}

impl AgingRule for UseCount {
    type Slot = u32;

    /// Frequencies `1`, `2..=3`, `4..=7`, ..., `128..=255`.
    const LEVELS: usize = 8;

    fn config(half_life: u32) -> EvictionConfig {
        EvictionConfig::Lfu { half_life }
    }

    #[inline]
    fn on_allocate(slots: &mut [u32], blocks: &[BlockId], epoch: u32) {
        let fresh = Self::slot(1, epoch);
        for &b in blocks {
            slots[b.index()] = fresh;
        }
    }

    #[inline]
    fn on_hit(slot: &mut u32, epoch: u32) {
        *slot = Self::slot(Self::read(*slot, epoch).saturating_add(1), epoch);
    }

    #[inline]
    fn free_level(slot: &mut u32, epoch: u32) -> usize {
        let c = Self::read(*slot, epoch);
        *slot = Self::slot(c, epoch);
        ilog2_level(u32::from(c), Self::LEVELS)
    }

    /// A block waiting at level `l >= 1` has a count in `2^l..2^(l+1)`:
    /// aging moves it down one level exactly when its count halves.
    fn check_waiting(block: BlockId, slot: u32, level: usize, epoch: u32) -> Result<(), String> {
        let count = Self::read(slot, epoch);
        if ilog2_level(u32::from(count), Self::LEVELS) != level {
            return Err(format!(
                "lfu: block {block} at level {level} with count {count}"
            ));
        }
        Ok(())
    }
}

impl Lfu {
    /// `block`'s use count now (after aging).
    #[inline]
    pub fn count(&self, block: BlockId) -> u8 {
        UseCount::read(self.slots[block.index()], self.clock.epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eviction::{EvictionPolicy, LevelQueue};

    #[test]
    fn counts_grow_with_hits_and_halve_with_age() {
        let mut q = LevelQueue::new_ascending(8, 1, UseCount::LEVELS);
        let mut lfu = Lfu::new(8, 2, 0);
        let mut out = [BlockId::NULL; 1];
        q.pop_front_into(&mut out, |_| {});
        lfu.on_allocate(&out, &mut q);
        let b = out[0];
        assert_eq!(lfu.count(b), 1);
        for _ in 0..4 {
            lfu.on_hit(b);
        }
        assert_eq!(lfu.count(b), 5);
        assert_eq!(lfu.free_level(b, 0), 2);
        q.push_back(b, 2);
        lfu.check_invariants(&q, 0).unwrap();
        // One half-life (2 more blocks handed out): 5 -> 2, level 1.
        let mut two = [BlockId::NULL; 2];
        q.pop_front_into(&mut two, |_| {});
        lfu.on_allocate(&two, &mut q);
        assert_eq!((lfu.count(b), q.front(1)), (2, Some(b)));
        lfu.check_invariants(&q, 0).unwrap();
        // Negative control: a block at a level its count does not give.
        q.remove(b);
        q.push_back(b, 2);
        let err = lfu.check_invariants(&q, 0).unwrap_err();
        assert!(err.contains("at level 2 with count 2"), "{err}");
    }
}
