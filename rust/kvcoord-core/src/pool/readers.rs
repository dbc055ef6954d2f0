//! What the pool reports: counters, a block's keys, read-outs of the
//! whole state (free ids, reference counts, the cached mask) and the
//! residency metrics. Nothing here changes the pool but the metrics'
//! switches.

use super::order::Order;
use super::{BlockMeta, BlockPool, PoolConfig, NO_KEY, WHOLE_BLOCK};
use crate::error::KvResult;
use crate::ids::BlockId;
use crate::prefix_index::CacheKey;
use crate::residency::Residency;
use crate::sampled_lives::{LifeSample, SampledLives};

impl BlockPool {
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

    /// Start vLLM's sampled residency metrics ([`crate::sampled_lives`]):
    /// follow a `sample_rate` share of block lives, drawn from `seed`.
    /// Enabling again starts over.
    pub fn enable_sampled_lives(&mut self, sample_rate: f64, seed: u64) -> KvResult<()> {
        self.sampled = Some(Box::new(SampledLives::new(sample_rate, seed)?));
        Ok(())
    }

    /// vLLM's sampled residency metrics, when enabled.
    pub fn sampled_lives(&self) -> Option<&SampledLives> {
        self.sampled.as_deref()
    }

    /// The samples of lives ended since the last drain (none when the
    /// sampled metrics are off).
    pub fn drain_life_samples(&mut self) -> Vec<LifeSample> {
        self.sampled
            .as_deref_mut()
            .map(SampledLives::drain)
            .unwrap_or_default()
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

    /// Number of blocks still in use besides the null block.
    pub fn num_used_blocks(&self) -> usize {
        self.meta.len() - 1 - self.free.len()
    }
}
