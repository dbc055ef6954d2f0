//! `BlockPool`: every physical block's metadata, the free queue and the
//! prefix index, with vLLM 0.33.0's allocation, free and eviction order.
//!
//! # Order rules
//!
//! * A new pool's free queue is `1, 2, ..., num_blocks-1`; block 0 is the null
//!   block and never enters it.
//! * `get_new_blocks` takes from the front. A block that still carries a
//!   cache key loses it there (that is the moment a cached prefix is evicted).
//! * `free_blocks` receives blocks in eviction-priority order. Blocks reaching
//!   zero references without a key go to the front (reused first, in the
//!   given order); blocks with a key go to the back (kept longest: the back of
//!   the queue is an LRU of reusable prefixes).
//! * `touch` pins a block; a free cached block leaves the queue wherever it is.
//!
//! That is the default eviction policy ([`EvictionConfig::Lru`]). Any other
//! policy ([`crate::eviction`]) keeps the first three rules for unhashed
//! blocks and the free count, and orders the cached free blocks by its own
//! rule (`BlockPool::with_eviction`, `BlockPool::with_policy`).
//!
//! # Errors
//!
//! Every method validates its whole input before mutating anything; an `Err`
//! leaves the pool exactly as it was.
//!
//! # Files
//!
//! * this file: the per-block metadata, the [`BlockPool`] struct, its
//!   construction and [`BlockPool::check_invariants`];
//! * `order.rs`: the free blocks in their reuse order (vLLM's LRU queue or
//!   a ranked policy's levels);
//! * `alloc.rs`: taking, freeing and touching blocks, priorities and the
//!   clock;
//! * `prefix.rs`: caching full blocks, lookups, eviction and reset;
//! * `partial.rs`: partial and secondary keys (keys inside a block);
//! * `watch.rs`: blocks released but still read (`HiSparse`'s unpinning);
//! * `event_log.rs`: the events, and dropping a key (the one way a key
//!   leaves the index with an event);
//! * `readers.rs`: counters and read-outs of the pool's state.
//!
//! Layering inside the folder: `order.rs` imports nothing of this file; the
//! files holding `impl BlockPool` blocks import this file, and this file
//! imports only `order.rs`.

use crate::error::{KvError, KvResult};
use crate::events::{KvEvent, Medium};
use crate::eviction::{EvictionConfig, EvictionPolicy, LevelQueue, Ranker};
use crate::free_queue::FreeQueue;
use crate::ids::BlockId;
use crate::partial_keys::PartialKeys;
use crate::prefix_index::{KeySlot, PrefixIndex};
use crate::residency::Residency;
use crate::reuse_watch::ReuseWatch;
use crate::sampled_lives::SampledLives;

mod alloc;
mod event_log;
mod order;
mod partial;
mod prefix;
mod readers;
#[cfg(test)]
mod tests;
mod watch;

use order::{Order, Ranked};

/// `BlockMeta::key` of a block that is not in the prefix index.
const NO_KEY: KeySlot = KeySlot::MAX;

/// Per-block metadata: eight bytes, plus eight for the free-queue links.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct BlockMeta {
    /// Number of owners (request block tables, plus transient pins).
    /// Invariant: 0 iff the block is in the free queue, except the null block,
    /// which is never counted and never queued.
    ref_cnt: u32,
    /// Slot of this block's entry in the prefix index, or `NO_KEY`.
    /// Invariant: when set, that entry is live and lists this block; always
    /// `NO_KEY` when caching is disabled, and for the null block unless a
    /// caller keyed it by hand ([`BlockPool::insert_key`]).
    key: KeySlot,
}

/// The token count of a secondary key inserted by hand for the whole block
/// ([`BlockPool::insert_key`] without `tokens`).
const WHOLE_BLOCK: u32 = u32::MAX;

const FRESH: BlockMeta = BlockMeta {
    ref_cnt: 0,
    key: NO_KEY,
};

/// Construction parameters of a [`BlockPool`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Number of physical blocks, the null block included.
    pub num_blocks: usize,
    /// Whether full blocks may be registered in and looked up from the
    /// prefix index.
    pub enable_caching: bool,
    /// Tokens per hash unit (informational for the pool; the managers use it).
    pub hash_block_size: u32,
    /// Whether to record [`KvEvent`]s.
    pub enable_events: bool,
}

impl PoolConfig {
    /// Defaults matching vLLM: caching on, 16-token hash units, no events.
    pub fn new(num_blocks: usize) -> Self {
        Self {
            num_blocks,
            enable_caching: true,
            hash_block_size: 16,
            enable_events: false,
        }
    }
}

