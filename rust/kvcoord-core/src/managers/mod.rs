//! Single-type managers: the per-group rules of vLLM 0.33.0's
//! `SingleTypeKVCacheManager` family (hit finders, skipped-block removal,
//! allocation prediction, caching, freeing).
//!
//! A [`Manager`] is stateless apart from its group's spec: the per-request
//! state of one group is a [`GroupTable`] that the coordinator owns (one map
//! lookup per request and step instead of one per group). Dispatch is a
//! `match` on [`SpecKind`]; the kind-specific pieces live in one file each.
//!
//! Files: this one holds [`Manager`] and its dispatch; one file per kind
//! holds that kind's rules; `table.rs` the per-request state
//! ([`GroupTable`]), `hash_view.rs` what the hit finders share
//! ([`HashView`]), `cache_policy.rs` the coordinator's sparse-caching
//! input ([`CachePolicy`]). The kinds' facts are in [`crate::spec`].
//! Layering: the kind files import the shared files, never this one, so
//! dispatch depends on the kinds and not the other way round.

mod cache_policy;
pub mod chunked_local;
pub mod cross_attention;
pub mod full_attention;
mod hash_view;
pub mod hisparse;
pub mod mamba;
pub mod mamba_align;
pub mod mla_attention;
pub mod rswa;
pub mod sliding_window;
pub mod sliding_window_mla;
mod table;

pub use cache_policy::CachePolicy;
use hash_view::hash_scale;
pub use hash_view::{HashView, HitLists};
pub use table::GroupTable;

use crate::block_hash::BlockHash;
use crate::error::{KvError, KvResult};
use crate::ids::{BlockId, GroupId};
use crate::pool::BlockPool;
pub use crate::spec::{size_field, GroupSpec, HitSearch, KindFacts, NullEntries, SpecKind};

/// The rules of one group, dispatched on its [`SpecKind`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Manager {
    spec: GroupSpec,
    group: GroupId,
    /// `spec.block_size` as a `usize` (no DCP scaling in kvcoord).
    block_size: usize,
    /// Whether this group serves an EAGLE drafter: its hits drop their last
    /// block again, so what it caches reaches one block further (see
    /// [`Manager::with_eagle`]).
    eagle: bool,
}

impl Manager {
    /// The manager of group `group` with spec `spec` (validated).
    pub fn new(spec: GroupSpec, group: GroupId) -> KvResult<Self> {
        spec.validate()?;
        Ok(Self {
            spec,
            group,
            block_size: spec.block_size as usize,
            eagle: false,
        })
    }

    /// This manager for a group whose prefix-cache hits drop their last
    /// block for EAGLE (vLLM's per-manager `use_eagle`). It changes what the
    /// group caches (the tails a hit reaches, the blocks kept around a
    /// shared-prefix junction); whether one lookup drops is the caller's
    /// choice (`drop_eagle` of [`Manager::find_longest_cache_hit`]).
    #[must_use]
    pub fn with_eagle(mut self, eagle: bool) -> Self {
        self.eagle = eagle;
        self
    }

    /// Whether this group's hits drop their last block for EAGLE.
    pub fn eagle(&self) -> bool {
        self.eagle
    }

    /// [`eagle_margin`](Self::eagle_margin) for a group whose hits drop
    /// EAGLE's block, `None` for any other.
    pub fn eagle_hit_margin(&self) -> Option<usize> {
        self.eagle.then(|| self.eagle_margin())
    }

    /// Tokens a hybrid lookup lets an EAGLE group match past the candidate
    /// hit before it drops them again (vLLM's EAGLE proof margin): one
    /// block, or 0 for Mamba "align", whose finder never drops (a margin
    /// would let its hit grow past the candidate).
    pub fn eagle_margin(&self) -> usize {
        match self.spec.kind {
            SpecKind::MambaAlign { .. } | SpecKind::Mamba { .. } => 0,
            SpecKind::FullAttention
            | SpecKind::SlidingWindow { .. }
            | SpecKind::ChunkedLocal { .. }
            | SpecKind::CrossAttention
            | SpecKind::MlaAttention
            | SpecKind::SlidingWindowMla { .. }
            | SpecKind::Rswa { .. }
            | SpecKind::HiSparseResident
            | SpecKind::HiSparseHot { .. } => self.block_size,
        }
    }

