//! The KV kinds: [`SpecKind`] (what a group holds, with its parameters),
//! [`GroupSpec`] (a kind and a block size) and [`KindFacts`], the one table
//! of what every layer knows about a kind.
//!
//! A leaf: it imports nothing of the crate but the error type, so the pool,
//! the events, the managers and the coordinator all read the same facts.
//! Adding a kind adds one arm to [`SpecKind::facts`]; the compiler lists
//! every other match that needs one.

use crate::error::{KvError, KvResult};

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
    /// gap between them is released (see [`rswa`](crate::managers::rswa)).
    Rswa {
        /// Generated tokens kept visible.
        rswa_window: u32,
    },
    /// Mamba state, mode "align": states cached at block boundaries so that
    /// prefix caching works (see [`mamba_align`](crate::managers::mamba_align)).
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
    /// residency overlay over an append-only table (see
    /// [`hisparse`](crate::managers::hisparse)).
    HiSparseResident,
    /// `HiSparse` hot region: `blocks_per_request` blocks a request holds
    /// once it reads from the host (see [`hisparse`](crate::managers::hisparse)).
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

    /// Whether the group is of the full-attention family
    /// ([`SpecKind::is_full_attention`]).
    #[inline]
    pub const fn is_full_attention(&self) -> bool {
        self.kind.is_full_attention()
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
        self.kind.param()
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
// Independent facts of one kind (a row of a table), not a state machine.
#[allow(clippy::struct_excessive_bools)]
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
    /// Whether a hit may end inside one of its blocks, on a hash-unit
    /// boundary (vLLM's `enable_partial_hash_hits` eligibility: the
    /// full-attention family and Mamba "align"): its hits then take a
    /// copy-on-write copy of the block they end in.
    pub sub_block_hits: bool,
    /// vLLM's `kv_cache_spec_kind` string in `BlockStored` events.
    pub event_kind: &'static str,
    /// Whether `BlockStored` events report the kind's parameter as the
    /// group's sliding window (`kv_cache_spec_sliding_window`).
    pub event_window: bool,
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

    /// The kind's one parameter (window, chunk, speculative blocks), if any.
    pub const fn param(self) -> Option<u32> {
        match self {
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

    /// Whether the kind is of the full-attention family: managed by vLLM's
    /// `FullAttentionManager` or a subclass (full attention, MLA, R-SWA),
    /// the kinds whose hits are prefix-closed. Only they share a common
    /// prefix between requests (cascade attention) and key a prompt tail
    /// inside a block.
    #[inline]
    pub const fn is_full_attention(self) -> bool {
        matches!(self.facts().hit_search, HitSearch::PrefixClosed)
    }

    /// vLLM's `(kv_cache_spec_kind, kv_cache_spec_sliding_window)` of the
    /// kind in `BlockStored` events.
    #[inline]
    pub const fn event_metadata(self) -> (&'static str, Option<u32>) {
        let facts = self.facts();
        let window = if facts.event_window {
            self.param()
        } else {
            None
        };
        (facts.event_kind, window)
    }

    /// The kind's facts. Inlined so that reading one fact on a hot path
    /// compiles to a match on the kind, not a copy of the whole table row.
    // The table itself: one arm per kind.
    #[allow(clippy::too_many_lines)]
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
                sub_block_hits: true,
                event_kind: "full_attention",
                event_window: false,
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
                sub_block_hits: false,
                event_kind: "sliding_window",
                event_window: true,
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
                sub_block_hits: false,
                event_kind: "chunked_local_attention",
                event_window: false,
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
                sub_block_hits: false,
                event_kind: "mamba",
                event_window: false,
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
                sub_block_hits: false,
                event_kind: "cross_attention",
                event_window: false,
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
                sub_block_hits: true,
                event_kind: "mla_attention",
                event_window: false,
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
                sub_block_hits: false,
                event_kind: "sliding_window_mla",
                event_window: true,
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
                sub_block_hits: true,
                // vLLM's R-SWA spec is a full-attention subclass without a
                // window.
                event_kind: "full_attention",
                event_window: false,
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
                sub_block_hits: true,
                event_kind: "mamba",
                event_window: false,
            },
            Self::HiSparseResident => KindFacts {
                spec_name: "HiSparseResidentSpec",
                block_size_field: "HiSparseResidentSpec.block_size",
                param_field: None,
                hit_search: HitSearch::Never,
                prefix_cacheable: false,
                sparse: false,
                sized_by_encoder: false,
                // The table's nulls (host-only pages) form a prefix; the
                // overlay's do not.
                nulls: NullEntries::Prefix,
                sub_block_hits: false,
                // vLLM names no kind for its HiSparse device specs.
                event_kind: "unknown",
                event_window: false,
            },
            Self::HiSparseHot { .. } => KindFacts {
                spec_name: "HiSparseHotSpec",
                block_size_field: "HiSparseHotSpec.block_size",
                param_field: Some(("HiSparseHotSpec.blocks_per_request", true)),
                hit_search: HitSearch::Never,
                prefix_cacheable: false,
                sparse: false,
                sized_by_encoder: false,
                nulls: NullEntries::Prefix,
                sub_block_hits: false,
                event_kind: "unknown",
                event_window: false,
            },
        }
    }
}

