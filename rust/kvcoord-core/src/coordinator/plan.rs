//! A step's planning and allocation: [`CoordinatorCore::allocate_slots`]
//! (vLLM's `allocate_slots`, every group in one call) and the prediction
//! [`CoordinatorCore::num_blocks_to_allocate`], which count blocks with the
//! same function ([`predict`]) so that a step that fits by the prediction
//! fits when it allocates, and [`CoordinatorCore::allocation_fits`], the
//! allocation's own input checks and count without the allocation.
//!
//! Invariant: an allocation that does not fit changes nothing but the
//! out-of-window blocks of a running request (dead either way).

use hashbrown::hash_map::Entry;
use hashbrown::{HashMap, HashSet};

use super::caching::{cache_tables, BoundaryOffload, StepLog};
use super::config::CoordinatorConfig;
use super::hits::check_hits;
use super::CoordinatorCore;
use crate::block_ids::NewBlocks;
use crate::error::{KvError, KvResult};
use crate::ids::{BlockId, GroupId, ReqId};
use crate::managers::{hisparse, mamba_align, GroupTable, Manager};
use crate::pool::BlockPool;
use crate::prefix_index::CacheKey;
use crate::request::{Request, RequestView};
use crate::spec::SpecKind;
use crate::step_args::{AllocateArgs, PredictArgs};

impl CoordinatorCore {
    /// Blocks an allocation of `args.num_tokens` slots for `request` would
    /// pull from the pool over all groups, adopting the prefix-cache hits
    /// `hits` (one list per group, or none): vLLM's
    /// `get_num_blocks_to_allocate`, the prediction `allocate_slots` checks
    /// against the free blocks. Changes nothing.
    pub fn num_blocks_to_allocate(
        &self,
        request: &Request,
        hits: &[Vec<BlockId>],
        args: &PredictArgs,
    ) -> KvResult<usize> {
        // Every count below 2^48: the prediction's sums cannot wrap.
        crate::step_args::check_predict(args)?;
        let arg = |detail: String| KvError::InvalidArgument {
            name: "new_computed_blocks",
            detail,
        };
        if !hits.is_empty() && hits.len() != self.managers.len() {
            return Err(arg(format!(
                "{} lists for {} groups",
                hits.len(),
                self.managers.len()
            )));
        }
        if hits.iter().any(|list| !self.pool.ids_in_range(list)) {
            return Err(arg("block id out of range".into()));
        }
        let tables = self
            .registry
            .get(request.id())
            .and_then(|req| self.requests.get(&req))
            .map(Vec::as_slice);
        // Speculative slots (num_tokens past the main model's) count for
        // the attention groups only, as in an allocation.
        let PredictArgs {
            num_tokens,
            total_computed_tokens: total,
            ..
        } = *args;
        let main = args
            .num_tokens_main_model
            .map_or(num_tokens, |m| m.min(num_tokens));
        let mut step = StepSize::new(main, num_tokens, total, args.num_encoder_tokens)
            .with_local(args.local_computed_tokens.unwrap_or(total));
        step.prefill_end = args.prefill_end;
        let mut checkpoints = vec![None; self.managers.len()];
        let caps = Caps {
            max_in_flight_tokens: args.max_in_flight_tokens,
            max_model_len: self.config.max_model_len,
            allocation: false,
        };
        Ok(predict(
            &self.managers,
            &self.pool,
            &self.config,
            self.retention,
            &request.view(),
            tables,
            hits,
            &step,
            &self.cached_this_step,
            &mut checkpoints,
            caps,
        ))
    }

    /// Slots this group allocates for (cross-attention is sized by the
    /// encoder, everything else by the decoder slots).
    fn group_tokens(m: &Manager, need_slots: usize, num_encoder_tokens: usize) -> usize {
        if m.spec().facts().sized_by_encoder {
            num_encoder_tokens
        } else {
            need_slots
        }
    }

