//! [`HiSparsePair`]: vLLM's `HiSparse` layout on two cores, and the calls
//! that change both as one transaction each.
//!
//! A `HiSparse` configuration keeps its source group (vLLM's group 0) on a
//! private host pool and every other group (indexer, resident, hot) on the
//! device pool. kvcoord holds it on two [`CoordinatorCore`]s: the *host*
//! core, one full-attention group on the host pool, and the *device* core,
//! the other groups with `group_id_base = 1`, so that the pair's group ids
//! are vLLM's (0 = the host's group, `g >= 1` = the device's group `g - 1`).
//! Most of vLLM's `HiSparse` calls touch one pool and go to that core
//! alone; the pair borrows both halves for the calls that change both, so
//! each core stays reachable on its own between them.
//!
//! # Transactions
//!
//! Each call here changes both halves or neither:
//!
//! * [`allocate`](HiSparsePair::allocate) plans the host half (every check
//!   of its input and its fit, [`CoordinatorCore::allocation_fits`], the
//!   allocation's own), then allocates the device half, which changes
//!   nothing when it refuses or fails, then the host half, which the plan
//!   says fits on a host core nothing has changed since. A refusal or an
//!   error of either half leaves both as they were.
//! * [`free`](HiSparsePair::free) and
//!   [`pop_request_to_caller`](HiSparsePair::pop_request_to_caller) refuse
//!   no input (an unknown id is held by neither half) and change both.
//! * [`reset_prefix_cache`](HiSparsePair::reset_prefix_cache) is vLLM's
//!   rule, not a transaction: each pool with no block in use forgets its
//!   cache on its own, and the answer says which did.
//! * The predictions ([`num_blocks_to_allocate`](HiSparsePair::num_blocks_to_allocate),
//!   [`host_admission_blocks`](HiSparsePair::host_admission_blocks)) change
//!   nothing.
//!
//! # Invariants
//!
//! Checked by [`check_invariants`](HiSparsePair::check_invariants), beside
//! each core's own: the host core holds one full-attention group and
//! reports group ids from 0, the device core reports them from 1, and both
//! track the same requests (a transaction registers or forgets a request in
//! both).

use crate::block_ids::NewBlocks;
use crate::coordinator::CoordinatorCore;
use crate::error::{KvError, KvResult};
use crate::ids::{BlockId, GroupId};
use crate::request::Request;
use crate::spec::SpecKind;
use crate::step_args::{AllocateArgs, PredictArgs};

/// Which halves a [`HiSparsePair::reset_prefix_cache`] reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixReset {
    /// The host pool had no block in use and forgot its cache.
    pub host: bool,
    /// The device pool had no block in use and forgot its cache.
    pub device: bool,
}

impl PrefixReset {
    /// Both pools reset (vLLM's answer to `reset_prefix_cache`).
    pub fn both(self) -> bool {
        self.host && self.device
    }
}

/// The host and device halves of one `HiSparse` manager, borrowed for one
/// call (see the module docs).
#[derive(Debug)]
pub struct HiSparsePair<'a> {
    host: &'a mut CoordinatorCore,
    device: &'a mut CoordinatorCore,
    /// Test-only: allocate without planning the host half (the device half
    /// then stays changed when the host half refuses), the negative control
    /// of the transaction tests.
    #[cfg(test)]
    skip_host_plan: bool,
}

impl<'a> HiSparsePair<'a> {
    /// The pair of `host` and `device`; refused unless they have the pair's
    /// shape (the module docs' invariants, requests aside).
    pub fn new(host: &'a mut CoordinatorCore, device: &'a mut CoordinatorCore) -> KvResult<Self> {
        check_shape(host, device)?;
        Ok(Self {
            host,
            device,
            #[cfg(test)]
            skip_host_plan: false,
        })
    }

    /// The host half, read-only.
    pub fn host(&self) -> &CoordinatorCore {
        self.host
    }

    /// The device half, read-only.
    pub fn device(&self) -> &CoordinatorCore {
        self.device
    }

    /// The host half's arguments of a step: no encoder tokens, and no
    /// caching on allocation (the source group publishes through vLLM's
    /// `HiSparse` coordinator, only what its host copies make durable).
    fn host_args(args: &AllocateArgs) -> AllocateArgs {
        AllocateArgs {
            num_encoder_tokens: 0,
            delay_cache_blocks: true,
            ..*args
        }
    }

