//! The eviction seam: which free block the pool reuses next.
//!
//! Every free block (reference count 0) stays reusable whatever the policy,
//! so the free count, `usage` and out-of-blocks errors are the same under
//! every policy; a policy only orders reuse. Blocks without a cache key are
//! always reused first (front of the queue, most recently freed first, as in
//! vLLM); policies order the cached ones, whose reuse is an eviction.
//!
//! * [`EvictionConfig::Lru`], the default, is vLLM 0.33.0's order (tail
//!   first, unhashed first, least recently released first), kept on the
//!   pool's original [`FreeQueue`](crate::FreeQueue) path so the default pays
//!   nothing for the seam.
//! * Every other policy implements [`EvictionPolicy`]: it assigns each
//!   released cached block a *level* of a [`LevelQueue`] (level 0 reused
//!   first, least recently released first within a level) and may move
//!   blocks down levels as it ages them. The built-in ones ([`Lfu`],
//!   [`PrefixDepth`], [`Priority`]) are chosen with an [`EvictionConfig`] and
//!   dispatched statically; any other implementation (a test double, an
//!   experiment) plugs in through
//!   [`BlockPool::with_policy`](crate::BlockPool::with_policy).
//!
//! The rules of each policy are on its type and in `docs/eviction.md`.
//!
//! Files: `config.rs` (the spec strings), `policy.rs` (the trait),
//! `level_queue.rs`, `aging.rs` (the shape of the half-life policies, whose
//! rules are `lfu.rs` and `depth.rs`), `priority.rs`; this one builds a
//! config's policy and dispatches to it (`Ranker`).
//! The policies import the trait and the config, never this file.

mod aging;
mod config;
mod depth;
mod level_queue;
mod lfu;
mod policy;
mod priority;

pub use aging::{Aging, AgingRule};
pub use config::EvictionConfig;
pub use depth::{ChainDepth, PrefixDepth};
pub use level_queue::{LevelQueue, MAX_LEVELS};
pub use lfu::{Lfu, UseCount};
pub use policy::{EvictionPolicy, MAX_PRIORITY};
pub use priority::Priority;

impl EvictionConfig {
    /// Build the policy for a pool of `num_blocks` blocks; `None` for LRU,
    /// which the pool runs on its own queue.
    pub(crate) fn build(self, num_blocks: usize) -> Option<Ranker> {
        let turnover = |h: u32| {
            if h == 0 {
                u32::try_from(num_blocks.saturating_sub(1).max(1)).unwrap_or(u32::MAX)
            } else {
                h
            }
        };
        match self {
            Self::Lru => None,
            Self::Lfu { half_life } => Some(Ranker::Lfu(Lfu::new(
                num_blocks,
                turnover(half_life),
                half_life,
            ))),
            Self::PrefixDepth { half_life } => Some(Ranker::Depth(PrefixDepth::new(
                num_blocks,
                turnover(half_life),
                half_life,
            ))),
            Self::Priority { retention } => {
                Some(Ranker::Priority(Priority::new(num_blocks, retention)))
            }
        }
    }
}

/// The policy of a ranked pool: the built-ins by value (static dispatch),
/// anything else boxed.
#[derive(Clone, Debug)]
pub(crate) enum Ranker {
    Lfu(Lfu),
    Depth(PrefixDepth),
    Priority(Priority),
    Custom(Box<dyn EvictionPolicy>),
}

/// Run `$body` with `$p` bound to the policy inside `$ranker` as a concrete
/// type (or `dyn EvictionPolicy`), so hot loops are monomorphised per
/// built-in policy.
macro_rules! with_policy {
    ($ranker:expr, $p:ident => $body:expr) => {
        match $ranker {
            $crate::eviction::Ranker::Lfu($p) => $body,
            $crate::eviction::Ranker::Depth($p) => $body,
            $crate::eviction::Ranker::Priority($p) => $body,
            $crate::eviction::Ranker::Custom(boxed) => {
                let $p = &mut **boxed;
                $body
            }
        }
    };
}
pub(crate) use with_policy;

impl Ranker {
    /// The policy as a trait object (for the cold paths).
    pub(crate) fn as_dyn(&self) -> &dyn EvictionPolicy {
        match self {
            Self::Lfu(p) => p,
            Self::Depth(p) => p,
            Self::Priority(p) => p,
            Self::Custom(p) => &**p,
        }
    }

    /// The policy as a mutable trait object (for the cold paths).
    pub(crate) fn as_dyn_mut(&mut self) -> &mut dyn EvictionPolicy {
        match self {
            Self::Lfu(p) => p,
            Self::Depth(p) => p,
            Self::Priority(p) => p,
            Self::Custom(p) => &mut **p,
        }
    }
}