    /// Allocate the slots for one step of `req` in every group (vLLM's
    /// `allocate_slots` steps 1, 3, 7-15): release out-of-window blocks, check
    /// that the new blocks (and evictable hits) fit, adopt the prefix-cache
    /// hits `new_computed_blocks` (one list per group, first allocation
    /// only), grow every table to cover the computed, new and lookahead
    /// tokens, and cache the newly full blocks unless `delay_cache_blocks`.
    ///
    /// Returns the newly allocated blocks per group, or `None` when the pool
    /// cannot hold them (nothing allocated, hits not pinned).
    pub fn allocate_slots(
        &mut self,
        req: ReqId,
        view: &RequestView<'_>,
        args: &AllocateArgs,
        new_computed_blocks: Option<&[Vec<BlockId>]>,
    ) -> KvResult<Option<Vec<Vec<BlockId>>>> {
        let mut out = std::mem::take(&mut self.out);
        let res = self.allocate_slots_into(req, view, args, new_computed_blocks, &mut out);
        let ret = res.map(|ok| ok.then(|| out.to_vecs()));
        self.out = out;
        ret
    }

    /// [`allocate_slots`](Self::allocate_slots) into a reusable buffer;
    /// returns `false` (and leaves `out` empty) when the blocks do not fit.
    /// A decode step that needs no new block allocates nothing.
    pub fn allocate_slots_into(
        &mut self,
        req: ReqId,
        view: &RequestView<'_>,
        args: &AllocateArgs,
        new_computed_blocks: Option<&[Vec<BlockId>]>,
        out: &mut NewBlocks,
    ) -> KvResult<bool> {
        out.clear();
        let AllocateArgs {
            num_new_tokens,
            num_encoder_tokens,
            delay_cache_blocks,
            num_external_computed_tokens,
            ..
        } = *args;
        let hits = new_computed_blocks.unwrap_or(&[]);
        let Self {
            pool,
            managers,
            requests,
            spare,
            scratch,
            mask_buf,
            config,
            retention,
            cached_this_step,
            boundary_offloads,
            checkpoints,
            has_align,
            pending_copies,
            caller_held,
            ..
        } = self;
        // The request's tables are probed for once: a decode step is the
        // hottest call, and a map lookup is a large part of its work.
        let mut slot = requests.entry(req);
        let tracked = matches!(slot, Entry::Occupied(_));
        let input = (tracked, view, args, new_computed_blocks);
        let (local, total, main, need_slots) = check_input(managers, pool, config, input)?;
        // Step 8: blocks that left the window are dead whether or not this
        // step fits; in-flight steps may still read the newest ones.
        if let Entry::Occupied(tables) = &mut slot {
            let processed = total.saturating_sub(view.num_in_flight_tokens);
            remove_skipped_all(managers, pool, tables.get_mut(), processed, view, scratch)?;
        }
        // Steps 9-10.
        let tracked_tables = match &slot {
            Entry::Occupied(tables) => Some(tables.get().as_slice()),
            Entry::Vacant(_) => None,
        };
        let step = StepSize::new(main, need_slots, total, num_encoder_tokens).with_local(local);
        // Computed tokens without blocks (unverified) get fresh blocks.
        let unbacked = !tracked && local > 0 && hits.iter().all(Vec::is_empty);
        let needed = step_needs(
            managers,
            pool,
            config,
            *retention,
            view,
            tracked_tables,
            hits,
            &step,
            cached_this_step,
            checkpoints,
            unbacked.then_some(num_external_computed_tokens),
        );
        if needed > pool.num_free_blocks() {
            return Ok(false);
        }
        // Step 11: adopt hits (all groups are touched before any allocation,
        // so no group's allocation can evict another group's hit).
        let tables = match slot {
            Entry::Occupied(tables) => tables.into_mut(),
            Entry::Vacant(vacant) => {
                let mut fresh = spare.pop().unwrap_or_default();
                fresh.resize_with(managers.len(), GroupTable::default);
                let adopt = new_computed_blocks.is_some();
                let external = num_external_computed_tokens;
                let counts = (local.min(total), total, external);
                adopt_prefix(managers, pool, &mut fresh, hits, adopt, counts, scratch)?;
                vacant.insert(fresh)
            }
        };
        if *has_align {
            for (t, c) in tables.iter_mut().zip(checkpoints.iter()) {
                t.align.checkpoint = *c;
            }
        }
        // Step 12.
        let log = StepLog::new(req, cached_this_step, boundary_offloads);
        let cow = (&mut *pending_copies, &mut *caller_held);
        allocate_groups(managers, pool, tables, &step, out, cow, log)?;
        // Steps 13-14: only final tokens (no drafts) are cached.
        if config.enable_caching() && !delay_cache_blocks {
            let n = (total + num_new_tokens).min(view.num_tokens);
            let log = StepLog::new(req, cached_this_step, boundary_offloads);
            cache_tables(
                managers, pool, tables, config, *retention, view, n, mask_buf, log,
            )?;
        }
        Ok(true)
    }