/// The KV-cache block pool. One owner thread; not internally synchronised.
#[derive(Clone, Debug)]
pub struct BlockPool {
    meta: Vec<BlockMeta>,
    /// Invariant: holds exactly the non-null blocks with `ref_cnt == 0`.
    free: Order,
    index: PrefixIndex,
    /// Partial and secondary keys of the few blocks that have them
    /// ([`crate::partial_keys`]). Invariant: an entry only for a block with
    /// a primary key; its secondary slots are live and list the block.
    partial: PartialKeys,
    /// Tokens behind each block's primary key (vLLM's
    /// `block_hash_num_tokens`): the block's end for a full-block key, the
    /// partial key's own count otherwise. Meaningful only while the block
    /// has a key; kept apart from `meta` (written only when a key is
    /// registered, read only by [`Self::key_num_tokens`]).
    key_tokens: Vec<u32>,
    config: PoolConfig,
    /// `Some` iff events are enabled.
    events: Option<Vec<KvEvent>>,
    /// Events before this index have been completed (`events_to_complete`).
    events_done: usize,
    /// The medium the events report.
    medium: Medium,
    /// Added to every group id the pool reports (events, key read-outs):
    /// a core holding only some of a configuration's groups (vLLM's
    /// `HiSparse` device groups, after the host-side source) reports the
    /// configuration's ids.
    group_base: u32,
    /// Cached blocks handed out again by `get_new_blocks` (each one lost its
    /// cache key: a prefix eviction), since construction.
    num_evictions: u64,
    /// The clock of time-based policies ([`Self::advance_clock`]), wrapping.
    now: u32,
    /// Residency metrics, when enabled (see [`crate::residency`]).
    residency: Option<Box<Residency>>,
    /// vLLM's sampled residency metrics, when enabled (see
    /// [`crate::sampled_lives`]).
    sampled: Option<Box<SampledLives>>,
    /// Released blocks still read until reused ([`Self::unpin_blocks`]).
    watch: ReuseWatch,
}

/// Bytes per block a ranked eviction policy adds to a pool, at most: its
/// level queue's links (8) and the policy's own state (up to 5).
const RANKED_BYTES_PER_BLOCK: usize = 16;

impl BlockPool {
    /// A pool of `config.num_blocks` blocks, all free except the null block,
    /// reused in vLLM's order.
    pub fn new(config: PoolConfig) -> KvResult<Self> {
        Self::with_eviction(config, EvictionConfig::Lru)
    }

    /// A pool reusing free blocks in the order of the built-in policy
    /// `eviction`.
    pub fn with_eviction(config: PoolConfig, eviction: EvictionConfig) -> KvResult<Self> {
        eviction.validate()?;
        if eviction != EvictionConfig::Lru {
            let bytes = config.num_blocks.saturating_mul(RANKED_BYTES_PER_BLOCK);
            crate::limits::reserve("the eviction policy's state", bytes)?;
        }
        Self::build(config, |n| match eviction.build(n) {
            None => Order::Lru(FreeQueue::new_ascending(n, 1)),
            Some(policy) => Self::ranked(n, policy),
        })
    }

    /// A pool reusing free blocks in the order of `policy`, whose per-block
    /// state must cover `config.num_blocks` blocks (a test double, an
    /// experiment; the built-ins are chosen with [`Self::with_eviction`]).
    pub fn with_policy(config: PoolConfig, policy: Box<dyn EvictionPolicy>) -> KvResult<Self> {
        let levels = policy.num_levels();
        if !(1..=crate::eviction::MAX_LEVELS).contains(&levels) {
            return Err(KvError::InvalidConfig {
                name: "eviction_policy",
                value: policy.name(),
                rule: format!(
                    "must use 1 to {} levels, not {levels}",
                    crate::eviction::MAX_LEVELS
                ),
            });
        }
        Self::build(config, |n| Self::ranked(n, Ranker::Custom(policy)))
    }

    /// Switch to the built-in policy `eviction`; refused while any block is
    /// in use (the null block aside). The free blocks keep their current
    /// order, all at the new policy's level 0, and its state starts fresh;
    /// cached blocks stay cached. Lets a pool built elsewhere (a manager's)
    /// take a policy without a new constructor parameter.
    pub fn set_eviction(&mut self, eviction: EvictionConfig) -> KvResult<()> {
        eviction.validate()?;
        let in_use = self.num_used_blocks();
        if in_use != 0 {
            return Err(KvError::Unsupported {
                what: format!(
                    "switching the eviction policy to {eviction} while {in_use} blocks are in use"
                ),
            });
        }
        let n = self.meta.len();
        // The new order's state is pool-sized: reserved before the switch.
        crate::limits::reserve(
            "the eviction policy's state",
            n.saturating_mul(RANKED_BYTES_PER_BLOCK),
        )?;
        let order = crate::limits::try_collect(
            self.num_free_blocks(),
            self.free_block_ids(),
            "free block ids",
        )?;
        self.free = match eviction.build(n) {
            None => {
                let mut q = FreeQueue::new_empty(n);
                let mut batch = q.begin_enqueue();
                for &b in &order {
                    batch.push(b, true);
                }
                batch.commit();
                Order::Lru(q)
            }
            Some(policy) => {
                let mut queue = LevelQueue::new_empty(n, policy.as_dyn().num_levels());
                for &b in &order {
                    queue.push_back(b, 0);
                }
                Order::Ranked(Box::new(Ranked {
                    queue,
                    policy,
                    released: Vec::new(),
                }))
            }
        };
        Ok(())
    }

