//! Single-type managers: the per-group rules of vLLM 0.33.0's
//! `SingleTypeKVCacheManager` family (hit finders, skipped-block removal,
//! allocation prediction, caching, freeing).
//!
//! A [`Manager`] is stateless apart from its group's spec: the per-request
//! state of one group is a [`GroupTable`] that the coordinator owns (one map
//! lookup per request and step instead of one per group). Dispatch is a
//! `match` on [`SpecKind`]; the kind-specific pieces live in one file each.

pub mod chunked_local;
pub mod cross_attention;
pub mod full_attention;
pub mod hisparse;
pub mod mamba;
pub mod mamba_align;
pub mod mla_attention;
pub mod rswa;
pub mod sliding_window;
pub mod sliding_window_mla;

use crate::block_hash::BlockHash;
use crate::error::{KvError, KvResult};
use crate::ids::{BlockId, GroupId};
use crate::pool::BlockPool;

/// What kind of KV cache a group holds, with its kind-specific parameters.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum SpecKind {
    /// Every token attends to every earlier token.
    FullAttention,
    /// Each token attends to the previous `sliding_window` tokens (itself
    /// included).
    SlidingWindow {
        /// Window length in tokens.
        sliding_window: u32,
    },
    /// Attention within fixed chunks of `attention_chunk_size` tokens.
    ChunkedLocal {
        /// Chunk length in tokens.
        attention_chunk_size: u32,
    },
    /// Mamba state, mode "none" (no prefix caching).
    Mamba {
        /// Extra scratch blocks for speculative decoding.
        num_speculative_blocks: u32,
    },
    /// Cross-attention over the encoder output: one static allocation sized
    /// by the encoder tokens, never cached.
    CrossAttention,
    /// Multi-head latent attention (one latent vector per token, `DeepSeek`
    /// style): managed exactly like full attention, but a spec of its own
    /// (hybrid lookups bucket it apart from plain full attention).
    MlaAttention,
    /// Sliding-window MLA: managed exactly like [`SpecKind::SlidingWindow`],
    /// a spec of its own.
    SlidingWindowMla {
        /// Window length in tokens.
        sliding_window: u32,
    },
    /// Reference sliding-window attention: full attention over the prompt,
    /// only the last `rswa_window` generated tokens stay visible; the decode
    /// gap between them is released (see [`rswa`]).
    Rswa {
        /// Generated tokens kept visible.
        rswa_window: u32,
    },
    /// Mamba state, mode "align": states cached at block boundaries so that
    /// prefix caching works (see [`mamba_align`]).
    MambaAlign {
        /// Extra scratch blocks for speculative decoding (0 only: see
        /// [`GroupSpec::validate`]).
        num_speculative_blocks: u32,
        /// Whether a prefill chunk may export the state at the prompt's last
        /// cacheable boundary into a reserved block (vLLM's
        /// `num_prefill_checkpoint_blocks > 0`).
        prefill_checkpoint: bool,
        /// Token alignment of an exported checkpoint relative to the chunk
        /// start (`None`: the backend cannot export one).
        prefill_checkpoint_alignment: Option<u32>,
    },
    /// `HiSparse` resident pages: device copies of host-backed KV, with a
    /// residency overlay over an append-only table (see [`hisparse`]).
    HiSparseResident,
    /// `HiSparse` hot region: `blocks_per_request` blocks a request holds
    /// once it reads from the host (see [`hisparse`]).
    HiSparseHot {
        /// Blocks of the region.
        blocks_per_request: u32,
    },
}

/// One KV-cache group's spec.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct GroupSpec {
    /// The kind of cache.
    pub kind: SpecKind,
    /// Tokens per block.
    pub block_size: u32,
}

impl GroupSpec {
    /// A full-attention spec.
    pub const fn full_attention(block_size: u32) -> Self {
        Self {
            kind: SpecKind::FullAttention,
            block_size,
        }
    }

