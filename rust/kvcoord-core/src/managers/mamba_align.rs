//! Mamba, mode "align": prefix caching of Mamba state (vLLM 0.33.0's
//! `MambaManager` with `mamba_cache_mode="align"`).
//!
//! The table is indexed by token position like an attention table (entry `i`
//! covers tokens `[i*bs, (i+1)*bs)`) but is mostly null. The real entries
//! are the block holding the running state (the entry of the block being
//! filled), the block of the previous state (the kernel copies from it; a
//! later allocation frees it once the request has moved past it) and,
//! optionally, a reserved prefill checkpoint block in the entry just before
//! the running one. A real block gets its cache key when a step ends exactly
//! at its boundary (the key is registered before the state exists, so a hit
//! on a key cached during the current step is refused until the next step).
//!
//! With `num_speculative_blocks = k` (MTP) the table ends with the running
//! state followed by `k` scratch blocks; an allocation moves the scratch
//! blocks a step leaves behind to the new end of the table.
//!
//! Supported here: hash unit = block size (no partial-block entries); the
//! coordinator's configuration check refuses the rest.

use hashbrown::HashSet;

use super::cache_policy::CachePolicy;
use super::hash_view::{lookup_all, HashView, HitLists};
pub use super::table::AlignState;
use super::table::GroupTable;
use crate::block_hash::BlockHash;
use crate::error::KvResult;
use crate::ids::{BlockId, GroupId};
use crate::pool::BlockPool;
use crate::prefix_index::CacheKey;
use crate::spec::{GroupSpec, SpecKind};

/// The checkpoint boundary of a prefill reaching `num_tokens`: the last
/// multiple of `unit` strictly below it (one token is always recomputed for
/// the logits).
#[inline]
pub fn prefill_checkpoint_position(num_tokens: usize, unit: usize) -> usize {
    CheckpointRule::default().position(num_tokens, unit)
}

/// What a prefill checkpoint must leave after it (vLLM's
/// `get_mamba_prefill_checkpoint_position`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckpointRule {
    /// Hash lookahead tokens: the boundary leaves `max(1, lookahead)`
    /// tokens after it, so that its hash exists.
    pub lookahead: usize,
    /// EAGLE's block drop (vLLM's `drop_eagle_checkpoint_block`, set under
    /// `use_eagle`): the boundary is one unit below the last one at or
    /// below the end, EAGLE's replay boundary (which already leaves tokens
    /// to recompute).
    pub drop_eagle: bool,
}

impl CheckpointRule {
    /// The checkpoint boundary of a prefill reaching `num_tokens`, on a
    /// multiple of `unit`.
    #[inline]
    pub fn position(self, num_tokens: usize, unit: usize) -> usize {
        if self.drop_eagle {
            (num_tokens / unit * unit).saturating_sub(unit)
        } else {
            num_tokens.saturating_sub(self.lookahead.max(1)) / unit * unit
        }
    }
}

/// Whether a chunk `[start, end)` can export the state at `checkpoint` into
/// the reserved block (vLLM's `is_mamba_prefill_checkpoint_valid`).
pub fn prefill_checkpoint_valid(
    start: usize,
    end: usize,
    checkpoint: usize,
    hash_block_size: usize,
    block_size: usize,
    alignment: Option<usize>,
) -> bool {
    let Some(alignment) = alignment else {
        return false;
    };
    // The reserved block's column (`cdiv(end, bs) - 2`) must lie past the
    // column of the state the chunk starts from (`(start - 1) / bs`, -1 for
    // a chunk starting at 0).
    let end_cols = end.div_ceil(block_size);
    start % hash_block_size == 0
        && end_cols >= 2
        && (start == 0 || end_cols - 2 > (start - 1) / block_size)
        && start + hash_block_size <= checkpoint
        && start < checkpoint
        && checkpoint < end
        && (checkpoint - start) % alignment == 0
}

