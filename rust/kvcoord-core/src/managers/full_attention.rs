//! Full attention: every block of the prefix is needed, so a hit is the
//! longest run of cached blocks from block 0.

use super::hash_view::{lookup_all, HashView, HitLists};
use super::table::GroupTable;
use crate::block_hash::BlockHash;
use crate::error::KvResult;
use crate::ids::GroupId;
use crate::pool::BlockPool;

/// Scan left to right and stop at the first miss (chained hashes make every
/// later block miss too), then round down to the alignment. `drop_eagle`:
/// a non-empty run loses its last block first (EAGLE recomputes the block
/// before the generation point to get its hidden states).
pub(crate) fn find_longest_cache_hit(
    pool: &BlockPool,
    groups: &[GroupId],
    view: &HashView<'_>,
    max_length: usize,
    alignment: usize,
    drop_eagle: bool,
    out: &mut HitLists,
) -> usize {
    let bs = view.block_size();
    let max_blocks = (max_length / bs).min(view.len());
    let mut n = 0;
    while n < max_blocks && lookup_all(pool, groups, view.get(n), out) {
        n += 1;
    }
    if alignment < bs && bs % alignment == 0 {
        // Sub-block hits (vLLM's partial hash hits, `alignment` = the hash
        // unit): past the full blocks, the highest interior hash-unit
        // boundary of the next block with a (partial) key extends the hit.
        let units = view.units();
        let scale = bs / alignment;
        let first = n * scale;
        let last = (first + scale - 1)
            .min(max_length / alignment)
            .min(units.len());
        let mut hit = n * bs;
        for fine in (first..last).rev() {
            if lookup_all(pool, groups, &units[fine], out) {
                hit = (fine + 1) * alignment;
                break;
            }
        }
        if drop_eagle && hit > 0 {
            hit -= alignment.min(bs);
        }
        let keep = hit.div_ceil(bs);
        for list in out.iter_mut() {
            list.truncate(keep);
        }
        return hit;
    }
    if drop_eagle {
        n = n.saturating_sub(1);
    }
    let hit = n * bs / alignment * alignment;
    let keep = hit.div_ceil(bs);
    for list in out.iter_mut() {
        list.truncate(keep);
    }
    hit
}

/// The prompt's last hash-unit boundary that a group whose blocks span
/// several hash units keys its prompt-tail block at (vLLM's
/// `FullAttentionManager._cache_partial_tail_block`): `num_prompt_tokens - 1`
/// (a resend recomputes the last token) or, for an EAGLE group, the whole
/// prompt, rounded down to the hash unit and capped at the hashes there
/// are. `None` when it is 0, on a block boundary (the full key covers it),
/// or past `cacheable` tokens.
pub(crate) fn partial_tail_boundary(
    num_prompt_tokens: usize,
    num_hashes: usize,
    hash_block_size: usize,
    block_size: usize,
    eagle: bool,
    cacheable: usize,
) -> Option<usize> {
    let limit = if eagle {
        num_prompt_tokens
    } else {
        num_prompt_tokens.saturating_sub(1)
    };
    let boundary = (limit / hash_block_size).min(num_hashes) * hash_block_size;
    (boundary != 0 && boundary <= cacheable && boundary % block_size != 0).then_some(boundary)
}

