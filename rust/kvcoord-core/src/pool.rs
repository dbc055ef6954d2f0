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

use crate::block_hash::BlockHash;
use crate::error::{KvError, KvResult};
use crate::events::{KvEvent, Medium, StoredBlocks};
use crate::eviction::{with_policy, EvictionConfig, EvictionPolicy, LevelQueue, Ranker};
use crate::free_queue::FreeQueue;
use crate::ids::{BlockId, GroupId};
use crate::partial_keys::PartialKeys;
use crate::prefix_index::{CacheKey, KeySlot, PrefixIndex};
use crate::residency::Residency;
use crate::reuse_watch::ReuseWatch;

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

/// The free blocks and the order in which they are reused.
#[derive(Clone, Debug)]
enum Order {
    /// vLLM's order on its own queue: the default path pays only this
    /// variant's match for the seam.
    Lru(FreeQueue),
    /// Any other policy: levels chosen by the policy.
    Ranked(Box<Ranked>),
}

/// A policy-ordered free queue.
#[derive(Clone, Debug)]
struct Ranked {
    queue: LevelQueue,
    policy: Ranker,
    /// Blocks whose count reached zero in the current `free_blocks` call.
    released: Vec<BlockId>,
}

impl Order {
    #[inline]
    fn len(&self) -> usize {
        match self {
            Self::Lru(q) => q.len(),
            Self::Ranked(r) => r.queue.len(),
        }
    }

    #[inline]
    fn contains(&self, b: BlockId) -> bool {
        match self {
            Self::Lru(q) => q.contains(b),
            Self::Ranked(r) => r.queue.contains(b),
        }
    }

    fn capacity(&self) -> usize {
        match self {
            Self::Lru(q) => q.capacity(),
            Self::Ranked(r) => r.queue.capacity(),
        }
    }

    fn heap_bytes(&self) -> usize {
        match self {
            Self::Lru(q) => q.heap_bytes(),
            Self::Ranked(r) => {
                r.queue.heap_bytes() + r.policy.as_dyn().heap_bytes() + r.released.capacity() * 4
            }
        }
    }

