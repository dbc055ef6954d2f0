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

mod depth;
mod level_queue;
mod lfu;
mod priority;

use std::fmt;
use std::str::FromStr;

pub use depth::PrefixDepth;
pub use level_queue::{LevelQueue, Prepend, MAX_LEVELS};
pub use lfu::Lfu;
pub use priority::Priority;

use crate::error::KvError;

/// Highest request priority [`BlockPool::set_priority`](crate::BlockPool::set_priority)
/// accepts (0 is ordinary).
pub const MAX_PRIORITY: u8 = 7;
use crate::ids::BlockId;

/// A reuse order for the pool's cached free blocks.
///
/// The pool calls the hooks after validating each operation, so a refused
/// call never reaches the policy. Per-block state belongs in flat slabs
/// indexed by [`BlockId::index`], a few bytes per block.
pub trait EvictionPolicy: fmt::Debug + Send + Sync {
    /// The policy's spec string (what [`EvictionConfig::from_str`] parses).
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

/// The built-in eviction policies, chosen when the pool is built.
///
/// Parsed from and printed as a spec string: `lru`, `lfu`,
/// `lfu:half_life=N`, `prefix-depth`, `prefix-depth:half_life=N`,
/// `priority`, `priority:retention=N`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum EvictionConfig {
    /// vLLM 0.33.0's order (the default).
    #[default]
    Lru,
    /// Least frequently used with aging; see [`Lfu`].
    Lfu {
        /// Blocks handed out between two halvings of every frequency; 0
        /// means one pool turnover (the number of usable blocks).
        half_life: u32,
    },
    /// Shallow prefix blocks protected; see [`PrefixDepth`].
    PrefixDepth {
        /// Blocks handed out between two one-level decays of protection; 0
        /// means one pool turnover.
        half_life: u32,
    },
    /// Per-request priority with a retention duration; see [`Priority`].
    Priority {
        /// Clock ticks a released block keeps its priority.
        retention: u32,
    },
}

impl EvictionConfig {
    /// Default retention of [`EvictionConfig::Priority`], in clock ticks.
    pub const DEFAULT_RETENTION: u32 = 1000;

    /// The built-in policies' names (what a spec starts with), in the order the
    /// docs list them; exported to Python for its did-you-mean.
    pub const NAMES: [&'static str; 4] = ["lru", "lfu", "prefix-depth", "priority"];

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

    /// Check the parameters' ranges.
    pub fn validate(&self) -> Result<(), KvError> {
        match *self {
            Self::Priority { retention } if retention > i32::MAX as u32 => {
                Err(KvError::InvalidConfig {
                    name: "eviction_policy",
                    value: self.to_string(),
                    rule: format!("retention must be at most {}", i32::MAX),
                })
            }
            _ => Ok(()),
        }
    }
}

impl fmt::Display for EvictionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Lru => f.write_str("lru"),
            Self::Lfu { half_life: 0 } => f.write_str("lfu"),
            Self::Lfu { half_life } => write!(f, "lfu:half_life={half_life}"),
            Self::PrefixDepth { half_life: 0 } => f.write_str("prefix-depth"),
            Self::PrefixDepth { half_life } => write!(f, "prefix-depth:half_life={half_life}"),
            Self::Priority { retention } => write!(f, "priority:retention={retention}"),
        }
    }
}

impl FromStr for EvictionConfig {
    type Err = KvError;

