//! What the kinds' hit finders share: the request's hash-unit hashes seen
//! at a group's block size ([`HashView`]), the probe of every group of a
//! lookup ([`lookup_all`]) and the per-group result lists ([`HitLists`]).

use crate::block_hash::BlockHash;
use crate::error::{KvError, KvResult};
use crate::ids::{BlockId, GroupId};
use crate::pool::BlockPool;

/// Reusable per-group lookup results: `out[g]` receives the blocks of the
/// `g`-th group of a finder call.
pub type HitLists = [Vec<BlockId>];

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
