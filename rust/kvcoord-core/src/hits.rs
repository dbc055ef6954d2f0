//! Verification of the prefix-cache hits a caller hands back to
//! `allocate_slots` (`new_computed_blocks`).
//!
//! Hits come from `find_longest_cache_hit`, but they travel through the
//! caller and the pool may change in between (another thread, or a misuse):
//! a hit block may have been evicted and reused, and a caller may pass
//! anything. Adopting a block that does not hold this request's prefix
//! would let two requests write one block, or serve wrong KV. So every hit
//! is checked against the prefix index before anything is pinned: block `i`
//! of group `g` must be cached under this request's own hash of block `i`
//! for group `g` (one probe per block). Null entries are allowed only where
//! the group's attention window skips the block (they are never adopted);
//! full attention skips nothing.

use crate::block_hash::BlockHash;
use crate::error::{KvError, KvResult};
use crate::ids::BlockId;
use crate::managers::{HashView, Manager};
use crate::pool::BlockPool;

/// Check `list`, the hits of group `m` covering `num_local` computed
/// tokens (one entry per block), against the request's `hashes` (units of
/// `hash_block_size` tokens).
pub(crate) fn verify_group_hits(
    m: &Manager,
    pool: &BlockPool,
    hashes: &[BlockHash],
    hash_block_size: usize,
    list: &[BlockId],
    num_local: usize,
) -> KvResult<()> {
    let refuse = |detail: String| KvError::InvalidArgument {
        name: "new_computed_blocks",
        detail: format!("group {}: {detail}", m.group()),
    };
    let view = HashView::new(hashes, hash_block_size, m.block_size())?;
    // A sub-block hit's last block is not full.
    let allowed = view.len() + usize::from(num_local % m.block_size() != 0);
    if list.len() > allowed {
        return Err(refuse(format!(
            "{} hit blocks but the request has only {} full hashed blocks",
            list.len(),
            view.len()
        )));
    }
    let skipped = m.num_skipped_tokens(num_local) / m.block_size();
    for (i, &b) in list.iter().enumerate() {
        if b.is_null() {
            if i >= skipped {
                return Err(refuse(format!(
                    "null block at position {i}, inside the attention window"
                )));
            }
            continue;
        }
        let matches = if (i + 1) * m.block_size() > num_local {
            // A hit ending inside this block (sub-block hits): one of its
            // keys is this request's hash at a hash-unit boundary from the
            // hit's end to the block's (a longer hit cut by another group).
            let lo = num_local / hash_block_size;
            let hi = ((i + 1) * m.block_size() / hash_block_size).min(hashes.len());
            lo > 0
                && lo <= hi
                && pool
                    .cache_keys(b)?
                    .iter()
                    .any(|(k, _)| k.group == m.group() && hashes[lo - 1..hi].contains(&k.hash))
        } else {
            let key = pool.cache_key(b)?;
            key.is_some_and(|k| k.group == m.group() && k.hash == *view.get(i))
        };
        if !matches {
            return Err(refuse(format!(
                "block {b} at position {i} is not cached for this request's prefix \
                 (stale hit: evicted or reused since the lookup, or not from this request's lookup)"
            )));
        }
    }
    Ok(())
}
