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
//!
//! The check is a coordinator option ([`CoordinatorConfig::verify_hits`]):
//! vLLM's scheduler is single-threaded and adopts whatever blocks it is
//! handed (its connectors and tests rely on that), so its adapter turns the
//! probe off and keeps only [`check_group_hit_shape`], the part without
//! which the tables themselves would be wrong.
//!
//! [`CoordinatorConfig::verify_hits`]: crate::CoordinatorConfig::verify_hits

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
    if list.len() > view.len() {
        return Err(refuse(format!(
            "{} hit blocks but the request has only {} full hashed blocks",
            list.len(),
            view.len()
        )));
    }
    check_group_hit_shape(m, list, num_local)?;
    for (i, &b) in list.iter().enumerate() {
        if b.is_null() {
            continue;
        }
        let key = pool.cache_key(b)?;
        let matches = key.is_some_and(|k| k.group == m.group() && k.hash == *view.get(i));
        if !matches {
            return Err(refuse(format!(
                "block {b} at position {i} is not cached for this request's prefix \
                 (stale hit: evicted or reused since the lookup, or not from this request's lookup)"
            )));
        }
    }
    Ok(())
}

/// What every hit list of group `m` (covering `num_local` computed tokens)
/// must satisfy whether or not its blocks are verified: null entries only
/// where the attention window skips the block (a null inside the window
/// would be a table entry that holds no KV). Ids, counts and the pool's own
/// limits are checked by the caller and the pool.
pub(crate) fn check_group_hit_shape(
    m: &Manager,
    list: &[BlockId],
    num_local: usize,
) -> KvResult<()> {
    let skipped = m.num_skipped_tokens(num_local) / m.block_size();
    match list.iter().skip(skipped).position(|b| b.is_null()) {
        None => Ok(()),
        Some(i) => Err(KvError::InvalidArgument {
            name: "new_computed_blocks",
            detail: format!(
                "group {}: null block at position {}, inside the attention window",
                m.group(),
                skipped + i
            ),
        }),
    }
}
