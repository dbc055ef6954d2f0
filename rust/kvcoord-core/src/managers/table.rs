//! [`GroupTable`]: one request's blocks in one group, with the
//! bookkeeping of the kinds that keep more than blocks ([`AlignState`] for
//! Mamba "align", [`HiSparseRow`] for `HiSparse`). The coordinator owns the
//! tables; the kinds' rules (`mamba_align.rs`, `hisparse.rs`, ...) read and
//! change them.
//!
//! Invariants are written on the fields and checked by
//! [`GroupTable::check_invariants`].

use std::collections::{BTreeMap, BTreeSet};

use crate::ids::BlockId;

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
    /// Mamba "align" only (see [`mamba_align`](super::mamba_align)): per-request bookkeeping;
    /// its `partial_hit` also serves full attention's sub-block hits.
    pub(crate) align: AlignState,
    /// `HiSparse` kinds only (see [`hisparse`](super::hisparse)): residency overlay, unpinned
    /// pages, hot-region demand.
    pub(crate) hisparse: HiSparseRow,
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
    /// [`GroupSpec::has_interior_nulls`](crate::GroupSpec::has_interior_nulls)).
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

/// Per-request bookkeeping of an align-mode table (all zero for every other
/// kind).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AlignState {
    /// Entry of the previous running state, freed once the request is past
    /// it.
    pub(crate) last_state: Option<usize>,
    /// Entries below this index were already released by skipped-block
    /// removal (the walk does not stop at nulls, so it needs a frontier).
    pub(crate) retired: usize,
    /// Whether an allocation has run for the request since admission.
    pub(crate) allocated: bool,
    /// The prefill checkpoint of the latest allocation: (token position,
    /// table index of the reserved block).
    pub(crate) checkpoint: Option<(usize, usize)>,
    /// A state cached at a sub-block boundary that the next allocation
    /// copies into a fresh block (vLLM's `_partial_hit_reqs`): (table index,
    /// the block holding it). Set by a hit ending inside a block and by the
    /// request's own prompt-tail state.
    pub(crate) partial_hit: Option<(usize, BlockId)>,
    /// The request's own prompt-tail state at a sub-block boundary (vLLM's
    /// `_producer_partial_tail_reqs`): (block, boundary tokens). Its copy
    /// is handed to the boundary-state offloads; a request finishing first
    /// hands the block itself ([`finalize_partial_tail`](super::mamba_align::finalize_partial_tail)).
    pub(crate) producer_tail: Option<(BlockId, usize)>,
}

impl AlignState {
    /// Forget everything (the request freed its blocks).
    pub(crate) fn clear(&mut self) {
        *self = Self::default();
    }
}

/// Per-request `HiSparse` state of one group's table (empty for other kinds).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HiSparseRow {
    /// Resident groups: residency changes over the table, page -> block
    /// (the null block: the page is read from the host).
    pub(crate) changes: BTreeMap<usize, BlockId>,
    /// Resident groups: adopted pages whose reference is not taken yet
    /// (the adopter's next `touch` of the block takes it).
    pub(crate) unbacked: BTreeSet<usize>,
    /// Hot groups: the request must hold its hot region.
    pub(crate) hot_required: bool,
}

impl HiSparseRow {
    /// Forget everything (the request freed its blocks).
    pub(crate) fn clear(&mut self) {
        self.changes.clear();
        self.unbacked.clear();
        self.hot_required = false;
    }

    /// Whether nothing is recorded.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.changes.is_empty() && self.unbacked.is_empty() && !self.hot_required
    }
}