    /// A sliding-window spec.
    pub const fn sliding_window(block_size: u32, sliding_window: u32) -> Self {
        Self {
            kind: SpecKind::SlidingWindow { sliding_window },
            block_size,
        }
    }

    /// A chunked-local spec.
    pub const fn chunked_local(block_size: u32, attention_chunk_size: u32) -> Self {
        Self {
            kind: SpecKind::ChunkedLocal {
                attention_chunk_size,
            },
            block_size,
        }
    }

    /// A Mamba (mode "none") spec.
    pub const fn mamba(block_size: u32, num_speculative_blocks: u32) -> Self {
        Self {
            kind: SpecKind::Mamba {
                num_speculative_blocks,
            },
            block_size,
        }
    }

    /// A cross-attention spec.
    pub const fn cross_attention(block_size: u32) -> Self {
        Self {
            kind: SpecKind::CrossAttention,
            block_size,
        }
    }

    /// An MLA (full-attention) spec.
    pub const fn mla_attention(block_size: u32) -> Self {
        Self {
            kind: SpecKind::MlaAttention,
            block_size,
        }
    }

    /// A sliding-window MLA spec.
    pub const fn sliding_window_mla(block_size: u32, sliding_window: u32) -> Self {
        Self {
            kind: SpecKind::SlidingWindowMla { sliding_window },
            block_size,
        }
    }

    /// A reference sliding-window (R-SWA) spec.
    pub const fn rswa(block_size: u32, rswa_window: u32) -> Self {
        Self {
            kind: SpecKind::Rswa { rswa_window },
            block_size,
        }
    }

    /// A Mamba spec in mode "align" (prefix caching of block-aligned states).
    pub const fn mamba_align(
        block_size: u32,
        prefill_checkpoint: bool,
        prefill_checkpoint_alignment: Option<u32>,
    ) -> Self {
        Self {
            kind: SpecKind::MambaAlign {
                num_speculative_blocks: 0,
                prefill_checkpoint,
                prefill_checkpoint_alignment,
            },
            block_size,
        }
    }

    /// A `HiSparse` resident spec.
    pub const fn hisparse_resident(block_size: u32) -> Self {
        Self {
            kind: SpecKind::HiSparseResident,
            block_size,
        }
    }

    /// A `HiSparse` hot spec.
    pub const fn hisparse_hot(block_size: u32, blocks_per_request: u32) -> Self {
        Self {
            kind: SpecKind::HiSparseHot { blocks_per_request },
            block_size,
        }
    }

    /// The kind's facts (see [`KindFacts`]): the one table every layer
    /// asks, the bindings and Python included.
    #[inline]
    pub const fn facts(&self) -> KindFacts {
        self.kind.facts()
    }

    /// Whether blocks of this group may be registered in the prefix cache.
    #[inline]
    pub const fn prefix_cacheable(&self) -> bool {
        self.kind.facts().prefix_cacheable
    }

    /// Whether this group's hits are prefix-closed (full attention): hybrid
    /// lookups put these first and never re-scan them.
    #[inline]
    pub const fn is_full_attention(&self) -> bool {
        matches!(self.kind.facts().hit_search, HitSearch::PrefixClosed)
    }

    /// Whether retention intervals apply to this group (it caches sparsely).
    #[inline]
    pub const fn is_sparse(&self) -> bool {
        self.kind.facts().sparse
    }

    /// Whether table entries after the first real block may be null (R-SWA
    /// decode gaps, Mamba "align" skipped states); every other kind keeps
    /// its nulls as a prefix.
    #[inline]
    pub const fn has_interior_nulls(&self) -> bool {
        matches!(self.kind.facts().nulls, NullEntries::Anywhere)
    }

