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
//!   ([`caller_held`]: blocks taken straight from the pool).
//! * Every public method validates its whole input before changing
//!   anything, except that `allocate_slots` releases out-of-window blocks of
//!   a running request before finding out whether the new slots fit (vLLM
//!   does the same: those blocks are dead either way).

use hashbrown::hash_map::Entry;
use hashbrown::{HashMap, HashSet};

use crate::block_hash::BlockHash;
pub use crate::block_ids::NewBlocks;
use crate::error::{KvError, KvResult};
use crate::events::Medium;
use crate::ids::{BlockId, GroupId, ReqId};
use crate::managers::{full_attention, hisparse, mamba_align};
use crate::managers::{CachePolicy, GroupSpec, GroupTable, Manager, SpecKind};
use crate::pool::{BlockPool, PoolConfig};
use crate::prefix_index::CacheKey;
pub use crate::request::RequestView;
use crate::request::{Request, RequestRegistry};
use crate::retention::validate_retention_interval;
pub use crate::step_args::{AllocateArgs, PredictArgs};

mod caller_held;
mod hisparse_rows;

/// Which coordinator policy serves a configuration (vLLM's
/// `get_kv_cache_coordinator`): it decides hit alignment and how many tokens
/// are worth caching. Chosen once, by [`CoordinatorKind::choose`]; the
/// Python policies are keyed by it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum CoordinatorKind {
    /// Prefix caching off: no lookups, nothing cached, any number of groups.
    NoPrefixCache,
    /// Exactly one caching group: hits align to the group's block size and
    /// every full block is cached.
    Unitary,
    /// Several caching groups (without partial hits): hits align to the
    /// scheduler block size, so tokens past the last multiple of it are
    /// never cached (no hit could use them).
    Hybrid,
}

impl CoordinatorKind {
    /// vLLM's choice: caching off -> `NoPrefixCache`; one group ->
    /// `Unitary`; otherwise `Hybrid`.
    pub const fn choose(num_groups: usize, enable_caching: bool) -> Self {
        if !enable_caching {
            Self::NoPrefixCache
        } else if num_groups == 1 {
            Self::Unitary
        } else {
            Self::Hybrid
        }
    }

    /// Whether this policy caches prefixes.
    pub const fn enable_caching(self) -> bool {
        match self {
            Self::NoPrefixCache => false,
            Self::Unitary | Self::Hybrid => true,
        }
    }
}

/// LCM of the groups' block sizes: the granularity at which every group
/// agrees on block boundaries (1 without groups).
pub fn scheduler_block_size(groups: &[GroupSpec]) -> u32 {
    groups
        .iter()
        .fold(1u32, |acc, g| lcm(acc, g.block_size.max(1)))
}

/// The hash unit (tokens per hash) a manager uses by default, and the one
/// requests must be hashed with: vLLM hashes at the GCD of the cacheable
/// groups' block sizes when caching several groups (none of them
/// non-cacheable), else at the scheduler block size. `kvcoord replay` and
/// the manager both call this.
pub fn default_hash_block_size(groups: &[GroupSpec], enable_caching: bool) -> u32 {
    let all_cacheable = groups.iter().all(GroupSpec::prefix_cacheable);
    let gcd_all = if enable_caching && all_cacheable {
        groups.iter().fold(0u32, |acc, g| gcd(acc, g.block_size))
    } else {
        0
    };
    if gcd_all == 0 {
        scheduler_block_size(groups)
    } else {
        gcd_all
    }
}

/// Construction parameters of a [`CoordinatorCore`].
// Independent switches of vLLM's constructor (events, partial hits, context
// parallelism, hit verification), not a state machine.
#[allow(clippy::struct_excessive_bools)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoordinatorConfig {
    /// One spec per KV-cache group, by group id.
    pub groups: Vec<GroupSpec>,
    /// Physical blocks in the shared pool, the null block included.
    pub num_blocks: usize,
    /// The coordinator policy (decides whether prefix caching is on).
    pub kind: CoordinatorKind,
    /// Tokens per hash unit of the request hashes.
    pub hash_block_size: u32,
    /// LCM of the groups' block sizes.
    pub scheduler_block_size: u32,
    /// Longest sequence a request may reach.
    pub max_model_len: usize,
    /// Prefix-cache retention interval (`None` = dense caching).
    pub retention_interval: Option<i64>,
    /// Whether the pool records [`KvEvent`](crate::KvEvent)s.
    pub enable_events: bool,
    /// Multi-module MTP's re-prefillable tail (one less than vLLM's
    /// `num_prefill_lookahead`): the last computed tokens are written again
    /// by the next step, so their KV is not final (see
    /// [`Self::num_cacheable_tokens`]).
    pub num_reprefillable_tokens: usize,
    /// Groups serving an EAGLE drafter (vLLM's `drop_eagle_group_ids`): their
    /// hits drop one block, so a hybrid coordinator caches them one block
    /// past its aligned prefix. Every group with the spec of one of them is
    /// one too (equal specs are looked up together, so they share the drop).
    pub eagle_groups: Vec<GroupId>,
    /// Tokens after each hash unit its hash covers (vLLM's
    /// `num_hash_lookahead_tokens`): a Mamba prefill checkpoint leaves that
    /// many tokens after it (at least one, recomputed for the logits), so
    /// its hash exists.
    pub num_hash_lookahead_tokens: usize,
    /// Whether sub-block (partial) hits may be turned on
    /// ([`Self::partial_hits`]); off by default: their copy-on-write copies
    /// keep both ends referenced until the caller frees them after running
    /// the copy ([`CoordinatorCore::take_block_copies`]), which a caller
    /// must be ready to do.
    pub allow_partial_hits: bool,
    /// Whether decode context parallelism is on (vLLM's `dcp_world_size >
    /// 1`; the caller scales the sharded groups' block sizes): a Mamba
    /// block equal to the hash unit then turns on partial hits too, as
    /// vLLM's `partial_hash_hits_enabled` does.
    pub context_parallel: bool,
    /// Whether `allocate_slots` checks every prefix-cache hit against the
    /// prefix index (default): block `i` of group `g` must be cached under
    /// the request's own hash of block `i`, so a hit that went stale
    /// between lookup and allocation (another thread, a misuse) is refused.
    /// Off, hits are adopted as vLLM adopts `new_computed_blocks`: whatever
    /// they hold (free, cached under any key, or in use), each gains a
    /// reference; ids out of range, a null inside the attention window,
    /// wrong counts and whatever the pool refuses are still refused. Off,
    /// too, the computed tokens of a request the core does not track yet
    /// (`num_computed_tokens`, or `num_new_computed_tokens` without hit
    /// blocks) are taken as vLLM takes them: they get fresh blocks.
    pub verify_hits: bool,
    /// Added to every group id the pool reports (events, key read-outs):
    /// for a core holding groups `base..` of a larger configuration (vLLM's
    /// `HiSparse` device groups beside a host core for the source group),
    /// so its events and keys carry the configuration's group ids.
    pub group_id_base: u32,
    /// The medium the pool's events report ([`Medium::Gpu`]; vLLM's
    /// `HiSparse` host pool reports [`Medium::Cpu`]).
    pub event_medium: Medium,
    /// A Mamba "align" state already keyed at the prompt's last hash-unit
    /// boundary (by a hit or an earlier step) is keyed there again when a
    /// chunk ends on it (vLLM 0.32; off by default, as in vLLM 0.33): it
    /// counts as cached this step, so siblings' hits on it wait for the next
    /// step, and a boundary inside its block is copied out again.
    pub rekey_keyed_prompt_tail: bool,
    /// Under a retention interval, an EAGLE group also retains the block
    /// below the shared-prefix junction, where a sibling diverging right
    /// after the junction lands its hit (vLLM 0.33, the default; vLLM 0.32
    /// retains the junction only).
    pub eagle_junction_block: bool,
}

impl CoordinatorConfig {
    /// vLLM's defaults for these groups: coordinator from
    /// [`CoordinatorKind::choose`], scheduler block size = LCM of the block
    /// sizes, hash block size from [`default_hash_block_size`], dense
    /// retention, no events.
    pub fn new(
        groups: Vec<GroupSpec>,
        num_blocks: usize,
        enable_caching: bool,
        max_model_len: usize,
    ) -> Self {
        Self {
            kind: CoordinatorKind::choose(groups.len(), enable_caching),
            hash_block_size: default_hash_block_size(&groups, enable_caching),
            scheduler_block_size: scheduler_block_size(&groups),
            groups,
            num_blocks,
            max_model_len,
            retention_interval: None,
            enable_events: false,
            num_reprefillable_tokens: 0,
            eagle_groups: Vec::new(),
            num_hash_lookahead_tokens: 0,
            allow_partial_hits: false,
            context_parallel: false,
            verify_hits: true,
            group_id_base: 0,
            event_medium: Medium::Gpu,
            rekey_keyed_prompt_tail: false,
            eagle_junction_block: true,
        }
    }

    /// vLLM's `enable_partial_hash_hits`: a hybrid coordinator with a Mamba
    /// "align" group whose blocks span several hash units, every other
    /// caching group able to look up hash-unit boundaries inside its blocks
    /// (full attention, MLA, R-SWA, Mamba "align") or one hash unit long.
    /// Hits then end on any hash-unit boundary ([`Self::hit_alignment`]) and
    /// caching is not rounded ([`Self::num_cacheable_tokens`]).
    pub fn partial_hits(&self) -> bool {
        let hbs = self.hash_block_size;
        self.allow_partial_hits
            && self.kind == CoordinatorKind::Hybrid
            && self.groups.iter().any(|g| {
                matches!(g.kind, SpecKind::MambaAlign { .. })
                    && (g.block_size > hbs || (self.context_parallel && g.block_size == hbs))
            })
            && self
                .groups
                .iter()
                .all(|g| !g.prefix_cacheable() || g.block_size == hbs || g.facts().sub_block_hits)
    }

    /// Where a Mamba prefill checkpoint goes (vLLM's
    /// `get_mamba_prefill_checkpoint_position`): after the hash lookahead,
    /// or at EAGLE's replay boundary when EAGLE groups drop their block
    /// (vLLM's `drop_eagle_checkpoint_block`, set under `use_eagle`).
    pub fn checkpoint_rule(&self) -> mamba_align::CheckpointRule {
        mamba_align::CheckpointRule {
            lookahead: self.num_hash_lookahead_tokens,
            drop_eagle: !self.eagle_groups.is_empty(),
        }
    }

    /// Tokens a hit ends on a multiple of (vLLM's
    /// `cache_hit_alignment_tokens`): the hash unit with
    /// [`Self::partial_hits`], else the scheduler block size.
    pub fn hit_alignment(&self) -> usize {
        if self.partial_hits() {
            self.hash_block_size as usize
        } else {
            self.scheduler_block_size.max(1) as usize
        }
    }

