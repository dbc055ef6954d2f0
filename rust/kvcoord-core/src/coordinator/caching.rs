//! Caching a request's blocks: every group's newly full blocks
//! ([`cache_tables`]), a full-attention prompt tail keyed inside its block
//! (sub-block hits), and the Mamba "align" states committed, handed to KV
//! connectors as [`BoundaryOffload`]s.
//!
//! Invariant: every group is validated before any group caches, so a
//! refused call caches nothing.

use hashbrown::HashSet;

use super::config::CoordinatorConfig;
use crate::error::{KvError, KvResult};
use crate::ids::{BlockId, GroupId, ReqId};
use crate::managers::{full_attention, mamba_align, CachePolicy, GroupTable, Manager};
use crate::pool::BlockPool;
use crate::prefix_index::CacheKey;
use crate::request::RequestView;
use crate::spec::SpecKind;

/// Cache every group's newly full blocks of the first `num_tokens` tokens.
/// Validates all groups before caching any.
#[allow(clippy::too_many_arguments)]
// Measured: as an out-of-line call this step helper cost more in
// prologue and argument spills than its work (callgrind, decode step).
#[allow(clippy::inline_always)]
#[inline(always)]
pub(super) fn cache_tables(
    managers: &[Manager],
    pool: &mut BlockPool,
    tables: &mut [GroupTable],
    config: &CoordinatorConfig,
    retention: Option<usize>,
    view: &RequestView<'_>,
    num_tokens: usize,
    mask_buf: &mut Vec<bool>,
    log: StepLog<'_>,
) -> KvResult<()> {
    let StepLog {
        req,
        cached: cached_this_step,
        offloads,
    } = log;
    let sbs = config.scheduler_block_size as usize;
    let hbs = config.hash_block_size as usize;
    let hashed = view.hashes.len() * hbs;
    // Whether any group has a newly full block, or keeps Mamba "align"
    // state (which is looked after on every call): on most decode steps
    // neither, and nothing below would change anything.
    let mut work = false;
    for (m, t) in managers.iter().zip(tables.iter()) {
        let cacheable = config.num_cacheable_tokens(m.group(), num_tokens);
        let num_full = cacheable.min(hashed) / m.block_size();
        let cacheable_group = m.spec().prefix_cacheable();
        if cacheable_group && num_full > t.num_cached() && num_full > t.blocks().len() {
            return Err(table_too_short(num_tokens, num_full, m, t));
        }
        work |= (cacheable_group && num_full > t.num_cached())
            || matches!(m.spec().kind, SpecKind::MambaAlign { .. })
            || partial_tail(m, view, hbs, cacheable).is_some();
    }
    if !work {
        return Ok(());
    }
    // Positions a later request may resume at: [replay boundaries..., the
    // shared-prefix junction, the block below it (EAGLE groups)].
    let mut boundaries = [0usize; 4];
    let mut nb = replay_boundaries(
        view.num_prompt_tokens,
        sbs,
        managers.iter().any(Manager::eagle),
        &mut boundaries,
    );
    let junction = view.shared_prefix_boundary;
    if junction != 0 {
        boundaries[nb] = junction;
        nb += 1;
    }
    for (m, t) in managers.iter().zip(tables.iter_mut()) {
        // An EAGLE sibling diverging right after the junction cannot use the
        // block past it as its dropped block: its hit lands a block lower.
        let mut own = nb;
        if junction != 0 && m.eagle() && config.eagle_junction_block {
            boundaries[own] = junction.saturating_sub(m.block_size());
            own += 1;
        }
        let policy = CachePolicy {
            alignment: config.hit_alignment(),
            retention,
            reachable_boundaries: &boundaries[..own],
        };
        let before = t.num_cached();
        let cacheable = config.num_cacheable_tokens(m.group(), num_tokens);
        m.cache_blocks(pool, t, view.hashes, hbs, cacheable, &policy, mask_buf)?;
        if let Some(boundary) = partial_tail(m, view, hbs, cacheable) {
            full_attention::cache_partial_tail(
                pool,
                t,
                view.hashes,
                boundary,
                m.block_size(),
                m.group(),
            )?;
        }
        if let SpecKind::MambaAlign { .. } = m.spec().kind {
            // The states committed as full blocks by the regular caching
            // (a sub-block prompt tail may lower the count below).
            let end = t.num_cached().min(t.blocks().len());
            mamba_align::after_cache_blocks(
                m.block_size(),
                m.group(),
                pool,
                t,
                view.hashes,
                cacheable,
                view.num_prompt_tokens,
                view.shared_prefix_boundary,
                &policy,
                before,
                cached_this_step,
                (
                    hbs,
                    config.checkpoint_rule(),
                    config.rekey_keyed_prompt_tail,
                ),
            )?;
            // Every state committed by this call is handed off (vLLM's
            // boundary-state offloads), with the tokens its key covers (a
            // checkpoint re-keyed inside its block covers fewer).
            let end = end.max(t.num_cached()).min(t.blocks().len());
            for idx in before.min(end)..end {
                let b = t.blocks()[idx];
                if b.is_null() {
                    continue;
                }
                if let Some(num_tokens) = pool.key_num_tokens(b)? {
                    offloads.push(BoundaryOffload {
                        req,
                        group: m.group(),
                        block: b,
                        num_tokens,
                    });
                }
            }
        }
    }
    Ok(())
}