/// Scan right to left; the first cached block whose end is aligned wins:
/// nulls before it, one real block (the state at that boundary).
pub(crate) fn find_longest_cache_hit(
    pool: &BlockPool,
    groups: &[GroupId],
    view: &HashView<'_>,
    max_length: usize,
    alignment: usize,
    out: &mut HitLists,
) -> usize {
    let bs = view.block_size();
    if alignment < bs && bs % alignment == 0 {
        // Sub-block hits (vLLM's partial hash hits, `alignment` = the hash
        // unit): the longest hash-unit boundary with a cached state wins.
        let units = view.units();
        let unit = alignment;
        for fine in (0..(max_length / unit).min(units.len())).rev() {
            if !lookup_all(pool, groups, &units[fine], out) {
                continue;
            }
            let block_idx = fine * unit / bs;
            for list in out.iter_mut() {
                let b = list.pop().unwrap_or(BlockId::NULL);
                list.resize(block_idx, BlockId::NULL);
                list.push(b);
            }
            return (fine + 1) * unit;
        }
        return 0;
    }
    let max_blocks = (max_length / bs).min(view.len());
    for i in (0..max_blocks).rev() {
        if !lookup_all(pool, groups, view.get(i), out) {
            continue;
        }
        if bs != alignment && ((i + 1) * bs) % alignment != 0 {
            for list in out.iter_mut() {
                list.clear();
            }
            continue;
        }
        for list in out.iter_mut() {
            let b = list.pop().unwrap_or(BlockId::NULL);
            list.resize(i, BlockId::NULL);
            list.push(b);
        }
        return (i + 1) * bs;
    }
    0
}

/// What one allocation needs to know beyond the table.
#[derive(Copy, Clone, Debug)]
pub(crate) struct AllocInput<'a> {
    /// Tokens of the main model after this step (`computed + new`).
    pub main: usize,
    /// Computed tokens (local and external) before this step.
    pub total_computed: usize,
    /// The request's prefill end when only the prefill-end chunk may export
    /// a checkpoint (retention 0); 0 otherwise.
    pub prefill_end: usize,
    /// Tokens a hit must end on a multiple of.
    pub alignment: usize,
    /// Tokens per hash unit.
    pub hash_block_size: usize,
    /// This request's hits in this group (first allocation only).
    pub hits: &'a [BlockId],
    /// Locally computed tokens (hits included, external tokens not).
    pub local: usize,
    /// Where the checkpoint goes.
    pub rule: CheckpointRule,
}

/// What an allocation will pull from the pool, as vLLM's signed count:
/// `take - give_back` (a table already longer than needed gives a negative
/// count, which the coordinator sums with the other groups').
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Needed {
    /// Blocks taken (new blocks and evictable hits).
    pub take: usize,
    /// Surplus table entries counted against the other groups.
    pub give_back: usize,
    /// The prefill checkpoint reserved: (token position, table index).
    pub checkpoint: Option<(usize, usize)>,
}