/// Key the block holding `boundary` (from [`partial_tail_boundary`]) at
/// that boundary: a partial key (primary when the block is not full yet,
/// secondary beside its full key otherwise; see
/// [`BlockPool::cache_partial_block`]). No hit reads it unless sub-block
/// hits are on, but it makes a not-yet-full block a cached one (freed to
/// the back of the queue) and it is stored, reported and removed as vLLM
/// does. A table that does not reach the block, or a null entry (R-SWA
/// gaps), keys nothing.
pub(crate) fn cache_partial_tail(
    pool: &mut BlockPool,
    table: &GroupTable,
    hashes: &[BlockHash],
    boundary: usize,
    block_size: usize,
    group: GroupId,
) -> KvResult<()> {
    let idx = boundary / block_size;
    if let Some(&b) = table.blocks.get(idx) {
        pool.cache_partial_block(b, hashes, boundary, (idx + 1) * block_size, group, false)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn partial_tail_boundary_follows_the_prompt() {
        use super::partial_tail_boundary as b;
        // 8-token blocks of 4-token hash units, a 15-token prompt: the last
        // boundary below the recomputed token is 12 (inside block 1).
        assert_eq!(b(15, 3, 4, 8, false, 16), Some(12));
        assert_eq!(b(15, 3, 4, 8, false, 8), None, "not cacheable yet");
        // EAGLE reads the whole prompt: 16 is a block boundary.
        assert_eq!(b(16, 4, 4, 8, true, 16), None);
        assert_eq!(b(13, 3, 4, 8, true, 12), Some(12));
        // Capped by the hashes there are; nothing below one unit.
        assert_eq!(b(15, 1, 4, 8, false, 16), Some(4));
        assert_eq!(b(4, 1, 4, 8, false, 16), None);
    }

    use crate::ids::GroupId;
    use crate::managers::test_util::{cache_block, h, hashes, ids, pool};
    use crate::managers::{GroupSpec, Manager};

    #[test]
    fn eagle_margin_is_one_block_and_only_for_eagle_groups() {
        let m = Manager::new(GroupSpec::full_attention(4), GroupId(0)).unwrap();
        assert_eq!(m.eagle_hit_margin(), None);
        assert_eq!(m.with_eagle(true).eagle_hit_margin(), Some(4));
        let mamba = Manager::new(GroupSpec::mamba(4, 0), GroupId(1)).unwrap();
        assert_eq!(mamba.with_eagle(true).eagle_hit_margin(), Some(0));
    }

    fn find(cached: &[bool], max_length: usize, alignment: usize) -> (usize, Vec<u32>) {
        find_eagle(cached, max_length, alignment, false)
    }

    fn find_eagle(
        cached: &[bool],
        max_length: usize,
        alignment: usize,
        drop_eagle: bool,
    ) -> (usize, Vec<u32>) {
        let mut p = pool(20, 2);
        for (i, &c) in cached.iter().enumerate() {
            if c {
                cache_block(&mut p, i as u32 + 1, &h(i as u32));
            }
        }
        let m = Manager::new(GroupSpec::full_attention(2), GroupId(0)).unwrap();
        let mut out = vec![Vec::new()];
        let hs = hashes(cached.len() as u32);
        let hit = m
            .find_longest_cache_hit(
                &p,
                &[GroupId(0)],
                &hs,
                2,
                max_length,
                alignment,
                drop_eagle,
                &mut out,
            )
            .unwrap();
        (hit, ids(&out[0]))
    }

    #[test]
    fn finder() {
        assert_eq!(find(&[true, true, false, true], 8, 2), (4, vec![1, 2]));
        assert_eq!(find(&[true, true, true], 5, 2), (4, vec![1, 2]));
        assert_eq!(find(&[true, true, true], 6, 4), (4, vec![1, 2]));
        assert_eq!(find(&[false, true], 4, 2), (0, vec![]));
    }

    #[test]
    fn eagle_drop() {
        // The run loses its last block, then rounds down to the alignment.
        let all = [true; 6];
        assert_eq!(find_eagle(&all, 12, 2, true), (10, vec![1, 2, 3, 4, 5]));
        assert_eq!(find_eagle(&all, 12, 4, true), (8, vec![1, 2, 3, 4]));
        assert_eq!(find_eagle(&all, 8, 4, true), (4, vec![1, 2]));
        assert_eq!(find_eagle(&[true], 2, 2, true), (0, vec![]));
        assert_eq!(find_eagle(&[false, true], 4, 2, true), (0, vec![]));
    }
}