    /// Check the parameters (positive sizes); messages name the public spec
    /// field (`SlidingWindowSpec.sliding_window`).
    pub fn validate(&self) -> KvResult<()> {
        let facts = self.kind.facts();
        let bad = |name, value: u32| KvError::InvalidConfig {
            name,
            value: value.to_string(),
            rule: "must be positive".into(),
        };
        if self.block_size == 0 {
            return Err(bad(facts.block_size_field, 0));
        }
        match (self.param(), facts.param_field) {
            (Some(0), Some((name, true))) => Err(bad(name, 0)),
            (_, _)
                if matches!(
                    self.kind,
                    SpecKind::MambaAlign {
                        prefill_checkpoint_alignment: Some(0),
                        ..
                    }
                ) =>
            {
                Err(bad("MambaSpec.prefill_checkpoint_alignment", 0))
            }
            _ => Ok(()),
        }
    }

    /// The kind's one parameter (window, chunk, speculative blocks), if any.
    pub const fn param(&self) -> Option<u32> {
        match self.kind {
            SpecKind::SlidingWindow { sliding_window: v }
            | SpecKind::ChunkedLocal {
                attention_chunk_size: v,
            }
            | SpecKind::Mamba {
                num_speculative_blocks: v,
            }
            | SpecKind::SlidingWindowMla { sliding_window: v }
            | SpecKind::Rswa { rswa_window: v }
            | SpecKind::MambaAlign {
                num_speculative_blocks: v,
                ..
            }
            | SpecKind::HiSparseHot {
                blocks_per_request: v,
            } => Some(v),
            SpecKind::FullAttention
            | SpecKind::CrossAttention
            | SpecKind::MlaAttention
            | SpecKind::HiSparseResident => None,
        }
    }

    /// A spec of `kind` (whatever parameter value it carries is replaced)
    /// from caller-supplied sizes: each is range-checked under the public
    /// field name it came from (`SlidingWindowSpec.sliding_window`), then
    /// the spec is validated.
    pub fn from_sizes(kind: SpecKind, block_size: i64, param: Option<i64>) -> KvResult<Self> {
        let spec = Self::sized(kind, block_size, param)?;
        spec.validate()?;
        Ok(spec)
    }

    /// A Mamba "align" spec from caller-supplied sizes (see
    /// [`from_sizes`](Self::from_sizes)); any prefill checkpoint block turns
    /// checkpoints on.
    pub fn mamba_align_from_sizes(
        block_size: i64,
        num_speculative_blocks: i64,
        num_prefill_checkpoint_blocks: i64,
        prefill_checkpoint_alignment: Option<i64>,
    ) -> KvResult<Self> {
        let template = Self::mamba_align(1, false, None).kind;
        let mut spec = Self::sized(template, block_size, Some(num_speculative_blocks))?;
        let checkpoint = size_field(
            "MambaSpec.num_prefill_checkpoint_blocks",
            num_prefill_checkpoint_blocks,
            false,
        )? > 0;
        let alignment = prefill_checkpoint_alignment
            .map(|a| size_field("MambaSpec.prefill_checkpoint_alignment", a, true))
            .transpose()?;
        if let SpecKind::MambaAlign {
            prefill_checkpoint,
            prefill_checkpoint_alignment,
            ..
        } = &mut spec.kind
        {
            *prefill_checkpoint = checkpoint;
            *prefill_checkpoint_alignment = alignment;
        }
        spec.validate()?;
        Ok(spec)
    }

    /// Range-checked sizes, not yet validated.
    fn sized(kind: SpecKind, block_size: i64, param: Option<i64>) -> KvResult<Self> {
        let facts = kind.facts();
        let block_size = size_field(facts.block_size_field, block_size, true)?;
        let kind = match (param, facts.param_field) {
            (Some(v), Some((field, positive))) => kind.with_param(size_field(field, v, positive)?),
            _ => kind,
        };
        Ok(Self { kind, block_size })
    }
}