/// Blocks this allocation of a group of `spec` (a Mamba "align" group)
/// pulls from the pool and the prefill checkpoint it reserves. A hit whose
/// state was cached during the current step cannot be used yet: the count
/// is then larger than the pool.
pub(crate) fn num_blocks_to_allocate(
    spec: &GroupSpec,
    pool: &BlockPool,
    table: Option<&GroupTable>,
    input: &AllocInput<'_>,
    cached_this_step: &HashSet<CacheKey>,
) -> Needed {
    let spec_bs = spec.block_size as usize;
    let SpecKind::MambaAlign {
        num_speculative_blocks,
        prefill_checkpoint,
        prefill_checkpoint_alignment,
    } = spec.kind
    else {
        return Needed::default();
    };
    let scratch = num_speculative_blocks as usize;
    let checkpoint_alignment = prefill_checkpoint_alignment.map(|a| a as usize);
    if let Some(&last) = input.hits.last() {
        if let Ok(Some(key)) = pool.cache_key(last) {
            if cached_this_step.contains(&key) {
                return Needed {
                    take: pool.num_blocks() + 1,
                    ..Needed::default()
                };
            }
        }
    }
    let state_blocks = input.main.div_ceil(spec_bs);
    let required = state_blocks + scratch;
    let table_len = table.map_or(0, |t| t.blocks.len());
    let allocated = table.is_some_and(|t| t.align.allocated);
    let have = input.hits.len() + table_len;
    // A state at a sub-block boundary is copied into one more block.
    let partial = (!input.hits.is_empty() && input.local % spec_bs != 0)
        || table.is_some_and(|t| t.align.partial_hit.is_some());
    let position = input.rule.position(input.main, input.alignment);
    // The reserved block sits just before the running state's entry.
    let checkpoint_idx = state_blocks.checked_sub(2);
    let reserves = prefill_checkpoint
        && input.main >= input.prefill_end
        && prefill_checkpoint_valid(
            input.total_computed,
            input.main,
            position,
            input.hash_block_size,
            spec_bs,
            checkpoint_alignment,
        )
        && checkpoint_idx.is_some_and(|idx| {
            // Free for the checkpoint: past the table, a null entry, or one
            // of the scratch blocks at its end (relocated by the allocation).
            idx >= table_len
                || table.is_some_and(|t| t.blocks[idx].is_null())
                || (allocated && idx + scratch >= table_len)
        });
    let checkpoint = checkpoint_idx
        .filter(|_| reserves)
        .map(|idx| (position, idx));
    // At most the running state and the checkpoint per step, plus the
    // scratch blocks on the first allocation.
    let cap =
        1 + usize::from(partial) + usize::from(reserves) + if allocated { 0 } else { scratch };
    let new = (required.saturating_sub(have) + usize::from(partial)).min(cap);
    Needed {
        take: new + pool.num_unreferenced(input.hits),
        give_back: if partial {
            0
        } else {
            have.saturating_sub(required)
        },
        checkpoint,
    }
}

/// Grow the table for `main` tokens: nulls up to the entry before the
/// running state (or before the reserved checkpoint), the speculative
/// scratch blocks the step leaves behind moved to the end (their entries
/// become null; one at the checkpoint's entry stays, the checkpoint is
/// exported into it), then fresh blocks. The table always ends with the
/// running state followed by `num_speculative_blocks` scratch blocks. The
/// padded nulls, the moved scratch blocks and the fresh blocks are appended
/// to `new_blocks` (vLLM returns every entry past the old length).
pub(crate) fn allocate_new_blocks(
    spec_bs: usize,
    num_speculative_blocks: usize,
    pool: &mut BlockPool,
    table: &mut GroupTable,
    main: usize,
    new_blocks: &mut Vec<BlockId>,
    cow: &mut CowLog<'_>,
) -> KvResult<()> {
    let scratch = num_speculative_blocks;
    let state_blocks = main.div_ceil(spec_bs);
    let required = state_blocks + scratch;
    let checkpoint_block = usize::from(table.align.checkpoint.is_some());
    let prev_len = table.blocks.len();
    let start = new_blocks.len();
    let partial = table.align.partial_hit.take();
    if required <= prev_len && checkpoint_block == 0 && partial.is_none() {
        table.align.allocated = true;
        return Ok(());
    }
    if table.align.allocated {
        // The running state sits before the scratch blocks; the kernel
        // copies from it this step.
        table.align.last_state = prev_len.checked_sub(1 + scratch);
    } else if prev_len > 0 {
        // Right after admission the hit state is the last entry.
        table.align.last_state = Some(prev_len - 1);
    }
    let skipped_blocks = state_blocks.saturating_sub(1);
    let null_end = skipped_blocks.saturating_sub(checkpoint_block);
    if prev_len < skipped_blocks && null_end > prev_len {
        table.blocks.resize(null_end, BlockId::NULL);
    }
    if table.align.allocated {
        for idx in prev_len.saturating_sub(scratch)..prev_len {
            if idx >= null_end {
                break;
            }
            let b = std::mem::replace(&mut table.blocks[idx], BlockId::NULL);
            table.blocks.push(b);
        }
    }
    new_blocks.extend_from_slice(&table.blocks[prev_len.min(table.blocks.len())..]);
    let n = required.saturating_sub(table.blocks.len()) + usize::from(partial.is_some());
    let fresh = new_blocks.len();
    pool.get_new_blocks(n, new_blocks)?;
    if let Some((idx, src)) = partial {
        // The first fresh block receives a copy of the state at the
        // sub-block boundary (vLLM's copy-on-write).
        let dst = new_blocks.remove(fresh);
        cow.copies.push((cow.group, src, dst));
        if table.align.allocated {
            // A running request keeps writing `src` (its table is
            // append-only): the cache keys move to the copy instead, which
            // is filled by this step's copy (no hit on it before the next
            // step). Both ends are held for the copy.
            pool.move_block_keys(src, dst)?;
            pool.touch(&[src])?;
            *cow.held.entry(src).or_insert(0) += 1;
            *cow.held.entry(dst).or_insert(0) += 1;
            if let Some((_, tokens)) = table.align.producer_tail.take() {
                cow.offloads.push((dst, tokens));
            }
            if let Some(key) = pool.cache_key(dst)? {
                cow.cached.insert(key);
            }
        } else {
            // A new request's hit: its table takes the private copy; the
            // hit block's reference is now held for the copy, and the copy
            // gets one more.
            table.blocks[idx] = dst;
            pool.touch(&[dst])?;
            *cow.held.entry(src).or_insert(0) += 1;
            *cow.held.entry(dst).or_insert(0) += 1;
            new_blocks.insert(start, dst);
        }
    }
    let fresh = new_blocks.len() - (n - usize::from(partial.is_some()));
    table.blocks.extend_from_slice(&new_blocks[fresh..]);
    table.align.allocated = true;
    Ok(())
}