    /// Whether [`allocate_request`](Self::allocate_request) of `request`
    /// with these arguments would fit, with every check of its input made
    /// (their errors returned): the allocation's own checks and count, on
    /// the state as it is. Changes nothing. Exact where no group releases
    /// blocks behind a window (full attention among them); where one does,
    /// a running request's allocation releases those blocks before it
    /// counts, so this may refuse a step that fits.
    pub fn allocation_fits(
        &self,
        request: &Request,
        args: &AllocateArgs,
        new_computed_blocks: Option<&[Vec<BlockId>]>,
    ) -> KvResult<bool> {
        self.check_hash_unit(request)?;
        let view = request.view();
        let tables = self
            .registry
            .get(request.id())
            .and_then(|req| self.requests.get(&req))
            .map(Vec::as_slice);
        let tracked = tables.is_some();
        let input = (tracked, &view, args, new_computed_blocks);
        let (managers, pool, config) = (&self.managers, &self.pool, &self.config);
        let (local, total, main, need_slots) = check_input(managers, pool, config, input)?;
        let hits = new_computed_blocks.unwrap_or(&[]);
        let step =
            StepSize::new(main, need_slots, total, args.num_encoder_tokens).with_local(local);
        let unbacked = !tracked && local > 0 && hits.iter().all(Vec::is_empty);
        let mut checkpoints = vec![None; managers.len()];
        let needed = step_needs(
            managers,
            pool,
            config,
            self.retention,
            &view,
            tables,
            hits,
            &step,
            &self.cached_this_step,
            &mut checkpoints,
            unbacked.then_some(args.num_external_computed_tokens),
        );
        Ok(needed <= pool.num_free_blocks())
    }
}

/// One step's input: whether the request is tracked, its view, the step's
/// arguments and the hits it adopts.
type StepInput<'a> = (
    bool,
    &'a RequestView<'a>,
    &'a AllocateArgs,
    Option<&'a [Vec<BlockId>]>,
);