    /// Allocate one step of `request` in both halves, or in neither: the
    /// host half adopts `host_hits` (its one list, or none), the device
    /// half `device_hits` (one list per device group, or none) and caches
    /// as `args` says. Fills `out` with the new blocks of every group, the
    /// host's first, and answers `true`; `false` (both halves unchanged,
    /// `out` empty) when either pool cannot hold the step. An error of
    /// either half leaves both unchanged.
    pub fn allocate(
        &mut self,
        request: &Request,
        args: &AllocateArgs,
        host_hits: Option<&[BlockId]>,
        device_hits: Option<&[Vec<BlockId>]>,
        out: &mut NewBlocks,
    ) -> KvResult<bool> {
        out.clear();
        let host_args = Self::host_args(args);
        let host_hits = host_hits.map(|h| vec![h.to_vec()]);
        let host_hits = host_hits.as_deref();
        #[cfg(test)]
        let plan = !self.skip_host_plan;
        #[cfg(not(test))]
        let plan = true;
        if plan && !self.host.allocation_fits(request, &host_args, host_hits)? {
            return Ok(false);
        }
        // The device half refuses or fails without changing anything but
        // the blocks a running request's windows left (dead either way, as
        // in any allocation; vLLM's device groups have no window).
        let mut device_new = NewBlocks::new();
        if !self
            .device
            .allocate_request(request, args, device_hits, &mut device_new)?
        {
            return Ok(false);
        }
        let host_done = self
            .host
            .allocate_request(request, &host_args, host_hits, out);
        if !matches!(host_done, Ok(true)) {
            out.clear();
            // Only a plan that disagrees with its allocation gets here.
            return Err(host_done.err().unwrap_or_else(|| {
                KvError::Invariant(format!(
                    "request {:?}: the host allocation refused a step its plan said fits",
                    request.id()
                ))
            }));
        }
        for g in 0..device_new.num_groups() {
            out.push_group(device_new.group(g).iter().copied());
        }
        Ok(true)
    }

    /// The source group's admission count of a step (vLLM's
    /// `HiSparseSourceManager`): host blocks never count against the device
    /// pool, so 0, or the device pool's size plus one (a sure refusal) when
    /// the host pool cannot back the step's new pages. `args` are the
    /// host half's prediction arguments (no encoder tokens, no admission
    /// cap). Changes nothing.
    pub fn host_admission_blocks(
        &self,
        request: &Request,
        host_hits: Option<&[BlockId]>,
        args: &PredictArgs,
    ) -> KvResult<usize> {
        let hits = host_hits.map(|h| vec![h.to_vec()]).unwrap_or_default();
        let needed = self.host.num_blocks_to_allocate(request, &hits, args)?;
        if needed > self.host.pool().num_free_blocks() {
            return Ok(self.device.pool().num_blocks() + 1);
        }
        Ok(0)
    }

    /// Blocks a step of `request` would pull from the device pool over
    /// every group (vLLM's coordinator's `get_num_blocks_to_allocate`): the
    /// device half's prediction plus the source group's admission count
    /// ([`host_admission_blocks`](Self::host_admission_blocks), with the
    /// host's share of `args`). Changes nothing.
    pub fn num_blocks_to_allocate(
        &self,
        request: &Request,
        host_hits: Option<&[BlockId]>,
        device_hits: &[Vec<BlockId>],
        args: &PredictArgs,
    ) -> KvResult<usize> {
        let device = self
            .device
            .num_blocks_to_allocate(request, device_hits, args)?;
        let host_args = PredictArgs {
            num_encoder_tokens: 0,
            max_in_flight_tokens: None,
            num_tokens_main_model: None,
            prefill_end: None,
            ..*args
        };
        Ok(device + self.host_admission_blocks(request, host_hits, &host_args)?)
    }

    /// Free request `id` in both halves, each table tail first, the host's
    /// first (vLLM's group order); whether either held it.
    pub fn free(&mut self, id: &str) -> KvResult<bool> {
        let host = self.host.free_request(id)?;
        let device = self.device.free_request(id)?;
        Ok(host || device)
    }

