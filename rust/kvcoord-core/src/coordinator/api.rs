//! The calls around a step: accessors, the calls on requests known by their
//! scheduler id, caching calls, freeing, retention changes, and the drains
//! of what steps leave for the caller (copy-on-write copies, boundary-state
//! hand-offs). Each validates its whole input before changing anything.

use super::caching::{cache_tables, BoundaryOffload, StepLog};
use super::config::CoordinatorConfig;
use super::CoordinatorCore;
use crate::block_ids::NewBlocks;
use crate::error::{KvError, KvResult};
use crate::ids::{BlockId, GroupId, ReqId};
use crate::managers::{mamba_align, GroupTable, Manager};
use crate::pool::BlockPool;
use crate::request::{Request, RequestView};
use crate::retention::validate_retention_interval;
use crate::spec::GroupSpec;
use crate::step_args::AllocateArgs;

impl CoordinatorCore {
    /// The configuration.
    pub fn config(&self) -> &CoordinatorConfig {
        &self.config
    }

    /// The shared pool.
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// The shared pool, mutably (eviction, reset). Changing reference counts
    /// through it breaks the coordinator's invariants.
    pub fn pool_mut(&mut self) -> &mut BlockPool {
        &mut self.pool
    }

    /// Number of groups.
    pub fn num_groups(&self) -> usize {
        self.managers.len()
    }

    /// The per-group managers, by group id.
    pub fn managers(&self) -> &[Manager] {
        &self.managers
    }

    /// Number of tracked requests.
    pub fn num_requests(&self) -> usize {
        self.requests.len()
    }

    /// Whether `req` holds blocks.
    pub fn contains(&self, req: ReqId) -> bool {
        self.requests.contains_key(&req)
    }

    /// `req`'s tables, by group.
    pub fn tables(&self, req: ReqId) -> KvResult<&[GroupTable]> {
        self.requests
            .get(&req)
            .map(Vec::as_slice)
            .ok_or(KvError::RequestWithoutBlocks(req))
    }

    /// `req`'s block tables, by group (null block in skipped positions).
    pub fn block_ids(&self, req: ReqId) -> KvResult<Vec<&[BlockId]>> {
        Ok(self.tables(req)?.iter().map(GroupTable::blocks).collect())
    }