/// The checks of one step's input (an allocation's, before it changes
/// anything), naming the first argument refused. Returns the step's token
/// counts: local computed, computed (capped at `max_model_len`), after the
/// step, and slots with the lookahead.
#[inline]
fn check_input(
    managers: &[Manager],
    pool: &BlockPool,
    config: &CoordinatorConfig,
    (tracked, view, args, new_computed_blocks): StepInput<'_>,
) -> KvResult<(usize, usize, usize, usize)> {
    // Every count is below 2^48, so the sums below cannot wrap.
    crate::step_args::check_step(view, args)?;
    check_nonempty(args)?; // Step 1.
    let hits = new_computed_blocks.unwrap_or(&[]);
    // A new request's computed tokens must come with their blocks, or
    // fresh ones are cached as holding them. Unverified (vLLM takes its
    // caller's word), they get fresh blocks: see `step_needs`.
    crate::step_args::check_progress(tracked, view, config.verify_hits)?;
    // Step 3 (no external tokens).
    let local = view.num_computed_tokens + args.num_new_computed_tokens;
    let claims_hits = !tracked
        && args.num_new_computed_tokens > 0
        && config.enable_caching()
        && config.verify_hits;
    if !tracked && args.num_external_computed_tokens > 0 {
        check_external(managers)?;
    }
    if new_computed_blocks.is_some() || claims_hits {
        check_hits(managers, pool, config, hits, tracked, view, args)?;
    }
    // Steps 3 and 7 (external tokens count as computed).
    let computed = local + args.num_external_computed_tokens;
    let (total, main, need_slots) = step_tokens(computed, args, config.max_model_len)?;
    Ok((local, total, main, need_slots))
}

/// Token counts of one `allocate_slots` call.
struct StepSize {
    /// Tokens of the main model after the step (computed + new).
    main: usize,
    /// Slots needed (main + lookahead, capped at `max_model_len`).
    need_slots: usize,
    /// Computed tokens before the step (hits included).
    total: usize,
    /// Of `total`, the locally computed ones (no external tokens).
    local: usize,
    /// Encoder tokens (cross-attention groups).
    num_encoder_tokens: usize,
    /// Where the prefill ends (`None`: the request's own).
    prefill_end: Option<usize>,
}

impl StepSize {
    fn new(main: usize, need_slots: usize, total: usize, num_encoder_tokens: usize) -> Self {
        Self {
            main,
            need_slots,
            total,
            local: total,
            num_encoder_tokens,
            prefill_end: None,
        }
    }

    /// With `local` of the computed tokens local (the rest external).
    fn with_local(mut self, local: usize) -> Self {
        self.local = local.min(self.total);
        self
    }
}

/// Computed tokens (capped at `max_model_len`), tokens after the step
/// (refused beyond `max_model_len`) and slots needed with the lookahead.
#[inline]
fn step_tokens(
    local: usize,
    args: &AllocateArgs,
    max_model_len: usize,
) -> KvResult<(usize, usize, usize)> {
    let total = local.min(max_model_len);
    let main = total + args.num_new_tokens;
    if main > max_model_len {
        return Err(KvError::InvalidArgument {
            name: "num_new_tokens",
            detail: format!(
                "{total} computed + {} new tokens exceed max_model_len {max_model_len}",
                args.num_new_tokens
            ),
        });
    }
    Ok((
        total,
        main,
        (main + args.num_lookahead_tokens).min(max_model_len),
    ))
}

/// Step 1 of `allocate_slots`: a step must allocate or adopt something.
fn check_nonempty(args: &AllocateArgs) -> KvResult<()> {
    if args.num_new_tokens == 0
        && args.num_new_computed_tokens == 0
        && args.num_external_computed_tokens == 0
    {
        return Err(KvError::InvalidArgument {
            name: "num_new_tokens",
            detail: "num_new_tokens must be greater than 0 when there are no computed tokens to \
                     adopt"
                .into(),
        });
    }
    Ok(())
}

/// Refuse external tokens where some group cannot take them.
fn check_external(managers: &[Manager]) -> KvResult<()> {
    if managers.iter().all(Manager::supports_external_tokens) {
        return Ok(());
    }
    Err(KvError::Unsupported {
        what: "external (KV-connector) tokens with Mamba groups in mode \"none\"".into(),
    })
}