/// A size from a caller as `u32`, positive where `positive` (else
/// non-negative); out of range is an [`KvError::InvalidConfig`] naming
/// `field`.
pub fn size_field(field: &'static str, value: i64, positive: bool) -> KvResult<u32> {
    match u32::try_from(value) {
        Ok(v) if v > 0 || !positive => Ok(v),
        _ => Err(KvError::InvalidConfig {
            name: field,
            value: value.to_string(),
            rule: if positive {
                "must be a positive int".into()
            } else {
                "must be an int >= 0".into()
            },
        }),
    }
}

/// How a kind searches the prefix cache for hits.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum HitSearch {
    /// Left to right, stop at the first miss: the hit set is prefix-closed
    /// (full attention).
    PrefixClosed,
    /// Right to left, for a run of consecutive hits covering the window
    /// (sliding window).
    Window,
    /// Blocks before the last chunk boundary are skipped (chunked local).
    Chunk,
    /// Right to left, the latest cached state at or below the bound: one
    /// real block after nulls (Mamba "align").
    LastState,
    /// Never searched (Mamba mode "none", cross-attention).
    Never,
}

/// Everything the layers above the managers know about a KV kind, written
/// once here. Adding a kind adds one arm to [`SpecKind::facts`] (the
/// compiler lists every other match that needs one).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct KindFacts {
    /// Name of the public spec type (the Python dataclass), for messages.
    pub spec_name: &'static str,
    /// `<spec_name>.block_size`, for messages.
    pub block_size_field: &'static str,
    /// `<spec_name>.<parameter>` of the kind's one parameter, if it has
    /// one, and whether it must be positive (else non-negative).
    pub param_field: Option<(&'static str, bool)>,
    /// How hits are searched.
    pub hit_search: HitSearch,
    /// Whether its blocks may enter the prefix cache (a caching manager
    /// refuses a group whose kind is not cacheable).
    pub prefix_cacheable: bool,
    /// Whether retention intervals (sparse caching) apply.
    pub sparse: bool,
    /// Whether slots are sized by the encoder's tokens rather than the
    /// decoder's.
    pub sized_by_encoder: bool,
    /// Where a request's table may hold null entries.
    pub nulls: NullEntries,
}

/// Where a kind's block tables may hold the null block.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum NullEntries {
    /// Only as a prefix (skipped positions before the window or chunk).
    Prefix,
    /// Also after real entries (R-SWA decode gaps, Mamba "align" skipped
    /// states).
    Anywhere,
}

impl SpecKind {
    /// The same kind with its one parameter (window, chunk, speculative
    /// blocks) set to `v`; kinds without a parameter are returned as they are.
    #[must_use]
    pub const fn with_param(self, v: u32) -> Self {
        match self {
            Self::SlidingWindow { .. } => Self::SlidingWindow { sliding_window: v },
            Self::ChunkedLocal { .. } => Self::ChunkedLocal {
                attention_chunk_size: v,
            },
            Self::Mamba { .. } => Self::Mamba {
                num_speculative_blocks: v,
            },
            Self::SlidingWindowMla { .. } => Self::SlidingWindowMla { sliding_window: v },
            Self::Rswa { .. } => Self::Rswa { rswa_window: v },
            Self::MambaAlign {
                prefill_checkpoint,
                prefill_checkpoint_alignment,
                ..
            } => Self::MambaAlign {
                num_speculative_blocks: v,
                prefill_checkpoint,
                prefill_checkpoint_alignment,
            },
            Self::HiSparseHot { .. } => Self::HiSparseHot {
                blocks_per_request: v,
            },
            Self::FullAttention
            | Self::CrossAttention
            | Self::MlaAttention
            | Self::HiSparseResident => self,
        }
    }