/// Where an allocation records its copy-on-write work.
pub(crate) struct CowLog<'a> {
    /// The group allocating.
    pub group: GroupId,
    /// (group, source, destination) copies for the worker, in order.
    pub copies: &'a mut Vec<(GroupId, BlockId, BlockId)>,
    /// References held outside the tables (the copies' ends).
    pub held: &'a mut hashbrown::HashMap<BlockId, u32>,
    /// Keys refused as hits until the next step.
    pub cached: &'a mut HashSet<CacheKey>,
    /// Copies of a request's own prompt-tail state, with the tokens they
    /// cover (boundary-state offloads).
    pub offloads: &'a mut Vec<(BlockId, usize)>,
}

/// A finishing request's own prompt-tail state, handed off as is when no
/// later token was computed into its block (vLLM's
/// `finalize_partial_tail_offload`): (block, tokens). Forgets it either way.
pub(crate) fn finalize_partial_tail(
    table: &mut GroupTable,
    num_computed: usize,
    num_in_flight: usize,
) -> Option<(BlockId, usize)> {
    let (b, tokens) = table.align.producer_tail.take()?;
    (num_in_flight == 0 && num_computed == tokens).then_some((b, tokens))
}

/// Release the states that no longer matter once `processed` tokens are
/// computed: every real entry below the block of the last computed token
/// (walking down from the highest, not stopping at nulls, never below the
/// retired frontier), then the previous running state once the request is
/// past it. Each is one `free_blocks` call, in that order.
pub(crate) fn remove_skipped_blocks(
    spec_bs: usize,
    pool: &mut BlockPool,
    table: &mut GroupTable,
    processed: usize,
    scratch: &mut Vec<BlockId>,
) -> KvResult<()> {
    let skipped = processed.saturating_sub(1);
    if skipped > 0 {
        let last = (skipped / spec_bs).min(table.blocks.len());
        let first = table.align.retired;
        if first < last {
            scratch.clear();
            for entry in table.blocks[first..last].iter_mut().rev() {
                if !entry.is_null() {
                    scratch.push(std::mem::replace(entry, BlockId::NULL));
                }
            }
            pool.free_blocks(scratch)?;
            table.align.retired = last;
        }
    }
    if let Some(idx) = table.align.last_state {
        // Past it: the block of the last computed token is further on.
        if idx + 1 < processed.div_ceil(spec_bs) && !table.blocks[idx].is_null() {
            let b = std::mem::replace(&mut table.blocks[idx], BlockId::NULL);
            pool.free_blocks(&[b])?;
        }
    }
    Ok(())
}