    fn from_str(spec: &str) -> Result<Self, KvError> {
        let fail = |rule: String| KvError::InvalidConfig {
            name: "eviction_policy",
            value: format!("{spec:?}"),
            rule,
        };
        let (name, params) = match spec.split_once(':') {
            Some((name, params)) => (name, Some(params)),
            None => (spec, None),
        };
        // The one parameter each policy takes, and its value when omitted.
        let (param, default) = match name {
            "lru" => ("", 0),
            "lfu" | "prefix-depth" => ("half_life", 0),
            "priority" => ("retention", Self::DEFAULT_RETENTION),
            _ => {
                return Err(fail(format!(
                    "must be one of {} (optionally followed by :half_life=N or :retention=N)",
                    Self::NAMES.join(", ")
                )))
            }
        };
        let value = match params {
            None => default,
            Some(p) => {
                let (key, value) = p.split_once('=').unwrap_or((p, ""));
                if param.is_empty() || key != param {
                    return Err(fail(if param.is_empty() {
                        format!("{name} takes no parameter")
                    } else {
                        format!("{name} takes one parameter, {param}=N")
                    }));
                }
                value
                    .parse::<u32>()
                    .map_err(|_| fail(format!("{param} must be a non-negative 32-bit integer")))?
            }
        };
        let config = match name {
            "lru" => Self::Lru,
            "lfu" => Self::Lfu { half_life: value },
            "prefix-depth" => Self::PrefixDepth { half_life: value },
            _ => Self::Priority { retention: value },
        };
        config.validate()?;
        Ok(config)
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

/// `floor(log2(x))` clamped to `0..levels` (0 for `x == 0`).
pub(crate) fn ilog2_level(x: u32, levels: usize) -> usize {
    if x == 0 {
        0
    } else {
        (x.ilog2() as usize).min(levels - 1)
    }
}

/// A counter of blocks handed out that ages a [`LevelQueue`] every
/// `half_life` blocks (shared by [`Lfu`] and [`PrefixDepth`]).
#[derive(Clone, Debug)]
pub(crate) struct AgingClock {
    /// Blocks handed out per aging step. Invariant: positive.
    pub(crate) half_life: u32,
    /// Blocks handed out since the last aging step. Invariant: below
    /// `half_life`.
    pub(crate) since: u32,
    /// Aging steps so far (wrapping).
    pub(crate) epoch: u32,
}

impl AgingClock {
    pub(crate) fn new(half_life: u32) -> Self {
        Self {
            half_life: half_life.max(1),
            since: 0,
            epoch: 0,
        }
    }

    /// Count `n` blocks handed out, aging `queue` once per completed
    /// half-life.
    #[inline]
    pub(crate) fn advance(&mut self, n: usize, queue: &mut LevelQueue) {
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

    pub(crate) fn check(&self) -> Result<(), String> {
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

    #[test]
    fn spec_strings_round_trip() {
        for (spec, want) in [
            ("lru", EvictionConfig::Lru),
            ("lfu", EvictionConfig::Lfu { half_life: 0 }),
            ("lfu:half_life=64", EvictionConfig::Lfu { half_life: 64 }),
            ("prefix-depth", EvictionConfig::PrefixDepth { half_life: 0 }),
            (
                "prefix-depth:half_life=9",
                EvictionConfig::PrefixDepth { half_life: 9 },
            ),
            (
                "priority:retention=5",
                EvictionConfig::Priority { retention: 5 },
            ),
        ] {
            let parsed: EvictionConfig = spec.parse().unwrap();
            assert_eq!(parsed, want, "{spec}");
            assert_eq!(parsed.to_string(), spec);
        }
        for name in EvictionConfig::NAMES {
            let parsed: EvictionConfig = name.parse().unwrap();
            assert!(parsed.to_string().starts_with(name), "{name}");
        }
        assert_eq!(
            "priority".parse::<EvictionConfig>().unwrap(),
            EvictionConfig::Priority {
                retention: EvictionConfig::DEFAULT_RETENTION
            }
        );
        for bad in [
            "",
            "LRU",
            "lru:x=1",
            "lfu:half_life",
            "lfu:half_life=-1",
            "lfu:retention=3",
            "priority:retention=4294967295",
            "arc",
        ] {
            let err = bad.parse::<EvictionConfig>().unwrap_err();
            assert!(
                matches!(
                    err,
                    KvError::InvalidConfig {
                        name: "eviction_policy",
                        ..
                    }
                ),
                "{bad}: {err}"
            );
        }
    }

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
}