    /// The kind's facts. Inlined so that reading one fact on a hot path
    /// compiles to a match on the kind, not a copy of the whole table row.
    #[inline]
    pub const fn facts(self) -> KindFacts {
        match self {
            Self::FullAttention => KindFacts {
                spec_name: "FullAttentionSpec",
                block_size_field: "FullAttentionSpec.block_size",
                param_field: None,
                hit_search: HitSearch::PrefixClosed,
                prefix_cacheable: true,
                sparse: false,
                sized_by_encoder: false,
                nulls: NullEntries::Prefix,
            },
            Self::SlidingWindow { .. } => KindFacts {
                spec_name: "SlidingWindowSpec",
                block_size_field: "SlidingWindowSpec.block_size",
                param_field: Some(("SlidingWindowSpec.sliding_window", true)),
                hit_search: HitSearch::Window,
                prefix_cacheable: true,
                sparse: true,
                sized_by_encoder: false,
                nulls: NullEntries::Prefix,
            },
            Self::ChunkedLocal { .. } => KindFacts {
                spec_name: "ChunkedLocalAttentionSpec",
                block_size_field: "ChunkedLocalAttentionSpec.block_size",
                param_field: Some(("ChunkedLocalAttentionSpec.attention_chunk_size", true)),
                hit_search: HitSearch::Chunk,
                prefix_cacheable: true,
                sparse: false,
                sized_by_encoder: false,
                nulls: NullEntries::Prefix,
            },
            Self::Mamba { .. } => KindFacts {
                spec_name: "MambaSpec",
                block_size_field: "MambaSpec.block_size",
                param_field: Some(("MambaSpec.num_speculative_blocks", false)),
                hit_search: HitSearch::Never,
                prefix_cacheable: false,
                sparse: true,
                sized_by_encoder: false,
                nulls: NullEntries::Prefix,
            },
            Self::CrossAttention => KindFacts {
                spec_name: "CrossAttentionSpec",
                block_size_field: "CrossAttentionSpec.block_size",
                param_field: None,
                hit_search: HitSearch::Never,
                prefix_cacheable: false,
                sparse: false,
                sized_by_encoder: true,
                nulls: NullEntries::Prefix,
            },
            Self::MlaAttention => KindFacts {
                spec_name: "MLAAttentionSpec",
                block_size_field: "MLAAttentionSpec.block_size",
                param_field: None,
                hit_search: HitSearch::PrefixClosed,
                prefix_cacheable: true,
                sparse: false,
                sized_by_encoder: false,
                nulls: NullEntries::Prefix,
            },
            Self::SlidingWindowMla { .. } => KindFacts {
                spec_name: "SlidingWindowMLASpec",
                block_size_field: "SlidingWindowMLASpec.block_size",
                param_field: Some(("SlidingWindowMLASpec.sliding_window", true)),
                hit_search: HitSearch::Window,
                prefix_cacheable: true,
                sparse: true,
                sized_by_encoder: false,
                nulls: NullEntries::Prefix,
            },
            Self::Rswa { .. } => KindFacts {
                spec_name: "RSWASpec",
                block_size_field: "RSWASpec.block_size",
                param_field: Some(("RSWASpec.rswa_window", true)),
                hit_search: HitSearch::PrefixClosed,
                prefix_cacheable: true,
                sparse: false,
                sized_by_encoder: false,
                nulls: NullEntries::Anywhere,
            },
            Self::MambaAlign { .. } => KindFacts {
                spec_name: "MambaSpec",
                block_size_field: "MambaSpec.block_size",
                param_field: Some(("MambaSpec.num_speculative_blocks", false)),
                hit_search: HitSearch::LastState,
                prefix_cacheable: true,
                sparse: true,
                sized_by_encoder: false,
                nulls: NullEntries::Anywhere,
            },
            Self::HiSparseResident => hisparse::RESIDENT_FACTS,
            Self::HiSparseHot { .. } => hisparse::HOT_FACTS,
        }
    }
}