    /// The group's spec.
    pub fn spec(&self) -> &GroupSpec {
        &self.spec
    }

    /// The group id (salt of this group's cache keys).
    pub fn group(&self) -> GroupId {
        self.group
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Tokens before the attention window of the token after the first `n`:
    /// their blocks are no longer needed. 0 when nothing can be dropped.
    pub fn num_skipped_tokens(&self, n: usize) -> usize {
        match self.spec.kind {
            SpecKind::FullAttention
            | SpecKind::CrossAttention
            | SpecKind::MlaAttention
            | SpecKind::Rswa { .. }
            | SpecKind::HiSparseResident
            | SpecKind::HiSparseHot { .. } => 0,
            SpecKind::SlidingWindow { sliding_window }
            | SpecKind::SlidingWindowMla { sliding_window } => {
                sliding_window::num_skipped_tokens(n, sliding_window as usize)
            }
            SpecKind::ChunkedLocal {
                attention_chunk_size,
            } => chunked_local::num_skipped_tokens(n, attention_chunk_size as usize),
            SpecKind::Mamba { .. } | SpecKind::MambaAlign { .. } => mamba::num_skipped_tokens(n),
        }
    }

    /// The most blocks one request can hold at once in this group, or `None`
    /// when it keeps every block until it finishes (vLLM's
    /// `max_admission_blocks_per_request`, the bound its startup pool sizing
    /// and its full-sequence admission check share). Kinds that release
    /// blocks behind the attention while a prompt is prefilled in chunks
    /// hold at most what the attention still reads plus the
    /// `max_in_flight_tokens` tokens scheduled but not yet processed
    /// (blocks are released on processed tokens only):
    ///
    /// * sliding window: the `W - 1` tokens before the next one plus the
    ///   in-flight tokens, capped at `max_model_len`, and one block more
    ///   because the window need not start on a block boundary;
    /// * chunked local: one chunk plus the in-flight tokens, capped at
    ///   `max_model_len` (chunks start on block boundaries).
    pub fn max_admission_blocks(
        &self,
        max_in_flight_tokens: usize,
        max_model_len: usize,
    ) -> Option<usize> {
        let bs = self.block_size;
        match self.spec.kind {
            SpecKind::SlidingWindow { sliding_window }
            | SpecKind::SlidingWindowMla { sliding_window } => {
                let tokens = (sliding_window as usize - 1)
                    .saturating_add(max_in_flight_tokens)
                    .min(max_model_len);
                Some(tokens.div_ceil(bs) + 1)
            }
            SpecKind::ChunkedLocal {
                attention_chunk_size,
            } => {
                let tokens = (attention_chunk_size as usize)
                    .saturating_add(max_in_flight_tokens)
                    .min(max_model_len);
                Some(tokens.div_ceil(bs))
            }
            // HiSparse resident pages: the in-flight window (older pages
            // move to the host).
            SpecKind::HiSparseResident => {
                Some(max_in_flight_tokens.min(max_model_len).div_ceil(bs))
            }
            // Every block stays until the request finishes (R-SWA's gap is
            // released during decode, but its peak is full attention's).
            SpecKind::FullAttention
            | SpecKind::CrossAttention
            | SpecKind::MlaAttention
            | SpecKind::Rswa { .. }
            | SpecKind::Mamba { .. }
            | SpecKind::MambaAlign { .. }
            | SpecKind::HiSparseHot { .. } => None,
        }
    }

    /// Tokens this group allocates for when the request needs `num_tokens`
    /// slots (Mamba adds its speculative scratch blocks).
    fn tokens_to_allocate(&self, num_tokens: usize) -> usize {
        match self.spec.kind {
            SpecKind::Mamba {
                num_speculative_blocks,
            } => mamba::tokens_to_allocate(num_tokens, num_speculative_blocks, self.block_size),
            SpecKind::FullAttention
            | SpecKind::SlidingWindow { .. }
            | SpecKind::ChunkedLocal { .. }
            | SpecKind::CrossAttention
            | SpecKind::MlaAttention
            | SpecKind::SlidingWindowMla { .. }
            | SpecKind::Rswa { .. }
            | SpecKind::HiSparseResident
            | SpecKind::HiSparseHot { .. }
            // Align mode sizes by the main model's tokens (its own path).
            | SpecKind::MambaAlign { .. } => num_tokens,
        }
    }

    /// Longest prefix-cache hit of `hashes` (hash-unit hashes at
    /// `hash_block_size`) over `groups` (all sharing this spec), at most
    /// `max_length` tokens, ending on a multiple of `alignment`. Writes each
    /// group's blocks into `out[g]` (cleared first; null block in skipped
    /// positions) and returns the hit length in tokens.
    ///
    /// `drop_eagle`: the hit loses its last block (EAGLE recomputes it to get
    /// the hidden states before the generation point); sliding windows match
    /// one block more for it. Mamba "align" never drops (drafters have no
    /// Mamba layers); chunked-local lookups refuse it, as vLLM's do.
    #[allow(clippy::too_many_arguments)]
    pub fn find_longest_cache_hit(
        &self,
        pool: &BlockPool,
        groups: &[GroupId],
        hashes: &[BlockHash],
        hash_block_size: usize,
        max_length: usize,
        alignment: usize,
        drop_eagle: bool,
        out: &mut HitLists,
    ) -> KvResult<usize> {
        if out.len() != groups.len() {
            return Err(KvError::InvalidArgument {
                name: "out",
                detail: format!("{} lists for {} groups", out.len(), groups.len()),
            });
        }
        if alignment == 0 {
            return Err(KvError::InvalidArgument {
                name: "alignment",
                detail: "must be positive".into(),
            });
        }
        // Token counts: a hit is at most `max_length`, and rounding it to
        // `alignment` (both below 2^48) stays far from 2^64.
        crate::limits::check_tokens("max_length", max_length)?;
        crate::limits::check_tokens("alignment", alignment)?;
        for list in out.iter_mut() {
            list.clear();
        }
        let view = HashView::new(hashes, hash_block_size, self.block_size)?;
        match self.spec.kind {
            SpecKind::FullAttention | SpecKind::MlaAttention | SpecKind::Rswa { .. } => {
                Ok(full_attention::find_longest_cache_hit(
                    pool, groups, &view, max_length, alignment, drop_eagle, out,
                ))
            }
            SpecKind::MambaAlign { .. } => Ok(mamba_align::find_longest_cache_hit(
                pool, groups, &view, max_length, alignment, out,
            )),
            SpecKind::SlidingWindow { sliding_window }
            | SpecKind::SlidingWindowMla { sliding_window } => {
                Ok(sliding_window::find_longest_cache_hit(
                    pool,
                    groups,
                    &view,
                    sliding_window as usize,
                    max_length,
                    alignment,
                    drop_eagle,
                    out,
                ))
            }
            SpecKind::ChunkedLocal { .. } if drop_eagle => Err(KvError::Unsupported {
                what: "an EAGLE block drop on a chunked-local lookup".into(),
            }),
            SpecKind::ChunkedLocal {
                attention_chunk_size,
            } => chunked_local::find_longest_cache_hit(
                pool,
                groups,
                &view,
                attention_chunk_size as usize,
                max_length,
                alignment,
                out,
            ),
            SpecKind::Mamba { .. } => Err(KvError::Unsupported {
                what: "prefix-cache lookup on a Mamba group (mode \"none\" has no prefix caching)"
                    .into(),
            }),
            SpecKind::CrossAttention => Err(KvError::Unsupported {
                what: "prefix-cache lookup on a cross-attention group".into(),
            }),
            // vLLM's HiSparse device groups answer every lookup with no hit
            // (the host group caches for them).
            SpecKind::HiSparseResident | SpecKind::HiSparseHot { .. } => Ok(0),
        }
    }

    /// Blocks that allocating `num_tokens` slots will pull from the free
    /// queue (fresh blocks plus evictable hits that get pinned). A pure
    /// prediction; never lower than what `add_local_computed_blocks` +
    /// `allocate_new_blocks` take.
    ///
    /// `table` is `None` for a request this group does not track yet;
    /// `total_computed` counts local and external computed tokens.
    pub fn num_blocks_to_allocate(
        &self,
        pool: &BlockPool,
        table: Option<&GroupTable>,
        num_tokens: usize,
        hits: &[BlockId],
        total_computed: usize,
    ) -> usize {
        self.num_blocks_to_allocate_capped(pool, table, num_tokens, hits, total_computed, None)
    }

    /// [`num_blocks_to_allocate`](Self::num_blocks_to_allocate) with the
    /// blocks the request needs capped at `cap` (vLLM's admission cap, see
    /// [`max_admission_blocks`](Self::max_admission_blocks); `None`: no cap).
    #[inline]
    pub fn num_blocks_to_allocate_capped(
        &self,
        pool: &BlockPool,
        table: Option<&GroupTable>,
        num_tokens: usize,
        hits: &[BlockId],
        total_computed: usize,
        cap: Option<usize>,
    ) -> usize {
        let bs = self.block_size;
        let mut required = self.tokens_to_allocate(num_tokens).div_ceil(bs);
        if let Some(cap) = cap {
            required = required.min(cap);
        }
        // Running request: hits were adopted at admission.
        if let Some(t) = table {
            return required.saturating_sub(t.blocks.len());
        }
        let skipped = self.num_skipped_tokens(total_computed) / bs;
        let new = required.saturating_sub(skipped.max(hits.len()));
        // Hits that fall in the skipped prefix are never touched.
        let kept = hits.get(skipped.min(hits.len())..).unwrap_or(&[]);
        new + pool.num_unreferenced(kept)
    }

    /// First-time adoption of prefix-cache hits: the table becomes nulls for
    /// the skipped positions followed by the remaining hits, which get a
    /// reference each. `num_computed` counts local and external tokens.
    pub fn add_local_computed_blocks(
        &self,
        pool: &mut BlockPool,
        table: &mut GroupTable,
        hits: &[BlockId],
        num_computed: usize,
    ) -> KvResult<()> {
        debug_assert!(
            table.blocks.is_empty(),
            "hits are adopted only by a fresh table"
        );
        let skipped = self.num_skipped_tokens(num_computed) / self.block_size;
        let kept = hits.get(skipped.min(hits.len())..).unwrap_or(&[]);
        pool.touch(kept)?;
        table.blocks.clear();
        table.blocks.resize(skipped, BlockId::NULL);
        table.blocks.extend_from_slice(kept);
        table.num_cached = table.blocks.len();
        Ok(())
    }

    /// A new request's blocks for `external` tokens a KV connector supplies
    /// (its table holds its hits, or the nulls before the window): fresh
    /// blocks up to the `total` computed tokens, unless every external
    /// token is before the window (vLLM's `allocate_external_computed_blocks`).
    /// Cross-attention has no external tokens (nothing allocated); callers
    /// refuse them for kinds without
    /// [`supports_external_tokens`](Self::supports_external_tokens).
    pub fn allocate_external_blocks(
        &self,
        pool: &mut BlockPool,
        table: &mut GroupTable,
        total: usize,
        external: usize,
        scratch: &mut Vec<BlockId>,
    ) -> KvResult<()> {
        match self.spec.kind {
            SpecKind::HiSparseResident if external > 0 => {
                return hisparse::resident_add_external(
                    pool,
                    table,
                    self.block_size,
                    total,
                    scratch,
                );
            }
            SpecKind::HiSparseHot { .. } if external > 0 => {
                // Reading imported pages needs the hot region.
                table.hisparse.hot_required = true;
                return Ok(());
            }
            SpecKind::HiSparseResident | SpecKind::HiSparseHot { .. } => return Ok(()),
            _ => {}
        }
        if self.spec.facts().sized_by_encoder || !self.supports_external_tokens() {
            return Ok(());
        }
        if external.min(total - self.num_skipped_tokens(total).min(total)) == 0 {
            return Ok(());
        }
        let n = total
            .div_ceil(self.block_size)
            .saturating_sub(table.blocks.len());
        if n > 0 {
            scratch.clear();
            pool.get_new_blocks(n, scratch)?;
            table.blocks.extend_from_slice(scratch);
            scratch.clear();
        }
        Ok(())
    }

    /// Whether a new request may bring external (KV-connector) tokens in
    /// this group: not Mamba groups in mode "none", whose scratch blocks
    /// the external blocks would have to count (not reproduced yet). An
    /// align-mode group gets the block of the state at the end of the
    /// external tokens, after nulls (vLLM's generic rule with Mamba's
    /// skipped tokens).
    pub const fn supports_external_tokens(&self) -> bool {
        match self.spec.kind {
            SpecKind::Mamba { .. } => false,
            SpecKind::MambaAlign { .. }
            | SpecKind::FullAttention
            | SpecKind::SlidingWindow { .. }
            | SpecKind::ChunkedLocal { .. }
            | SpecKind::CrossAttention
            | SpecKind::MlaAttention
            | SpecKind::SlidingWindowMla { .. }
            | SpecKind::Rswa { .. }
            | SpecKind::HiSparseResident
            | SpecKind::HiSparseHot { .. } => true,
        }
    }

    /// Grow the table to cover `num_tokens` slots with fresh blocks, which
    /// are also appended to `new_blocks`.
    #[inline]
    pub fn allocate_new_blocks(
        &self,
        pool: &mut BlockPool,
        table: &mut GroupTable,
        num_tokens: usize,
        new_blocks: &mut Vec<BlockId>,
    ) -> KvResult<()> {
        if let SpecKind::HiSparseHot { blocks_per_request } = self.spec.kind {
            return hisparse::hot_allocate_new(
                pool,
                table,
                blocks_per_request as usize,
                new_blocks,
            );
        }
        let required = self
            .tokens_to_allocate(num_tokens)
            .div_ceil(self.block_size);
        let n = required.saturating_sub(table.blocks.len());
        if n > 0 {
            let start = new_blocks.len();
            pool.get_new_blocks(n, new_blocks)?;
            table.blocks.extend_from_slice(&new_blocks[start..]);
        }
        Ok(())
    }

    /// Register the table's newly full blocks in the prefix cache: the first
    /// `num_tokens` tokens, as far as `hashes` (hash units of
    /// `hash_block_size` tokens) reach. Sliding-window groups cache only the
    /// blocks a later hit can reach (see [`sliding_window::reachable_block_mask`]).
    ///
    /// Inlined up to "nothing new is full" (most decode steps); the caching
    /// itself is `cache_new_blocks`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn cache_blocks(
        &self,
        pool: &mut BlockPool,
        table: &mut GroupTable,
        hashes: &[BlockHash],
        hash_block_size: usize,
        num_tokens: usize,
        policy: &CachePolicy<'_>,
        mask_buf: &mut Vec<bool>,
    ) -> KvResult<()> {
        if !self.spec.prefix_cacheable() {
            return Ok(());
        }
        let bs = self.block_size;
        let scale = hash_scale(hash_block_size, bs)?;
        let num_full = num_tokens.min(hashes.len() * hash_block_size) / bs;
        if table.num_cached >= num_full {
            return Ok(());
        }
        self.cache_new_blocks(
            pool, table, hashes, scale, num_tokens, num_full, policy, mask_buf,
        )
    }