    /// Whether group `g` drops EAGLE's block: it or a group of equal spec
    /// is listed in [`eagle_groups`](Self::eagle_groups).
    pub fn is_eagle_group(&self, g: usize) -> bool {
        let spec = self.groups.get(g);
        self.eagle_groups
            .iter()
            .any(|e| self.groups.get(e.0 as usize) == spec)
    }

    /// The groups whose hits drop the EAGLE block ([`Self::is_eagle_group`]).
    pub fn eagle_group_ids(&self) -> impl Iterator<Item = GroupId> + '_ {
        let n = u32::try_from(self.groups.len()).unwrap_or(u32::MAX);
        (0..n)
            .map(GroupId)
            .filter(|g| self.is_eagle_group(g.0 as usize))
    }

    /// Per group, [`Self::num_held_back_tokens`].
    pub fn held_back_tokens(&self) -> impl Iterator<Item = usize> + '_ {
        let n = u32::try_from(self.groups.len()).unwrap_or(u32::MAX);
        (0..n).map(move |g| self.num_held_back_tokens(GroupId(g)))
    }

    /// [`Self::num_cacheable_tokens`] of a caller's group id:
    /// [`KvError::UnknownGroup`] when there is no such group.
    pub fn checked_cacheable_tokens(
        &self,
        group: GroupId,
        num_computed_tokens: usize,
    ) -> KvResult<usize> {
        if group.0 as usize >= self.groups.len() {
            return Err(KvError::UnknownGroup(group));
        }
        // Below 2^48, the rounding in `num_cacheable_tokens` cannot wrap.
        let n = crate::limits::check_tokens("num_computed_tokens", num_computed_tokens)?;
        Ok(self.num_cacheable_tokens(group, n))
    }

    /// Whether `group` caches the way an EAGLE group of a hybrid
    /// coordinator does (see [`Self::num_cacheable_tokens`]).
    fn caches_past_alignment(&self, group: GroupId) -> bool {
        self.kind == CoordinatorKind::Hybrid && self.is_eagle_group(group.0 as usize)
    }

    /// The re-prefillable tokens `group` holds back from caching: all of
    /// them with one caching group and in a hybrid coordinator's EAGLE
    /// groups; the other groups of a hybrid coordinator cache the
    /// scheduler-block-aligned prefix, whatever its tail.
    pub fn num_held_back_tokens(&self, group: GroupId) -> usize {
        match self.kind {
            CoordinatorKind::Unitary => self.num_reprefillable_tokens,
            CoordinatorKind::Hybrid if self.caches_past_alignment(group) => {
                self.num_reprefillable_tokens
            }
            CoordinatorKind::Hybrid | CoordinatorKind::NoPrefixCache => 0,
        }
    }

    /// How many of `num_computed_tokens` `group` may cache (vLLM's
    /// `get_num_cacheable_tokens`). One caching group: all but the
    /// re-prefillable tail. Hybrid: hits land on scheduler-block
    /// boundaries, so the prefix rounded down to one; an EAGLE group, once
    /// that prefix is not empty, caches its final tokens up to one block
    /// past their own rounded prefix (the block an EAGLE lookup matches
    /// before dropping it).
    pub fn num_cacheable_tokens(&self, group: GroupId, num_computed_tokens: usize) -> usize {
        let finalized = num_computed_tokens.saturating_sub(self.num_held_back_tokens(group));
        match self.kind {
            CoordinatorKind::NoPrefixCache | CoordinatorKind::Unitary => finalized,
            CoordinatorKind::Hybrid => {
                // With partial hits no rounding applies (a hit may end on
                // any hash unit).
                let partial = self.partial_hits();
                let sbs = self.scheduler_block_size.max(1) as usize;
                let align = |n: usize| if partial { n } else { n / sbs * sbs };
                let aligned = align(num_computed_tokens);
                if aligned == 0 || !self.caches_past_alignment(group) {
                    return aligned;
                }
                let block_size = self
                    .groups
                    .get(group.0 as usize)
                    .map_or(0, |g| g.block_size as usize);
                finalized.min(align(finalized) + block_size)
            }
        }
    }

    /// Whether prefix caching is on.
    pub const fn enable_caching(&self) -> bool {
        self.kind.enable_caching()
    }

    /// Check the whole configuration; the one place its rules and messages
    /// are written.
    pub fn validate(&self) -> KvResult<()> {
        let bad = |name, value: String, rule: &str| KvError::InvalidConfig {
            name,
            value,
            rule: rule.into(),
        };
        for g in &self.groups {
            g.validate()?;
        }
        if u32::try_from(self.groups.len()).is_err() {
            return Err(bad(
                "groups",
                self.groups.len().to_string(),
                "must be fewer than 2^32 groups (group ids are 32 bits)",
            ));
        }
        if let Some(g) = self
            .eagle_groups
            .iter()
            .find(|g| g.0 as usize >= self.groups.len())
        {
            return Err(bad(
                "eagle_group_ids",
                g.0.to_string(),
                &format!("must name one of the {} groups", self.groups.len()),
            ));
        }
        if self.num_reprefillable_tokens >= crate::limits::MAX_TOKENS {
            return Err(bad(
                "num_reprefillable_tokens",
                self.num_reprefillable_tokens.to_string(),
                "must be below 2^48 tokens",
            ));
        }
        let (hbs, sbs) = (self.hash_block_size, self.scheduler_block_size);
        if hbs == 0 {
            return Err(bad("hash_block_size", "0".into(), "must be positive"));
        }
        if sbs == 0 || sbs % hbs != 0 {
            return Err(bad(
                "hash_block_size",
                hbs.to_string(),
                &format!(
                    "must divide the scheduler block size ({sbs}, the LCM of the groups' block sizes)"
                ),
            ));
        }
        if let Some(g) = self.groups.iter().find(|g| sbs % g.block_size != 0) {
            return Err(bad(
                "scheduler_block_size",
                sbs.to_string(),
                &format!(
                    "must be a multiple of every group's block size ({})",
                    g.block_size
                ),
            ));
        }
        if self.max_model_len == 0 {
            return Err(bad("max_model_len", "0".into(), "must be positive"));
        }
        if self.max_model_len >= crate::limits::MAX_TOKENS {
            return Err(bad(
                "max_model_len",
                self.max_model_len.to_string(),
                "must be below 2^48 tokens",
            ));
        }
        match self.kind {
            CoordinatorKind::NoPrefixCache => {}
            CoordinatorKind::Unitary | CoordinatorKind::Hybrid => self.validate_caching()?,
        }
        let sparse = self.groups.iter().any(GroupSpec::is_sparse);
        validate_retention_interval(self.retention_interval, sbs, sparse)
    }

    fn validate_caching(&self) -> KvResult<()> {
        let hbs = self.hash_block_size;
        let bad = |name, value: String, rule: String| KvError::InvalidConfig { name, value, rule };
        if self.groups.is_empty() {
            return Err(bad(
                "groups",
                "[]".into(),
                "prefix caching needs at least one KV cache group".into(),
            ));
        }
        if self.kind == CoordinatorKind::Unitary && self.groups.len() != 1 {
            return Err(bad(
                "groups",
                format!("{} groups", self.groups.len()),
                "the unitary coordinator needs exactly one KV cache group".into(),
            ));
        }
        for g in &self.groups {
            let facts = g.facts();
            // vLLM's HiSparse device groups sit beside cached groups: lookups
            // skip them and caching leaves them alone.
            let beside_caching = matches!(
                g.kind,
                SpecKind::HiSparseResident | SpecKind::HiSparseHot { .. }
            );
            if !facts.prefix_cacheable && !beside_caching {
                return Err(bad(
                    "enable_caching",
                    "true".into(),
                    format!(
                        "{} groups cannot be prefix-cached (Mamba state with mode \"none\": \
                         use mamba_cache_mode='align'; cross-attention); build the manager \
                         with caching off",
                        facts.spec_name
                    ),
                ));
            }
            if matches!(g.kind, SpecKind::MambaAlign { .. })
                && g.block_size != hbs
                && !self.partial_hits()
            {
                return Err(bad(
                    "hash_block_size",
                    hbs.to_string(),
                    format!(
                        "Mamba prefix caching (mamba_cache_mode='align') needs hash_block_size \
                         == the Mamba block size ({}): partial-block state entries are not \
                         supported",
                        g.block_size
                    ),
                ));
            }
            if g.block_size % hbs != 0 {
                return Err(bad(
                    "hash_block_size",
                    hbs.to_string(),
                    format!(
                        "every group's block size must be a multiple of hash_block_size; \
                         block sizes are {:?}",
                        self.groups.iter().map(|g| g.block_size).collect::<Vec<_>>()
                    ),
                ));
            }
        }
        if self.kind == CoordinatorKind::Unitary && self.groups[0].block_size != hbs {
            return Err(bad(
                "hash_block_size",
                hbs.to_string(),
                format!(
                    "must equal the block size ({}) when one group uses prefix caching",
                    self.groups[0].block_size
                ),
            ));
        }
        Ok(())
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Saturates at `u32::MAX`, which then fails validation (no group's block
/// size divides it unless the true LCM fits).
fn lcm(a: u32, b: u32) -> u32 {
    (a / gcd(a, b)).saturating_mul(b)
}

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
    hisparse: hisparse_rows::Ledger,
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
            hisparse: hisparse_rows::Ledger::default(),
        })
    }

    // ---- accessors ----------------------------------------------------

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
            .ok_or(KvError::UnknownRequest(req))
    }

    /// `req`'s block tables, by group (null block in skipped positions).
    pub fn block_ids(&self, req: ReqId) -> KvResult<Vec<&[BlockId]>> {
        Ok(self.tables(req)?.iter().map(GroupTable::blocks).collect())
    }

    // ---- requests by scheduler id -----------------------------------------

    fn req_of(&self, id: &str) -> KvResult<ReqId> {
        self.registry
            .get(id)
            .ok_or_else(|| KvError::NoSuchRequest(id.to_owned()))
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
    fn check_hash_unit(&self, request: &Request) -> KvResult<()> {
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

    // ---- lookups ------------------------------------------------------

    fn check_group_set(&self, group_ids: &[GroupId]) -> KvResult<&Manager> {
        let first = group_ids.first().ok_or_else(|| KvError::InvalidArgument {
            name: "group_ids",
            detail: "must not be empty".into(),
        })?;
        let manager_of = |g: &GroupId| {
            self.managers
                .get(g.0 as usize)
                .ok_or(KvError::UnknownGroup(*g))
        };
        let m = manager_of(first)?;
        for g in group_ids {
            if manager_of(g)?.spec() != m.spec() {
                return Err(KvError::InvalidArgument {
                    name: "group_ids",
                    detail: format!("groups {first} and {g} have different specs"),
                });
            }
        }
        Ok(m)
    }

    /// Longest prefix-cache hit for groups sharing one spec: at most
    /// `max_length` tokens, ending on a multiple of `alignment` (the group's
    /// block size when unitary, the scheduler block size when hybrid).
    /// `hashes` are the request's hash-unit hashes. `drop_eagle`: the hit
    /// drops its last block for EAGLE (only EAGLE groups may ask; see
    /// [`Manager::find_longest_cache_hit`]). Returns each group's blocks
    /// (null block in skipped positions) and the hit in tokens. Nothing is
    /// pinned: pass the blocks to `allocate_slots` right away.
    pub fn find_longest_cache_hit(
        &self,
        group_ids: &[GroupId],
        hashes: &[BlockHash],
        max_length: usize,
        alignment: usize,
        drop_eagle: bool,
    ) -> KvResult<(Vec<Vec<BlockId>>, usize)> {
        let mut out = Vec::new();
        crate::limits::try_reserve(&mut out, group_ids.len(), "hit lists")?;
        out.resize_with(group_ids.len(), Vec::new);
        let hit = self.find_longest_cache_hit_into(
            group_ids, hashes, max_length, alignment, drop_eagle, &mut out,
        )?;
        Ok((out, hit))
    }

    /// [`find_longest_cache_hit`](Self::find_longest_cache_hit) into
    /// caller-owned lists (`out[i]` for `group_ids[i]`, cleared first).
    pub fn find_longest_cache_hit_into(
        &self,
        group_ids: &[GroupId],
        hashes: &[BlockHash],
        max_length: usize,
        alignment: usize,
        drop_eagle: bool,
        out: &mut [Vec<BlockId>],
    ) -> KvResult<usize> {
        let m = self.check_group_set(group_ids)?;
        if drop_eagle && !m.eagle() {
            return Err(KvError::InvalidArgument {
                name: "drop_eagle",
                detail: format!("group {} is not an EAGLE group", m.group()),
            });
        }
        if !self.config.enable_caching() {
            if out.len() != group_ids.len() {
                return Err(KvError::InvalidArgument {
                    name: "out",
                    detail: format!("{} lists for {} groups", out.len(), group_ids.len()),
                });
            }
            out.iter_mut().for_each(Vec::clear);
            return Ok(0);
        }
        m.find_longest_cache_hit(
            &self.pool,
            group_ids,
            hashes,
            self.config.hash_block_size as usize,
            max_length,
            alignment,
            drop_eagle,
            out,
        )
    }

    // ---- allocation -----------------------------------------------------

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
            num_new_computed_tokens,
            num_lookahead_tokens: _,
            num_encoder_tokens,
            delay_cache_blocks,
            num_external_computed_tokens,
        } = *args;
        // Every count is below 2^48, so the sums below cannot wrap.
        crate::step_args::check_step(view, args)?;
        check_nonempty(args)?; // Step 1.
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
        // A new request's computed tokens must come with their blocks, or
        // fresh ones are cached as holding them. Unverified (vLLM takes its
        // caller's word), they get fresh blocks: see `step_needs`.
        crate::step_args::check_progress(tracked, view, config.verify_hits)?;
        // Step 3 (no external tokens).
        let local = view.num_computed_tokens + num_new_computed_tokens;
        let claims_hits = !tracked
            && num_new_computed_tokens > 0
            && config.enable_caching()
            && config.verify_hits;
        if !tracked && num_external_computed_tokens > 0 {
            check_external(managers)?;
        }
        if new_computed_blocks.is_some() || claims_hits {
            check_hits(managers, pool, config, hits, tracked, view, args)?;
        }
        // Steps 3 and 7 (external tokens count as computed).
        let computed = local + num_external_computed_tokens;
        let (total, main, need_slots) = step_tokens(computed, args, config.max_model_len)?;
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
        let tables = requests.get_mut(&req).ok_or(KvError::UnknownRequest(req))?;
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
        let tables = requests.get_mut(&req).ok_or(KvError::UnknownRequest(req))?;
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

/// Validate hit lists passed to `allocate_slots`: one list per group, only
/// for a new request, only where caching applies, in range, and covering
/// exactly the locally computed tokens (fewer for a lagging group before
/// external tokens).
fn check_hits(
    managers: &[Manager],
    pool: &BlockPool,
    config: &CoordinatorConfig,
    hits: &[Vec<BlockId>],
    tracked: bool,
    view: &RequestView<'_>,
    args: &AllocateArgs,
) -> KvResult<()> {
    let num_local = view.num_computed_tokens + args.num_new_computed_tokens;
    let num_external = args.num_external_computed_tokens;
    let hashes = view.hashes;
    let arg = |detail: String| KvError::InvalidArgument {
        name: "new_computed_blocks",
        detail,
    };
    if hits.len() != managers.len() {
        return Err(arg(format!(
            "{} lists for {} groups",
            hits.len(),
            managers.len()
        )));
    }
    // A connector's per-group lookup (vLLM's, beside Mamba groups) may hand
    // a group a hit below the reported one (even none) when external
    // tokens follow: that group adopts what its own hit covers, as vLLM
    // does (a Mamba group none of it: the state at the end of the external
    // tokens replaces it).
    let lagging = |list: &[BlockId], expected: usize| num_external > 0 && list.len() < expected;
    // A full-attention group whose pool keeps a longer prefix than the
    // reconciled hit (vLLM's `retains_longer_hit`: HiSparse's host group)
    // adopts the blocks of it that the local and external tokens cover
    // together: the external tokens are already in those blocks.
    let retained = |m: &Manager, list: &[BlockId], expected: usize| {
        num_external > 0
            && m.spec().is_full_attention()
            && list.len() > expected
            && list.len() <= (num_local + num_external).div_ceil(m.block_size())
    };
    for (m, list) in managers.iter().zip(hits) {
        if list.is_empty() {
            let needs_blocks = !tracked && num_local > 0 && config.enable_caching();
            if needs_blocks && m.spec().prefix_cacheable() && num_external == 0 {
                return Err(arg(format!(
                    "group {}: {num_local} hit tokens but no hit blocks",
                    m.group()
                )));
            }
            continue;
        }
        if tracked {
            return Err(arg(
                "a running request cannot adopt prefix-cache hits".into()
            ));
        }
        if !config.enable_caching() || !m.spec().prefix_cacheable() {
            return Err(arg(format!(
                "group {} cannot have prefix-cache hits",
                m.group()
            )));
        }
        if !pool.ids_in_range(list) {
            return Err(arg(format!("group {}: block id out of range", m.group())));
        }
        let sub_block = config.partial_hits()
            && m.spec().facts().sub_block_hits
            && num_local % config.hash_block_size as usize == 0;
        if num_local % m.block_size() != 0 && !sub_block {
            return Err(KvError::Unsupported {
                what: format!(
                    "partial-block hit ({num_local} tokens, block size {})",
                    m.block_size()
                ),
            });
        }
        // A lookup result covers exactly the computed prefix, one entry
        // (null included) per block (a lagging group's hit: fewer).
        let expected = if sub_block {
            num_local.div_ceil(m.block_size())
        } else {
            num_local / m.block_size()
        };
        if list.len() != expected && !lagging(list, expected) && !retained(m, list, expected) {
            return Err(arg(format!(
                "group {}: {} hit blocks for {num_local} computed tokens (expected {expected})",
                m.group(),
                list.len()
            )));
        }
        let hbs = config.hash_block_size as usize;
        let covered = if sub_block && list.len() == expected {
            num_local
        } else {
            list.len() * m.block_size()
        };
        if config.verify_hits {
            crate::hits::verify_group_hits(m, pool, hashes, hbs, list, covered)?;
        } else {
            crate::hits::check_group_hit_shape(m, list, covered)?;
        }
    }
    Ok(())
}

/// Cache every group's newly full blocks of the first `num_tokens` tokens.
/// Validates all groups before caching any.
#[allow(clippy::too_many_arguments)]
// Measured: as an out-of-line call this step helper cost more in
// prologue and argument spills than its work (callgrind, decode step).
#[allow(clippy::inline_always)]
#[inline(always)]
fn cache_tables(
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
/// ([`CoordinatorCore::take_boundary_state_offloads`]).
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
struct StepLog<'a> {
    req: ReqId,
    /// Keys of Mamba "align" states cached during the current step.
    cached: &'a mut HashSet<CacheKey>,
    /// Boundary-state hand-offs.
    offloads: &'a mut Vec<BoundaryOffload>,
}

impl<'a> StepLog<'a> {
    fn new(
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

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

    use super::*;

    /// Chained block hashes of `tokens` at `bs` tokens per block.
    fn hashes(tokens: &[u32], bs: usize) -> Vec<BlockHash> {
        let mut parent = [0u8; 32];
        tokens
            .chunks_exact(bs)
            .map(|block| {
                let mut h = Sha256::new();
                h.update(parent);
                for t in block {
                    h.update(t.to_le_bytes());
                }
                parent.copy_from_slice(&h.finalize());
                BlockHash::from_slice(&parent).unwrap()
            })
            .collect()
    }

    /// A request as the scheduler sees it.
    struct Req {
        id: ReqId,
        tokens: Vec<u32>,
        computed: usize,
        hashes: Vec<BlockHash>,
    }

    impl Req {
        fn new(id: u64, tokens: Vec<u32>, bs: usize) -> Self {
            let hashes = hashes(&tokens, bs);
            Self {
                id: ReqId(id),
                tokens,
                computed: 0,
                hashes,
            }
        }

        fn view(&self) -> RequestView<'_> {
            RequestView::new(
                self.computed,
                self.tokens.len(),
                self.tokens.len(),
                &self.hashes,
            )
        }
    }

    fn ids(v: &[BlockId]) -> Vec<u32> {
        v.iter().map(|b| b.0).collect()
    }

    fn full(num_blocks: usize, bs: u32, caching: bool) -> CoordinatorCore {
        let cfg = CoordinatorConfig::new(
            vec![GroupSpec::full_attention(bs)],
            num_blocks,
            caching,
            1 << 20,
        );
        CoordinatorCore::new(cfg).unwrap()
    }

    /// Unitary admission: lookup (max = `num_tokens - 1`) then allocate the
    /// rest. Returns (hit blocks, new blocks) or None.
    fn admit(c: &mut CoordinatorCore, r: &mut Req) -> Option<(Vec<u32>, Vec<u32>)> {
        let bs = c.managers()[0].block_size();
        let (hits, hit) = c
            .find_longest_cache_hit(&[GroupId(0)], &r.hashes, r.tokens.len() - 1, bs, false)
            .unwrap();
        let new = c
            .allocate_slots(
                r.id,
                &r.view(),
                &AllocateArgs {
                    num_new_tokens: r.tokens.len() - hit,
                    num_new_computed_tokens: hit,
                    num_lookahead_tokens: 0,
                    num_encoder_tokens: 0,
                    delay_cache_blocks: false,
                    num_external_computed_tokens: 0,
                },
                Some(&hits),
            )
            .unwrap()?;
        r.computed = r.tokens.len();
        c.check_invariants().unwrap();
        Some((ids(&hits[0]), ids(&new[0])))
    }

    fn queue(c: &CoordinatorCore) -> Vec<u32> {
        c.pool().free_block_ids().map(|b| b.0).collect()
    }

    fn refs(c: &CoordinatorCore, blocks: &[u32]) -> Vec<u32> {
        blocks
            .iter()
            .map(|&b| c.pool().ref_count(BlockId(b)).unwrap())
            .collect()
    }

    #[test]
    fn prefill_share_free_order_20() {
        let mut c = full(11, 16, true);
        let shared: Vec<u32> = (0..48).collect();
        let mut r0 = Req::new(0, [&shared[..], &[100; 7]].concat(), 16);
        assert_eq!(admit(&mut c, &mut r0), Some((vec![], vec![1, 2, 3, 4])));
        assert_eq!(
            c.pool().cached_mask().take(5).collect::<Vec<_>>(),
            [false, true, true, true, false]
        );
        let mut r1 = Req::new(1, [&shared[..], &[200; 5]].concat(), 16);
        assert_eq!(admit(&mut c, &mut r1), Some((vec![1, 2, 3], vec![5])));
        assert_eq!(refs(&c, &[1, 2, 3, 5]), [2, 2, 2, 1]);
        c.free(r0.id).unwrap();
        c.free(r1.id).unwrap();
        assert_eq!(queue(&c), [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]);
        let mut r2 = Req::new(2, [&shared[..], &[300; 6]].concat(), 16);
        assert_eq!(admit(&mut c, &mut r2), Some((vec![1, 2, 3], vec![5])));
        assert_eq!(c.pool().num_free_blocks(), 6);
        assert_eq!(c.get_num_common_prefix_blocks(r2.id, 1).unwrap(), [4]);
        c.free(r2.id).unwrap();
        let mut r3 = Req::new(3, (1000..1160).collect(), 16);
        assert_eq!(
            admit(&mut c, &mut r3),
            Some((vec![], vec![5, 4, 6, 7, 8, 9, 10, 3, 2, 1]))
        );
        assert_eq!(c.pool().num_free_blocks(), 0);
        assert!(!c.free(ReqId(99)).unwrap());
    }

    #[test]
    fn decode_growth_21() {
        let mut c = full(11, 16, true);
        let mut r = Req::new(0, (0..55).collect(), 16);
        assert_eq!(admit(&mut c, &mut r), Some((vec![], vec![1, 2, 3, 4])));
        r.tokens.extend(1000..1004);
        r.hashes = hashes(&r.tokens, 16);
        let new = c
            .allocate_slots(
                r.id,
                &r.view(),
                &AllocateArgs {
                    num_new_tokens: 4,
                    num_new_computed_tokens: 0,
                    num_lookahead_tokens: 0,
                    num_encoder_tokens: 0,
                    delay_cache_blocks: false,
                    num_external_computed_tokens: 0,
                },
                None,
            )
            .unwrap()
            .unwrap();
        assert!(new[0].is_empty());
        r.computed += 4;
        assert!(!c.pool().is_cached(BlockId(4)).unwrap());
        r.tokens.extend(2000..2019);
        r.hashes = hashes(&r.tokens, 16);
        let new = c
            .allocate_slots(
                r.id,
                &r.view(),
                &AllocateArgs {
                    num_new_tokens: 19,
                    num_new_computed_tokens: 0,
                    num_lookahead_tokens: 0,
                    num_encoder_tokens: 0,
                    delay_cache_blocks: false,
                    num_external_computed_tokens: 0,
                },
                None,
            )
            .unwrap()
            .unwrap();
        assert_eq!(ids(&new[0]), [5]);
        assert!(c.pool().is_cached(BlockId(4)).unwrap());
        assert!(!c.pool().is_cached(BlockId(5)).unwrap());
        assert_eq!(ids(c.block_ids(r.id).unwrap()[0]), [1, 2, 3, 4, 5]);
        c.check_invariants().unwrap();
    }

    #[test]
    fn lru_across_requests_22() {
        let mut c = full(11, 16, true);
        let mut r0 = Req::new(0, (0..87).collect(), 16);
        let mut r1 = Req::new(1, (87..135).collect(), 16);
        admit(&mut c, &mut r0).unwrap();
        admit(&mut c, &mut r1).unwrap();
        assert_eq!(c.pool().num_free_blocks(), 1);
        c.free(r0.id).unwrap();
        assert_eq!(queue(&c), [6, 10, 5, 4, 3, 2, 1]);
        c.free(r1.id).unwrap();
        assert_eq!(queue(&c), [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]);
        let mut r2 = Req::new(2, (0..35).collect(), 16);
        assert_eq!(admit(&mut c, &mut r2), Some((vec![1, 2], vec![6])));
        assert_eq!(c.pool().num_free_blocks(), 7);
    }

    #[test]
    fn reused_cached_block_loses_key_23() {
        let mut c = full(2, 16, true);
        let mut r0 = Req::new(0, (0..16).collect(), 16);
        admit(&mut c, &mut r0).unwrap();
        assert!(c.pool().is_cached(BlockId(1)).unwrap());
        c.free(r0.id).unwrap();
        let mut r1 = Req::new(1, (100..115).collect(), 16);
        assert_eq!(admit(&mut c, &mut r1), Some((vec![], vec![1])));
        assert!(!c.pool().is_cached(BlockId(1)).unwrap());
    }

    #[test]
    fn hit_blocks_protected_24() {
        let mut c = full(3, 16, true);
        let mut r0 = Req::new(0, (0..16).collect(), 16);
        let mut r1 = Req::new(1, (16..32).collect(), 16);
        admit(&mut c, &mut r0).unwrap();
        c.free(r0.id).unwrap();
        admit(&mut c, &mut r1).unwrap();
        c.free(r1.id).unwrap();
        // r1's tokens chained after r0's: block 1 hits, block 2's key differs.
        let mut r2 = Req::new(2, (0..32).collect(), 16);
        assert_eq!(admit(&mut c, &mut r2), Some((vec![1], vec![2])));
    }

    #[test]
    fn caching_disabled_25() {
        let mut c = full(5, 4, false);
        let mut r0 = Req::new(0, (0..10).collect(), 4);
        assert_eq!(admit(&mut c, &mut r0), Some((vec![], vec![1, 2, 3])));
        c.free(r0.id).unwrap();
        let mut r1 = Req::new(1, (0..16).collect(), 4);
        assert_eq!(admit(&mut c, &mut r1).unwrap().0, Vec::<u32>::new());
        assert_eq!(c.block_ids(r1.id).unwrap()[0].len(), 4);
        let mut r2 = Req::new(2, (50..54).collect(), 4);
        assert_eq!(admit(&mut c, &mut r2), None);
        assert!(!c.contains(r2.id));
        assert_eq!(c.pool().num_cached_keys(), 0);
    }

    #[test]
    fn failed_allocation_leaves_hits_untouched_26() {
        let mut c = full(11, 16, true);
        let base: Vec<u32> = (0..48).collect();
        let mut r0 = Req::new(0, base.clone(), 16);
        admit(&mut c, &mut r0).unwrap();
        let mut r1 = Req::new(1, base.repeat(2), 16);
        assert_eq!(admit(&mut c, &mut r1).unwrap().0, [1, 2, 3]);
        c.free(r1.id).unwrap();
        let mut r2 = Req::new(2, (500..532).collect(), 16);
        admit(&mut c, &mut r2).unwrap();
        assert_eq!(c.pool().num_free_blocks(), 5);
        let r3 = Req::new(3, base.repeat(3), 16);
        let (hits, hit) = c
            .find_longest_cache_hit(&[GroupId(0)], &r3.hashes, 143, 16, false)
            .unwrap();
        assert_eq!(hit, 96);
        let res = c
            .allocate_slots(
                r3.id,
                &r3.view(),
                &AllocateArgs {
                    num_new_tokens: 48,
                    num_new_computed_tokens: 96,
                    num_lookahead_tokens: 0,
                    num_encoder_tokens: 0,
                    delay_cache_blocks: false,
                    num_external_computed_tokens: 0,
                },
                Some(&hits),
            )
            .unwrap();
        assert_eq!(res, None);
        assert_eq!(refs(&c, &ids(&hits[0])), [1, 1, 1, 0, 0, 0]);
        assert!(!c.contains(r3.id));
        c.check_invariants().unwrap();
    }

    #[test]
    fn reset_27() {
        let mut c = full(11, 16, true);
        let mut r0 = Req::new(0, (0..40).collect(), 16);
        let mut r1 = Req::new(1, (100..140).collect(), 16);
        admit(&mut c, &mut r0).unwrap();
        admit(&mut c, &mut r1).unwrap();
        assert!(!c.reset_prefix_cache());
        assert_eq!(c.pool().num_cached_keys(), 4);
        c.free(r0.id).unwrap();
        c.free(r1.id).unwrap();
        assert!(c.reset_prefix_cache());
        assert_eq!(c.pool().num_cached_keys(), 0);
        assert!(c.pool().cached_mask().all(|k| !k));
        c.check_invariants().unwrap();
    }

    #[test]
    fn admission_arguments_29() {
        let cfg = CoordinatorConfig::new(vec![GroupSpec::full_attention(16)], 11, true, 40);
        let mut c = CoordinatorCore::new(cfg).unwrap();
        let r = Req::new(0, (0..40).collect(), 16);
        let err = c
            .allocate_slots(
                r.id,
                &r.view(),
                &AllocateArgs {
                    num_new_tokens: 0,
                    num_new_computed_tokens: 0,
                    num_lookahead_tokens: 0,
                    num_encoder_tokens: 0,
                    delay_cache_blocks: false,
                    num_external_computed_tokens: 0,
                },
                None,
            )
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("num_new_tokens must be greater than 0"),
            "{err}"
        );
        let new = c
            .allocate_slots(
                r.id,
                &r.view(),
                &AllocateArgs {
                    num_new_tokens: 40,
                    num_new_computed_tokens: 0,
                    num_lookahead_tokens: 20,
                    num_encoder_tokens: 0,
                    delay_cache_blocks: false,
                    num_external_computed_tokens: 0,
                },
                None,
            )
            .unwrap()
            .unwrap();
        assert_eq!(new[0].len(), 3);
        let err = c
            .allocate_slots(
                r.id,
                &r.view(),
                &AllocateArgs {
                    num_new_tokens: 41,
                    num_new_computed_tokens: 0,
                    num_lookahead_tokens: 0,
                    num_encoder_tokens: 0,
                    delay_cache_blocks: false,
                    num_external_computed_tokens: 0,
                },
                None,
            )
            .unwrap_err();
        assert!(matches!(err, KvError::InvalidArgument { .. }));
        c.check_invariants().unwrap();
    }

    #[test]
    fn bad_input_is_refused_before_mutation() {
        let mut c = full(11, 16, true);
        let mut r0 = Req::new(0, (0..40).collect(), 16);
        admit(&mut c, &mut r0).unwrap();
        let r1 = Req::new(1, (0..40).collect(), 16);
        let before = queue(&c);
        // Wrong number of hit lists, out-of-range id, hits for a running request.
        assert!(c
            .allocate_slots(
                r1.id,
                &r1.view(),
                &AllocateArgs {
                    num_new_tokens: 8,
                    num_new_computed_tokens: 32,
                    num_lookahead_tokens: 0,
                    num_encoder_tokens: 0,
                    delay_cache_blocks: false,
                    num_external_computed_tokens: 0
                },
                Some(&[])
            )
            .is_err());
        let far = vec![vec![BlockId(99)]];
        assert!(c
            .allocate_slots(
                r1.id,
                &r1.view(),
                &AllocateArgs {
                    num_new_tokens: 24,
                    num_new_computed_tokens: 16,
                    num_lookahead_tokens: 0,
                    num_encoder_tokens: 0,
                    delay_cache_blocks: false,
                    num_external_computed_tokens: 0
                },
                Some(&far)
            )
            .is_err());
        let hit = vec![vec![BlockId(1)]];
        assert!(c
            .allocate_slots(
                r0.id,
                &r0.view(),
                &AllocateArgs {
                    num_new_tokens: 1,
                    num_new_computed_tokens: 16,
                    num_lookahead_tokens: 0,
                    num_encoder_tokens: 0,
                    delay_cache_blocks: false,
                    num_external_computed_tokens: 0
                },
                Some(&hit)
            )
            .is_err());
        // A partial-block hit.
        assert!(matches!(
            c.allocate_slots(
                r1.id,
                &r1.view(),
                &AllocateArgs {
                    num_new_tokens: 24,
                    num_new_computed_tokens: 8,
                    num_lookahead_tokens: 0,
                    num_encoder_tokens: 0,
                    delay_cache_blocks: false,
                    num_external_computed_tokens: 0
                },
                Some(&hit)
            ),
            Err(KvError::Unsupported { .. })
        ));
        assert_eq!(queue(&c), before);
        assert!(matches!(
            c.block_ids(r1.id),
            Err(KvError::UnknownRequest(_))
        ));
        assert!(matches!(
            c.cache_blocks(r1.id, &r1.view(), 16),
            Err(KvError::UnknownRequest(_))
        ));
        assert!(matches!(
            c.find_longest_cache_hit(&[GroupId(3)], &r1.hashes, 39, 16, false),
            Err(KvError::UnknownGroup(_))
        ));
        c.check_invariants().unwrap();
    }

    #[test]
    fn config_validation() {
        let mk = |groups: Vec<GroupSpec>, caching: bool| {
            CoordinatorCore::new(CoordinatorConfig::new(groups, 10, caching, 100))
        };
        assert!(mk(vec![], false).is_ok());
        assert!(mk(vec![], true).is_err());
        assert!(mk(
            vec![GroupSpec::full_attention(16), GroupSpec::mamba(16, 0)],
            true
        )
        .is_err());
        assert!(mk(
            vec![GroupSpec::full_attention(16), GroupSpec::mamba(16, 0)],
            false
        )
        .is_ok());
        assert!(mk(vec![GroupSpec::cross_attention(16)], true).is_err());
        assert!(mk(vec![GroupSpec::sliding_window(16, 0)], true).is_err());
        let mut cfg = CoordinatorConfig::new(vec![GroupSpec::full_attention(32)], 10, true, 100);
        cfg.hash_block_size = 16;
        assert!(CoordinatorCore::new(cfg.clone()).is_err());
        cfg.kind = CoordinatorKind::Hybrid;
        assert!(CoordinatorCore::new(cfg.clone()).is_ok());
        cfg.retention_interval = Some(32);
        assert!(CoordinatorCore::new(cfg).is_err());
        let mut cfg = CoordinatorConfig::new(
            vec![
                GroupSpec::full_attention(32),
                GroupSpec::sliding_window(16, 32),
            ],
            10,
            true,
            100,
        );
        assert_eq!(
            (cfg.scheduler_block_size, cfg.kind, cfg.hash_block_size),
            (32, CoordinatorKind::Hybrid, 16)
        );
        cfg.retention_interval = Some(33);
        assert!(CoordinatorCore::new(cfg.clone()).is_err());
        cfg.retention_interval = Some(64);
        assert!(CoordinatorCore::new(cfg).is_ok());
    }

    fn live_request(id: &str, len: u32, unit: usize) -> Request {
        use crate::hashing::{ExtraKeys, HashAlgo, HashConfig, RequestHasher};
        let config = HashConfig::new(HashAlgo::Native, unit, Some("t")).unwrap();
        Request::new(
            id.into(),
            (0..len).collect(),
            RequestHasher::new(config, ExtraKeys::default()),
        )
    }

    #[test]
    fn predictions_take_the_callers_prefill_end_under_sparse_retention() {
        // Full + Mamba "align" with a prefill checkpoint, retention 0: a
        // chunk reserves the checkpoint only when it reaches the prefill's
        // end. A 100-token prompt's first 32 tokens do not reach its own end
        // (100); they reach an end the caller puts at 32 (vLLM's coordinator
        // takes prefill_end from its caller).
        let specs = vec![
            GroupSpec::full_attention(16),
            GroupSpec::mamba_align(16, true, Some(16)),
        ];
        let predict = |retention, prefill_end| {
            let mut cfg = CoordinatorConfig::new(specs.clone(), 100, true, 1000);
            cfg.retention_interval = retention;
            let c = CoordinatorCore::new(cfg).unwrap();
            let r = live_request("a", 100, 16);
            let args = PredictArgs {
                prefill_end,
                ..PredictArgs::new(32)
            };
            c.num_blocks_to_allocate(&r, &[], &args).unwrap()
        };
        let own = predict(Some(0), None);
        assert_eq!(predict(Some(0), Some(100)), own);
        assert_eq!(predict(Some(0), Some(32)), own + 1);
        assert_eq!(predict(Some(0), Some(0)), own + 1);
        // Dense and interval retention never read it (as in vLLM).
        for retention in [None, Some(64)] {
            let dense = predict(retention, None);
            assert_eq!(predict(retention, Some(32)), dense);
        }
    }

    #[test]
    fn deferred_publication_caches_up_to_each_token_count() {
        // kvcoord.vllm's HiSparse host core: allocation never caches; the
        // coordinator publishes the durable prefix later, growing.
        use crate::events::KvEvent;
        let mut cfg = CoordinatorConfig::new(vec![GroupSpec::full_attention(4)], 8, true, 64);
        cfg.hash_block_size = 4;
        cfg.enable_events = true;
        let mut c = CoordinatorCore::new(cfg).unwrap();
        let r = live_request("a", 13, 4);
        let mut out = NewBlocks::new();
        let args = AllocateArgs {
            delay_cache_blocks: true,
            ..AllocateArgs::new(13)
        };
        assert!(c.allocate_request(&r, &args, None, &mut out).unwrap());
        assert!(
            c.pool_mut().take_events().is_empty(),
            "nothing published yet"
        );
        let hit = |c: &CoordinatorCore| {
            c.find_longest_cache_hit(&[GroupId(0)], r.block_hashes(), 12, 4, false)
                .unwrap()
                .1
        };
        assert_eq!(hit(&c), 0);
        c.cache_request(&r, 4).unwrap();
        assert_eq!(hit(&c), 4);
        c.cache_request(&r, 12).unwrap();
        assert_eq!(hit(&c), 12);
        c.cache_request(&r, 12).unwrap(); // again: nothing new
        let stored: Vec<(usize, usize)> = c
            .pool_mut()
            .take_events()
            .iter()
            .map(|e| match e {
                KvEvent::BlockStored(s) => (s.first_block, s.num_blocks),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(stored, vec![(0, 1), (1, 2)]);
        c.check_invariants().unwrap();
    }

    #[test]
    fn group_id_base_and_medium_are_what_events_report() {
        use crate::events::{KvEvent, Medium};
        let mut cfg = CoordinatorConfig::new(vec![GroupSpec::full_attention(4)], 8, true, 64);
        cfg.hash_block_size = 4;
        cfg.enable_events = true;
        cfg.group_id_base = 1;
        cfg.event_medium = Medium::Cpu;
        let mut c = CoordinatorCore::new(cfg).unwrap();
        let r = live_request("a", 9, 4);
        let mut out = NewBlocks::new();
        assert!(c
            .allocate_request(&r, &AllocateArgs::new(9), None, &mut out)
            .unwrap());
        c.cache_request(&r, 8).unwrap();
        let events = c.pool_mut().take_events();
        let KvEvent::BlockStored(stored) = &events[0] else {
            panic!("{events:?}");
        };
        assert_eq!((stored.group, stored.medium), (GroupId(1), Medium::Cpu));
        // Keys inside the core keep the core's own group ids: lookups hit.
        let (_, hit) = c
            .find_longest_cache_hit(&[GroupId(0)], r.block_hashes(), 8, 4, false)
            .unwrap();
        assert_eq!(hit, 8);
        let first = out.group(0)[0];
        let key = c.pool().cache_key(first).unwrap().unwrap();
        assert_eq!(c.pool().reported_group(key.group), GroupId(1));
        assert!(c.free_request("a").unwrap());
        c.pool_mut().evict_blocks(&[first]).unwrap();
        let events = c.pool_mut().take_events();
        assert!(matches!(
            events.as_slice(),
            [KvEvent::BlockRemoved {
                group: GroupId(1),
                medium: Medium::Cpu,
                ..
            }]
        ));
        c.check_invariants().unwrap();
    }

    #[test]
    fn sub_block_mamba_states_are_keyed_copied_and_hit() {
        // Full B = 4 beside Mamba "align" B = 16, hash unit 4: partial hits.
        let mut cfg = CoordinatorConfig::new(
            vec![
                GroupSpec::full_attention(4),
                GroupSpec::mamba_align(16, false, None),
            ],
            40,
            true,
            1000,
        );
        cfg.hash_block_size = 4;
        assert!(!cfg.partial_hits(), "off unless allowed");
        cfg.allow_partial_hits = true;
        assert!(cfg.partial_hits());
        assert_eq!(cfg.hit_alignment(), 4);
        // Caching is not rounded to the scheduler block (16).
        assert_eq!(cfg.num_cacheable_tokens(GroupId(1), 20), 20);
        let mut c = CoordinatorCore::new(cfg).unwrap();
        // A 25-token prompt: its last hash boundary (24) is inside block 1.
        let mut r = live_request("a", 25, 4);
        let mut out = NewBlocks::new();
        assert!(c
            .allocate_request(&r, &AllocateArgs::new(24), None, &mut out)
            .unwrap());
        let state = *out.group(1).last().unwrap();
        let key = c.pool().cache_key(state).unwrap().unwrap();
        assert_eq!(key.hash, r.block_hashes()[5]);
        assert_eq!(c.pool().primary_key_tokens(state).unwrap(), Some(24));
        r.set_num_computed_tokens(24).unwrap();
        c.new_step_starts();
        // The next step copies the state out; the keys move to the copy.
        let free_before = c.pool().num_free_blocks();
        assert!(c
            .allocate_request(&r, &AllocateArgs::new(1), None, &mut out)
            .unwrap());
        assert!(out.group(1).is_empty(), "the copy is not in the table");
        let copies = c.take_block_copies();
        assert_eq!(copies.len(), 1);
        let (src, dst) = copies[0];
        assert_eq!(src, state);
        assert_eq!(c.pool().cache_key(src).unwrap(), None);
        assert_eq!(c.pool().cache_key(dst).unwrap(), Some(key));
        assert_eq!(
            c.pool().num_free_blocks(),
            free_before - 2,
            "the copy and a full block"
        );
        assert_eq!(c.num_caller_references(), 2, "both ends held for the copy");
        let offloads = c.take_boundary_state_offloads();
        assert_eq!(
            offloads.last().map(|o| (o.block, o.num_tokens)),
            Some((dst, 24))
        );
        c.check_invariants().unwrap();
        r.set_num_computed_tokens(25).unwrap();
        assert!(c
            .finalize_partial_tail_offloads("a", 25, 0)
            .unwrap()
            .is_empty());
        c.free_caller_blocks(&[src, dst]).unwrap();
        assert!(c.free_request("a").unwrap());
        c.new_step_starts();
        // The same prompt again hits the copy at 24 tokens, inside its block.
        let r2 = live_request("b", 25, 4);
        let (hits, n) = c
            .find_longest_cache_hit(&[GroupId(1)], r2.block_hashes(), 24, 4, false)
            .unwrap();
        assert_eq!((n, hits[0].clone()), (24, vec![BlockId::NULL, dst]));
        let (full_hits, m) = c
            .find_longest_cache_hit(&[GroupId(0)], r2.block_hashes(), 24, 4, false)
            .unwrap();
        assert_eq!(m, 24);
        let lists = vec![full_hits[0].clone(), hits[0].clone()];
        assert!(c
            .allocate_request(
                &r2,
                &AllocateArgs::with_hit(1, 24),
                Some(lists.as_slice()),
                &mut out
            )
            .unwrap());
        // The new request's table takes a private copy of the hit state.
        let copies = c.take_block_copies();
        assert_eq!(copies.len(), 1);
        assert_eq!(copies[0].0, dst);
        assert_eq!(out.group(1)[0], copies[0].1);
        assert_eq!(c.request_block_ids("b").unwrap()[1][1], copies[0].1);
        c.check_invariants().unwrap();
    }

    #[test]
    fn sub_block_checkpoint_is_rekeyed_at_its_boundary() {
        // Full B = 4 beside Mamba "align" B = 16 with a prefill checkpoint
        // (alignment 4), hash unit 4: a 30-token prompt in one chunk
        // exports the state at 28 into the block before the running one
        // (column 0), whose full key at 16 is replaced by the key at 28, as
        // vLLM's _cache_partial_tail_block; the hand-off covers 28 tokens.
        let mut cfg = CoordinatorConfig::new(
            vec![
                GroupSpec::full_attention(4),
                GroupSpec::mamba_align(16, true, Some(4)),
            ],
            40,
            true,
            1000,
        );
        cfg.hash_block_size = 4;
        cfg.allow_partial_hits = true;
        let mut c = CoordinatorCore::new(cfg).unwrap();
        let r = live_request("a", 30, 4);
        let mut out = NewBlocks::new();
        assert!(c
            .allocate_request(&r, &AllocateArgs::new(30), None, &mut out)
            .unwrap());
        let table = c.request_block_ids("a").unwrap()[1].to_vec();
        assert_eq!(table.len(), 2, "checkpoint block, running state");
        let checkpoint = table[0];
        let key = c.pool().cache_key(checkpoint).unwrap().unwrap();
        assert_eq!(key.hash, r.block_hashes()[6]);
        assert_eq!(c.pool().key_num_tokens(checkpoint).unwrap(), Some(28));
        assert_eq!(c.pool().lookup(&r.block_hashes()[3], GroupId(1)), None);
        let offloads: Vec<_> = c
            .take_boundary_state_offloads()
            .into_iter()
            .map(|o| (o.block, o.num_tokens))
            .collect();
        assert_eq!(offloads, vec![(checkpoint, 28)]);
        c.new_step_starts();
        // The same prompt again: the hit is the checkpoint, at 28 tokens
        // (in the entry of the block holding token 28).
        let r2 = live_request("b", 30, 4);
        let (hits, n) = c
            .find_longest_cache_hit(&[GroupId(1)], r2.block_hashes(), 29, 4, false)
            .unwrap();
        assert_eq!((n, hits[0].clone()), (28, vec![BlockId::NULL, checkpoint]));
        c.check_invariants().unwrap();
    }

    #[test]
    fn mamba_boundary_offloads() {
        // Full B = 16 beside Mamba "align" B = 16: each chunk that ends on a
        // block boundary commits the Mamba state there, handed off once.
        let cfg = CoordinatorConfig::new(
            vec![
                GroupSpec::full_attention(16),
                GroupSpec::mamba_align(16, false, None),
            ],
            40,
            true,
            1000,
        );
        let mut c = CoordinatorCore::new(cfg).unwrap();
        let mut r = live_request("a", 64, 16);
        let mut out = NewBlocks::new();
        let mut states = Vec::new();
        for end in [16, 32, 48] {
            assert!(c
                .allocate_request(&r, &AllocateArgs::new(16), None, &mut out)
                .unwrap());
            states.push(*out.group(1).last().unwrap());
            r.set_num_computed_tokens(end).unwrap();
            let taken = c.take_boundary_state_offloads();
            assert_eq!(taken.len(), 1, "one state per chunk");
            let o = taken[0];
            assert_eq!(c.request_name(o.req), Some("a"));
            assert_eq!(
                (o.group, o.block, o.num_tokens),
                (GroupId(1), states[states.len() - 1], end)
            );
            // Drained: a second take is empty.
            assert!(c.take_boundary_state_offloads().is_empty());
            c.new_step_starts();
        }
        // A freed request's hand-offs not yet taken are dropped.
        let r2 = live_request("b", 40, 16);
        assert!(c
            .allocate_request(&r2, &AllocateArgs::new(32), None, &mut out)
            .unwrap());
        assert!(c.free_request("b").unwrap());
        assert!(c.take_boundary_state_offloads().is_empty());
        // Caching off: nothing is handed off.
        let cfg = CoordinatorConfig::new(
            vec![GroupSpec::mamba_align(16, false, None)],
            40,
            false,
            1000,
        );
        let mut c = CoordinatorCore::new(cfg).unwrap();
        let r = live_request("c", 64, 16);
        assert!(c
            .allocate_request(&r, &AllocateArgs::new(32), None, &mut out)
            .unwrap());
        assert!(c.take_boundary_state_offloads().is_empty());
        c.check_invariants().unwrap();
    }

    #[test]
    fn external_tokens_allocate_like_vllm() {
        // Full B = 4 + SWA B = 4 (W = 8); a new request with 24 external
        // tokens and 8 new ones: every group's external blocks come before
        // any group's new blocks; SWA skips the 4 blocks before its window.
        let cfg = CoordinatorConfig::new(
            vec![
                GroupSpec::full_attention(4),
                GroupSpec::sliding_window(4, 8),
            ],
            100,
            true,
            1000,
        );
        let mut c = CoordinatorCore::new(cfg).unwrap();
        let r = live_request("a", 40, 4);
        let args = AllocateArgs {
            num_external_computed_tokens: 24,
            ..AllocateArgs::new(8)
        };
        let mut out = NewBlocks::new();
        assert!(c.allocate_request(&r, &args, None, &mut out).unwrap());
        // Returned: the new blocks only (vLLM's result).
        assert_eq!(
            (ids(out.group(0)), ids(out.group(1))),
            (vec![9, 10], vec![11, 12])
        );
        let tables = c.request_block_ids("a").unwrap();
        assert_eq!(ids(tables[0]), (1..=6).chain(9..=10).collect::<Vec<_>>());
        assert_eq!(ids(tables[1]), vec![0, 0, 0, 0, 7, 8, 11, 12]);
        // Mamba groups refuse external tokens before any change.
        let cfg = CoordinatorConfig::new(
            vec![GroupSpec::full_attention(4), GroupSpec::mamba(4, 0)],
            100,
            false,
            1000,
        );
        let mut c = CoordinatorCore::new(cfg).unwrap();
        let free = c.pool().num_free_blocks();
        assert!(c.allocate_request(&r, &args, None, &mut out).is_err());
        assert_eq!((c.pool().num_free_blocks(), c.num_requests()), (free, 0));
    }

    #[test]
    fn mamba_align_external_tokens_after_a_lagging_hit() {
        // Full B = 4 beside Mamba "align" B = 4. A 9-token prompt caches two
        // full-attention blocks and no state (its chunk ends mid-block).
        let cfg = CoordinatorConfig::new(
            vec![
                GroupSpec::full_attention(4),
                GroupSpec::mamba_align(4, false, None),
            ],
            30,
            true,
            1000,
        );
        let mut c = CoordinatorCore::new(cfg).unwrap();
        let mut out = NewBlocks::new();
        let r0 = live_request("a", 9, 4);
        assert!(c
            .allocate_request(&r0, &AllocateArgs::new(9), None, &mut out)
            .unwrap());
        assert!(c.free_request("a").unwrap());
        let r1 = live_request("b", 14, 4);
        let (fa, hit) = c
            .find_longest_cache_hit(&[GroupId(0)], r1.block_hashes(), 13, 4, false)
            .unwrap();
        assert_eq!(hit, 8);
        let hits = vec![fa[0].clone(), Vec::new()];
        // Without external tokens the Mamba group must hit too.
        let local = AllocateArgs {
            num_new_computed_tokens: 8,
            ..AllocateArgs::new(6)
        };
        let free = c.pool().num_free_blocks();
        assert!(c
            .allocate_request(&r1, &local, Some(&hits), &mut out)
            .is_err());
        assert_eq!((c.pool().num_free_blocks(), c.num_requests()), (free, 0));
        // With 4 external tokens (a connector supplies the state at 12):
        // Mamba nulls the 2 blocks below the last computed token's, then
        // one block for the external tokens and one for the new ones.
        let external = AllocateArgs {
            num_external_computed_tokens: 4,
            ..AllocateArgs::new(2)
        };
        let args = AllocateArgs {
            num_new_computed_tokens: 8,
            ..external
        };
        assert!(c
            .allocate_request(&r1, &args, Some(&hits), &mut out)
            .unwrap());
        let tables = c.request_block_ids("b").unwrap();
        assert_eq!(&tables[0][..2], &hits[0][..]);
        assert_eq!(tables[0].len(), 4);
        let nulls: Vec<bool> = tables[1].iter().map(|b| b.is_null()).collect();
        assert_eq!(nulls, [true, true, false, false]);
        c.check_invariants().unwrap();
    }

    #[test]
    fn external_tokens_keep_a_longer_full_attention_hit() {
        // Full attention B = 4: a 16-token prompt caches 4 blocks. A request
        // with no local hit whose connector imports 10 tokens keeps the
        // first cdiv(10, 4) = 3 blocks of its pool's longer hit (vLLM's
        // retained hit: those blocks hold the imported tokens) and takes
        // new blocks only past them; more than the import covers is refused.
        let cfg = CoordinatorConfig::new(vec![GroupSpec::full_attention(4)], 30, true, 1000);
        let mut c = CoordinatorCore::new(cfg).unwrap();
        let mut out = NewBlocks::new();
        let r0 = live_request("a", 16, 4);
        assert!(c
            .allocate_request(&r0, &AllocateArgs::new(16), None, &mut out)
            .unwrap());
        assert!(c.free_request("a").unwrap());
        let r1 = live_request("b", 16, 4);
        let (found, hit) = c
            .find_longest_cache_hit(&[GroupId(0)], r1.block_hashes(), 15, 4, false)
            .unwrap();
        assert_eq!((found[0].len(), hit), (3, 12));
        let args = AllocateArgs {
            num_external_computed_tokens: 10,
            ..AllocateArgs::new(2)
        };
        let free = c.pool().num_free_blocks();
        let too_long = vec![found[0].iter().copied().chain([found[0][0]]).collect()];
        assert!(c
            .allocate_request(&r1, &args, Some(&too_long), &mut out)
            .is_err());
        assert_eq!((c.pool().num_free_blocks(), c.num_requests()), (free, 0));
        let hits = vec![found[0].clone()];
        assert!(c
            .allocate_request(&r1, &args, Some(&hits), &mut out)
            .unwrap());
        let tables = c.request_block_ids("b").unwrap();
        assert_eq!(&tables[0][..3], &hits[0][..]);
        assert_eq!(tables[0].len(), 3);
        // Without external tokens the hit must match the local tokens.
        assert!(c.free_request("b").unwrap());
        let r2 = live_request("c", 16, 4);
        assert!(c
            .allocate_request(&r2, &AllocateArgs::new(2), Some(&hits), &mut out)
            .is_err());
        c.check_invariants().unwrap();
    }

    #[test]
    fn admission_capped_prediction() {
        // Full B = 4, SWA B = 4 (W = 8), chunked local B = 4 (chunk 8),
        // max_model_len 1000; a 100-token request needs 25 blocks per group.
        let cfg = CoordinatorConfig::new(
            vec![
                GroupSpec::full_attention(4),
                GroupSpec::sliding_window(4, 8),
                GroupSpec::chunked_local(4, 8),
            ],
            200,
            true,
            1000,
        );
        let mut c = CoordinatorCore::new(cfg).unwrap();
        let r = live_request("a", 100, 4);
        // A prediction under vLLM's admission check, 16 tokens in flight.
        let capped = |num_tokens, total_computed_tokens| PredictArgs {
            total_computed_tokens,
            max_in_flight_tokens: Some(16),
            ..PredictArgs::new(num_tokens)
        };
        assert_eq!(
            c.num_blocks_to_allocate(&r, &[], &PredictArgs::new(100))
                .unwrap(),
            75
        );
        // 16 tokens in flight: SWA holds cdiv(7 + 16, 4) + 1 = 7 blocks at
        // most, chunked local cdiv(8 + 16, 4) = 6; full attention is not capped.
        assert_eq!(
            c.num_blocks_to_allocate(&r, &[], &capped(100, 0)).unwrap(),
            25 + 7 + 6
        );
        // The cap never exceeds what max_model_len allows.
        let m = &c.managers()[1];
        assert_eq!(m.max_admission_blocks(10_000, 1000), Some(251));
        assert_eq!(
            c.managers()[2].max_admission_blocks(10_000, 1000),
            Some(250)
        );
        assert_eq!(c.managers()[0].max_admission_blocks(16, 1000), None);
        // Below the cap the prediction is the uncapped one.
        assert_eq!(c.num_blocks_to_allocate(&r, &[], &capped(8, 0)).unwrap(), 6);
        // A running request: only the blocks past its table (capped likewise);
        // nothing changed by the predictions.
        let free = c.pool().num_free_blocks();
        let mut out = NewBlocks::new();
        assert!(c
            .allocate_request(&r, &AllocateArgs::new(24), None, &mut out)
            .unwrap());
        assert_eq!(c.pool().num_free_blocks(), free - 18);
        assert_eq!(
            c.num_blocks_to_allocate(&r, &[], &capped(100, 24)).unwrap(),
            19 + 1
        );
        assert_eq!(c.pool().num_free_blocks(), free - 18);
        // Bad hit lists are refused.
        assert!(c
            .num_blocks_to_allocate(&r, &[vec![BlockId(1)]], &PredictArgs::new(8))
            .is_err());
        assert!(c
            .num_blocks_to_allocate(
                &r,
                &[vec![], vec![], vec![BlockId(9999)]],
                &PredictArgs::new(8)
            )
            .is_err());
        // Released blocks: an unknown id holds nothing; a known one drops
        // the SWA and chunked-local blocks before the window.
        assert!(!c.remove_skipped_request("nobody", 24, None).unwrap());
        assert!(c.remove_skipped_request("a", 24, None).unwrap());
        assert_eq!(c.pool().num_free_blocks(), free - 18 + 4 + 6);
    }

    #[test]
    fn hybrid_swa_cacheable_clamp_53_and_masks_54() {
        // Full B = 32 + SWA B = 16 (W = 32), hash unit 16: a 112-token prompt
        // caches full blocks 0-2 and SWA blocks 0-5 (dense masks keep all of
        // them: need = 2 blocks = one 32-token segment).
        let mut cfg = CoordinatorConfig::new(
            vec![
                GroupSpec::full_attention(32),
                GroupSpec::sliding_window(16, 32),
            ],
            100,
            true,
            1000,
        );
        cfg.hash_block_size = 16;
        let mut c = CoordinatorCore::new(cfg).unwrap();
        let r = Req::new(0, (0..112).collect(), 16);
        let new = c
            .allocate_slots(
                r.id,
                &r.view(),
                &AllocateArgs {
                    num_new_tokens: 112,
                    num_new_computed_tokens: 0,
                    num_lookahead_tokens: 0,
                    num_encoder_tokens: 0,
                    delay_cache_blocks: false,
                    num_external_computed_tokens: 0,
                },
                None,
            )
            .unwrap()
            .unwrap();
        assert_eq!((new[0].len(), new[1].len()), (4, 7));
        let cached = |b: &[BlockId]| {
            b.iter()
                .map(|&x| c.pool().is_cached(x).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(cached(&new[0]), [true, true, true, false]);
        assert_eq!(cached(&new[1]), [true, true, true, true, true, true, false]);
        // Lookups: 96 tokens in each bucket.
        let (hits, hit) = c
            .find_longest_cache_hit(&[GroupId(0)], &r.hashes, 111, 32, false)
            .unwrap();
        assert_eq!((hit, hits[0].len()), (96, 3));
        let (hits, hit) = c
            .find_longest_cache_hit(&[GroupId(1)], &r.hashes, 96, 32, false)
            .unwrap();
        assert_eq!((hit, hits[0].len()), (96, 6));
        assert!(hits[0][..4].iter().all(|b| b.is_null()));
        c.check_invariants().unwrap();

        // Full B = 32 + SWA B = 8 (W = 8), hash unit 8: dense caching keeps
        // SWA blocks {3, 7} of a 64-token prompt; retention 0 keeps {11}
        // of a 128-token prompt.
        for (retention, len, expect) in [
            (None, 64usize, vec![3usize, 7]),
            (Some(0), 128, vec![11]),
            (Some(64), 128, vec![7, 11, 15]),
        ] {
            let mut cfg = CoordinatorConfig::new(
                vec![
                    GroupSpec::full_attention(32),
                    GroupSpec::sliding_window(8, 8),
                ],
                100,
                true,
                1000,
            );
            cfg.hash_block_size = 8;
            cfg.retention_interval = retention;
            let mut c = CoordinatorCore::new(cfg).unwrap();
            let r = Req::new(0, (0..len as u32).collect(), 8);
            let new = c
                .allocate_slots(
                    r.id,
                    &r.view(),
                    &AllocateArgs {
                        num_new_tokens: len,
                        num_new_computed_tokens: 0,
                        num_lookahead_tokens: 0,
                        num_encoder_tokens: 0,
                        delay_cache_blocks: false,
                        num_external_computed_tokens: 0,
                    },
                    None,
                )
                .unwrap()
                .unwrap();
            let keyed: Vec<usize> = (0..new[1].len())
                .filter(|&i| c.pool().is_cached(new[1][i]).unwrap())
                .collect();
            assert_eq!(keyed, expect, "retention {retention:?}");
            c.check_invariants().unwrap();
        }
    }

    #[test]
    fn mamba_and_cross_attention_without_caching() {
        let cfg = CoordinatorConfig::new(
            vec![
                GroupSpec::full_attention(4),
                GroupSpec::mamba(4, 1),
                GroupSpec::cross_attention(4),
            ],
            40,
            false,
            1000,
        );
        assert_eq!(cfg.kind, CoordinatorKind::NoPrefixCache);
        let mut c = CoordinatorCore::new(cfg).unwrap();
        let mut r = Req::new(0, (0..10).collect(), 4);
        let new = c
            .allocate_slots(
                r.id,
                &r.view(),
                &AllocateArgs {
                    num_new_tokens: 10,
                    num_new_computed_tokens: 0,
                    num_lookahead_tokens: 0,
                    num_encoder_tokens: 6,
                    delay_cache_blocks: false,
                    num_external_computed_tokens: 0,
                },
                None,
            )
            .unwrap()
            .unwrap();
        assert_eq!(new.iter().map(Vec::len).collect::<Vec<_>>(), [3, 4, 2]);
        r.computed = 10;
        r.tokens.push(7);
        let new = c
            .allocate_slots(
                r.id,
                &r.view(),
                &AllocateArgs {
                    num_new_tokens: 1,
                    num_new_computed_tokens: 0,
                    num_lookahead_tokens: 0,
                    num_encoder_tokens: 6,
                    delay_cache_blocks: false,
                    num_external_computed_tokens: 0,
                },
                None,
            )
            .unwrap()
            .unwrap();
        assert_eq!(new.iter().map(Vec::len).collect::<Vec<_>>(), [0, 0, 0]);
        // Mamba kept only the block of the last computed token (+ scratch).
        assert_eq!(c.tables(r.id).unwrap()[1].num_leading_nulls(), 2);
        c.remove_skipped_blocks(r.id, 13, None).unwrap();
        assert_eq!(c.tables(r.id).unwrap()[1].num_leading_nulls(), 3);
        assert!(c.remove_skipped_blocks(ReqId(9), 13, None).is_err());
        c.check_invariants().unwrap();
        c.free(r.id).unwrap();
        assert_eq!(c.pool().num_free_blocks(), 39);
        assert_eq!(c.num_requests(), 0);
    }

    #[test]
    fn eagle_replay_boundaries() {
        let mut out = [0usize; 4];
        let n = replay_boundaries(50, 16, false, &mut out);
        assert_eq!(&out[..n], &[49]);
        // Unaligned prompt: the resend and a longer sibling agree.
        let n = replay_boundaries(50, 16, true, &mut out);
        assert_eq!(&out[..n], &[32]);
        // Aligned prompt: the resend stops a block below the sibling.
        let n = replay_boundaries(48, 16, true, &mut out);
        assert_eq!(&out[..n], &[16, 32]);
        let n = replay_boundaries(10, 16, true, &mut out);
        assert_eq!(&out[..n], &[0]);
        assert_eq!(replay_boundaries(0, 16, false, &mut out), 0);
    }

    #[test]
    fn eagle_groups_join_by_spec_and_are_checked() {
        let specs = vec![
            GroupSpec::full_attention(16),
            GroupSpec::sliding_window(16, 32),
            GroupSpec::sliding_window(16, 32),
        ];
        let mut config = CoordinatorConfig::new(specs, 64, true, 1024);
        config.eagle_groups = vec![GroupId(2)];
        let c = CoordinatorCore::new(config.clone()).unwrap();
        let flags: Vec<bool> = c.managers().iter().map(Manager::eagle).collect();
        assert_eq!(flags, vec![false, true, true]);
        // Only EAGLE groups may drop.
        let err = c.find_longest_cache_hit(&[GroupId(0)], &[], 32, 16, true);
        assert!(err.is_err());
        assert!(c
            .find_longest_cache_hit(&[GroupId(1), GroupId(2)], &[], 32, 16, true)
            .is_ok());
        config.eagle_groups = vec![GroupId(3)];
        let err = CoordinatorCore::new(config).unwrap_err();
        assert!(err.to_string().contains("eagle_group_ids"), "{err}");
    }

    #[test]
    fn reprefillable_tail_held_back_per_group() {
        // Unitary, B = 4, R = 2: all but the tail.
        let mut cfg = CoordinatorConfig::new(vec![GroupSpec::full_attention(4)], 10, true, 100);
        cfg.num_reprefillable_tokens = 2;
        let g0 = GroupId(0);
        assert_eq!(cfg.num_cacheable_tokens(g0, 11), 9);
        assert_eq!(cfg.num_cacheable_tokens(g0, 1), 0);
        assert_eq!(cfg.num_held_back_tokens(g0), 2);
        // Hybrid full 4 + full 8 (scheduler block 8), R = 3: no EAGLE group
        // caches the aligned prefix, tail included.
        let mut cfg = CoordinatorConfig::new(
            vec![GroupSpec::full_attention(4), GroupSpec::full_attention(8)],
            10,
            true,
            100,
        );
        cfg.hash_block_size = 4;
        cfg.num_reprefillable_tokens = 3;
        for g in [GroupId(0), GroupId(1)] {
            assert_eq!(cfg.num_cacheable_tokens(g, 17), 16);
            assert_eq!(cfg.num_cacheable_tokens(g, 7), 0);
            assert_eq!(cfg.num_held_back_tokens(g), 0);
        }
        // Group 0 an EAGLE group: final tokens (17 - 3 = 14) up to one of its
        // blocks past their aligned prefix (8 + 4 = 12); nothing while the
        // aligned prefix of all tokens is empty.
        cfg.eagle_groups = vec![GroupId(0)];
        assert_eq!(cfg.num_cacheable_tokens(GroupId(0), 17), 12);
        assert_eq!(cfg.num_cacheable_tokens(GroupId(0), 13), 10);
        assert_eq!(cfg.num_cacheable_tokens(GroupId(0), 7), 0);
        // 9 tokens: 6 final ones, one block past their empty aligned prefix.
        assert_eq!(cfg.num_cacheable_tokens(GroupId(0), 9), 4);
        assert_eq!(cfg.num_cacheable_tokens(GroupId(1), 17), 16);
        assert_eq!(cfg.num_held_back_tokens(GroupId(0)), 3);
        assert_eq!(cfg.eagle_group_ids().collect::<Vec<_>>(), vec![GroupId(0)]);
        assert_eq!(cfg.held_back_tokens().collect::<Vec<_>>(), vec![3, 0]);
        assert_eq!(cfg.checked_cacheable_tokens(GroupId(1), 17), Ok(16));
        assert_eq!(
            cfg.checked_cacheable_tokens(GroupId(2), 17),
            Err(KvError::UnknownGroup(GroupId(2)))
        );
        // Caching off: nothing is held back.
        cfg.kind = CoordinatorKind::NoPrefixCache;
        assert_eq!(cfg.num_held_back_tokens(GroupId(0)), 0);
        // Out-of-range EAGLE groups and huge tails are refused.
        cfg.kind = CoordinatorKind::Hybrid;
        cfg.eagle_groups = vec![GroupId(2)];
        assert!(matches!(
            cfg.validate(),
            Err(KvError::InvalidConfig {
                name: "eagle_group_ids",
                ..
            })
        ));
        cfg.eagle_groups.clear();
        cfg.num_reprefillable_tokens = crate::limits::MAX_TOKENS;
        assert!(cfg.validate().is_err());
    }

    #[test]
    fn caching_holds_back_the_tail_group_by_group() {
        // An EAGLE full group of B = 4 beside a full group of B = 8
        // (scheduler block 8), R = 2, an 18-token prompt. After 16 tokens
        // the plain group caches the aligned 16 whatever the tail (2
        // blocks; holding the tail back would leave 1), the EAGLE group the
        // 14 final tokens (3 blocks).
        let mut cfg = CoordinatorConfig::new(
            vec![GroupSpec::full_attention(4), GroupSpec::full_attention(8)],
            20,
            true,
            100,
        );
        cfg.hash_block_size = 4;
        cfg.num_reprefillable_tokens = 2;
        cfg.eagle_groups = vec![GroupId(0)];
        let mut c = CoordinatorCore::new(cfg).unwrap();
        let mut r = Req::new(0, (0..18).collect(), 4);
        let cached = |c: &CoordinatorCore| {
            let tables = c.block_ids(ReqId(0)).unwrap();
            tables
                .iter()
                .map(|t| {
                    t.iter()
                        .filter(|&&x| c.pool().is_cached(x).unwrap())
                        .count()
                })
                .collect::<Vec<_>>()
        };
        c.allocate_slots(r.id, &r.view(), &AllocateArgs::new(16), None)
            .unwrap()
            .unwrap();
        assert_eq!(cached(&c), [3, 2]);
        // The rest of the prompt: 16 final tokens, 4 blocks of the EAGLE group.
        r.computed = 16;
        c.allocate_slots(r.id, &r.view(), &AllocateArgs::new(2), None)
            .unwrap()
            .unwrap();
        assert_eq!(cached(&c), [4, 2]);
        c.check_invariants().unwrap();
    }

    #[test]
    fn entry_points_refuse_counts_past_the_token_range() {
        use crate::hashing::{ExtraKeys, HashAlgo, HashConfig, RequestHasher};
        use crate::managers::GroupSpec;
        use crate::request::Request;

        let mut config = CoordinatorConfig::new(vec![GroupSpec::full_attention(4)], 64, true, 1024);
        config.hash_block_size = 4;
        let mut c = CoordinatorCore::new(config).unwrap();
        let hash = HashConfig::new(HashAlgo::Native, 4, Some("t")).unwrap();
        let r = Request::new(
            "a".into(),
            (0..9).collect(),
            RequestHasher::new(hash, ExtraKeys::default()),
        );
        let mut out = NewBlocks::new();
        assert!(c
            .allocate_request(&r, &AllocateArgs::new(9), None, &mut out)
            .unwrap());
        let before = c.clone();
        for bad in [crate::limits::MAX_TOKENS, usize::MAX] {
            assert!(c.cache_request(&r, bad).is_err());
            assert!(c
                .num_blocks_to_allocate(&r, &[], &PredictArgs::new(bad))
                .is_err());
            let past = PredictArgs {
                prefill_end: Some(bad),
                ..PredictArgs::new(1)
            };
            assert!(c.num_blocks_to_allocate(&r, &[], &past).is_err());
            assert!(c.remove_skipped_request("a", bad, None).is_err());
            assert!(c.remove_skipped_request("a", 1, Some(bad)).is_err());
            assert!(c.finalize_partial_tail_offloads("a", bad, 0).is_err());
            assert!(c.finalize_partial_tail_offloads("a", 0, bad).is_err());
            assert!(c
                .config()
                .checked_cacheable_tokens(crate::GroupId(0), bad)
                .is_err());
            let hashes = r.block_hashes();
            assert!(c
                .find_longest_cache_hit(&[crate::GroupId(0)], hashes, bad, 4, false)
                .is_err());
            assert!(c
                .find_longest_cache_hit(&[crate::GroupId(0)], hashes, 8, bad, false)
                .is_err());
        }
        assert_eq!(c.pool().num_free_blocks(), before.pool().num_free_blocks());
        c.check_invariants().unwrap();
        let last = crate::limits::MAX_TOKENS - 1;
        assert!(c
            .num_blocks_to_allocate(&r, &[], &PredictArgs::new(last))
            .is_ok());
        assert_eq!(
            c.config().checked_cacheable_tokens(crate::GroupId(0), last),
            Ok(last)
        );
    }
}