/// One request's blocks in one group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupTable {
    /// Position-indexed block table: entry `i` covers tokens
    /// `[i*bs, (i+1)*bs)`. Invariant: null entries (skipped positions) form a
    /// prefix; every other entry holds one reference on its block.
    pub(crate) blocks: Vec<BlockId>,
    /// Leading entries already registered in the prefix cache (or hits that
    /// came from it). Invariant: `num_cached <= blocks.len()`.
    pub(crate) num_cached: usize,
    /// Mamba "align" only (see [`mamba_align`]): per-request bookkeeping;
    /// its `partial_hit` also serves full attention's sub-block hits.
    pub(crate) align: mamba_align::AlignState,
    /// `HiSparse` kinds only (see [`hisparse`]): residency overlay, unpinned
    /// pages, hot-region demand.
    pub(crate) hisparse: hisparse::HiSparseRow,
}

impl GroupTable {
    /// The position-indexed table (null block in skipped positions).
    #[inline]
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// How many leading entries are registered in the prefix cache.
    #[inline]
    pub fn num_cached(&self) -> usize {
        self.num_cached
    }

    /// Number of leading null entries.
    pub fn num_leading_nulls(&self) -> usize {
        self.blocks.iter().take_while(|b| b.is_null()).count()
    }

    /// Check the invariants written on the fields (`interior_nulls`: the
    /// group's kind may leave null entries after real ones, see
    /// [`GroupSpec::has_interior_nulls`]).
    pub fn check_invariants(&self, interior_nulls: bool) -> Result<(), String> {
        if self.num_cached > self.blocks.len() {
            return Err(format!(
                "num_cached {} exceeds the table length {}",
                self.num_cached,
                self.blocks.len()
            ));
        }
        let nulls = self.num_leading_nulls();
        if !interior_nulls && self.blocks[nulls..].iter().any(|b| b.is_null()) {
            return Err("null entry after a real block".into());
        }
        Ok(())
    }
}

/// `ceil(a / b)` for `b > 0`.
#[inline]
pub(crate) const fn cdiv(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

/// Reusable per-group lookup results: `out[g]` receives the blocks of the
/// `g`-th group of a finder call.
pub type HitLists = [Vec<BlockId>];

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
                Some(cdiv(tokens, bs) + 1)
            }
            SpecKind::ChunkedLocal {
                attention_chunk_size,
            } => {
                let tokens = (attention_chunk_size as usize)
                    .saturating_add(max_in_flight_tokens)
                    .min(max_model_len);
                Some(cdiv(tokens, bs))
            }
            // HiSparse resident pages: the in-flight window (older pages
            // move to the host).
            SpecKind::HiSparseResident => Some(cdiv(max_in_flight_tokens.min(max_model_len), bs)),
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
        let mut required = cdiv(self.tokens_to_allocate(num_tokens), bs);
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
        let n = cdiv(total, self.block_size).saturating_sub(table.blocks.len());
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
        let required = cdiv(self.tokens_to_allocate(num_tokens), self.block_size);
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
    /// itself is [`cache_new_blocks`](Self::cache_new_blocks).
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

/// What the coordinator tells a group's `cache_blocks` about sparse caching.
#[derive(Clone, Debug)]
pub struct CachePolicy<'a> {
    /// Tokens a hit must end on a multiple of (the scheduler block size
    /// without partial hits).
    pub alignment: usize,
    /// Retention interval: `None` dense, `Some(0)` latest boundary only,
    /// `Some(r)` one boundary every `r` tokens.
    pub retention: Option<usize>,
    /// Token positions a later request may resume from (the prompt's replay
    /// boundary, a shared-prefix boundary); used only with a retention
    /// interval.
    pub reachable_boundaries: &'a [usize],
}

/// Number of hash units per block; errors unless `block_size` is a positive
/// multiple of `hash_block_size`.
pub(crate) fn hash_scale(hash_block_size: usize, block_size: usize) -> KvResult<usize> {
    if hash_block_size == 0 || block_size % hash_block_size != 0 {
        return Err(KvError::InvalidArgument {
            name: "hash_block_size",
            detail: format!("{hash_block_size} does not divide the block size {block_size}"),
        });
    }
    Ok(block_size / hash_block_size)
}