    /// The part of [`cache_blocks`](Self::cache_blocks) that registers
    /// `table`'s blocks `[num_cached, num_full)`.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn cache_new_blocks(
        &self,
        pool: &mut BlockPool,
        table: &mut GroupTable,
        hashes: &[BlockHash],
        scale: usize,
        num_tokens: usize,
        num_full: usize,
        policy: &CachePolicy<'_>,
        mask_buf: &mut Vec<bool>,
    ) -> KvResult<()> {
        let bs = self.block_size;
        if num_full > table.blocks.len() {
            return Err(KvError::InvalidArgument {
                name: "num_tokens",
                detail: format!(
                    "{num_tokens} tokens fill {num_full} blocks but the table holds {}",
                    table.blocks.len()
                ),
            });
        }
        let mask = match self.spec.kind {
            SpecKind::MambaAlign { .. } => {
                mamba_align::reachable_block_mask(table.num_cached, num_full, bs, policy, mask_buf)
            }
            SpecKind::SlidingWindow { sliding_window }
            | SpecKind::SlidingWindowMla { sliding_window } => {
                sliding_window::reachable_block_mask(
                    table.num_cached,
                    num_full,
                    bs,
                    sliding_window as usize,
                    self.eagle,
                    policy,
                    mask_buf,
                )
            }
            SpecKind::FullAttention
            | SpecKind::MlaAttention
            | SpecKind::Rswa { .. }
            | SpecKind::ChunkedLocal { .. }
            | SpecKind::Mamba { .. }
            | SpecKind::CrossAttention
            | SpecKind::HiSparseResident
            | SpecKind::HiSparseHot { .. } => false,
        };
        pool.cache_full_blocks_scaled(
            &table.blocks,
            hashes,
            scale,
            table.num_cached,
            num_full,
            self.group,
            mask.then_some(mask_buf.as_slice()),
        )?;
        table.num_cached = num_full;
        Ok(())
    }

    /// Release the blocks that no longer matter once `processed` tokens are
    /// computed: entries `[0, k)` become null, walking back from `k-1` and
    /// stopping at the first null (nulls form a prefix); they are freed in
    /// that backward order. `scratch` is a reusable buffer.
    ///
    /// R-SWA frees its decode gap instead when `num_prompt_tokens` is given
    /// (see [`rswa`]); Mamba "align" skips null gaps and also frees the
    /// previous state (see [`mamba_align`]).
    #[inline]
    pub fn remove_skipped_blocks(
        &self,
        pool: &mut BlockPool,
        table: &mut GroupTable,
        processed: usize,
        num_prompt_tokens: Option<usize>,
        scratch: &mut Vec<BlockId>,
    ) -> KvResult<()> {
        match self.spec.kind {
            SpecKind::Rswa { rswa_window } => {
                if let Some(prompt) = num_prompt_tokens {
                    let range = rswa::gap(prompt, processed, rswa_window as usize, self.block_size);
                    return rswa::remove_gap(pool, &mut table.blocks, range, scratch);
                }
            }
            SpecKind::MambaAlign { .. } => {
                return mamba_align::remove_skipped_blocks(
                    self.block_size,
                    pool,
                    table,
                    processed,
                    scratch,
                );
            }
            SpecKind::FullAttention
            | SpecKind::SlidingWindow { .. }
            | SpecKind::ChunkedLocal { .. }
            | SpecKind::Mamba { .. }
            | SpecKind::CrossAttention
            | SpecKind::MlaAttention
            | SpecKind::SlidingWindowMla { .. }
            | SpecKind::HiSparseResident
            | SpecKind::HiSparseHot { .. } => {}
        }
        let skipped = self.num_skipped_tokens(processed);
        if skipped == 0 {
            return Ok(());
        }
        let k = (skipped / self.block_size).min(table.blocks.len());
        // Nulls form a prefix: when entry `k - 1` is null (or there is
        // none), nothing is left to free (most steps of a window).
        if k == 0 || table.blocks[k - 1].is_null() {
            return Ok(());
        }
        scratch.clear();
        for entry in table.blocks[..k].iter_mut().rev() {
            if entry.is_null() {
                break;
            }
            scratch.push(std::mem::replace(entry, BlockId::NULL));
        }
        pool.free_blocks(scratch)
    }

    /// Release the whole table, tail first (the deepest prefix block is
    /// evicted before the shallower ones), leading nulls trimmed.
    pub fn free(&self, pool: &mut BlockPool, table: &mut GroupTable) -> KvResult<()> {
        if let SpecKind::HiSparseResident = self.spec.kind {
            return hisparse::resident_free(pool, table);
        }
        table.hisparse.clear();
        let nulls = table.num_leading_nulls();
        table.blocks.drain(..nulls);
        table.blocks.reverse();
        let res = pool.free_blocks(&table.blocks);
        table.blocks.clear();
        table.num_cached = 0;
        table.align.clear();
        res
    }
}

#[cfg(test)]
pub(crate) mod test_util;
