//! [`Priority`]: per-request priority with a retention duration.

use super::config::EvictionConfig;
use super::level_queue::LevelQueue;
use super::policy::{EvictionPolicy, MAX_PRIORITY};
use crate::ids::BlockId;

/// Priorities `0` (ordinary) to `MAX_PRIORITY`.
const LEVELS: usize = MAX_PRIORITY as usize + 1;

/// Whether tick `a` comes strictly before tick `b` on the wrapping clock
/// (serial-number order; retentions and clock steps stay below 2^31).
#[inline]
fn precedes(a: u32, b: u32) -> bool {
    a != b && b.wrapping_sub(a) < 1 << 31
}

/// Whether `expiry` has been reached at clock `now`.
#[inline]
fn reached(expiry: u32, now: u32) -> bool {
    !precedes(now, expiry)
}

/// Per-request priority with a retention duration (in the manner of
/// TensorRT-LLM's retention priorities).
///
/// Rule: a scheduler marks the blocks a request holds with the request's
/// priority, `0` (ordinary, the default) to `7`
/// ([`BlockPool::set_priority`](crate::BlockPool::set_priority); a block
/// keeps the highest priority set since it was last handed out). When a
/// cached block of priority `p > 0` is released at clock `t`, it waits at
/// level `p` until the clock reaches `t + retention`: every ordinary free
/// block is reused before it, and lower priorities before higher ones,
/// least recently released first within a priority. When its retention
/// expires it becomes ordinary: it joins the back of level 0 as if released
/// at its expiry (blocks expiring at the same advance in expiry order, lower
/// priority first on ties) and its priority is cleared. The clock is the
/// pool's ([`BlockPool::advance_clock`](crate::BlockPool::advance_clock),
/// e.g. one tick per scheduler step); a retention of 0 makes priorities
/// inert.
///
/// State: a `u8` priority and a `u32` expiry per block. One retention for all
/// priorities keeps each level sorted by expiry, so expiry is checked at the
/// levels' fronts only.
#[derive(Clone, Debug)]
pub struct Priority {
    /// Priority per block, applied at its next release.
    prio: Vec<u8>,
    /// Clock tick at which a released protected block becomes ordinary.
    expiry: Vec<u32>,
    /// Ticks a released block keeps its priority.
    retention: u32,
}

impl Priority {
    /// State for `num_blocks` blocks.
    pub fn new(num_blocks: usize, retention: u32) -> Self {
        Self {
            prio: vec![0; num_blocks],
            expiry: vec![0; num_blocks],
            retention,
        }
    }

    /// `block`'s priority (applied at its next release).
    pub fn priority(&self, block: BlockId) -> u8 {
        self.prio[block.index()]
    }
}

impl EvictionPolicy for Priority {
    fn name(&self) -> String {
        EvictionConfig::Priority {
            retention: self.retention,
        }
        .to_string()
    }

    fn num_levels(&self) -> usize {
        LEVELS
    }

    #[inline]
    fn on_allocate(&mut self, blocks: &[BlockId], _queue: &mut LevelQueue) {
        for &b in blocks {
            self.prio[b.index()] = 0;
        }
    }

    #[inline]
    fn free_level(&mut self, block: BlockId, now: u32) -> usize {
        let p = self.prio[block.index()];
        if p == 0 || self.retention == 0 {
            return 0;
        }
        self.expiry[block.index()] = now.wrapping_add(self.retention);
        usize::from(p)
    }

    fn set_priority(&mut self, block: BlockId, priority: u8) {
        let p = &mut self.prio[block.index()];
        *p = (*p).max(priority);
    }

    fn on_clock(&mut self, now: u32, queue: &mut LevelQueue) {
        loop {
            // The earliest expired front over all protected levels.
            let mut pick: Option<(u32, BlockId)> = None;
            for level in 1..LEVELS {
                if let Some(b) = queue.front(level) {
                    let e = self.expiry[b.index()];
                    let earlier = pick.is_none_or(|(pe, _)| precedes(e, pe));
                    if reached(e, now) && earlier {
                        pick = Some((e, b));
                    }
                }
            }
            let Some((_, b)) = pick else { return };
            queue.remove(b);
            queue.push_back(b, 0);
            self.prio[b.index()] = 0;
        }
    }

    fn check_invariants(&self, queue: &LevelQueue, now: u32) -> Result<(), String> {
        if self.prio.len() != queue.capacity() || self.expiry.len() != queue.capacity() {
            return Err("priority: state slabs differ from the pool size".into());
        }
        for level in 1..LEVELS {
            let mut last: Option<u32> = None;
            for b in queue.iter_level(level) {
                let e = self.expiry[b.index()];
                if reached(e, now) {
                    return Err(format!(
                        "priority: block {b} at level {level} expired at {e} (now {now})"
                    ));
                }
                if last.is_some_and(|l| precedes(e, l)) {
                    return Err(format!("priority: level {level} not in expiry order"));
                }
                last = Some(e);
            }
        }
        Ok(())
    }

    fn heap_bytes(&self) -> usize {
        self.prio.capacity() + self.expiry.capacity() * 4
    }

    fn clone_box(&self) -> Box<dyn EvictionPolicy> {
        Box::new(self.clone())
    }
}