/// Which of the blocks `[start, end)` keep their state under a retention
/// interval (one per segment, plus the block ending at each reachable
/// boundary). Writes `buf` and returns `true` when a mask applies; `false`
/// means every block is kept (dense caching).
pub(crate) fn reachable_block_mask(
    start: usize,
    end: usize,
    bs: usize,
    policy: &CachePolicy<'_>,
    buf: &mut Vec<bool>,
) -> bool {
    let Some(retention) = policy.retention else {
        return false;
    };
    buf.clear();
    buf.resize(end - start, false);
    if retention != 0 {
        let per_segment = retention / bs;
        if per_segment <= 1 {
            return false;
        }
        let first = (start + per_segment) / per_segment * per_segment - 1;
        let mut i = first - start;
        while i < buf.len() {
            buf[i] = true;
            i += per_segment;
        }
    }
    for &boundary in policy.reachable_boundaries {
        let aligned = boundary / policy.alignment * policy.alignment;
        if aligned < bs {
            continue;
        }
        let block = aligned / bs - 1;
        if (start..end).contains(&block) {
            buf[block - start] = true;
        }
    }
    true
}

/// After the group's regular caching (vLLM's `_cache_partial_tail_block`
/// and the bookkeeping around it): re-key the reserved checkpoint block at
/// its exported boundary (or drop a transient checkpoint's keys under a
/// retention interval), or, without a checkpoint, key the prompt's last
/// hash-unit boundary on the block of the state there; record every key
/// registered by this call in `cached_this_step`. `before` is the table's
/// cached count before the regular caching.
#[allow(clippy::too_many_arguments)]
pub(crate) fn after_cache_blocks(
    spec_bs: usize,
    group: GroupId,
    pool: &mut BlockPool,
    table: &mut GroupTable,
    hashes: &[BlockHash],
    num_tokens: usize,
    num_prompt_tokens: usize,
    shared_prefix_boundary: usize,
    policy: &CachePolicy<'_>,
    before: usize,
    cached_this_step: &mut HashSet<CacheKey>,
    (hbs, rule, rekey_keyed_tail): (usize, CheckpointRule, bool),
) -> KvResult<()> {
    let mut lowered = None;
    if let Some((position, idx)) = table.align.checkpoint {
        checkpoint_key(
            spec_bs,
            group,
            pool,
            table,
            hashes,
            (position, idx),
            (num_prompt_tokens, shared_prefix_boundary, rule, hbs),
            policy,
            cached_this_step,
        )?;
    } else {
        lowered = prompt_tail_key(
            spec_bs,
            hbs,
            group,
            pool,
            table,
            hashes,
            (num_tokens, num_prompt_tokens, rule),
            rekey_keyed_tail,
            cached_this_step,
        )?;
    }
    for &b in table.blocks.get(before..table.num_cached).unwrap_or(&[]) {
        if b.is_null() {
            continue;
        }
        if let Some(key) = pool.cache_key(b)? {
            cached_this_step.insert(key);
        }
    }
    if let Some(idx) = lowered {
        // The block holding the sub-block state is cached again once full
        // (its keys move to the copy first).
        table.num_cached = idx;
    }
    Ok(())
}