/// A new request's table before its new tokens (vLLM's
/// `allocate_new_computed_blocks`): when it adopts hits or brings external
/// tokens, every group first takes its hits (nulls before the window), then
/// every group its blocks for the `external` tokens.
#[allow(clippy::too_many_arguments)]
fn adopt_prefix(
    managers: &[Manager],
    pool: &mut BlockPool,
    tables: &mut [GroupTable],
    hits: &[Vec<BlockId>],
    adopt: bool,
    (local, total, external): (usize, usize, usize),
    scratch: &mut Vec<BlockId>,
) -> KvResult<()> {
    if !adopt && external == 0 {
        return Ok(());
    }
    let has_resident = managers
        .iter()
        .any(|m| matches!(m.spec().kind, SpecKind::HiSparseResident));
    for (g, (m, t)) in managers.iter().zip(tables.iter_mut()).enumerate() {
        let group_hits = hits.get(g).map_or(&[][..], Vec::as_slice);
        match m.spec().kind {
            // The host prefix of a HiSparse request: null pages, the hot
            // region asked for when it resumes one.
            SpecKind::HiSparseResident => hisparse::resident_add_local(t, m.block_size(), local),
            SpecKind::HiSparseHot { .. } => hisparse::hot_add_local(t, local, has_resident),
            _ => m.add_local_computed_blocks(pool, t, group_hits, total)?,
        }
        if let Some(&last) = group_hits.last() {
            let sub_block = m.spec().facts().sub_block_hits;
            if sub_block && local % m.block_size() != 0 {
                // The hit ends inside its block: the state is copied into a
                // private block by the allocation (vLLM's partial hit).
                let idx = local / m.block_size();
                t.align.partial_hit = Some((idx, last));
                t.num_cached = idx;
            }
        }
    }
    if external > 0 {
        for (m, t) in managers.iter().zip(tables.iter_mut()) {
            m.allocate_external_blocks(pool, t, total, external, scratch)?;
        }
    }
    Ok(())
}

/// Step 8 of `allocate_slots` in every group (R-SWA measures its gap from
/// the request's prompt).
// Measured: as an out-of-line call this step helper cost more in
// prologue and argument spills than its work (callgrind, decode step).
#[allow(clippy::inline_always)]
#[inline(always)]
fn remove_skipped_all(
    managers: &[Manager],
    pool: &mut BlockPool,
    tables: &mut [GroupTable],
    processed: usize,
    view: &RequestView<'_>,
    scratch: &mut Vec<BlockId>,
) -> KvResult<()> {
    let prompt = Some(view.num_prompt_tokens);
    for (m, t) in managers.iter().zip(tables.iter_mut()) {
        m.remove_skipped_blocks(pool, t, processed, prompt, scratch)?;
    }
    Ok(())
}

/// Grow every group's table for the step (vLLM's `allocate_new_blocks` per
/// group), appending each group's new ids to `out`.
// Measured: as an out-of-line call this step helper cost more in
// prologue and argument spills than its work (callgrind, decode step).
#[allow(clippy::inline_always)]
#[inline(always)]
fn allocate_groups(
    managers: &[Manager],
    pool: &mut BlockPool,
    tables: &mut [GroupTable],
    step: &StepSize,
    out: &mut NewBlocks,
    (copies, held): CowSinks<'_>,
    log: StepLog<'_>,
) -> KvResult<()> {
    let StepLog {
        req,
        cached,
        offloads,
    } = log;
    for (m, t) in managers.iter().zip(tables.iter_mut()) {
        if let SpecKind::MambaAlign {
            num_speculative_blocks,
            ..
        } = m.spec().kind
        {
            // Align mode sizes by the main model's tokens (no lookahead).
            let mut tails = Vec::new();
            let mut cow = mamba_align::CowLog {
                group: m.group(),
                copies: &mut *copies,
                held: &mut *held,
                cached: &mut *cached,
                offloads: &mut tails,
            };
            mamba_align::allocate_new_blocks(
                m.block_size(),
                num_speculative_blocks as usize,
                pool,
                t,
                step.main,
                &mut out.ids,
                &mut cow,
            )?;
            for (block, num_tokens) in tails {
                offloads.push(BoundaryOffload {
                    req,
                    group: m.group(),
                    block,
                    num_tokens,
                });
            }
        } else {
            if let Some((idx, src)) = t.align.partial_hit.take() {
                // A full-attention hit ending inside its last block: the
                // table takes a private copy of that block, allocated first
                // (vLLM's copy-on-write); both ends are held for the copy.
                let start = out.ids.len();
                pool.get_new_blocks(1, &mut out.ids)?;
                let dst = out.ids[start];
                t.blocks[idx] = dst;
                copies.push((m.group(), src, dst));
                pool.touch(&[dst])?;
                *held.entry(src).or_insert(0) += 1;
                *held.entry(dst).or_insert(0) += 1;
            }
            let tokens = CoordinatorCore::group_tokens(m, step.need_slots, step.num_encoder_tokens);
            m.allocate_new_blocks(pool, t, tokens, &mut out.ids)?;
        }
        out.ends.push(out.ids.len());
    }
    Ok(())
}