    /// Forget request `id` in both halves and hand its references to the
    /// caller (vLLM's `pop_blocks_for_free`): per group, the host's first,
    /// the blocks as [`CoordinatorCore::pop_request_to_caller`] pops them.
    /// `None` when neither half holds it.
    pub fn pop_request_to_caller(&mut self, id: &str) -> KvResult<Option<Vec<Vec<BlockId>>>> {
        let host = self.host.pop_request_to_caller(id)?;
        let device = self.device.pop_request_to_caller(id)?;
        if host.is_none() && device.is_none() {
            return Ok(None);
        }
        let host = host.unwrap_or_else(|| vec![Vec::new()]);
        let device = device.unwrap_or_else(|| vec![Vec::new(); self.device.num_groups()]);
        Ok(Some(host.into_iter().chain(device).collect()))
    }

    /// Forget every cached prefix of each pool that has no block in use,
    /// the host's first, as vLLM's coordinator resets each of its pools:
    /// a block held in one pool does not keep the other's cache. Refuses
    /// no input; answers which halves reset.
    pub fn reset_prefix_cache(&mut self) -> PrefixReset {
        let host = self.host.reset_prefix_cache();
        let device = self.device.reset_prefix_cache();
        PrefixReset { host, device }
    }

    /// The most blocks one request can hold in the pair's group `group`
    /// (vLLM's group id) with `max_in_flight_tokens` in flight
    /// ([`Manager::max_admission_blocks`](crate::managers::Manager::max_admission_blocks));
    /// `None`: no cap.
    pub fn max_admission_blocks(
        &self,
        group: GroupId,
        max_in_flight_tokens: usize,
    ) -> KvResult<Option<usize>> {
        let (core, g) = match group.0.checked_sub(1) {
            None => (&*self.host, 0),
            Some(g) => (&*self.device, g as usize),
        };
        let manager = core.managers().get(g).ok_or(KvError::UnknownGroup(group))?;
        Ok(manager.max_admission_blocks(max_in_flight_tokens, core.config().max_model_len))
    }

    /// Check both halves' invariants and the pair's (the module docs);
    /// `Err` names the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.host
            .check_invariants()
            .map_err(|e| format!("host core: {e}"))?;
        self.device
            .check_invariants()
            .map_err(|e| format!("device core: {e}"))?;
        check_shape(self.host, self.device).map_err(|e| e.to_string())?;
        if self.host.num_requests() != self.device.num_requests() {
            return Err(format!(
                "the host core tracks {} requests, the device core {}",
                self.host.num_requests(),
                self.device.num_requests()
            ));
        }
        for id in self.host.request_names() {
            if self.device.request_block_ids(id).is_err() {
                return Err(format!("request {id:?}: tracked by the host core alone"));
            }
        }
        Ok(())
    }

    /// Test-only: see the field.
    #[cfg(test)]
    fn without_host_plan(mut self) -> Self {
        self.skip_host_plan = true;
        self
    }
}

/// The pair's shape: one full-attention group on the host, group ids from
/// 0 there and from 1 on the device.
fn check_shape(host: &CoordinatorCore, device: &CoordinatorCore) -> KvResult<()> {
    let refuse = |name: &'static str, value: String, rule: &str| KvError::InvalidConfig {
        name,
        value,
        rule: format!("a HiSparse pair's {rule}"),
    };
    let kinds: Vec<SpecKind> = host.managers().iter().map(|m| m.spec().kind).collect();
    if !matches!(kinds.as_slice(), [SpecKind::FullAttention]) {
        return Err(refuse(
            "groups",
            format!("{kinds:?}"),
            "host core holds one full-attention group",
        ));
    }
    if host.config().group_id_base != 0 {
        let base = host.config().group_id_base.to_string();
        return Err(refuse("group_id_base", base, "host core reports group 0"));
    }
    if device.config().group_id_base != 1 {
        let base = device.config().group_id_base.to_string();
        return Err(refuse(
            "group_id_base",
            base,
            "device core reports its groups from 1",
        ));
    }
    Ok(())
}

#[cfg(test)]
#[path = "hisparse_pair_tests.rs"]
mod tests;