/// The reserved checkpoint block keyed at the boundary whose state the
/// worker exports into it: kept when it is the prompt's checkpoint, a
/// retained segment boundary or the shared-prefix junction (its keys
/// replaced by the one at the boundary unless already keyed there),
/// otherwise its keys are dropped (a transient state overwrites it).
#[allow(clippy::too_many_arguments)]
fn checkpoint_key(
    spec_bs: usize,
    group: GroupId,
    pool: &mut BlockPool,
    table: &GroupTable,
    hashes: &[BlockHash],
    (position, idx): (usize, usize),
    (num_prompt_tokens, shared_prefix_boundary, rule, hbs): (usize, usize, CheckpointRule, usize),
    policy: &CachePolicy<'_>,
    cached_this_step: &mut HashSet<CacheKey>,
) -> KvResult<()> {
    let is_prompt = position == rule.position(num_prompt_tokens, policy.alignment);
    let retained = position % spec_bs == 0 && position >= spec_bs && {
        let block = position / spec_bs - 1;
        let mut buf = Vec::new();
        let no_boundaries = CachePolicy {
            reachable_boundaries: &[],
            ..policy.clone()
        };
        !reachable_block_mask(block, block + 1, spec_bs, &no_boundaries, &mut buf) || buf[0]
    };
    let b = table.blocks.get(idx).copied().unwrap_or(BlockId::NULL);
    if b.is_null() {
        return Ok(());
    }
    if !is_prompt && !retained && position != shared_prefix_boundary {
        // A transient state overwrites this slot: its keys are useless.
        return pool.evict_blocks(&[b]);
    }
    if pool.key_num_tokens(b)? == Some(position) || position == 0 || position / hbs > hashes.len() {
        return Ok(());
    }
    let full = (idx + 1) * spec_bs;
    if let Some(key) = pool.cache_partial_block(b, hashes, position, full, group, true)? {
        cached_this_step.insert(key);
    }
    Ok(())
}