/// Where allocations record copy-on-write copies and the references held
/// for them.
type CowSinks<'a> = (
    &'a mut Vec<(GroupId, BlockId, BlockId)>,
    &'a mut HashMap<BlockId, u32>,
);

/// The admission cap of a prediction: with `max_in_flight_tokens`, each
/// group's blocks are capped at [`Manager::max_admission_blocks`].
#[derive(Clone, Copy)]
struct Caps {
    max_in_flight_tokens: Option<usize>,
    max_model_len: usize,
    /// Count what the allocation takes where it differs from vLLM's
    /// prediction (`HiSparse` groups in states where vLLM's allocation
    /// fails midway): `allocate_slots`' own check, not the prediction API.
    allocation: bool,
}

impl Caps {
    /// No cap, the allocation's count (the check of a step).
    const fn none(max_model_len: usize) -> Self {
        Self {
            max_in_flight_tokens: None,
            max_model_len,
            allocation: true,
        }
    }
}

/// The blocks an allocation of `step` takes: [`predict`]'s count, or, for
/// a new request whose computed tokens come without blocks (`unbacked`:
/// its external tokens), the larger of that and the count with those
/// tokens uncomputed. The prediction lets windows skip such tokens, as
/// vLLM's does, but the fresh blocks cover them all, as vLLM's allocation
/// does; where only the allocation would not fit (vLLM fails midway), the
/// step does not fit and nothing is changed.
#[allow(clippy::too_many_arguments)]
fn step_needs(
    managers: &[Manager],
    pool: &BlockPool,
    config: &CoordinatorConfig,
    retention: Option<usize>,
    view: &RequestView<'_>,
    tables: Option<&[GroupTable]>,
    hits: &[Vec<BlockId>],
    step: &StepSize,
    cached_this_step: &HashSet<CacheKey>,
    checkpoints: &mut [Option<(usize, usize)>],
    unbacked: Option<usize>,
) -> usize {
    let caps = Caps::none(config.max_model_len);
    let count = |tables, step: &StepSize, checkpoints: &mut [Option<(usize, usize)>]| {
        predict(
            managers,
            pool,
            config,
            retention,
            view,
            tables,
            hits,
            step,
            cached_this_step,
            checkpoints,
            caps,
        )
    };
    let needed = count(tables, step, checkpoints);
    let Some(external) = unbacked else {
        return needed;
    };
    let fresh = StepSize {
        total: external,
        local: 0,
        ..*step
    };
    needed.max(count(None, &fresh, &mut vec![None; managers.len()]))
}

