//! Full attention: every block of the prefix is needed, so a hit is the
//! longest run of cached blocks from block 0.

use super::{cdiv, lookup_all, HashView, HitLists};
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
    if drop_eagle {
        n = n.saturating_sub(1);
    }
    let hit = n * bs / alignment * alignment;
    let keep = cdiv(hit, bs);
    for list in out.iter_mut() {
        list.truncate(keep);
    }
    hit
}

#[cfg(test)]
mod tests {
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