    fn check_invariants(&self, now: u32) -> Result<(), String> {
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
            watch: ReuseWatch::default(),
        })
    }

    // ---- residency metrics ----------------------------------------------

    /// Start tracking residency metrics for every block (clock at 0).
    /// Enabling again keeps the data gathered so far.
    pub fn enable_residency(&mut self) -> KvResult<()> {
        self.enable_residency_with(true)
    }

    /// [`Self::enable_residency`], choosing whether each eviction keeps a
    /// record for `drain_records` (`false`: the histograms only; see
    /// [`Residency::set_keep_records`]). Enabling again sets the choice and
    /// keeps the data gathered so far. The per-block state is pool-sized:
    /// reserved fallibly first (`OutOfMemory`, nothing changed).
    pub fn enable_residency_with(&mut self, keep_records: bool) -> KvResult<()> {
        if self.residency.is_none() {
            let n = self.meta.len();
            crate::limits::reserve("residency metrics", Residency::bytes_for(n))?;
            self.residency = Some(Box::new(Residency::new(n)));
        }
        if let Some(r) = self.residency.as_mut() {
            r.set_keep_records(keep_records);
        }
        Ok(())
    }

    /// The residency metrics, when enabled.
    pub fn residency(&self) -> Option<&Residency> {
        self.residency.as_deref()
    }

    /// The residency metrics, mutably (clock, drain), when enabled.
    pub fn residency_mut(&mut self) -> Option<&mut Residency> {
        self.residency.as_deref_mut()
    }

    /// Move the residency clock to `now` (a no-op when metrics are off).
    pub fn set_residency_clock(&mut self, now: u64) {
        if let Some(r) = self.residency_mut() {
            r.set_now(now);
        }
    }

    /// The eviction records gathered since the last drain (none when
    /// metrics are off).
    pub fn drain_eviction_records(&mut self) -> Vec<crate::EvictionRecord> {
        self.residency_mut()
            .map(Residency::drain_records)
            .unwrap_or_default()
    }

    // ---- counters -------------------------------------------------------

    /// The construction parameters.
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// Number of blocks, the null block included.
    pub fn num_blocks(&self) -> usize {
        self.meta.len()
    }

    /// Blocks in the free queue (evictable cached blocks included).
    #[inline]
    pub fn num_free_blocks(&self) -> usize {
        self.free.len()
    }

    /// Fraction of usable blocks (null block excluded) that are in use.
    pub fn usage(&self) -> f64 {
        let usable = self.meta.len() - 1;
        if usable == 0 {
            return 0.0;
        }
        1.0 - self.free.len() as f64 / usable as f64
    }

    /// Cached blocks reused for new data since construction (prefix-cache
    /// evictions caused by allocation; `evict_blocks` is not counted).
    pub fn num_evictions(&self) -> u64 {
        self.num_evictions
    }

    /// Number of distinct keys in the prefix index.
    pub fn num_cached_keys(&self) -> usize {
        self.index.len()
    }

    /// Whether prefix caching is on.
    pub fn caching_enabled(&self) -> bool {
        self.config.enable_caching
    }

    /// Reference count of `block` (0 for the null block).
    pub fn ref_count(&self, block: BlockId) -> KvResult<u32> {
        self.check_ids(&[block])?;
        Ok(self.meta[block.index()].ref_cnt)
    }

    /// Whether `block` currently carries a cache key.
    pub fn is_cached(&self, block: BlockId) -> KvResult<bool> {
        self.check_ids(&[block])?;
        Ok(self.meta[block.index()].key != NO_KEY)
    }

    /// The key `block` is cached under, if any.
    pub fn cache_key(&self, block: BlockId) -> KvResult<Option<CacheKey>> {
        self.check_ids(&[block])?;
        let slot = self.meta[block.index()].key;
        Ok((slot != NO_KEY).then(|| self.index.key_at(slot)))
    }

    /// Tokens behind `block`'s primary key when it was registered as a
    /// partial key ([`Self::cache_partial_block`], or moved from one by
    /// [`Self::move_block_keys`]); `None` for a full-block key (it covers
    /// the whole block) and for an uncached block.
    pub fn primary_key_tokens(&self, block: BlockId) -> KvResult<Option<usize>> {
        self.check_ids(&[block])?;
        Ok(self.partial.primary_tokens(block).map(|t| t as usize))
    }

    /// Tokens behind `block`'s primary key (vLLM's `block_hash_num_tokens`):
    /// the end of the block's position for a full-block key, the partial
    /// key's count otherwise (moved with the key by
    /// [`Self::move_block_keys`]); `None` for an uncached block and for a
    /// whole-block key inserted by hand without a count
    /// ([`Self::insert_key`]).
    pub fn key_num_tokens(&self, block: BlockId) -> KvResult<Option<usize>> {
        self.check_ids(&[block])?;
        let t = self.key_tokens[block.index()];
        Ok((self.meta[block.index()].key != NO_KEY && t != WHOLE_BLOCK).then_some(t as usize))
    }

    /// Every key `block` is cached under: the primary key first, then its
    /// secondary keys in insertion order, each with the tokens behind it
    /// (`None`: the whole block).
    pub fn cache_keys(&self, block: BlockId) -> KvResult<Vec<(CacheKey, Option<usize>)>> {
        self.check_ids(&[block])?;
        let slot = self.meta[block.index()].key;
        if slot == NO_KEY {
            return Ok(Vec::new());
        }
        let mut out = vec![(
            self.index.key_at(slot),
            self.partial.primary_tokens(block).map(|t| t as usize),
        )];
        if let Some(e) = self.partial.get(block) {
            out.extend(e.secondary.iter().map(|&(s, t)| {
                (
                    self.index.key_at(s),
                    (t != WHOLE_BLOCK).then_some(t as usize),
                )
            }));
        }
        Ok(out)
    }

    /// Number of blocks with a partial primary key or secondary keys.
    pub fn num_partial_blocks(&self) -> usize {
        self.partial.len()
    }

    // ---- state export -----------------------------------------------------

    /// The free queue, front (handed out next) to back. Under a ranked
    /// policy: level 0 front to back, then level 1, ... (the order in which
    /// `get_new_blocks` hands them out while the clock stands still).
    pub fn free_block_ids(&self) -> impl Iterator<Item = BlockId> + '_ {
        let (lru, ranked) = match &self.free {
            Order::Lru(q) => (Some(q.iter()), None),
            Order::Ranked(r) => (None, Some(r.queue.iter())),
        };
        lru.into_iter()
            .flatten()
            .chain(ranked.into_iter().flatten())
    }

    /// The free-queue entries either side of `block`, front side first, in
    /// [`Self::free_block_ids`]'s order (`None` for an end of the queue);
    /// `None` when `block` is not free. O(1) under LRU, a walk otherwise.
    pub fn free_neighbours(
        &self,
        block: BlockId,
    ) -> KvResult<Option<(Option<BlockId>, Option<BlockId>)>> {
        self.check_ids(&[block])?;
        if let Order::Lru(q) = &self.free {
            return Ok(q.neighbours(block));
        }
        let mut prev = None;
        let mut it = self.free_block_ids();
        for b in it.by_ref() {
            if b == block {
                return Ok(Some((prev, it.next())));
            }
            prev = Some(b);
        }
        Ok(None)
    }

    /// Reference count of every block, by id.
    pub fn ref_counts(&self) -> impl ExactSizeIterator<Item = u32> + '_ {
        self.meta.iter().map(|m| m.ref_cnt)
    }

    /// Whether each block carries a cache key, by id.
    pub fn cached_mask(&self) -> impl ExactSizeIterator<Item = bool> + '_ {
        self.meta.iter().map(|m| m.key != NO_KEY)
    }

    /// Heap bytes used by per-block metadata (metadata and free-queue links),
    /// excluding the prefix index, whose size follows the number of keys.
    pub fn metadata_bytes(&self) -> usize {
        self.meta.capacity() * std::mem::size_of::<BlockMeta>() + self.free.heap_bytes()
    }

    /// Heap bytes of the prefix index.
    pub fn index_bytes(&self) -> usize {
        self.index.heap_bytes() + self.partial.heap_bytes()
    }

    // ---- validation helpers -------------------------------------------

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

    // ---- allocation -------------------------------------------------------

    /// Take `n` blocks from the front of the free queue, append them to `out`
    /// in queue order and give each one reference. A taken block that was
    /// still cached is evicted from the prefix index.
    pub fn get_new_blocks(&mut self, n: usize, out: &mut Vec<BlockId>) -> KvResult<()> {
        if n > self.free.len() {
            return Err(KvError::OutOfBlocks {
                requested: n,
                available: self.free.len(),
            });
        }
        let start = out.len();
        out.resize(start + n, BlockId::NULL);
        let mut any_cached = false;
        // A slice local, so the loop does not reload the Vec's header.
        let meta = &mut self.meta[..];
        match &mut self.free {
            Order::Lru(q) => q.pop_front_into(&mut out[start..], |b| {
                any_cached |= Self::take(meta, b);
            }),
            Order::Ranked(r) => {
                let Ranked { queue, policy, .. } = &mut **r;
                queue.pop_front_into(&mut out[start..], |b| {
                    any_cached |= Self::take(meta, b);
                });
                with_policy!(policy, p => p.on_allocate(&out[start..], queue));
            }
        }
        if !self.watch.is_empty() {
            self.watch.on_handed_out(&out[start..]);
        }
        if let Some(r) = self.residency.as_deref_mut() {
            for &b in &out[start..] {
                if self.meta[b.index()].key != NO_KEY {
                    r.on_evict(b);
                }
                r.on_allocate(b);
            }
        }
        if any_cached {
            for &b in &out[start..] {
                if self.meta[b.index()].key != NO_KEY {
                    self.drop_key(b);
                    self.num_evictions += 1;
                }
            }
        }
        Ok(())
    }

    /// Give a block popped from the free queue its first reference; returns
    /// whether it is still cached.
    #[inline]
    fn take(meta: &mut [BlockMeta], b: BlockId) -> bool {
        let m = &mut meta[b.index()];
        debug_assert_eq!(m.ref_cnt, 0, "queued block {b} has owners");
        m.ref_cnt = 1;
        m.key != NO_KEY
    }

    /// Release one reference of each block, `blocks` ordered by eviction
    /// priority (first = evicted first). The null block is skipped.
    ///
    /// Blocks reaching zero are queued in the given order: uncached ones in
    /// front of the current front (reused first), cached ones behind the
    /// current back (kept longest). A block listed several times takes the
    /// place of its last occurrence.
    pub fn free_blocks(&mut self, blocks: &[BlockId]) -> KvResult<()> {
        let q = match &mut self.free {
            Order::Lru(q) => q,
            Order::Ranked(r) => {
                let Ranked {
                    queue,
                    policy,
                    released,
                } = &mut **r;
                // As below, in one pass: unhashed blocks staged for the
                // front of level 0, cached ones kept for the policy, which
                // sees them only once the whole call is accepted.
                let meta = &mut self.meta[..];
                released.clear();
                let mut front = queue.begin_prepend();
                for i in 0..blocks.len() {
                    let b = blocks[i];
                    if b.is_null() {
                        continue;
                    }
                    let err = match meta.get_mut(b.index()) {
                        Some(m) if m.ref_cnt > 0 => {
                            m.ref_cnt -= 1;
                            if m.ref_cnt == 0 {
                                if m.key == NO_KEY {
                                    front.push(b);
                                } else {
                                    released.push(b);
                                }
                            }
                            continue;
                        }
                        Some(_) => KvError::RefCountUnderflow(b),
                        None => KvError::BlockOutOfRange {
                            block: u64::from(b.0),
                            num_blocks: meta.len(),
                        },
                    };
                    drop(front);
                    released.clear();
                    for &undo in &blocks[..i] {
                        if !undo.is_null() {
                            meta[undo.index()].ref_cnt += 1;
                        }
                    }
                    return Err(err);
                }
                front.commit();
                let now = self.now;
                with_policy!(policy, p => Self::enqueue_cached(queue, p, released, now));
                released.clear();
                return Ok(());
            }
        };
        // One pass: decrement, and stage each block whose count reaches zero
        // (once per block, at its last occurrence) for the front or, if it
        // is cached, the back of the free queue. On the first bad id the
        // staged batch is dropped (unstaged) and the decrements undone.
        let meta = &mut self.meta[..];
        let mut batch = q.begin_enqueue();
        for i in 0..blocks.len() {
            let b = blocks[i];
            if b.is_null() {
                continue;
            }
            let err = match meta.get_mut(b.index()) {
                Some(m) if m.ref_cnt > 0 => {
                    m.ref_cnt -= 1;
                    if m.ref_cnt == 0 {
                        batch.push(b, m.key != NO_KEY);
                    }
                    continue;
                }
                Some(_) => KvError::RefCountUnderflow(b),
                None => KvError::BlockOutOfRange {
                    block: u64::from(b.0),
                    num_blocks: meta.len(),
                },
            };
            drop(batch);
            for &undo in &blocks[..i] {
                if !undo.is_null() {
                    meta[undo.index()].ref_cnt += 1;
                }
            }
            return Err(err);
        }
        batch.commit();
        Ok(())
    }

    /// Queue released cached blocks at the back of the level the policy
    /// picks for each, in the given order.
    #[inline]
    fn enqueue_cached<P: EvictionPolicy + ?Sized>(
        queue: &mut LevelQueue,
        policy: &mut P,
        released: &[BlockId],
        now: u32,
    ) {
        let top = queue.levels() - 1;
        for &b in released {
            let level = policy.free_level(b, now).min(top);
            queue.push_back(b, level);
        }
    }

    /// How many of `blocks` are non-null and unreferenced: a prefix hit on
    /// them pulls them out of the free queue, so they consume free capacity
    /// just like fresh blocks. Out-of-range ids count as 0 (callers validate).
    pub fn num_unreferenced(&self, blocks: &[BlockId]) -> usize {
        blocks
            .iter()
            .filter(|b| !b.is_null() && self.meta.get(b.index()).is_some_and(|m| m.ref_cnt == 0))
            .count()
    }

    /// Whether every id is below the pool size.
    pub fn ids_in_range(&self, blocks: &[BlockId]) -> bool {
        self.check_ids(blocks).is_ok()
    }

    /// Add one reference to each block; a block with no owner leaves the free
    /// queue (a prefix hit on an evictable block). The null block is skipped.
    pub fn touch(&mut self, blocks: &[BlockId]) -> KvResult<()> {
        self.check_ids(blocks)?;
        // Even if every entry named the same block, no count may overflow:
        // checking that up front lets the one real pass below not fail.
        let headroom = u32::MAX - u32::try_from(blocks.len()).unwrap_or(u32::MAX);
        if let Some(&b) = blocks
            .iter()
            .find(|b| self.meta[b.index()].ref_cnt > headroom)
        {
            return Err(KvError::RefCountOverflow(b));
        }
        match &mut self.free {
            Order::Lru(q) => {
                for &b in blocks {
                    if b.is_null() {
                        continue;
                    }
                    let m = &mut self.meta[b.index()];
                    if m.ref_cnt == 0 {
                        // An evictable (cached, free) block is now in use.
                        q.remove(b);
                    }
                    m.ref_cnt += 1;
                }
            }
            Order::Ranked(r) => {
                let Ranked { queue, policy, .. } = &mut **r;
                let meta = &mut self.meta[..];
                with_policy!(policy, p => {
                    for &b in blocks {
                        if b.is_null() {
                            continue;
                        }
                        let m = &mut meta[b.index()];
                        if m.ref_cnt == 0 {
                            queue.remove(b);
                        }
                        m.ref_cnt += 1;
                        p.on_hit(b);
                    }
                });
            }
        }
        if let Some(r) = self.residency.as_deref_mut() {
            for &b in blocks.iter().filter(|b| !b.is_null()) {
                r.on_hit(b);
            }
        }
        Ok(())
    }

    /// Mark `blocks` as held by a request of priority `priority` (0, the
    /// default, to [`MAX_PRIORITY`](crate::eviction::MAX_PRIORITY)). Only the
    /// [`Priority`](crate::eviction::Priority) policy acts on it; the others
    /// accept and ignore it, so a scheduler can pass priorities whatever the
    /// policy. The null block is skipped.
    pub fn set_priority(&mut self, blocks: &[BlockId], priority: i64) -> KvResult<()> {
        self.check_ids(blocks)?;
        let priority = u8::try_from(priority)
            .ok()
            .filter(|&p| p <= crate::eviction::MAX_PRIORITY)
            .ok_or_else(|| KvError::InvalidArgument {
                name: "priority",
                detail: format!(
                    "must be 0 to {}, got {priority}",
                    crate::eviction::MAX_PRIORITY
                ),
            })?;
        if let Order::Ranked(r) = &mut self.free {
            let policy = r.policy.as_dyn_mut();
            for &b in blocks.iter().filter(|b| !b.is_null()) {
                policy.set_priority(b, priority);
            }
        }
        Ok(())
    }

    /// Advance the clock of time-based policies by `ticks` (for example one
    /// per scheduler step); retentions that expire are applied now.
    pub fn advance_clock(&mut self, ticks: i64) -> KvResult<()> {
        let ticks = u32::try_from(ticks)
            .ok()
            .filter(|&t| i32::try_from(t).is_ok())
            .ok_or_else(|| KvError::InvalidArgument {
                name: "ticks",
                detail: format!("must be 0 to {} per call, got {ticks}", i32::MAX),
            })?;
        // A modular clock, not a count: policies compare its readings in
        // serial-number order (`eviction::priority`), so it wraps by design.
        self.now = self.now.wrapping_add(ticks);
        if let Order::Ranked(r) = &mut self.free {
            let Ranked { queue, policy, .. } = &mut **r;
            policy.as_dyn_mut().on_clock(self.now, queue);
        }
        Ok(())
    }

    /// The clock (wrapping at 2^32 ticks).
    pub fn clock(&self) -> u32 {
        self.now
    }

    // ---- prefix index -----------------------------------------------------

    /// Register `block_ids[num_cached_blocks..num_full_blocks]` in the prefix
    /// index under `block_hashes[i]` salted with `group`.
    ///
    /// `block_mask`, when given, has one entry per block of that range; a
    /// `false` entry skips the block (sparse caching for sliding-window and
    /// Mamba groups). Null blocks are skipped. A no-op when caching is
    /// disabled or when `num_cached_blocks >= num_full_blocks`.
    pub fn cache_full_blocks(
        &mut self,
        block_ids: &[BlockId],
        block_hashes: &[BlockHash],
        num_cached_blocks: usize,
        num_full_blocks: usize,
        group: GroupId,
        block_mask: Option<&[bool]>,
    ) -> KvResult<()> {
        self.cache_full_blocks_scaled(
            block_ids,
            block_hashes,
            1,
            num_cached_blocks,
            num_full_blocks,
            group,
            block_mask,
        )
    }

    /// [`cache_full_blocks`](Self::cache_full_blocks) for a group whose
    /// blocks span `scale` hash units: `unit_hashes` are the request's
    /// hash-unit hashes and block `i` is keyed by `unit_hashes[(i+1)*scale-1]`
    /// (the last unit inside it; the chain already covers the whole prefix).
    /// Views the hashes in place instead of materialising a coarse list.
    #[allow(clippy::too_many_arguments)]
    pub fn cache_full_blocks_scaled(
        &mut self,
        block_ids: &[BlockId],
        unit_hashes: &[BlockHash],
        scale: usize,
        num_cached_blocks: usize,
        num_full_blocks: usize,
        group: GroupId,
        block_mask: Option<&[bool]>,
    ) -> KvResult<()> {
        if num_cached_blocks >= num_full_blocks {
            return Ok(());
        }
        let range = num_cached_blocks..num_full_blocks;
        check_scaled_args(
            block_ids.len(),
            unit_hashes.len(),
            scale,
            &range,
            block_mask,
        )?;
        let hash_at = |i: usize| unit_hashes[(i + 1) * scale - 1];
        let new_blocks = &block_ids[range.clone()];
        self.check_ids(new_blocks)?;
        if !self.config.enable_caching {
            return Ok(());
        }
        let selected = |i: usize| block_mask.is_none_or(|m| m[i]);
        // Token ends of blocks: the products saturate where they pass any
        // 32-bit key count (only reachable with ranges of 2^32 blocks), so
        // a comparison with such a count stays right and nothing wraps.
        let unit_tokens = scale.saturating_mul(self.config.hash_block_size as usize);
        self.check_promotions(new_blocks, num_cached_blocks, unit_tokens, &selected)?;
        let promotable = |pool: &Self, i: usize, b: BlockId| {
            pool.partial.primary_tokens(b).is_some_and(|t| {
                (t as usize) < (num_cached_blocks + i + 1).saturating_mul(unit_tokens)
            })
        };
        let record = self.events.is_some();
        let mut stored_hashes = Vec::new();
        let mut stored_ids = Vec::new();
        let mut skipped = Vec::new();
        for (i, &b) in new_blocks.iter().enumerate() {
            if !selected(i) || b.is_null() {
                if record {
                    skipped.push(u32::try_from(num_cached_blocks + i).unwrap_or(u32::MAX));
                }
                continue;
            }
            if self.meta[b.index()].key != NO_KEY && promotable(self, i, b) {
                // Partial -> full promotion of the same block (vLLM removes
                // every key of the block, reported, before the new one).
                self.drop_key(b);
            }
            if self.meta[b.index()].key != NO_KEY {
                // Only possible when `b` appears twice in the range: undo the
                // keys this call added and refuse.
                for &done in &stored_ids {
                    self.unlink_key_silently(done);
                }
                return Err(KvError::AlreadyCached(b));
            }
            let hash = hash_at(num_cached_blocks + i);
            let key = CacheKey { hash, group };
            self.meta[b.index()].key = self.index.insert(key, b);
            self.key_tokens[b.index()] =
                u32::try_from((num_cached_blocks + i + 1).saturating_mul(unit_tokens))
                    .unwrap_or(u32::MAX);
            stored_ids.push(b);
            if record {
                stored_hashes.push(hash);
            }
        }
        if let Order::Ranked(r) = &mut self.free {
            let policy = r.policy.as_dyn_mut();
            for (i, &b) in new_blocks.iter().enumerate() {
                if selected(i) && !b.is_null() {
                    let depth = num_cached_blocks + i + 1;
                    policy.on_cache(b, u32::try_from(depth).unwrap_or(u32::MAX));
                }
            }
        }
        let reported = self.reported_group(group);
        if let Some(events) = &mut self.events {
            let block_size = u32::try_from(scale)
                .unwrap_or(u32::MAX)
                .saturating_mul(self.config.hash_block_size);
            events.push(KvEvent::BlockStored(Box::new(StoredBlocks {
                block_hashes: stored_hashes,
                block_ids: stored_ids,
                parent_block_hash: num_cached_blocks.checked_sub(1).map(hash_at),
                first_block: num_cached_blocks,
                num_blocks: range.len(),
                skipped,
                ..StoredBlocks::new(reported, block_size, self.medium)
            })));
        }
        Ok(())
    }

    /// `cache_full_blocks` on `new_blocks` (block `i` ends at
    /// `(first + i + 1) * unit_tokens`): a selected block that already has a
    /// key is accepted only when that key is a partial one covering less
    /// (partial -> full promotion, which drops keys for good, so then no
    /// block may be listed twice).
    fn check_promotions(
        &self,
        new_blocks: &[BlockId],
        first: usize,
        unit_tokens: usize,
        selected: &dyn Fn(usize) -> bool,
    ) -> KvResult<()> {
        let mut any_promotion = false;
        for (i, &b) in new_blocks.iter().enumerate() {
            if selected(i) && !b.is_null() && self.meta[b.index()].key != NO_KEY {
                let promotable = self
                    .partial
                    .primary_tokens(b)
                    .is_some_and(|t| (t as usize) < (first + i + 1).saturating_mul(unit_tokens));
                if !promotable {
                    return Err(KvError::AlreadyCached(b));
                }
                any_promotion = true;
            }
        }
        if any_promotion {
            let mut seen = hashbrown::HashSet::new();
            seen.try_reserve(new_blocks.len()).map_err(|_| {
                crate::limits::out_of_memory("a set of block ids", new_blocks.len())
            })?;
            for (i, &b) in new_blocks.iter().enumerate() {
                if selected(i) && !b.is_null() && !seen.insert(b) {
                    return Err(KvError::AlreadyCached(b));
                }
            }
        }
        Ok(())
    }

    /// For each group in order, the earliest block cached under
    /// `(hash, group)`; `None` if any group misses. Pure lookup.
    pub fn get_cached_block(
        &self,
        hash: &BlockHash,
        groups: &[GroupId],
        out: &mut Vec<BlockId>,
    ) -> bool {
        if !self.config.enable_caching {
            return false;
        }
        let start = out.len();
        for &group in groups {
            if let Some(b) = self.index.get_one(&CacheKey { hash: *hash, group }) {
                out.push(b);
            } else {
                out.truncate(start);
                return false;
            }
        }
        true
    }

    /// The earliest block cached under `(hash, group)`.
    #[inline]
    pub fn lookup(&self, hash: &BlockHash, group: GroupId) -> Option<BlockId> {
        if !self.config.enable_caching {
            return None;
        }
        self.index.get_one(&CacheKey { hash: *hash, group })
    }

    /// Drop these blocks' cache keys. Ref counts and queue positions do not
    /// change: a block in use stays allocated, it just stops serving hits.
    pub fn evict_blocks(&mut self, blocks: &[BlockId]) -> KvResult<()> {
        self.check_ids(blocks)?;
        for &b in blocks {
            if self.meta[b.index()].key != NO_KEY {
                if let Some(r) = self.residency.as_deref_mut() {
                    r.on_evict(b);
                }
                self.drop_key(b);
            }
        }
        Ok(())
    }

    /// Forget every cached prefix. Refused (returns `false`, no change)
    /// unless only the null block is in use.
    pub fn reset_prefix_cache(&mut self) -> bool {
        if self.meta.len() - self.free.len() != 1 {
            return false;
        }
        self.index.clear();
        self.partial.clear();
        for (i, m) in self.meta.iter_mut().enumerate() {
            if m.key != NO_KEY {
                if let Some(r) = self.residency.as_deref_mut() {
                    r.on_evict(BlockId(i as u32));
                }
            }
            m.key = NO_KEY;
        }
        if !self.watch.is_empty() {
            self.watch.on_reset();
        }
        if let Some(events) = &mut self.events {
            events.push(KvEvent::AllBlocksCleared);
        }
        true
    }

    // ---- released but still read (HiSparse) --------------------------------

    /// Release one reference of each block while its contents stay readable
    /// until the pool reuses it (vLLM's `BlockPool.unpin_blocks`). A block
    /// reaching zero joins the back of the free queue whether or not it is
    /// cached (the last to be reused), and counts as free; every listed block
    /// is watched: when [`Self::get_new_blocks`] hands it out, or a
    /// successful [`Self::reset_prefix_cache`] forgets the pool's contents,
    /// it is reported once by [`Self::take_reused_watched`].
    ///
    /// Refused (nothing changed) for an out-of-range id, the null block, a
    /// block listed more often than it has references, and on a pool with a
    /// ranked eviction policy (vLLM's rule is a single LRU queue).
    pub fn unpin_blocks(&mut self, blocks: &[BlockId]) -> KvResult<()> {
        self.check_ids(blocks)?;
        let Order::Lru(q) = &mut self.free else {
            return Err(KvError::Unsupported {
                what: "unpin_blocks on a pool with a ranked eviction policy".into(),
            });
        };
        let mut counts: std::collections::HashMap<BlockId, u32> = std::collections::HashMap::new();
        counts
            .try_reserve(blocks.len())
            .map_err(|_| crate::limits::out_of_memory("a count per block id", blocks.len()))?;
        // The watch list is pool-sized: reserved before anything changes.
        self.watch.reserve(self.meta.len())?;
        for &b in blocks {
            if b.is_null() {
                return Err(KvError::InvalidArgument {
                    name: "blocks",
                    detail: "the null block cannot be unpinned".into(),
                });
            }
            let n = counts.entry(b).or_insert(0);
            *n += 1;
            if *n > self.meta[b.index()].ref_cnt {
                return Err(KvError::RefCountUnderflow(b));
            }
        }
        let mut batch = q.begin_enqueue();
        for &b in blocks {
            let m = &mut self.meta[b.index()];
            m.ref_cnt -= 1;
            if m.ref_cnt == 0 {
                batch.push(b, true);
            }
        }
        batch.commit();
        self.watch.watch(self.meta.len(), blocks);
        Ok(())
    }

    /// The watched blocks ([`Self::unpin_blocks`]) handed out or forgotten
    /// since the last call, in that order; each is reported once and is no
    /// longer watched.
    pub fn take_reused_watched(&mut self) -> Vec<BlockId> {
        self.watch.take_reused()
    }

    /// Number of blocks watched by [`Self::unpin_blocks`] and not reused yet.
    pub fn num_watched(&self) -> usize {
        self.watch.len()
    }

    /// Number of blocks still in use besides the null block.
    pub fn num_used_blocks(&self) -> usize {
        self.meta.len() - 1 - self.free.len()
    }

    /// Drain the recorded events (empty when events are disabled).
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.events_done = 0;
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Whether events are being recorded.
    pub fn events_enabled(&self) -> bool {
        self.events.is_some()
    }

    /// The medium the events report ([`Medium::Gpu`] unless set).
    pub fn event_medium(&self) -> Medium {
        self.medium
    }

    /// Report events of this pool as living on `medium` from now on.
    pub fn set_event_medium(&mut self, medium: Medium) {
        self.medium = medium;
    }

    /// Report group `g` as `g + base` from now on (events, key read-outs);
    /// keys inside the pool keep the caller's ids.
    pub fn set_group_base(&mut self, base: u32) {
        self.group_base = base;
    }

    /// The id group `group` is reported under (see [`Self::set_group_base`]).
    pub fn reported_group(&self, group: GroupId) -> GroupId {
        GroupId(group.0.saturating_add(self.group_base))
    }

    /// The `BlockStored` events recorded since the last call, for the
    /// caller to complete with what only it knows
    /// ([`StoredBlocks::complete`]: the request's tokens and extra keys, the
    /// group's spec); the coordinator calls this after every call that may
    /// cache blocks of one request. Empty when events are off.
    pub fn events_to_complete(&mut self) -> impl Iterator<Item = &mut StoredBlocks> + '_ {
        let (start, events) = match &mut self.events {
            Some(events) => {
                let start = self.events_done;
                self.events_done = events.len();
                (start, &mut events[..])
            }
            None => (0, &mut [][..]),
        };
        events[start..].iter_mut().filter_map(|e| match e {
            KvEvent::BlockStored(s) => Some(&mut **s),
            _ => None,
        })
    }

    /// Remove `b`'s key, recording a `BlockRemoved` (vLLM reports every
    /// block that loses its key, even when others still hold the key).
    fn drop_key(&mut self, b: BlockId) {
        let slot = std::mem::replace(&mut self.meta[b.index()].key, NO_KEY);
        if let Some(events) = &mut self.events {
            let key = self.index.key_at(slot);
            events.push(KvEvent::BlockRemoved {
                block_hash: key.hash,
                group: GroupId(key.group.0.saturating_add(self.group_base)),
                medium: self.medium,
            });
        }
        self.index.remove(slot, b);
        if let Some(e) = self.partial.take(b) {
            // Then its secondary keys, in insertion order.
            for (slot, _) in e.secondary {
                if let Some(events) = &mut self.events {
                    let key = self.index.key_at(slot);
                    events.push(KvEvent::BlockRemoved {
                        block_hash: key.hash,
                        group: GroupId(key.group.0.saturating_add(self.group_base)),
                        medium: self.medium,
                    });
                }
                self.index.remove(slot, b);
            }
        }
    }

    /// Remove every key of `b` without an event (undo of a refused call,
    /// copy-on-write moves).
    fn unlink_key_silently(&mut self, b: BlockId) {
        let slot = std::mem::replace(&mut self.meta[b.index()].key, NO_KEY);
        self.index.remove(slot, b);
        if let Some(e) = self.partial.take(b) {
            for (slot, _) in e.secondary {
                self.index.remove(slot, b);
            }
        }
    }

    // ---- partial keys -------------------------------------------------

    /// Make `block` reachable from the hash-unit boundary at `num_tokens`
    /// (vLLM's `BlockPool.cache_partial_block`): the key is
    /// `(unit_hashes[num_tokens / hash_block_size - 1], group)`, the chained
    /// hash of the whole prefix up to that boundary, which may lie inside
    /// the block. `full_tokens` is the prefix a full-block key on `block`
    /// stands for (the end of the block at its table position).
    ///
    /// * `replace_existing`: the block's contents were replaced; every key
    ///   it has is removed (reported) first;
    /// * otherwise, a block whose primary key covers fewer tokens loses its
    ///   keys (reported) first, and the new key becomes the primary key of a
    ///   block without one, a secondary key of a block with one;
    /// * a `BlockStored` event of one hash unit is recorded unless the key
    ///   was already there.
    ///
    /// Returns the key, or `None` for the null block or with caching off.
    /// Refused (nothing changed) for an out-of-range block, a `num_tokens`
    /// that is not a positive multiple of the hash unit, or beyond the
    /// hashes given.
    pub fn cache_partial_block(
        &mut self,
        block: BlockId,
        unit_hashes: &[BlockHash],
        num_tokens: usize,
        full_tokens: usize,
        group: GroupId,
        replace_existing: bool,
    ) -> KvResult<Option<CacheKey>> {
        self.check_ids(&[block])?;
        let hbs = self.config.hash_block_size as usize;
        let units = num_tokens / hbs;
        if num_tokens == 0 || num_tokens % hbs != 0 || units > unit_hashes.len() {
            return Err(KvError::InvalidArgument {
                name: "num_tokens",
                detail: format!(
                    "{num_tokens} is not a positive multiple of the hash unit ({hbs}) \
                     within the {} hashes given",
                    unit_hashes.len()
                ),
            });
        }
        let tokens32 = u32::try_from(num_tokens).map_err(|_| KvError::InvalidArgument {
            name: "num_tokens",
            detail: format!("{num_tokens} does not fit 32 bits"),
        })?;
        if block.is_null() || !self.config.enable_caching {
            return Ok(None);
        }
        let key = CacheKey {
            hash: unit_hashes[units - 1],
            group,
        };
        let mut already = self.holds_key(block, &key);
        let primary = self.meta[block.index()].key;
        if replace_existing {
            if primary != NO_KEY {
                self.drop_key(block);
            }
            already = false;
        } else if !already && primary != NO_KEY {
            let covered = self
                .partial
                .primary_tokens(block)
                .map_or(full_tokens, |t| t as usize);
            if covered < num_tokens {
                self.drop_key(block);
            }
        }
        if !self.holds_key(block, &key) {
            let slot = self.index.insert(key, block);
            if self.meta[block.index()].key == NO_KEY {
                self.meta[block.index()].key = slot;
                self.key_tokens[block.index()] = tokens32;
                self.partial.set_primary_tokens(block, Some(tokens32));
                if let Order::Ranked(r) = &mut self.free {
                    let depth = u32::try_from(units).unwrap_or(u32::MAX);
                    r.policy.as_dyn_mut().on_cache(block, depth);
                }
            } else {
                self.partial.push_secondary(block, slot, tokens32);
            }
        }
        if !already {
            if let Some(events) = &mut self.events {
                events.push(KvEvent::BlockStored(Box::new(StoredBlocks {
                    block_hashes: vec![key.hash],
                    block_ids: vec![block],
                    parent_block_hash: units.checked_sub(2).map(|i| unit_hashes[i]),
                    first_block: units - 1,
                    num_blocks: 1,
                    ..StoredBlocks::new(
                        GroupId(group.0.saturating_add(self.group_base)),
                        self.config.hash_block_size,
                        self.medium,
                    )
                })));
            }
        }
        Ok(Some(key))
    }

    /// Put `block` in the prefix index under `key` by hand: what vLLM's pool
    /// does when a caller inserts a block into `cached_block_hash_to_block`
    /// or sets a block's hash (vLLM's `_insert_block_hash`). A no-op when the
    /// block already holds the key; otherwise the key becomes the block's
    /// primary key when it has none (`tokens`: the prefix it stands for when
    /// partial; `None`: the whole block), a secondary key when it has one.
    /// The block is listed after the blocks already under the key. Nothing
    /// else changes (reference count, free-queue position), and no event is
    /// recorded (vLLM's index edits record none; a later removal is reported
    /// as any other). Unlike the pool's own caching, which never keys the
    /// null block, this keys it too when asked, as vLLM's pool lets a caller
    /// do. Returns whether the key was added (false with caching off).
    ///
    /// Refused (nothing changed) for an out-of-range block and on a pool with
    /// a ranked eviction policy.
    pub fn insert_key(
        &mut self,
        block: BlockId,
        key: CacheKey,
        tokens: Option<u32>,
    ) -> KvResult<bool> {
        self.check_ids(&[block])?;
        if matches!(self.free, Order::Ranked(_)) {
            return Err(KvError::Unsupported {
                what: "insert_key on a pool with a ranked eviction policy".into(),
            });
        }
        if !self.config.enable_caching || self.holds_key(block, &key) {
            return Ok(false);
        }
        let slot = self.index.insert(key, block);
        if self.meta[block.index()].key == NO_KEY {
            self.meta[block.index()].key = slot;
            // vLLM's block_hash_num_tokens is what the caller gave (None
            // for a whole-block key inserted by hand).
            self.key_tokens[block.index()] = tokens.unwrap_or(WHOLE_BLOCK);
            self.partial.set_primary_tokens(block, tokens);
        } else {
            self.partial
                .push_secondary(block, slot, tokens.unwrap_or(WHOLE_BLOCK));
        }
        Ok(true)
    }

    /// Whether `block` is cached under `key` (as its primary or a secondary
    /// key).
    fn holds_key(&self, block: BlockId, key: &CacheKey) -> bool {
        self.meta[block.index()].key != NO_KEY
            && self
                .index
                .slot_of(key)
                .is_some_and(|s| self.index.slot_holds(s, block))
    }

    /// Copy-on-write: re-point every key of `src` to `dst` (vLLM's
    /// `BlockPool.move_block_hashes`). The request owning `src` keeps
    /// writing into it; the prefix cache holds the private copy `dst` under
    /// the same keys instead. `dst`'s first key (the old primary) keeps the
    /// token count of `src`'s primary key. No event (the keys stay live);
    /// a key shared with other blocks now lists `dst` last. A no-op when
    /// `src` has no key.
    ///
    /// Refused (nothing changed) for an out-of-range block, the null block,
    /// `src == dst`, or a `dst` that is cached.
    pub fn move_block_keys(&mut self, src: BlockId, dst: BlockId) -> KvResult<()> {
        self.check_ids(&[src, dst])?;
        let bad = |detail: &str| KvError::InvalidArgument {
            name: "dst",
            detail: detail.into(),
        };
        if src.is_null() || dst.is_null() {
            return Err(bad("the null block is never cached"));
        }
        if src == dst {
            return Err(bad("a block's keys cannot move to itself"));
        }
        if self.meta[dst.index()].key != NO_KEY {
            return Err(KvError::AlreadyCached(dst));
        }
        let primary = self.meta[src.index()].key;
        if primary == NO_KEY {
            return Ok(());
        }
        let primary_key = self.index.key_at(primary);
        let entry = self.partial.get(src).cloned().unwrap_or_default();
        let secondary: Vec<(CacheKey, u32)> = entry
            .secondary
            .iter()
            .map(|&(s, t)| (self.index.key_at(s), t))
            .collect();
        self.unlink_key_silently(src);
        self.meta[dst.index()].key = self.index.insert(primary_key, dst);
        self.key_tokens[dst.index()] = self.key_tokens[src.index()];
        self.partial.set_primary_tokens(dst, entry.primary_tokens);
        for (key, tokens) in secondary {
            let slot = self.index.insert(key, dst);
            self.partial.push_secondary(dst, slot, tokens);
        }
        Ok(())
    }

    // ---- invariants -------------------------------------------------------

    /// Check every invariant written on the fields above; `Err` names the
    /// first violation. `O(num_blocks)`; for tests and debugging.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.free.check_invariants(self.now)?;
        self.index.check_invariants()?;
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