/// Blocks the step pulls from the pool over all groups (vLLM's signed sum:
/// a Mamba "align" table longer than needed lowers the total, floored at 0).
/// Records each Mamba "align" group's prefill checkpoint in `checkpoints`.
#[allow(clippy::too_many_arguments)]
// Measured: as an out-of-line call this step helper cost more in
// prologue and argument spills than its work (callgrind, decode step).
#[allow(clippy::inline_always)]
#[inline(always)]
fn predict(
    managers: &[Manager],
    pool: &BlockPool,
    config: &CoordinatorConfig,
    retention: Option<usize>,
    view: &RequestView<'_>,
    tables: Option<&[GroupTable]>,
    hits: &[Vec<BlockId>],
    step: &StepSize,
    cached_this_step: &HashSet<CacheKey>,
    checkpoints: &mut [Option<(usize, usize)>],
    caps: Caps,
) -> usize {
    let (mut needed, mut surplus) = (0usize, 0usize);
    for (g, m) in managers.iter().enumerate() {
        let group_hits = hits.get(g).map_or(&[][..], Vec::as_slice);
        let table = tables.map(|t| &t[g]);
        if let SpecKind::MambaAlign { .. } = m.spec().kind {
            let input = mamba_align::AllocInput {
                main: step.main,
                total_computed: step.total,
                // Only sparse retention reads it (as in vLLM).
                prefill_end: if retention == Some(0) {
                    step.prefill_end.unwrap_or_else(|| {
                        view.num_prompt_tokens
                            .max(view.num_tokens.saturating_sub(1))
                    })
                } else {
                    0
                },
                // vLLM's `cache_hit_alignment_tokens`.
                alignment: config.hit_alignment(),
                hash_block_size: config.hash_block_size as usize,
                hits: group_hits,
                local: step.local,
                rule: config.checkpoint_rule(),
            };
            let n = mamba_align::num_blocks_to_allocate(
                m.spec(),
                pool,
                table,
                &input,
                cached_this_step,
            );
            checkpoints[g] = n.checkpoint;
            needed = needed.saturating_add(n.take);
            surplus = surplus.saturating_add(n.give_back);
        } else {
            let tokens = CoordinatorCore::group_tokens(m, step.need_slots, step.num_encoder_tokens);
            let cap = caps
                .max_in_flight_tokens
                .and_then(|f| m.max_admission_blocks(f, caps.max_model_len));
            // A full-attention hit ending inside its last block copies that
            // block into a private one (sub-block hits).
            let copy = table.is_none()
                && !group_hits.is_empty()
                && step.local % m.block_size() != 0
                && m.spec().is_full_attention();
            let bs = m.block_size();
            let n = match m.spec().kind {
                SpecKind::HiSparseResident => {
                    let n = hisparse::resident_blocks_to_allocate(
                        table, bs, tokens, step.total, step.local, cap,
                    );
                    // A tracked table grows to the tokens whatever vLLM's
                    // host-prefix rule says (computed tokens past the
                    // pages would else run the pool dry between groups).
                    match table {
                        Some(t) if caps.allocation => {
                            n.max(tokens.div_ceil(bs).saturating_sub(t.blocks.len()))
                        }
                        _ => n,
                    }
                }
                SpecKind::HiSparseHot { blocks_per_request } => {
                    // A new request that adopts (hits passed, even none) in
                    // a layout without resident groups is given its hot
                    // region at admission (`hot_add_local`): the allocation
                    // takes it although vLLM's prediction does not count it.
                    let adopts_without_resident = caps.allocation
                        && table.is_none()
                        && !hits.is_empty()
                        && !managers
                            .iter()
                            .any(|m| matches!(m.spec().kind, SpecKind::HiSparseResident));
                    if adopts_without_resident {
                        blocks_per_request as usize
                    } else {
                        hisparse::hot_blocks_to_allocate(
                            table,
                            blocks_per_request as usize,
                            step.total,
                            step.local,
                        )
                    }
                }
                _ => m.num_blocks_to_allocate_capped(
                    pool, table, tokens, group_hits, step.total, cap,
                ),
            };
            needed = needed.saturating_add(n + usize::from(copy));
        }
    }
    needed.saturating_sub(surplus)
}
