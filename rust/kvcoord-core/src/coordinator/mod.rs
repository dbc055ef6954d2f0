//! `CoordinatorCore`: one [`BlockPool`] shared by one [`Manager`] per KV-cache
//! group, and every request's per-group block tables. It implements the
//! per-step entry point of vLLM 0.33.0's `KVCacheManager.allocate_slots` for
//! all groups in one call, plus freeing, caching and the per-spec hit
//! finders (the hybrid fixed point over those finders runs in the caller).
//!
//! # Invariants
//!
//! * A request is *tracked* iff it has an entry in `requests`; its entry has
//!   one [`GroupTable`] per group. Entries appear when an `allocate_slots`
//!   call succeeds and disappear on `free`.
//! * Every non-null block's reference count equals the number of tables
//!   that hold it (hits shared between requests count once per request)
//!   plus the references the caller holds outside every table
//!   (`caller_held.rs`: blocks taken straight from the pool).
//! * Every public method validates its whole input before changing
//!   anything, except that `allocate_slots` releases out-of-window blocks of
//!   a running request before finding out whether the new slots fit (vLLM
//!   does the same: those blocks are dead either way).
//!
//! # Files
//!
//! * `config.rs`: [`CoordinatorConfig`] and its validation, the coordinator
//!   policy ([`CoordinatorKind`]) and the block sizes derived from the
//!   groups.
//! * this file: the [`CoordinatorCore`] struct, its construction and
//!   [`CoordinatorCore::check_invariants`].
//! * `api.rs`: the per-request calls around a step (accessors, requests by
//!   scheduler id, caching calls, freeing, the drains of copies and
//!   hand-offs).
//! * `plan.rs`: a step's planning and allocation (`allocate_slots`, the
//!   prediction `num_blocks_to_allocate`).
//! * `hits.rs`: prefix-cache lookups and the checks of the hits a caller
//!   hands back.
//! * `caching.rs`: caching a request's blocks (full blocks, prompt tails
//!   inside a block, Mamba states handed off).
//! * `caller_held.rs`, `hisparse_rows.rs` (with `ledger.rs`): blocks the
//!   caller holds outside every table, and `HiSparse` rows.
//!
//! Layering inside the folder: `config.rs`, `caching.rs` and `ledger.rs`
//! import nothing of this file; the files holding `impl CoordinatorCore`
//! blocks (`api.rs`, `plan.rs`, `hits.rs`, `caller_held.rs`,
//! `hisparse_rows.rs`) import this file and those three, and this file
//! imports only those three.

use hashbrown::{HashMap, HashSet};

use crate::error::KvResult;
use crate::ids::{BlockId, GroupId, ReqId};
use crate::managers::{hisparse, GroupTable, Manager};
use crate::pool::{BlockPool, PoolConfig};
use crate::prefix_index::CacheKey;
use crate::request::RequestRegistry;
use crate::spec::SpecKind;

mod api;
mod caching;
mod caller_held;
mod config;
mod hisparse_rows;
mod hits;
mod ledger;
mod plan;
#[cfg(test)]
mod tests;

pub use crate::block_ids::NewBlocks;
pub use crate::request::RequestView;
pub use crate::step_args::{AllocateArgs, PredictArgs};
pub use caching::{replay_boundaries, BoundaryOffload};
pub use config::{
    default_hash_block_size, scheduler_block_size, CoordinatorConfig, CoordinatorKind,
};

/// The block manager of one scheduler: shared pool, per-group rules, and
/// every tracked request's tables.
#[derive(Clone, Debug)]
pub struct CoordinatorCore {
    pool: BlockPool,
    /// One per group, by group id.
    managers: Vec<Manager>,
    config: CoordinatorConfig,
    /// Validated retention interval.
    retention: Option<usize>,
    /// Tracked requests: one table per group.
    requests: HashMap<ReqId, Vec<GroupTable>>,
    /// Emptied table sets of freed requests, reused on admission so that a
    /// steady workload stops allocating table storage.
    spare: Vec<Vec<GroupTable>>,
    /// Scratch for skipped-block removal.
    scratch: Vec<BlockId>,
    /// Scratch for sliding-window cache masks.
    mask_buf: Vec<bool>,
    /// Output buffer of [`allocate_slots`](Self::allocate_slots).
    out: NewBlocks,
    /// Cache keys of Mamba "align" states registered during the current
    /// step: a hit on one is refused until [`new_step_starts`](Self::new_step_starts)
    /// (the state is written by this step's forward pass).
    cached_this_step: HashSet<CacheKey>,
    /// Mamba "align" states committed since the last
    /// [`take_boundary_state_offloads`](Self::take_boundary_state_offloads),
    /// in the order they were cached.
    boundary_offloads: Vec<BoundaryOffload>,
    /// Per group, the prefill checkpoint decided by the current allocation's
    /// prediction (Mamba "align" only).
    checkpoints: Vec<Option<(usize, usize)>>,
    /// Whether some group is Mamba "align" (the per-step bookkeeping above
    /// is skipped otherwise).
    has_align: bool,
    /// Scheduler ids of the tracked requests. Invariant: its ids are exactly
    /// the keys of `requests`.
    registry: RequestRegistry,
    /// References held by the caller outside every table, per block (see
    /// [`caller_held`]).
    caller_held: HashMap<BlockId, u32>,
    /// Copy-on-write copies of Mamba "align" states at sub-block boundaries
    /// since the last [`take_block_copies`](Self::take_block_copies):
    /// (source, destination). Both ends are held in `caller_held` until the
    /// caller frees them (the copy has run).
    pending_copies: Vec<(GroupId, BlockId, BlockId)>,
    /// `HiSparse` resident groups' per-block accounting (see
    /// [`hisparse_rows`]).
    hisparse: ledger::Ledger,
}