    /// The scheduler ids of the tracked requests, in no order.
    pub fn request_names(&self) -> impl Iterator<Item = &str> + '_ {
        self.requests
            .keys()
            .filter_map(|&req| self.registry.name(req))
    }

    pub(super) fn req_of(&self, id: &str) -> KvResult<ReqId> {
        self.registry
            .get(id)
            .ok_or_else(|| KvError::UnknownRequestId(id.to_owned()))
    }

    /// [`allocate_slots_into`](Self::allocate_slots_into) for a request
    /// known by its scheduler id (registered on its first successful
    /// allocation).
    pub fn allocate_request(
        &mut self,
        request: &Request,
        args: &AllocateArgs,
        new_computed_blocks: Option<&[Vec<BlockId>]>,
        out: &mut NewBlocks,
    ) -> KvResult<bool> {
        let allocated = self.allocate_registered(request, args, new_computed_blocks, out)?;
        Ok(allocated.is_some())
    }

    /// [`allocate_request`](Self::allocate_request), answering the
    /// request's core id when the allocation fitted (the caller's next
    /// call for it then needs no registry probe).
    pub(crate) fn allocate_registered(
        &mut self,
        request: &Request,
        args: &AllocateArgs,
        new_computed_blocks: Option<&[Vec<BlockId>]>,
        out: &mut NewBlocks,
    ) -> KvResult<Option<ReqId>> {
        self.check_hash_unit(request)?;
        // One registry probe per step: a running request is found, a new
        // one is registered only once its first allocation succeeded.
        let known = self.registry.get(request.id());
        let req = known.unwrap_or_else(|| self.registry.peek(request.id()));
        let ok = self.allocate_slots_into(req, &request.view(), args, new_computed_blocks, out)?;
        if ok && known.is_none() {
            self.registry.insert(request.id(), req);
        }
        self.complete_events(request);
        Ok(ok.then_some(req))
    }

    /// [`cache_blocks`](Self::cache_blocks) for a live request.
    pub fn cache_request(&mut self, request: &Request, num_tokens: usize) -> KvResult<()> {
        self.check_hash_unit(request)?;
        let req = self.req_of(request.id())?;
        self.cache_registered(req, request, num_tokens)
    }

    /// [`cache_request`](Self::cache_request) for a request known to be
    /// registered as `req` (its hash unit checked).
    pub(crate) fn cache_registered(
        &mut self,
        req: ReqId,
        request: &Request,
        num_tokens: usize,
    ) -> KvResult<()> {
        let res = self.cache_blocks(req, &request.view(), num_tokens);
        self.complete_events(request);
        res
    }

    /// Give the events the last call recorded what only `request` knows
    /// (its tokens, `LoRA` name, extra keys) and their group's spec.
    fn complete_events(&mut self, request: &Request) {
        if self.pool.events_enabled() {
            let extra = request.hasher().extra_keys();
            let groups = &self.config.groups;
            for s in self.pool.events_to_complete() {
                if let Some(g) = groups.get(s.group.0 as usize) {
                    s.complete(request.tokens(), extra, g.kind.event_metadata());
                }
            }
        }
    }

    /// With caching on, a request must be hashed in this coordinator's hash
    /// unit: its hashes would otherwise be cached under wrong keys.
    #[inline]
    pub(super) fn check_hash_unit(&self, request: &Request) -> KvResult<()> {
        let unit = request.hasher().config().block_size();
        let mine = self.config.hash_block_size as usize;
        if unit != mine && self.config.enable_caching() {
            return Err(Self::wrong_hash_unit(request, unit, mine));
        }
        Ok(())
    }

    #[cold]
    fn wrong_hash_unit(request: &Request, unit: usize, mine: usize) -> KvError {
        KvError::InvalidConfig {
            name: "hash_block_size",
            value: unit.to_string(),
            rule: format!(
                "request {:?} is hashed in units of {unit} tokens but this manager uses \
                 hash_block_size={mine}",
                request.id()
            ),
        }
    }

    /// Free a request by scheduler id; `false` (and nothing done) for an
    /// unknown or already freed id, as in vLLM.
    pub fn free_request(&mut self, id: &str) -> KvResult<bool> {
        match self.registry.remove(id) {
            Some(req) => self.free(req),
            None => Ok(false),
        }
    }

    /// A live request's block tables, by group.
    pub fn request_block_ids(&self, id: &str) -> KvResult<Vec<&[BlockId]>> {
        self.block_ids(self.req_of(id)?)
    }

    /// The prefill checkpoint a live request's latest allocation reserved
    /// in a Mamba "align" group (vLLM's `MambaManager._checkpoints`): (token
    /// position, table index); `None` in other groups and without one.
    pub fn request_mamba_checkpoint(
        &self,
        id: &str,
        group: GroupId,
    ) -> KvResult<Option<(usize, usize)>> {
        let tables = self.tables(self.req_of(id)?)?;
        let table = tables
            .get(group.0 as usize)
            .ok_or(KvError::UnknownGroup(group))?;
        Ok(table.align.checkpoint)
    }

    /// Change the prefix-cache retention interval (vLLM's coordinator reads
    /// its `retention_interval` on every call, so it may be set between
    /// steps); refused as at construction, nothing changed then.
    pub fn set_retention_interval(&mut self, interval: Option<i64>) -> KvResult<()> {
        let sparse = self.config.groups.iter().any(GroupSpec::is_sparse);
        validate_retention_interval(interval, self.config.scheduler_block_size, sparse)?;
        self.config.retention_interval = interval;
        self.retention = interval.map(|r| usize::try_from(r).unwrap_or(0));
        Ok(())
    }

    /// Per group, how many leading blocks of a live request are shared by
    /// every live request (cascade attention).
    pub fn request_common_prefix_blocks(&self, id: &str) -> KvResult<Vec<usize>> {
        self.get_num_common_prefix_blocks(self.req_of(id)?, self.requests.len())
    }

    /// Register `req`'s newly full blocks of its first `num_tokens` tokens in
    /// the prefix cache (a no-op when caching is off).
    pub fn cache_blocks(
        &mut self,
        req: ReqId,
        view: &RequestView<'_>,
        num_tokens: usize,
    ) -> KvResult<()> {
        let num_tokens = crate::limits::check_tokens("num_tokens", num_tokens)?;
        let Self {
            pool,
            managers,
            requests,
            config,
            retention,
            mask_buf,
            cached_this_step,
            boundary_offloads,
            ..
        } = self;
        let tables = requests
            .get_mut(&req)
            .ok_or(KvError::RequestWithoutBlocks(req))?;
        if !config.enable_caching() {
            return Ok(());
        }
        let log = StepLog {
            req,
            cached: cached_this_step,
            offloads: boundary_offloads,
        };
        cache_tables(
            managers, pool, tables, config, *retention, view, num_tokens, mask_buf, log,
        )
    }

    /// Release every block of `req`, group by group, each table tail first.
    /// Returns whether the request was tracked (freeing twice is harmless).
    pub fn free(&mut self, req: ReqId) -> KvResult<bool> {
        let Some(mut tables) = self.requests.remove(&req) else {
            return Ok(false);
        };
        // Its blocks go back to the pool now: a hand-off not yet taken could
        // name a block another request is about to get.
        if !self.boundary_offloads.is_empty() {
            self.boundary_offloads.retain(|o| o.req != req);
        }
        self.hisparse.forget(req);
        let mut res = Ok(());
        for (m, t) in self.managers.iter().zip(tables.iter_mut()) {
            res = res.and(m.free(&mut self.pool, t));
        }
        self.spare.push(tables);
        res.map(|()| true)
    }

    /// A new scheduler step begins: Mamba "align" states cached during the
    /// previous step become usable as hits (a no-op for the other kinds).
    pub fn new_step_starts(&mut self) {
        self.cached_this_step.clear();
    }

    /// Drain the Mamba "align" states committed (cached) since the last
    /// call, in the order they were cached: vLLM's boundary-state hand-offs
    /// for KV connectors, each (request, group, block, tokens the state
    /// covers). A freed request's hand-offs are dropped. Nothing is pinned:
    /// a caller that reads the blocks later must hold them itself.
    pub fn take_boundary_state_offloads(&mut self) -> Vec<BoundaryOffload> {
        std::mem::take(&mut self.boundary_offloads)
    }

    /// Drain the copy-on-write copies made since the last call, in order:
    /// (source, destination) blocks of Mamba "align" states at sub-block
    /// boundaries (vLLM's `take_kv_cache_block_copies`). Both ends of each
    /// copy stay referenced by the caller (see
    /// [`free_caller_blocks`](Self::free_caller_blocks)) until it frees them
    /// once the copy has run.
    pub fn take_block_copies(&mut self) -> Vec<(BlockId, BlockId)> {
        let mut copies = std::mem::take(&mut self.pending_copies);
        // vLLM drains group by group (stable: allocation order within one).
        copies.sort_by_key(|&(g, _, _)| g);
        copies.into_iter().map(|(_, s, d)| (s, d)).collect()
    }

    /// A finishing request's own prompt-tail states at sub-block boundaries
    /// that no later token was computed into (vLLM's
    /// `finalize_partial_tail_offloads`): (group, block, tokens) per Mamba
    /// "align" group that has one. Each is forgotten either way; nothing is
    /// pinned. The counts must be token counts (refused, nothing changed).
    pub fn finalize_partial_tail_offloads(
        &mut self,
        id: &str,
        num_computed_tokens: usize,
        num_in_flight_tokens: usize,
    ) -> KvResult<Vec<(GroupId, BlockId, usize)>> {
        crate::limits::check_tokens("num_computed_tokens", num_computed_tokens)?;
        crate::limits::check_tokens("num_in_flight_tokens", num_in_flight_tokens)?;
        let Some(req) = self.registry.get(id) else {
            return Ok(Vec::new());
        };
        let Some(tables) = self.requests.get_mut(&req) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for (m, t) in self.managers.iter().zip(tables.iter_mut()) {
            if let Some((b, tokens)) =
                mamba_align::finalize_partial_tail(t, num_computed_tokens, num_in_flight_tokens)
            {
                out.push((m.group(), b, tokens));
            }
        }
        Ok(out)
    }

    /// The scheduler id of a request registered through the id-keyed calls
    /// ([`allocate_request`](Self::allocate_request)).
    pub fn request_name(&self, req: ReqId) -> Option<&str> {
        self.registry.name(req)
    }

    /// Release `req`'s blocks that fell out of every group's attention window
    /// once `num_computed_tokens` tokens are processed (`allocate_slots` does
    /// this itself; schedulers call it for requests they skip this step).
    /// With `num_prompt_tokens`, R-SWA groups free their decode gap; without
    /// it they free nothing (vLLM's rule).
    pub fn remove_skipped_blocks(
        &mut self,
        req: ReqId,
        num_computed_tokens: usize,
        num_prompt_tokens: Option<usize>,
    ) -> KvResult<()> {
        crate::limits::check_tokens("num_computed_tokens", num_computed_tokens)?;
        if let Some(n) = num_prompt_tokens {
            crate::limits::check_tokens("num_prompt_tokens", n)?;
        }
        let Self {
            pool,
            managers,
            requests,
            scratch,
            ..
        } = self;
        let tables = requests
            .get_mut(&req)
            .ok_or(KvError::RequestWithoutBlocks(req))?;
        for (m, t) in managers.iter().zip(tables.iter_mut()) {
            m.remove_skipped_blocks(pool, t, num_computed_tokens, num_prompt_tokens, scratch)?;
        }
        Ok(())
    }

    /// [`remove_skipped_blocks`](Self::remove_skipped_blocks) for a request
    /// known by its scheduler id; an unknown id holds nothing (`false`).
    pub fn remove_skipped_request(
        &mut self,
        id: &str,
        num_computed_tokens: usize,
        num_prompt_tokens: Option<usize>,
    ) -> KvResult<bool> {
        let Some(req) = self.registry.get(id) else {
            return Ok(false);
        };
        if !self.requests.contains_key(&req) {
            return Ok(false);
        }
        self.remove_skipped_blocks(req, num_computed_tokens, num_prompt_tokens)?;
        Ok(true)
    }

    /// Per group, how many leading blocks of `req`'s table are shared by all
    /// `num_running_requests` running requests (reference count equal to
    /// that number): the prefix cascade attention can compute once. Only
    /// full-attention kinds (full, MLA, R-SWA) have one; the other kinds
    /// report 0 (their leading entries are null or per-request state).
    pub fn get_num_common_prefix_blocks(
        &self,
        req: ReqId,
        num_running_requests: usize,
    ) -> KvResult<Vec<usize>> {
        let tables = self.tables(req)?;
        Ok(tables
            .iter()
            .zip(&self.managers)
            .map(|(t, m)| {
                if !m.spec().is_full_attention() {
                    return 0;
                }
                t.blocks()
                    .iter()
                    .take_while(|&&b| {
                        !b.is_null()
                            && self
                                .pool
                                .ref_count(b)
                                .is_ok_and(|c| c as usize == num_running_requests)
                    })
                    .count()
            })
            .collect())
    }

    /// Forget every cached prefix; refused (`false`) while any request holds
    /// blocks.
    pub fn reset_prefix_cache(&mut self) -> bool {
        self.pool.reset_prefix_cache()
    }
}