/// The prompt's last hash-unit boundary keyed on the block of the state
/// there (vLLM's `_cache_partial_tail_block` without a checkpoint): when
/// this call caches up to exactly that boundary, the running state block
/// gets a key at it unless already keyed there. A boundary inside the
/// block (hash unit below the block size) makes the next allocation copy
/// the state out (the request's own partial hit and producer tail); the
/// table index the cached count is lowered to is returned then.
/// `rekey_keyed`: a block already keyed at that boundary (by a hit or an
/// earlier step) is keyed again, as vLLM 0.32 does: it counts as cached
/// this step (siblings' hits on it wait for the next step) and, inside the
/// block, is copied out again ([`CoordinatorConfig::rekey_keyed_prompt_tail`](crate::CoordinatorConfig)).
#[allow(clippy::too_many_arguments)]
fn prompt_tail_key(
    spec_bs: usize,
    hbs: usize,
    group: GroupId,
    pool: &mut BlockPool,
    table: &mut GroupTable,
    hashes: &[BlockHash],
    (num_tokens, num_prompt_tokens, rule): (usize, usize, CheckpointRule),
    rekey_keyed: bool,
    cached_this_step: &mut HashSet<CacheKey>,
) -> KvResult<Option<usize>> {
    if num_tokens == 0
        || num_tokens % hbs != 0
        || num_tokens != rule.position(num_prompt_tokens, hbs)
        || num_tokens / hbs > hashes.len()
    {
        return Ok(None);
    }
    let idx = num_tokens.div_ceil(spec_bs) - 1;
    let Some(&b) = table.blocks.get(idx) else {
        return Ok(None);
    };
    if b.is_null() || (!rekey_keyed && pool.key_num_tokens(b)? == Some(num_tokens)) {
        // Null, or already keyed here (a hit or an earlier step).
        return Ok(None);
    }
    let full = (idx + 1) * spec_bs;
    let Some(key) = pool.cache_partial_block(b, hashes, num_tokens, full, group, false)? else {
        return Ok(None);
    };
    cached_this_step.insert(key);
    if num_tokens % spec_bs == 0 {
        return Ok(None);
    }
    table.align.partial_hit = Some((idx, b));
    table.align.producer_tail = Some((b, num_tokens));
    Ok(Some(idx))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::managers::test_util::pool;

    /// A throwaway copy-on-write log.
    macro_rules! cow {
        () => {
            CowLog {
                group: GroupId(0),
                copies: &mut Vec::new(),
                held: &mut hashbrown::HashMap::new(),
                cached: &mut HashSet::new(),
                offloads: &mut Vec::new(),
            }
        };
    }

    #[test]
    fn speculative_scratch_blocks_follow_the_running_state() {
        let mut pl = pool(20, 4);
        let mut table = GroupTable::default();
        let mut out = Vec::new();
        // First allocation (8 tokens): a null, the running state, two
        // scratch blocks.
        allocate_new_blocks(4, 2, &mut pl, &mut table, 8, &mut out, &mut cow!()).unwrap();
        assert_eq!(out.len(), 4);
        assert!(out[0].is_null());
        let (s1, s2, s3) = (out[1], out[2], out[3]);
        assert_eq!(table.blocks, vec![BlockId::NULL, s1, s2, s3]);
        assert_eq!(table.align.last_state, None);
        // 12 tokens: the first scratch block becomes the running state, one
        // fresh scratch block; the previous state is remembered.
        out.clear();
        allocate_new_blocks(4, 2, &mut pl, &mut table, 12, &mut out, &mut cow!()).unwrap();
        assert_eq!(out.len(), 1);
        let s4 = out[0];
        assert_eq!(table.blocks, vec![BlockId::NULL, s1, s2, s3, s4]);
        assert_eq!(table.align.last_state, Some(1));
        // 24 tokens: both scratch blocks left behind move to the new end
        // (returned with the fresh one), their entries become null.
        out.clear();
        allocate_new_blocks(4, 2, &mut pl, &mut table, 24, &mut out, &mut cow!()).unwrap();
        assert_eq!(&out[..2], &[s3, s4]);
        let s5 = out[2];
        let nul = BlockId::NULL;
        assert_eq!(table.blocks, vec![nul, s1, s2, nul, nul, s3, s4, s5]);
        assert_eq!(table.align.last_state, Some(2));
        // Freeing past the old state releases it and s2 (the entries below
        // the last computed token's block).
        let mut scratch = Vec::new();
        remove_skipped_blocks(4, &mut pl, &mut table, 24, &mut scratch).unwrap();
        assert_eq!(table.blocks, vec![nul, nul, nul, nul, nul, s3, s4, s5]);
    }

    #[test]
    fn scratch_blocks_are_counted_once_and_free_the_checkpoint_entry() {
        let p = pool(20, 4);
        let spec = GroupSpec::mamba_align_from_sizes(4, 2, 1, Some(4)).unwrap();
        let input = |main, total_computed| AllocInput {
            main,
            total_computed,
            prefill_end: 0,
            alignment: 4,
            hash_block_size: 4,
            hits: &[],
            local: total_computed,
            rule: CheckpointRule::default(),
        };
        let none = HashSet::new();
        // A new request: state blocks, both scratch blocks and the checkpoint.
        let n = num_blocks_to_allocate(&spec, &p, None, &input(10, 0), &none);
        assert_eq!(n.checkpoint, Some((8, 1)));
        assert_eq!(n.take, 1 + 1 + 2);
        // A running request whose checkpoint entry is one of its scratch
        // blocks may still reserve it; scratch blocks are not taken again.
        let t = GroupTable {
            blocks: vec![BlockId::NULL, BlockId(1), BlockId(2), BlockId(3)],
            num_cached: 0,
            align: AlignState {
                allocated: true,
                ..AlignState::default()
            },
            ..GroupTable::default()
        };
        let n = num_blocks_to_allocate(&spec, &p, Some(&t), &input(12, 8), &none);
        assert_eq!(
            n.checkpoint, None,
            "chunk starts past the checkpoint column"
        );
        let n = num_blocks_to_allocate(&spec, &p, Some(&t), &input(16, 4), &none);
        assert_eq!(n.checkpoint, Some((12, 2)));
        assert_eq!((n.take, n.give_back), (2, 0));
    }

    #[test]
    fn a_prompt_tail_already_keyed_is_keyed_again_only_under_the_032_rule() {
        use crate::managers::test_util::hashes;
        // Block size 8, hash unit 4; a 6-token prompt's last hash boundary
        // is 4, inside the state's block (entry 0).
        let rule = CheckpointRule {
            lookahead: 0,
            drop_eagle: false,
        };
        let unit_hashes = hashes(2);
        for rekey in [false, true] {
            let mut pl = pool(8, 4);
            let mut got = Vec::new();
            pl.get_new_blocks(1, &mut got).unwrap();
            let b = got[0];
            let mut table = GroupTable {
                blocks: vec![b],
                ..GroupTable::default()
            };
            // Keyed at 4 already (an earlier step or a hit).
            pl.cache_partial_block(b, &unit_hashes, 4, 8, GroupId(0), false)
                .unwrap()
                .unwrap();
            let mut cached = HashSet::new();
            let lowered = prompt_tail_key(
                8,
                4,
                GroupId(0),
                &mut pl,
                &mut table,
                &unit_hashes,
                (4, 6, rule),
                rekey,
                &mut cached,
            )
            .unwrap();
            // 0.33 leaves it; 0.32 keys it again: cached this step, and the
            // sub-block state is copied out by the next allocation.
            assert_eq!(cached.len(), usize::from(rekey));
            assert_eq!(lowered, rekey.then_some(0));
            assert_eq!(table.align.producer_tail.is_some(), rekey);
            assert_eq!(pl.key_num_tokens(b).unwrap(), Some(4));
        }
    }

    #[test]
    fn checkpoint_rule_follows_lookahead_and_eagle() {
        // vLLM's get_mamba_prefill_checkpoint_position: the lookahead
        // leaves max(1, lookahead) tokens; EAGLE's drop sits one unit
        // below the last boundary at or below the end.
        let ahead = |lookahead| CheckpointRule {
            lookahead,
            drop_eagle: false,
        };
        assert_eq!(ahead(0).position(1089, 64), 1088);
        assert_eq!(ahead(2).position(1089, 64), 1024);
        assert_eq!(ahead(2).position(1090, 64), 1088);
        let eagle = CheckpointRule {
            lookahead: 0,
            drop_eagle: true,
        };
        assert_eq!(eagle.position(128, 32), 96);
        assert_eq!(eagle.position(127, 32), 64);
        assert_eq!(eagle.position(31, 32), 0);
    }

    #[test]
    fn checkpoint_position_and_validity() {
        assert_eq!(prefill_checkpoint_position(100, 16), 96);
        assert_eq!(prefill_checkpoint_position(96, 16), 80);
        assert_eq!(prefill_checkpoint_position(1, 16), 0);
        // A 100-token prompt from 0: the state at 96 goes to column 5.
        assert!(prefill_checkpoint_valid(0, 100, 96, 16, 16, Some(1)));
        assert!(!prefill_checkpoint_valid(0, 100, 96, 16, 16, None));
        // Start mid-block, checkpoint too close, or not past the start.
        assert!(!prefill_checkpoint_valid(8, 100, 96, 16, 16, Some(1)));
        assert!(!prefill_checkpoint_valid(96, 110, 104, 16, 16, Some(1)));
        assert!(prefill_checkpoint_valid(96, 120, 112, 16, 16, Some(1)));
        assert!(!prefill_checkpoint_valid(0, 96, 96, 16, 16, Some(1)));
        // Alignment relative to the start.
        assert!(!prefill_checkpoint_valid(16, 100, 96, 16, 16, Some(64)));
        assert!(prefill_checkpoint_valid(32, 100, 96, 16, 16, Some(64)));
    }
}