#[cfg(test)]
mod tests {
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

    /// One spec of every kind.
    const ALL: [GroupSpec; 11] = [
        GroupSpec::full_attention(16),
        GroupSpec::sliding_window(16, 64),
        GroupSpec::chunked_local(16, 64),
        GroupSpec::mamba(16, 1),
        GroupSpec::cross_attention(16),
        GroupSpec::mla_attention(16),
        GroupSpec::sliding_window_mla(16, 32),
        GroupSpec::rswa(16, 48),
        GroupSpec::mamba_align(16, true, None),
        GroupSpec::hisparse_resident(16),
        GroupSpec::hisparse_hot(16, 4),
    ];

    #[test]
    fn all_lists_every_kind() {
        // Exhaustive: a new kind fails to compile here until it is in ALL.
        let listed = |k: SpecKind| ALL.iter().any(|s| s.kind.with_param(0) == k.with_param(0));
        for spec in ALL {
            let present = match spec.kind {
                SpecKind::FullAttention
                | SpecKind::SlidingWindow { .. }
                | SpecKind::ChunkedLocal { .. }
                | SpecKind::Mamba { .. }
                | SpecKind::CrossAttention
                | SpecKind::MlaAttention
                | SpecKind::SlidingWindowMla { .. }
                | SpecKind::Rswa { .. }
                | SpecKind::MambaAlign { .. }
                | SpecKind::HiSparseResident
                | SpecKind::HiSparseHot { .. } => listed(spec.kind),
            };
            assert!(present);
        }
    }

    #[test]
    fn family_partial_hits_and_event_names_are_vllms() {
        let facts = |s: GroupSpec| {
            let f = s.facts();
            (
                s.is_full_attention(),
                f.sub_block_hits,
                s.kind.event_metadata(),
            )
        };
        let want = [
            (true, true, ("full_attention", None)),
            (false, false, ("sliding_window", Some(64))),
            (false, false, ("chunked_local_attention", None)),
            (false, false, ("mamba", None)),
            (false, false, ("cross_attention", None)),
            (true, true, ("mla_attention", None)),
            (false, false, ("sliding_window_mla", Some(32))),
            // R-SWA's vLLM spec is a full-attention subclass.
            (true, true, ("full_attention", None)),
            (false, true, ("mamba", None)),
            (false, false, ("unknown", None)),
            (false, false, ("unknown", None)),
        ];
        for (spec, want) in ALL.into_iter().zip(want) {
            assert_eq!(facts(spec), want, "{spec:?}");
        }
    }

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
