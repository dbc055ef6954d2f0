//! The prefix index: caching full blocks (vLLM's `cache_full_blocks`),
//! lookups, eviction of cached free blocks and the reset of the whole
//! cache.

use super::order::Order;
use super::{BlockPool, NO_KEY};
use crate::block_hash::BlockHash;
use crate::error::{KvError, KvResult};
use crate::events::{KvEvent, StoredBlocks};
use crate::ids::{BlockId, GroupId};
use crate::prefix_index::CacheKey;

impl BlockPool {
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
        if let Some(s) = self.sampled.as_deref_mut() {
            s.on_evicted(blocks);
        }
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
        if let Some(s) = self.sampled.as_deref_mut() {
            s.on_reset();
        }
        if let Some(events) = &mut self.events {
            events.push(KvEvent::AllBlocksCleared);
        }
        true
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
