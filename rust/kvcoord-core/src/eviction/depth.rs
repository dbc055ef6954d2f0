//! [`PrefixDepth`]: shallow prefix blocks are protected.

use super::aging::{ilog2_level, Aging, AgingRule};
use super::config::EvictionConfig;

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
/// State: one `u8` level per block (see [`ChainDepth`]).
pub type PrefixDepth = Aging<ChainDepth>;

/// [`PrefixDepth`]'s rule. A block's slot is the level it takes when
/// released, set when it is cached.
#[derive(Copy, Clone, Debug)]
pub struct ChainDepth;

impl ChainDepth {
    /// The level of a block cached at chain depth `depth` (1-based).
    pub fn level_of_depth(depth: u32) -> usize {
        Self::LEVELS - 1 - ilog2_level(depth, Self::LEVELS)
    }
}

impl AgingRule for ChainDepth {
    type Slot = u8;

    /// Chain depths `>= 2^15`, ..., `4..=7`, `2..=3`, `1` (level 15).
    const LEVELS: usize = 16;

    fn config(half_life: u32) -> EvictionConfig {
        EvictionConfig::PrefixDepth { half_life }
    }

    fn on_cache(slot: &mut u8, depth: u32) {
        *slot = Self::level_of_depth(depth) as u8;
    }

    #[inline]
    fn free_level(slot: &mut u8, _epoch: u32) -> usize {
        usize::from(*slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shallow_depths_take_high_levels() {
        let levels: Vec<usize> = [1, 2, 3, 4, 7, 8, 1 << 15, u32::MAX]
            .into_iter()
            .map(ChainDepth::level_of_depth)
            .collect();
        assert_eq!(levels, [15, 14, 14, 13, 13, 12, 0, 0]);
    }
}