/// Read-only view of hash-unit hashes at a group's block size: block `i` is
/// the last unit hash inside it.
#[derive(Copy, Clone, Debug)]
pub struct HashView<'a> {
    hashes: &'a [BlockHash],
    /// Hash units per block.
    scale: usize,
    /// Tokens per block.
    block_size: usize,
}

impl<'a> HashView<'a> {
    /// View `hashes` (units of `hash_block_size` tokens) at `block_size`.
    pub fn new(
        hashes: &'a [BlockHash],
        hash_block_size: usize,
        block_size: usize,
    ) -> KvResult<Self> {
        Ok(Self {
            hashes,
            scale: hash_scale(hash_block_size, block_size)?,
            block_size,
        })
    }

    /// Tokens per block.
    #[inline]
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Number of full blocks the hashes cover.
    #[inline]
    pub fn len(&self) -> usize {
        self.hashes.len() / self.scale
    }

    /// Whether no full block is covered.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Hash of block `i` (`i < len()`).
    #[inline]
    pub fn get(&self, i: usize) -> &'a BlockHash {
        &self.hashes[(i + 1) * self.scale - 1]
    }

    /// The hash-unit hashes underneath (sub-block boundaries).
    #[inline]
    pub fn units(&self) -> &'a [BlockHash] {
        self.hashes
    }

    /// Tokens per hash unit.
    #[inline]
    pub fn unit_size(&self) -> usize {
        self.block_size / self.scale
    }
}

/// Look `hash` up in every group; on a hit push one block per group, on a
/// miss leave `out` as it was.
#[inline]
pub(crate) fn lookup_all(
    pool: &BlockPool,
    groups: &[GroupId],
    hash: &BlockHash,
    out: &mut HitLists,
) -> bool {
    for (k, &g) in groups.iter().enumerate() {
        if let Some(b) = pool.lookup(hash, g) {
            out[k].push(b);
        } else {
            // Undo the pushes of the groups that hit.
            for list in &mut out[..k] {
                list.pop();
            }
            return false;
        }
    }
    true
}

#[cfg(test)]
pub(crate) mod test_util {
    use super::*;
    use crate::pool::PoolConfig;

    /// Hash number `n`.
    pub(crate) fn h(n: u32) -> BlockHash {
        let mut bytes = [0u8; 32];
        bytes[..4].copy_from_slice(&n.to_le_bytes());
        bytes[31] = 1;
        BlockHash::from_slice(&bytes).unwrap()
    }

    /// Hashes `0..n`.
    pub(crate) fn hashes(n: u32) -> Vec<BlockHash> {
        (0..n).map(h).collect()
    }

    pub(crate) fn pool(n: usize, hash_block_size: u32) -> BlockPool {
        BlockPool::new(PoolConfig {
            hash_block_size,
            ..PoolConfig::new(n)
        })
        .unwrap()
    }

    /// Cache pool block `id` under hash `hash` for group 0 (the block is
    /// allocated, cached and freed again so it is an evictable cached block).
    pub(crate) fn cache_block(pool: &mut BlockPool, id: u32, hash: &BlockHash) {
        let b = BlockId(id);
        pool.touch(&[b]).unwrap();
        pool.cache_full_blocks(&[b], std::slice::from_ref(hash), 0, 1, GroupId(0), None)
            .unwrap();
        pool.free_blocks(&[b]).unwrap();
    }

    pub(crate) fn ids(v: &[BlockId]) -> Vec<u32> {
        v.iter().map(|b| b.0).collect()
    }

    pub(crate) fn table(blocks: &[u32]) -> GroupTable {
        GroupTable {
            blocks: blocks.iter().map(|&b| BlockId(b)).collect(),
            ..GroupTable::default()
        }
    }
}

#[cfg(test)]
mod kind_table_tests {
    use super::*;

