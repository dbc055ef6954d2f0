//! Partial (secondary) prefix-cache keys: the side table of the pool.
//!
//! Most cached blocks carry one key, registered when the block became full,
//! and the pool keeps it in the block's own metadata (one `u32` slot of the
//! [`PrefixIndex`](crate::prefix_index::PrefixIndex)). vLLM 0.33.0 can also
//! make a block reachable from a hash-unit boundary *inside* it (a "partial"
//! key, `BlockPool.cache_partial_block`): the prompt tail of a group whose
//! block spans several hash units, the Mamba state at a sub-block boundary.
//! Such a key is the block's primary key when it had none (its token count
//! then says how much of the block it covers), and a secondary key otherwise.
//!
//! Only the few blocks with a partial key have an entry here, so the
//! per-block metadata stays eight bytes:
//!
//! * `primary_tokens`: the token count behind the primary key when it was
//!   registered as a partial key (or moved from one); absent, the primary
//!   key is a full-block key and covers the whole block;
//! * `secondary`: the other keys, each with its token count, in insertion
//!   order (the order their removals are reported in).
//!
//! Invariant (checked by the pool): an entry exists only for a block with a
//! primary key, and it is not empty.

use hashbrown::HashMap;
use smallvec::SmallVec;

use crate::ids::BlockId;
use crate::prefix_index::KeySlot;

/// What the side table knows about one block.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PartialEntry {
    /// Tokens behind the primary key when it is a partial one.
    pub(crate) primary_tokens: Option<u32>,
    /// Secondary keys: (index slot, tokens), in insertion order.
    pub(crate) secondary: SmallVec<[(KeySlot, u32); 1]>,
}

impl PartialEntry {
    fn is_empty(&self) -> bool {
        self.primary_tokens.is_none() && self.secondary.is_empty()
    }
}

/// Block -> partial-key facts, for the blocks that have any.
#[derive(Clone, Debug, Default)]
pub(crate) struct PartialKeys {
    by_block: HashMap<BlockId, PartialEntry>,
}

impl PartialKeys {
    /// Number of blocks with an entry.
    pub(crate) fn len(&self) -> usize {
        self.by_block.len()
    }

    pub(crate) fn get(&self, b: BlockId) -> Option<&PartialEntry> {
        self.by_block.get(&b)
    }

    /// Tokens behind `b`'s primary key when it is a partial key.
    pub(crate) fn primary_tokens(&self, b: BlockId) -> Option<u32> {
        self.by_block.get(&b).and_then(|e| e.primary_tokens)
    }

    /// Record the token count of `b`'s (new) primary key.
    pub(crate) fn set_primary_tokens(&mut self, b: BlockId, tokens: Option<u32>) {
        match tokens {
            Some(t) => self.by_block.entry(b).or_default().primary_tokens = Some(t),
            None => {
                if let Some(e) = self.by_block.get_mut(&b) {
                    e.primary_tokens = None;
                    if e.is_empty() {
                        self.by_block.remove(&b);
                    }
                }
            }
        }
    }

    /// Add a secondary key of `b`.
    pub(crate) fn push_secondary(&mut self, b: BlockId, slot: KeySlot, tokens: u32) {
        self.by_block
            .entry(b)
            .or_default()
            .secondary
            .push((slot, tokens));
    }

    /// Forget `b` and return what it had (one branch when no block has a
    /// partial key, the common case).
    #[inline]
    pub(crate) fn take(&mut self, b: BlockId) -> Option<PartialEntry> {
        if self.by_block.is_empty() {
            return None;
        }
        self.by_block.remove(&b)
    }

    /// Forget every block.
    pub(crate) fn clear(&mut self) {
        self.by_block.clear();
    }

    /// Every (block, entry), in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (BlockId, &PartialEntry)> + '_ {
        self.by_block.iter().map(|(&b, e)| (b, e))
    }

    /// Approximate heap bytes.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.by_block.capacity()
            * (std::mem::size_of::<BlockId>() + std::mem::size_of::<PartialEntry>() + 1)
    }

    /// Entries must not be empty; `Err` names the first that is.
    pub(crate) fn check_not_empty(&self) -> Result<(), String> {
        match self.by_block.iter().find(|(_, e)| e.is_empty()) {
            Some((b, _)) => Err(format!("block {b}: empty partial-key entry")),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_come_and_go() {
        let mut p = PartialKeys::default();
        assert_eq!(p.len(), 0);
        p.set_primary_tokens(BlockId(3), Some(8));
        p.push_secondary(BlockId(3), 7, 4);
        assert_eq!(p.primary_tokens(BlockId(3)), Some(8));
        assert_eq!(p.len(), 1);
        p.set_primary_tokens(BlockId(3), None);
        assert_eq!(p.get(BlockId(3)).unwrap().secondary.as_slice(), &[(7, 4)]);
        let e = p.take(BlockId(3)).unwrap();
        assert_eq!(e.secondary.len(), 1);
        assert_eq!(p.len(), 0);
        p.set_primary_tokens(BlockId(1), None);
        assert_eq!(p.len(), 0, "clearing an absent entry adds nothing");
        p.check_not_empty().unwrap();
    }
}