impl CoordinatorCore {
    /// A coordinator with a fresh pool; validates the whole configuration.
    pub fn new(config: CoordinatorConfig) -> KvResult<Self> {
        config.validate()?;
        let mut pool = BlockPool::new(PoolConfig {
            num_blocks: config.num_blocks,
            enable_caching: config.enable_caching(),
            hash_block_size: config.hash_block_size,
            enable_events: config.enable_events,
        })?;
        pool.set_event_medium(config.event_medium);
        pool.set_group_base(config.group_id_base);
        let managers = config
            .groups
            .iter()
            .enumerate()
            .map(|(g, &spec)| {
                // Fewer than 2^32 groups (validated): the id is exact.
                Manager::new(spec, GroupId(g as u32))
                    .map(|m| m.with_eagle(config.is_eagle_group(g)))
            })
            .collect::<KvResult<Vec<_>>>()?;
        let managers_len = managers.len();
        let has_align = config
            .groups
            .iter()
            .any(|g| matches!(g.kind, SpecKind::MambaAlign { .. }));
        // Validated non-negative above.
        let retention = config
            .retention_interval
            .map(|r| usize::try_from(r).unwrap_or(0));
        Ok(Self {
            pool,
            managers,
            config,
            retention,
            requests: HashMap::new(),
            spare: Vec::new(),
            scratch: Vec::new(),
            mask_buf: Vec::new(),
            out: NewBlocks::new(),
            cached_this_step: HashSet::new(),
            boundary_offloads: Vec::new(),
            checkpoints: vec![None; managers_len],
            has_align,
            registry: RequestRegistry::default(),
            caller_held: HashMap::new(),
            pending_copies: Vec::new(),
            hisparse: ledger::Ledger::default(),
        })
    }

    /// Check the pool's invariants and the coordinator's (see the module
    /// docs); `Err` names the first violation. O(blocks + table entries).
    pub fn check_invariants(&self) -> Result<(), String> {
        self.pool.check_invariants()?;
        let mut owners = vec![0u32; self.pool.num_blocks()];
        for (req, tables) in &self.requests {
            if tables.len() != self.managers.len() {
                return Err(format!(
                    "request {req}: {} tables for {} groups",
                    tables.len(),
                    self.managers.len()
                ));
            }
            for (g, t) in tables.iter().enumerate() {
                t.check_invariants(self.managers[g].spec().has_interior_nulls())
                    .map_err(|e| format!("request {req} group {g}: {e}"))?;
                let resident = matches!(self.managers[g].spec().kind, SpecKind::HiSparseResident);
                let held: Vec<BlockId> = if resident {
                    hisparse::check_row(t).map_err(|e| format!("request {req} group {g}: {e}"))?;
                    hisparse::referenced(t).collect()
                } else {
                    t.blocks().to_vec()
                };
                for &b in &held {
                    let slot = owners.get_mut(b.index()).ok_or_else(|| {
                        format!("request {req} group {g}: block {b} out of range")
                    })?;
                    if !b.is_null() {
                        *slot += 1;
                    }
                }
            }
        }
        if self.registry.len() > self.requests.len() {
            return Err(format!(
                "{} request ids registered but {} requests tracked",
                self.registry.len(),
                self.requests.len()
            ));
        }
        for (&(g, b), &n) in &self.hisparse.given_up {
            let slot = owners
                .get_mut(b.index())
                .ok_or_else(|| format!("given-up block {b} out of range"))?;
            if n == 0 || *slot < n {
                return Err(format!(
                    "group {g} block {b}: {n} references given up, {} held by rows",
                    *slot
                ));
            }
            *slot -= n;
        }
        let by_tables = owners.clone();
        for (&b, &n) in &self.caller_held {
            if b.is_null() || n == 0 {
                return Err(format!("block {b}: {n} caller references recorded"));
            }
            let slot = owners
                .get_mut(b.index())
                .ok_or_else(|| format!("caller-held block {b} out of range"))?;
            *slot += n;
        }
        for (i, (have, want)) in self.pool.ref_counts().zip(&owners).enumerate() {
            if have != *want {
                return Err(format!(
                    "block {i}: ref_cnt {have} but held by {} tables and {} times by the caller",
                    by_tables[i],
                    want - by_tables[i]
                ));
            }
        }
        Ok(())
    }
}
