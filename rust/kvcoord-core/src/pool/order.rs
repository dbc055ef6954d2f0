//! The pool's free blocks in the order they are reused ([`Order`]):
//! vLLM's LRU free queue, or the levels of a ranked eviction policy.
//!
//! Invariant (kept by the pool): the order holds exactly the non-null
//! blocks without references.

use crate::eviction::{LevelQueue, Ranker};
use crate::free_queue::FreeQueue;
use crate::ids::BlockId;

/// The free blocks and the order in which they are reused.
#[derive(Clone, Debug)]
pub(super) enum Order {
    /// vLLM's order on its own queue: the default path pays only this
    /// variant's match for the seam.
    Lru(FreeQueue),
    /// Any other policy: levels chosen by the policy.
    Ranked(Box<Ranked>),
}

/// A policy-ordered free queue.
#[derive(Clone, Debug)]
pub(super) struct Ranked {
    pub(super) queue: LevelQueue,
    pub(super) policy: Ranker,
    /// Blocks whose count reached zero in the current `free_blocks` call.
    pub(super) released: Vec<BlockId>,
}

impl Order {
    #[inline]
    pub(super) fn len(&self) -> usize {
        match self {
            Self::Lru(q) => q.len(),
            Self::Ranked(r) => r.queue.len(),
        }
    }

    #[inline]
    pub(super) fn contains(&self, b: BlockId) -> bool {
        match self {
            Self::Lru(q) => q.contains(b),
            Self::Ranked(r) => r.queue.contains(b),
        }
    }

    pub(super) fn capacity(&self) -> usize {
        match self {
            Self::Lru(q) => q.capacity(),
            Self::Ranked(r) => r.queue.capacity(),
        }
    }

    pub(super) fn heap_bytes(&self) -> usize {
        match self {
            Self::Lru(q) => q.heap_bytes(),
            Self::Ranked(r) => {
                r.queue.heap_bytes() + r.policy.as_dyn().heap_bytes() + r.released.capacity() * 4
            }
        }
    }

    pub(super) fn check_invariants(&self, now: u32) -> Result<(), String> {
        match self {
            Self::Lru(q) => q.check_invariants(),
            Self::Ranked(r) => {
                r.queue.check_invariants()?;
                let levels = r.policy.as_dyn().num_levels();
                if r.queue.levels() != levels {
                    return Err(format!(
                        "queue has {} levels, the policy {levels}",
                        r.queue.levels()
                    ));
                }
                if !r.released.is_empty() {
                    return Err("released scratch not empty between calls".into());
                }
                r.policy.as_dyn().check_invariants(&r.queue, now)
            }
        }
    }
}