    fn ranked(num_blocks: usize, policy: Ranker) -> Order {
        Order::Ranked(Box::new(Ranked {
            queue: LevelQueue::new_ascending(num_blocks, 1, policy.as_dyn().num_levels()),
            policy,
            released: Vec::new(),
        }))
    }

    /// The spec string of the eviction policy (`"lru"` by default).
    pub fn eviction_policy(&self) -> String {
        match &self.free {
            Order::Lru(_) => EvictionConfig::Lru.to_string(),
            Order::Ranked(r) => r.policy.as_dyn().name(),
        }
    }

    /// Validate `config`, then build the pool with the free queue `make`
    /// returns for `num_blocks` blocks (all free but the null block).
    fn build(config: PoolConfig, make: impl FnOnce(usize) -> Order) -> KvResult<Self> {
        let invalid = |name, rule: &str| KvError::InvalidConfig {
            name,
            value: match name {
                "num_blocks" => config.num_blocks.to_string(),
                _ => config.hash_block_size.to_string(),
            },
            rule: rule.into(),
        };
        if config.num_blocks == 0 {
            return Err(invalid(
                "num_blocks",
                "must be at least 1 (block 0 is the null block)",
            ));
        }
        if config.num_blocks > (u32::MAX - 2) as usize {
            return Err(invalid("num_blocks", "must be below 2^32 - 2"));
        }
        if config.hash_block_size == 0 {
            return Err(invalid("hash_block_size", "must be positive"));
        }
        // Fallible first: a pool the allocator cannot hold is an error.
        crate::limits::reserve_pool(config.num_blocks)?;
        Ok(Self {
            meta: vec![FRESH; config.num_blocks],
            free: make(config.num_blocks),
            index: PrefixIndex::new(),
            partial: PartialKeys::default(),
            key_tokens: vec![0; config.num_blocks],
            config,
            events: config.enable_events.then(Vec::new),
            events_done: 0,
            medium: Medium::Gpu,
            group_base: 0,
            num_evictions: 0,
            now: 0,
            residency: None,
            sampled: None,
            watch: ReuseWatch::default(),
        })
    }

    fn check_ids(&self, ids: &[BlockId]) -> KvResult<()> {
        let n = self.meta.len();
        match ids.iter().find(|b| b.index() >= n) {
            Some(b) => Err(KvError::BlockOutOfRange {
                block: u64::from(b.0),
                num_blocks: n,
            }),
            None => Ok(()),
        }
    }

    /// Check every invariant written on the fields above; `Err` names the
    /// first violation. `O(num_blocks)`; for tests and debugging.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.free.check_invariants(self.now)?;
        self.index.check_invariants()?;
        if let Some(s) = &self.sampled {
            s.check_invariants()?;
        }
        // The null block is never counted nor queued; it carries a key only
        // when keyed by hand (`insert_key`), checked with the others below.
        if self.meta[0].ref_cnt != FRESH.ref_cnt || self.free.contains(BlockId::NULL) {
            return Err("null block is counted or queued".into());
        }
        let mut keyed = 0usize;
        for (i, m) in self.meta.iter().enumerate() {
            let b = BlockId(i as u32);
            if !b.is_null() && (m.ref_cnt == 0) != self.free.contains(b) {
                return Err(format!(
                    "block {b}: ref_cnt {} but {} the free queue",
                    m.ref_cnt,
                    if self.free.contains(b) {
                        "in"
                    } else {
                        "not in"
                    }
                ));
            }
            if m.key != NO_KEY {
                if !self.config.enable_caching {
                    return Err(format!("block {b} cached with caching disabled"));
                }
                if !self.index.slot_holds(m.key, b) {
                    return Err(format!("block {b}: key slot {} does not list it", m.key));
                }
                keyed += 1;
            }
        }
        self.partial.check_not_empty()?;
        let mut secondaries = 0usize;
        for (b, e) in self.partial.iter() {
            let primary = self.meta.get(b.index()).map_or(NO_KEY, |m| m.key);
            if primary == NO_KEY {
                return Err(format!("block {b} has partial keys but no primary key"));
            }
            if e.primary_tokens
                .is_some_and(|t| t != self.key_tokens[b.index()])
            {
                return Err(format!(
                    "block {b}: partial primary key's token count differs"
                ));
            }
            for (j, &(slot, _)) in e.secondary.iter().enumerate() {
                if slot == primary || e.secondary[..j].iter().any(|&(s, _)| s == slot) {
                    return Err(format!("block {b}: secondary key slot {slot} repeated"));
                }
                if !self.index.slot_holds(slot, b) {
                    return Err(format!("block {b}: secondary slot {slot} does not list it"));
                }
                secondaries += 1;
            }
        }
        if keyed + secondaries != self.index.num_pairs() {
            return Err(format!(
                "{} (key, block) pairs in the index but {keyed} primary and \
                 {secondaries} secondary keys on blocks",
                self.index.num_pairs()
            ));
        }
        self.watch.check_invariants()?;
        if self.free.capacity() != self.meta.len() {
            return Err("free queue capacity differs from the pool size".into());
        }
        Ok(())
    }
}