/// Where a full-attention group (vLLM's `FullAttentionManager` and its
/// subclasses: MLA, R-SWA) whose blocks span several hash units keys its
/// prompt-tail block on this caching call, if anywhere.
#[inline]
fn partial_tail(
    m: &Manager,
    view: &RequestView<'_>,
    hbs: usize,
    cacheable: usize,
) -> Option<usize> {
    let bs = m.block_size();
    if bs == hbs || !m.spec().is_full_attention() {
        return None;
    }
    full_attention::partial_tail_boundary(
        view.num_prompt_tokens,
        view.hashes.len(),
        hbs,
        bs,
        m.eagle(),
        cacheable,
    )
}

/// The error of [`cache_tables`] for a table shorter than its full blocks.
#[cold]
fn table_too_short(num_tokens: usize, num_full: usize, m: &Manager, t: &GroupTable) -> KvError {
    KvError::InvalidArgument {
        name: "num_tokens",
        detail: format!(
            "{num_tokens} tokens fill {num_full} blocks of group {} but its table holds {}",
            m.group(),
            t.blocks().len()
        ),
    }
}

/// Where a later request replaying a prompt of `num_prompt_tokens` tokens
/// can resume, written to the front of `out`; returns how many. Without
/// EAGLE: a resend of the same prompt stops one token short (its last token
/// is recomputed for logits). With EAGLE hits land on scheduler blocks and
/// drop one block: the resend's and a longer sibling's aligned ends, each a
/// block lower (they differ only on a block-aligned prompt).
pub fn replay_boundaries(
    num_prompt_tokens: usize,
    scheduler_block_size: usize,
    eagle: bool,
    out: &mut [usize; 4],
) -> usize {
    if !eagle {
        return match num_prompt_tokens.checked_sub(1) {
            Some(b) => {
                out[0] = b;
                1
            }
            None => 0,
        };
    }
    let sbs = scheduler_block_size;
    let resend = num_prompt_tokens.saturating_sub(1) / sbs * sbs;
    let extension = num_prompt_tokens / sbs * sbs;
    out[0] = resend.saturating_sub(sbs);
    out[1] = extension.saturating_sub(sbs);
    if out[0] == out[1] {
        1
    } else {
        2
    }
}

/// One committed Mamba "align" state, handed to KV connectors
/// ([`take_boundary_state_offloads`](super::CoordinatorCore::take_boundary_state_offloads)).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct BoundaryOffload {
    /// The request that computed it.
    pub req: ReqId,
    /// Its group.
    pub group: GroupId,
    /// The block holding the state.
    pub block: BlockId,
    /// Tokens the state covers (its block's end).
    pub num_tokens: usize,
}

/// Where [`cache_tables`] records what it cached for one request.
pub(super) struct StepLog<'a> {
    pub(super) req: ReqId,
    /// Keys of Mamba "align" states cached during the current step.
    pub(super) cached: &'a mut HashSet<CacheKey>,
    /// Boundary-state hand-offs.
    pub(super) offloads: &'a mut Vec<BoundaryOffload>,
}

impl<'a> StepLog<'a> {
    pub(super) fn new(
        req: ReqId,
        cached: &'a mut HashSet<CacheKey>,
        offloads: &'a mut Vec<BoundaryOffload>,
    ) -> Self {
        Self {
            req,
            cached,
            offloads,
        }
    }
}