    #[test]
    fn specs_from_caller_sizes_name_the_field_they_came_from() {
        let swa = SpecKind::SlidingWindow { sliding_window: 0 };
        assert_eq!(
            GroupSpec::from_sizes(swa, 16, Some(64)),
            Ok(GroupSpec::sliding_window(16, 64))
        );
        let named = |r: KvResult<GroupSpec>| match r {
            Err(KvError::InvalidConfig { name, rule, .. }) => (name, rule),
            other => panic!("expected a config error, got {other:?}"),
        };
        let (name, rule) = named(GroupSpec::from_sizes(swa, 16, Some(0)));
        assert_eq!(name, "SlidingWindowSpec.sliding_window");
        assert_eq!(rule, "must be a positive int");
        let full = SpecKind::FullAttention;
        let (name, _) = named(GroupSpec::from_sizes(full, 1 << 32, None));
        assert_eq!(name, "FullAttentionSpec.block_size");
        // Mamba's parameter may be 0; negative values are refused.
        let mamba = SpecKind::Mamba {
            num_speculative_blocks: 9,
        };
        assert_eq!(
            GroupSpec::from_sizes(mamba, 16, Some(0)),
            Ok(GroupSpec::mamba(16, 0))
        );
        let (name, rule) = named(GroupSpec::from_sizes(mamba, 16, Some(-1)));
        assert_eq!(
            (name, rule.as_str()),
            ("MambaSpec.num_speculative_blocks", "must be an int >= 0")
        );
        // Align mode: checkpoints on with any checkpoint block; speculative
        // scratch blocks are kept, a negative count refused.
        assert_eq!(
            GroupSpec::mamba_align_from_sizes(16, 0, 2, Some(32)),
            Ok(GroupSpec::mamba_align(16, true, Some(32)))
        );
        let with_scratch = GroupSpec::mamba_align_from_sizes(16, 2, 0, None).unwrap();
        assert_eq!(with_scratch.param(), Some(2));
        let (name, _) = named(GroupSpec::mamba_align_from_sizes(16, -1, 0, None));
        assert_eq!(name, "MambaSpec.num_speculative_blocks");
        let (name, _) = named(GroupSpec::mamba_align_from_sizes(16, 0, -1, None));
        assert_eq!(name, "MambaSpec.num_prefill_checkpoint_blocks");
    }

    const ALL: [GroupSpec; 5] = [
        GroupSpec::full_attention(16),
        GroupSpec::sliding_window(16, 64),
        GroupSpec::chunked_local(16, 64),
        GroupSpec::mamba(16, 1),
        GroupSpec::cross_attention(16),
    ];

    #[test]
    fn facts_are_consistent() {
        for spec in ALL {
            let f = spec.facts();
            assert!(f.block_size_field.starts_with(f.spec_name), "{f:?}");
            if let Some((field, _)) = f.param_field {
                assert!(field.starts_with(f.spec_name), "{f:?}");
                assert!(spec.param().is_some(), "{f:?}");
            }
            // A kind never searched is never cached, and vice versa.
            assert_eq!(
                f.prefix_cacheable,
                f.hit_search != HitSearch::Never,
                "{f:?}"
            );
            assert_eq!(
                spec.is_full_attention(),
                f.hit_search == HitSearch::PrefixClosed
            );
        }
    }

    #[test]
    fn validation_names_the_public_field() {
        let msg = |s: GroupSpec| s.validate().unwrap_err().to_string();
        assert!(msg(GroupSpec::full_attention(0)).contains("FullAttentionSpec.block_size"));
        assert!(msg(GroupSpec::sliding_window(16, 0)).contains("SlidingWindowSpec.sliding_window"));
        assert!(msg(GroupSpec::chunked_local(16, 0))
            .contains("ChunkedLocalAttentionSpec.attention_chunk_size"));
        // Zero speculative blocks is valid.
        assert!(GroupSpec::mamba(16, 0).validate().is_ok());
        for spec in ALL {
            assert!(spec.validate().is_ok());
        }
    }
}