/// The shape checks of [`BlockPool::cache_full_blocks_scaled`]: enough block
/// ids and hashes for the full blocks, a positive scale, a mask of one entry
/// per new full block.
fn check_scaled_args(
    num_block_ids: usize,
    num_unit_hashes: usize,
    scale: usize,
    range: &std::ops::Range<usize>,
    block_mask: Option<&[bool]>,
) -> KvResult<()> {
    let arg = |name, detail: String| KvError::InvalidArgument { name, detail };
    let num_full_blocks = range.end;
    if num_full_blocks > num_block_ids {
        return Err(arg(
            "num_full_blocks",
            format!("{num_full_blocks} exceeds the {num_block_ids} block ids given"),
        ));
    }
    if scale == 0 {
        return Err(arg("scale", "must be positive".into()));
    }
    let num_block_hashes = num_unit_hashes / scale;
    if num_full_blocks > num_block_hashes {
        return Err(arg(
            "block_hashes",
            format!("{num_block_hashes} hashes given but {num_full_blocks} blocks are full"),
        ));
    }
    if let Some(mask) = block_mask {
        if mask.len() != range.len() {
            return Err(arg(
                "block_mask",
                format!("{} entries for {} new full blocks", mask.len(), range.len()),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: usize) -> BlockPool {
        BlockPool::new(PoolConfig::new(n)).unwrap()
    }

    fn h(n: u8) -> BlockHash {
        BlockHash::from_slice(&[n; 32]).unwrap()
    }

    fn get(p: &mut BlockPool, n: usize) -> Vec<u32> {
        let mut out = Vec::new();
        p.get_new_blocks(n, &mut out).unwrap();
        p.check_invariants().unwrap();
        out.into_iter().map(|b| b.0).collect()
    }

    fn queue(p: &BlockPool) -> Vec<u32> {
        p.free_block_ids().map(|b| b.0).collect()
    }

    fn ids(v: &[u32]) -> Vec<BlockId> {
        v.iter().map(|&b| BlockId(b)).collect()
    }

    #[test]
    fn fresh_pool() {
        let mut p = pool(10);
        assert_eq!(p.num_free_blocks(), 9);
        assert_eq!(get(&mut p, 2), vec![1, 2]);
        assert!((p.usage() - 2.0 / 9.0).abs() < 1e-12);
        let err = p.get_new_blocks(8, &mut Vec::new()).unwrap_err();
        assert_eq!(
            err,
            KvError::OutOfBlocks {
                requested: 8,
                available: 7
            }
        );
        assert_eq!(p.num_free_blocks(), 7);
        assert!(BlockPool::new(PoolConfig::new(0)).is_err());
        assert!(pool(1).usage().abs() < f64::EPSILON);
    }

    /// Walking `free_neighbours` from the front gives `free_block_ids`, both
    /// ways, under LRU (links) and a ranked policy (a walk).
    #[test]
    fn free_neighbours_walk_the_queue() {
        for policy in ["lru", "lfu"] {
            let mut p = pool(8);
            p.set_eviction(policy.parse().unwrap()).unwrap();
            let b = ids(&get(&mut p, 4));
            p.cache_full_blocks(&b[..2], &[h(1), h(2)], 0, 2, GroupId(0), None)
                .unwrap();
            p.free_blocks(&[b[3], b[0], b[2], b[1]]).unwrap();
            let order = queue(&p);
            let n = |x: u32| p.free_neighbours(BlockId(x)).unwrap();
            let mut walked = Vec::new();
            let mut cur = order.first().copied();
            let mut prev = None;
            while let Some(x) = cur {
                let (before, after) = n(x).unwrap();
                assert_eq!(before.map(|b| b.0), prev, "{policy}");
                walked.push(x);
                prev = Some(x);
                cur = after.map(|b| b.0);
            }
            assert_eq!(walked, order, "{policy}");
            let held = ids(&get(&mut p, 1))[0];
            assert_eq!(p.free_neighbours(held).unwrap(), None);
            assert_eq!(p.free_neighbours(BlockId(0)).unwrap(), None); // null block
            assert!(p.free_neighbours(BlockId(8)).is_err());
        }
    }

    #[test]
    fn residency_clock_and_records_through_the_pool() {
        let mut p = pool(3);
        p.set_residency_clock(5); // metrics off: nothing to move
        assert!(p.drain_eviction_records().is_empty());
        p.enable_residency().unwrap();
        p.set_residency_clock(10);
        let b = ids(&get(&mut p, 2));
        p.cache_full_blocks(&b[..1], &[h(1)], 0, 1, GroupId(0), None)
            .unwrap();
        p.free_blocks(&b).unwrap();
        p.set_residency_clock(30);
        get(&mut p, 2); // reuses both; the cached one is evicted
        let records = p.drain_eviction_records();
        assert_eq!(records.len(), 1);
        assert_eq!((records[0].block, records[0].lifetime), (b[0], 20));
        assert!(p.drain_eviction_records().is_empty());
    }

    #[test]
    fn free_order_split() {
        // Unhashed blocks to the front in order, hashed ones to the back.
        let mut p = pool(5);
        let b = ids(&get(&mut p, 4));
        p.cache_full_blocks(&b, &[h(1), h(2)], 0, 2, GroupId(7), None)
            .unwrap();
        p.free_blocks(&b).unwrap();
        assert_eq!(queue(&p), vec![3, 4, 1, 2]);
        p.check_invariants().unwrap();
    }

    #[test]
    fn double_free_is_refused_and_changes_nothing() {
        let mut p = pool(4);
        let b = ids(&get(&mut p, 2));
        let before = queue(&p);
        assert_eq!(
            p.free_blocks(&[b[0], b[1], b[0]]),
            Err(KvError::RefCountUnderflow(b[0]))
        );
        assert_eq!(queue(&p), before);
        assert_eq!(p.ref_count(b[0]).unwrap(), 1);
        p.free_blocks(&[b[0]]).unwrap();
        assert_eq!(
            p.free_blocks(&[b[0]]),
            Err(KvError::RefCountUnderflow(b[0]))
        );
        p.check_invariants().unwrap();
    }

    #[test]
    fn rejected_free_unstages_blocks_bound_for_both_ends() {
        // Regression guard for the one-pass free: blocks already staged for
        // the front and the back when a bad id turns up must be unstaged.
        for extra_free in [false, true] {
            let mut p = pool(8);
            let b = ids(&get(&mut p, 4));
            p.cache_full_blocks(&b, &[h(1), h(2)], 0, 2, GroupId(0), None)
                .unwrap();
            if extra_free {
                // Leave a cached block on the back so the queue is non-empty
                // at both ends.
                p.touch(&b[3..]).unwrap();
                p.free_blocks(&b[3..]).unwrap();
            }
            let (queue_before, refs_before) = (queue(&p), p.ref_counts().collect::<Vec<_>>());
            // b0 and b1 are cached (staged for the back), b2 is not (front);
            // then an out-of-range id, or a second release of b2.
            for bad in [BlockId(99), b[2]] {
                let call = [b[0], b[2], b[1], bad];
                assert!(p.free_blocks(&call).is_err(), "{call:?}");
                assert_eq!(queue(&p), queue_before);
                assert_eq!(p.ref_counts().collect::<Vec<_>>(), refs_before);
                p.check_invariants().unwrap();
            }
            p.free_blocks(&b[..3]).unwrap();
            let tail: Vec<u32> = queue(&p).into_iter().rev().take(2).collect();
            assert_eq!(
                tail,
                vec![b[1].0, b[0].0],
                "cached blocks at the back, in order"
            );
            p.check_invariants().unwrap();
        }
    }

    #[test]
    fn touch_pins_a_free_cached_block() {
        let mut p = pool(4);
        let b = ids(&get(&mut p, 1));
        p.cache_full_blocks(&b, &[h(9)], 0, 1, GroupId(0), None)
            .unwrap();
        p.free_blocks(&b).unwrap();
        assert_eq!(queue(&p), vec![2, 3, 1]);
        let mut hit = Vec::new();
        assert!(p.get_cached_block(&h(9), &[GroupId(0)], &mut hit));
        p.touch(&hit).unwrap();
        assert_eq!(queue(&p), vec![2, 3]);
        // The pinned hit is not evicted by allocation pressure.
        assert_eq!(get(&mut p, 2), vec![2, 3]);
        assert!(p.is_cached(BlockId(1)).unwrap());
        p.check_invariants().unwrap();
    }

    fn removed(n: u8, g: u32) -> KvEvent {
        KvEvent::BlockRemoved {
            block_hash: h(n),
            group: GroupId(g),
            medium: Medium::Gpu,
        }
    }

    fn partial_pool(n: usize) -> BlockPool {
        BlockPool::new(PoolConfig {
            enable_events: true,
            hash_block_size: 4,
            ..PoolConfig::new(n)
        })
        .unwrap()
    }

    #[test]
    fn partial_primary_key_is_promoted_when_the_block_fills() {
        let mut p = partial_pool(4);
        let b = ids(&get(&mut p, 2));
        let units = [h(1), h(2), h(3), h(4)];
        // Two hash units per block: block 1 (tokens 8..16) keyed at 12.
        let k = p.cache_partial_block(b[1], &units, 12, 16, GroupId(0), false);
        assert_eq!(k.unwrap().map(|k| k.hash), Some(h(3)));
        assert_eq!(p.primary_key_tokens(b[1]).unwrap(), Some(12));
        assert_eq!(p.lookup(&h(3), GroupId(0)), Some(b[1]));
        // Repeating it changes nothing and records nothing.
        p.take_events();
        p.cache_partial_block(b[1], &units, 12, 16, GroupId(0), false)
            .unwrap();
        assert!(p.take_events().is_empty());
        p.check_invariants().unwrap();
        // A partially keyed block is cached: freed to the back.
        // Full: the partial key is removed (reported), then the full keys.
        p.cache_full_blocks_scaled(&b, &units, 2, 0, 2, GroupId(0), None)
            .unwrap();
        let ev = p.take_events();
        assert_eq!(ev[0], removed(3, 0));
        assert!(matches!(&ev[1], KvEvent::BlockStored(s) if s.block_hashes == [h(2), h(4)]));
        assert_eq!(p.primary_key_tokens(b[1]).unwrap(), None);
        assert_eq!(p.lookup(&h(3), GroupId(0)), None);
        assert_eq!(p.num_partial_blocks(), 0);
        p.check_invariants().unwrap();
        // A full key is never promoted again.
        assert_eq!(
            p.cache_full_blocks_scaled(&b, &units, 2, 1, 2, GroupId(0), None),
            Err(KvError::AlreadyCached(b[1]))
        );
    }

    #[test]
    fn key_num_tokens_follow_the_primary_key() {
        // vLLM's block_hash_num_tokens: a full key covers its block's end,
        // a partial key its own count; moved keys keep theirs.
        let mut p = partial_pool(6);
        let b = ids(&get(&mut p, 4));
        let units = [h(1), h(2), h(3), h(4)];
        assert_eq!(p.key_num_tokens(b[0]).unwrap(), None);
        p.cache_full_blocks_scaled(&b, &units, 2, 0, 2, GroupId(0), None)
            .unwrap();
        assert_eq!(p.key_num_tokens(b[0]).unwrap(), Some(8));
        assert_eq!(p.key_num_tokens(b[1]).unwrap(), Some(16));
        assert_eq!(p.primary_key_tokens(b[1]).unwrap(), None);
        // A key replaced by one at 12 (a checkpoint inside its block).
        p.cache_partial_block(b[1], &units, 12, 16, GroupId(0), true)
            .unwrap();
        assert_eq!(p.key_num_tokens(b[1]).unwrap(), Some(12));
        p.move_block_keys(b[1], b[2]).unwrap();
        assert_eq!(p.key_num_tokens(b[1]).unwrap(), None);
        assert_eq!(p.key_num_tokens(b[2]).unwrap(), Some(12));
        p.move_block_keys(b[0], b[3]).unwrap();
        assert_eq!(p.key_num_tokens(b[3]).unwrap(), Some(8));
        p.check_invariants().unwrap();
        p.evict_blocks(&[b[3]]).unwrap();
        assert_eq!(p.key_num_tokens(b[3]).unwrap(), None);
        assert!(p.key_num_tokens(BlockId(99)).is_err());
    }

    #[test]
    fn keys_inserted_by_hand() {
        let mut p = partial_pool(5);
        let key = |n: u8, g: u32| CacheKey {
            hash: h(n),
            group: GroupId(g),
        };
        let queue_before = queue(&p);
        // A free block and the null block are keyed where they stand.
        assert!(p.insert_key(BlockId(2), key(1, 0), None).unwrap());
        assert_eq!(p.key_num_tokens(BlockId(2)).unwrap(), None);
        assert!(p.insert_key(BlockId::NULL, key(1, 0), None).unwrap());
        assert_eq!(queue(&p), queue_before);
        assert_eq!(p.ref_count(BlockId::NULL).unwrap(), 0);
        // Both under one key, in insertion order; a repeat is a no-op.
        assert_eq!(p.lookup(&h(1), GroupId(0)), Some(BlockId(2)));
        assert!(!p.insert_key(BlockId(2), key(1, 0), None).unwrap());
        // A second key of a keyed block is a secondary one, whole-block.
        assert!(p.insert_key(BlockId(2), key(2, 1), None).unwrap());
        assert_eq!(
            p.cache_keys(BlockId(2)).unwrap(),
            vec![(key(1, 0), None), (key(2, 1), None)]
        );
        assert_eq!(p.num_cached_keys(), 2);
        assert!(p.take_events().is_empty());
        p.check_invariants().unwrap();
        // Removal reports every key; the null block's key goes the same way.
        p.evict_blocks(&[BlockId(2)]).unwrap();
        assert_eq!(p.take_events(), vec![removed(1, 0), removed(2, 1)]);
        assert_eq!(p.lookup(&h(1), GroupId(0)), Some(BlockId::NULL));
        p.check_invariants().unwrap();
        // Handing blocks out, freeing and touching never count the null block.
        let got = get(&mut p, 4);
        assert!(!got.contains(&0));
        p.touch(&[BlockId::NULL]).unwrap();
        p.free_blocks(&ids(&got)).unwrap();
        p.check_invariants().unwrap();
        assert!(p.reset_prefix_cache());
        assert_eq!(p.num_cached_keys(), 0);
        assert!(!p.is_cached(BlockId::NULL).unwrap());
        p.check_invariants().unwrap();
        // Refused: out of range, and under a ranked policy.
        assert!(p.insert_key(BlockId(9), key(1, 0), None).is_err());
        let mut ranked =
            BlockPool::with_eviction(PoolConfig::new(4), "lfu".parse::<EvictionConfig>().unwrap())
                .unwrap();
        assert!(ranked.insert_key(BlockId(1), key(1, 0), None).is_err());
        assert_eq!(ranked.num_cached_keys(), 0);
    }

    #[test]
    fn secondary_keys_leave_with_the_block() {
        let mut p = partial_pool(4);
        let b = ids(&get(&mut p, 2));
        let units = [h(1), h(2), h(3), h(4)];
        p.cache_full_blocks_scaled(&b, &units, 2, 0, 2, GroupId(0), None)
            .unwrap();
        // Block 1 covers 16 tokens, so a key at 12 becomes a secondary key.
        p.cache_partial_block(b[1], &units, 12, 16, GroupId(0), false)
            .unwrap();
        let ev = p.take_events();
        assert!(matches!(&ev[1], KvEvent::BlockStored(s)
            if s.block_hashes == [h(3)] && s.parent_block_hash == Some(h(2))
                && s.first_block == 2 && s.num_blocks == 1 && s.block_size == 4));
        assert_eq!(
            p.cache_keys(b[1]).unwrap(),
            vec![
                (
                    CacheKey {
                        hash: h(4),
                        group: GroupId(0)
                    },
                    None
                ),
                (
                    CacheKey {
                        hash: h(3),
                        group: GroupId(0)
                    },
                    Some(12)
                ),
            ]
        );
        assert_eq!(p.num_cached_keys(), 3);
        p.check_invariants().unwrap();
        p.free_blocks(&[b[1], b[0]]).unwrap();
        assert_eq!(
            queue(&p),
            [3, 2, 1],
            "cached blocks go to the back in order"
        );
        // Reused: the primary key is reported first, then the secondary one.
        get(&mut p, 2);
        let ev = p.take_events();
        assert_eq!(ev, [removed(4, 0), removed(3, 0)]);
        assert_eq!(p.num_cached_keys(), 1);
        p.check_invariants().unwrap();
    }

    #[test]
    fn replacing_drops_every_key_first() {
        let mut p = partial_pool(4);
        let b = ids(&get(&mut p, 1));
        let units = [h(1), h(2)];
        p.cache_partial_block(b[0], &units, 4, 8, GroupId(1), false)
            .unwrap();
        // A longer prefix of the same block supersedes a shorter primary.
        p.cache_partial_block(b[0], &units, 8, 8, GroupId(1), false)
            .unwrap();
        assert_eq!(p.take_events()[1], removed(1, 1));
        assert_eq!(p.primary_key_tokens(b[0]).unwrap(), Some(8));
        // Contents replaced: even the same key is dropped and stored again.
        p.cache_partial_block(b[0], &units, 8, 8, GroupId(1), true)
            .unwrap();
        let ev = p.take_events();
        assert_eq!(ev[0], removed(2, 1));
        assert!(matches!(&ev[1], KvEvent::BlockStored(_)));
        p.check_invariants().unwrap();
        // Refusals change nothing.
        for bad in [0, 3, 12] {
            assert!(p
                .cache_partial_block(b[0], &units, bad, 8, GroupId(1), false)
                .is_err());
        }
        assert!(p
            .cache_partial_block(BlockId(9), &units, 4, 8, GroupId(1), false)
            .is_err());
        assert_eq!(
            p.cache_partial_block(BlockId::NULL, &units, 4, 8, GroupId(1), false),
            Ok(None)
        );
        assert!(p.take_events().is_empty());
        p.check_invariants().unwrap();
    }

    #[test]
    fn moved_keys_follow_the_copy() {
        let mut p = partial_pool(6);
        let units = [h(1), h(2)];
        let a = ids(&get(&mut p, 2));
        // Two blocks under the same key; the first keeps a secondary key.
        p.cache_partial_block(a[0], &units, 8, 8, GroupId(0), false)
            .unwrap();
        p.cache_partial_block(a[0], &units, 4, 8, GroupId(0), false)
            .unwrap();
        p.cache_partial_block(a[1], &units, 8, 8, GroupId(0), false)
            .unwrap();
        p.take_events();
        let c = ids(&get(&mut p, 1))[0];
        p.move_block_keys(a[0], c).unwrap();
        assert!(p.take_events().is_empty(), "the keys stay live");
        assert_eq!(p.cache_key(a[0]).unwrap(), None);
        assert_eq!(p.primary_key_tokens(c).unwrap(), Some(8));
        assert_eq!(p.cache_keys(c).unwrap().len(), 2);
        // The copy now comes after the other block under the shared key.
        assert_eq!(p.lookup(&h(2), GroupId(0)), Some(a[1]));
        assert_eq!(p.lookup(&h(1), GroupId(0)), Some(c));
        p.check_invariants().unwrap();
        // Refused: a cached destination, the null block, itself.
        assert_eq!(p.move_block_keys(a[1], c), Err(KvError::AlreadyCached(c)));
        assert!(p.move_block_keys(BlockId::NULL, a[0]).is_err());
        assert!(p.move_block_keys(c, c).is_err());
        // An uncached source moves nothing.
        p.move_block_keys(a[0], BlockId(5)).unwrap();
        p.check_invariants().unwrap();
        assert!(!p.reset_prefix_cache());
        p.free_blocks(&[a[0], a[1], c]).unwrap();
        assert!(p.reset_prefix_cache());
        assert_eq!((p.num_cached_keys(), p.num_partial_blocks()), (0, 0));
        p.check_invariants().unwrap();
    }

    #[test]
    fn reuse_evicts_and_records_events() {
        let mut p = BlockPool::new(PoolConfig {
            enable_events: true,
            ..PoolConfig::new(3)
        })
        .unwrap();
        let b = ids(&get(&mut p, 2));
        p.cache_full_blocks(&b, &[h(1), h(2)], 0, 2, GroupId(3), None)
            .unwrap();
        p.free_blocks(&b).unwrap();
        get(&mut p, 2);
        assert_eq!(p.num_evictions(), 2);
        let ev = p.take_events();
        assert_eq!(ev.len(), 3);
        assert!(
            matches!(&ev[0], KvEvent::BlockStored(s) if s.block_hashes.len() == 2 && s.parent_block_hash.is_none() && s.block_size == 16 && s.token_ids.is_empty())
        );
        assert_eq!(
            ev[1],
            KvEvent::BlockRemoved {
                block_hash: h(1),
                group: GroupId(3),
                medium: Medium::Gpu,
            }
        );
        assert_eq!(p.num_cached_keys(), 0);
        assert!(p.take_events().is_empty());
    }

    #[test]
    fn every_block_losing_a_key_is_reported_and_skips_recorded() {
        let mut p = BlockPool::new(PoolConfig {
            enable_events: true,
            ..PoolConfig::new(6)
        })
        .unwrap();
        let b = ids(&get(&mut p, 3));
        // Two blocks under the same key (two requests computed one prefix).
        p.cache_full_blocks(&b[..1], &[h(1)], 0, 1, GroupId(0), None)
            .unwrap();
        p.cache_full_blocks(&b[1..2], &[h(1)], 0, 1, GroupId(0), None)
            .unwrap();
        let masked = [b[2], BlockId(0), b[2]];
        p.cache_full_blocks(
            &masked,
            &[h(7), h(8), h(9)],
            1,
            3,
            GroupId(0),
            Some(&[false, true]),
        )
        .unwrap();
        p.evict_blocks(&b[..2]).unwrap();
        let ev = p.take_events();
        assert_eq!(ev.len(), 5);
        match &ev[2] {
            KvEvent::BlockStored(s) => {
                assert_eq!((s.first_block, s.num_blocks), (1, 2));
                assert_eq!(s.skipped, vec![1]);
                assert_eq!(s.block_hashes, vec![h(9)]);
                assert_eq!(s.parent_block_hash, Some(h(7)));
                assert_eq!(s.positions().collect::<Vec<_>>(), vec![2]);
            }
            other => panic!("{other:?}"),
        }
        assert!(ev[3..]
            .iter()
            .all(|e| matches!(e, KvEvent::BlockRemoved { block_hash, .. } if *block_hash == h(1))));
    }

    #[test]
    fn cache_validation_is_atomic() {
        let mut p = pool(6);
        let b = ids(&get(&mut p, 3));
        let dup = [b[0], b[1], b[0]];
        let hashes = [h(1), h(2), h(3)];
        assert_eq!(
            p.cache_full_blocks(&dup, &hashes, 0, 3, GroupId(0), None),
            Err(KvError::AlreadyCached(b[0]))
        );
        assert_eq!(p.num_cached_keys(), 0);
        assert!(p
            .cache_full_blocks(&b, &hashes[..2], 0, 3, GroupId(0), None)
            .is_err());
        assert!(p
            .cache_full_blocks(&b, &hashes, 0, 3, GroupId(0), Some(&[true]))
            .is_err());
        assert!(p
            .cache_full_blocks(&b, &hashes, 0, 4, GroupId(0), None)
            .is_err());
        p.cache_full_blocks(&b, &hashes, 0, 3, GroupId(0), Some(&[true, false, true]))
            .unwrap();
        assert_eq!(p.num_cached_keys(), 2);
        assert!(!p.is_cached(b[1]).unwrap());
        p.check_invariants().unwrap();
    }

    #[test]
    fn reset_only_when_idle() {
        let mut p = pool(4);
        let b = ids(&get(&mut p, 1));
        p.cache_full_blocks(&b, &[h(1)], 0, 1, GroupId(0), None)
            .unwrap();
        assert!(!p.reset_prefix_cache());
        p.free_blocks(&b).unwrap();
        assert!(p.reset_prefix_cache());
        assert_eq!(p.num_cached_keys(), 0);
        assert!(!p.is_cached(b[0]).unwrap());
        p.check_invariants().unwrap();
    }

    #[test]
    fn caching_disabled_caches_nothing() {
        let mut p = BlockPool::new(PoolConfig {
            enable_caching: false,
            ..PoolConfig::new(4)
        })
        .unwrap();
        let b = ids(&get(&mut p, 2));
        p.cache_full_blocks(&b, &[h(1), h(2)], 0, 2, GroupId(0), None)
            .unwrap();
        assert_eq!(p.num_cached_keys(), 0);
        p.free_blocks(&b).unwrap();
        assert_eq!(queue(&p), vec![1, 2, 3]);
    }

    #[test]
    fn null_block_is_skipped() {
        let mut p = pool(4);
        let b = ids(&get(&mut p, 1));
        p.touch(&[BlockId::NULL, b[0]]).unwrap();
        p.free_blocks(&[BlockId::NULL, b[0], b[0]]).unwrap();
        assert_eq!(p.ref_count(BlockId::NULL).unwrap(), 0);
        assert!(!p.free_block_ids().any(super::super::ids::BlockId::is_null));
        assert!(p.free_blocks(&[BlockId(4)]).is_err());
        p.check_invariants().unwrap();
    }

    #[test]
    fn metadata_is_small() {
        let p = pool(1_000_000);
        let per_block = p.metadata_bytes() as f64 / 1e6;
        assert!(per_block <= 16.1, "{per_block} bytes per block");
    }

    #[test]
    fn set_eviction_keeps_the_free_order_and_is_refused_in_use() {
        let mut p = pool(6);
        let b = ids(&get(&mut p, 3));
        p.cache_full_blocks(&b, &[h(1), h(2)], 0, 2, GroupId(0), None)
            .unwrap();
        let err = p.set_eviction(EvictionConfig::Lfu { half_life: 0 });
        assert!(matches!(err, Err(KvError::Unsupported { .. })), "{err:?}");
        assert_eq!(p.eviction_policy(), "lru");
        p.free_blocks(&[b[2], b[1], b[0]]).unwrap();
        let before = queue(&p);
        for spec in ["prefix-depth", "priority:retention=3", "lru", "lfu"] {
            p.set_eviction(spec.parse().unwrap()).unwrap();
            assert_eq!(p.eviction_policy(), spec);
            assert_eq!(queue(&p), before, "{spec}");
            assert!(p.is_cached(b[0]).unwrap());
            p.check_invariants().unwrap();
        }
        // The new policy orders what is released from now on.
        let mut hit = Vec::new();
        assert!(p.get_cached_block(&h(1), &[GroupId(0)], &mut hit));
        p.touch(&hit).unwrap();
        p.touch(&hit).unwrap();
        p.free_blocks(&hit).unwrap();
        p.free_blocks(&hit).unwrap();
        assert_eq!(queue(&p).last(), Some(&b[0].0));
        p.check_invariants().unwrap();
    }

    #[test]
    fn policy_metadata_is_a_few_bytes_per_block() {
        // 16 bytes of metadata and links, plus the policy's slabs.
        for (spec, extra) in [
            ("lfu", 4.0),
            ("prefix-depth", 1.0),
            ("priority:retention=1000", 5.0),
        ] {
            let config = spec.parse().unwrap();
            let p = BlockPool::with_eviction(PoolConfig::new(1_000_000), config).unwrap();
            assert_eq!(p.eviction_policy(), spec);
            let per_block = p.metadata_bytes() as f64 / 1e6;
            assert!(
                per_block <= 16.1 + extra,
                "{spec}: {per_block} bytes per block"
            );
            p.check_invariants().unwrap();
        }
    }

    // ---- unpin_blocks (HiSparse's released-but-read pages) ---------------

    #[test]
    fn unpinned_blocks_go_to_the_back_and_fire_once_when_reused() {
        // Pool of 6: free queue 1..=5. Take 1, 2, 3; unpin 1 and 2 (uncached,
        // yet they join the back, unlike free_blocks which puts them first).
        let mut p = pool(6);
        let mut b = Vec::new();
        p.get_new_blocks(3, &mut b).unwrap();
        assert_eq!(b, ids(&[1, 2, 3]));
        p.unpin_blocks(&ids(&[2, 1])).unwrap();
        assert_eq!(queue(&p), vec![4, 5, 2, 1]);
        assert_eq!(p.num_free_blocks(), 4);
        assert_eq!(p.num_watched(), 2);
        p.check_invariants().unwrap();
        // Handing out 4, 5, 2 reports 2 only; 1 stays watched.
        let mut c = Vec::new();
        p.get_new_blocks(3, &mut c).unwrap();
        assert_eq!(c, ids(&[4, 5, 2]));
        assert_eq!(p.take_reused_watched(), ids(&[2]));
        assert!(p.take_reused_watched().is_empty());
        assert_eq!(p.num_watched(), 1);
        p.check_invariants().unwrap();
    }

    #[test]
    fn unpin_keeps_a_shared_block_allocated_but_watched() {
        let mut p = pool(4);
        let mut b = Vec::new();
        p.get_new_blocks(1, &mut b).unwrap();
        p.touch(&b).unwrap(); // two owners
        p.unpin_blocks(&b).unwrap();
        assert_eq!(p.ref_count(b[0]).unwrap(), 1);
        assert_eq!(queue(&p), vec![2, 3]);
        assert_eq!(p.num_watched(), 1);
        // Its last owner frees it normally: front of the queue (uncached).
        p.free_blocks(&b).unwrap();
        assert_eq!(queue(&p), vec![1, 2, 3]);
        let mut c = Vec::new();
        p.get_new_blocks(1, &mut c).unwrap();
        assert_eq!(p.take_reused_watched(), b);
        p.check_invariants().unwrap();
    }

    #[test]
    fn unpin_refuses_bad_input_without_change() {
        let mut p = pool(4);
        let mut b = Vec::new();
        p.get_new_blocks(1, &mut b).unwrap();
        let before = (queue(&p), p.ref_count(b[0]).unwrap());
        for bad in [ids(&[0]), ids(&[9]), ids(&[1, 1]), ids(&[2])] {
            assert!(p.unpin_blocks(&bad).is_err(), "{bad:?}");
            assert_eq!((queue(&p), p.ref_count(b[0]).unwrap()), before);
            assert_eq!(p.num_watched(), 0);
        }
        let mut ranked =
            BlockPool::with_eviction(PoolConfig::new(4), "lfu".parse().unwrap()).unwrap();
        let mut r = Vec::new();
        ranked.get_new_blocks(1, &mut r).unwrap();
        assert!(matches!(
            ranked.unpin_blocks(&r),
            Err(KvError::Unsupported { .. })
        ));
        assert_eq!(ranked.ref_count(r[0]).unwrap(), 1);
        p.check_invariants().unwrap();
    }

    #[test]
    fn reset_reports_every_watched_block_in_first_watch_order() {
        let mut p = pool(5);
        let mut b = Vec::new();
        p.get_new_blocks(3, &mut b).unwrap();
        p.unpin_blocks(&ids(&[3])).unwrap();
        p.unpin_blocks(&ids(&[1, 2])).unwrap();
        assert!(p.reset_prefix_cache());
        assert_eq!(p.take_reused_watched(), ids(&[3, 1, 2]));
        assert_eq!(p.num_watched(), 0);
        p.check_invariants().unwrap();
    }
}
