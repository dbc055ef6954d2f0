//! [`CoordinatorConfig`]: what a coordinator is built from, the one place
//! its rules are checked ([`CoordinatorConfig::validate`]), and what follows
//! from it (the coordinator policy, the hit alignment, how many tokens each
//! group may cache).
//!
//! Invariant: a [`CoordinatorCore`](super::CoordinatorCore) is only built
//! from a config that validated; every derived number below assumes it.

use crate::error::{KvError, KvResult};
use crate::events::Medium;
use crate::ids::GroupId;
use crate::managers::mamba_align;
use crate::retention::validate_retention_interval;
use crate::spec::{GroupSpec, SpecKind};

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

/// Construction parameters of a [`CoordinatorCore`](super::CoordinatorCore).
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
    /// the copy
    /// ([`CoordinatorCore::take_block_copies`](super::CoordinatorCore::take_block_copies)),
    /// which a caller
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
