//! Sliding-window attention: a token only needs the previous `W - 1` tokens,
//! so a hit needs just the last `cdiv(W - 1, bs)` blocks before its end, and
//! blocks that fell out of the window can be released while the request runs.

use smallvec::SmallVec;

use super::cache_policy::CachePolicy;
use super::hash_view::{HashView, HitLists};
use crate::ids::{BlockId, GroupId};
use crate::pool::BlockPool;

/// Blocks a hit needs right before its end: the window of the next token,
/// and with EAGLE one more (the block the hit drops again, whose hidden
/// states EAGLE recomputes).
#[inline]
pub fn contiguous_blocks_needed(sliding_window: usize, block_size: usize, eagle: bool) -> usize {
    sliding_window.saturating_sub(1).div_ceil(block_size) + usize::from(eagle)
}

/// Tokens strictly before the window of the token after the first `n`.
#[inline]
pub fn num_skipped_tokens(n: usize, sliding_window: usize) -> usize {
    (n + 1).saturating_sub(sliding_window)
}

/// Scan right to left for the last run of `need` cached blocks whose end is
/// aligned; positions before the run are null. Without such a run, a run
/// starting at block 0 is still a hit (nothing before token 0 is needed),
/// trimmed to the alignment.
///
/// `drop_eagle`: the run needs one block more and loses it afterwards, so
/// the alignment applies to the run's end without its last block; the
/// result is trimmed to the alignment again after the drop.
#[allow(clippy::too_many_arguments)]
pub(crate) fn find_longest_cache_hit(
    pool: &BlockPool,
    groups: &[GroupId],
    view: &HashView<'_>,
    sliding_window: usize,
    max_length: usize,
    alignment: usize,
    drop_eagle: bool,
    out: &mut HitLists,
) -> usize {
    let bs = view.block_size();
    let need = contiguous_blocks_needed(sliding_window, bs, drop_eagle);
    // Blocks past the hashes cannot hit: scanning them would only reset the
    // (still empty) run, and the result never extends past a hit, so the
    // scan starts at the last hashed block.
    let max_blocks = (max_length / bs).min(view.len());
    for list in out.iter_mut() {
        list.resize(max_blocks, BlockId::NULL);
    }
    let aligned = |blocks: usize| (blocks * bs) % alignment == 0;
    let mut run = 0usize;
    let mut found = None;
    // One block per group; hybrid models have a handful of groups per spec.
    let mut probe: SmallVec<[BlockId; 4]> = SmallVec::new();
    for i in (0..max_blocks).rev() {
        probe.clear();
        let hit = groups.iter().all(|&g| match pool.lookup(view.get(i), g) {
            Some(b) => {
                probe.push(b);
                true
            }
            None => false,
        });
        if !hit {
            run = 0;
            continue;
        }
        // A run must end on an aligned boundary (after the EAGLE drop).
        let end = if drop_eagle { i } else { i + 1 };
        if run == 0 && bs != alignment && !aligned(end) {
            continue;
        }
        for (list, &b) in out.iter_mut().zip(&probe) {
            list[i] = b;
        }
        run += 1;
        if run >= need {
            // `run` is `need`, or 1 when a window of one token needs no
            // block before the hit's end (the hit still keeps block `i`, as
            // vLLM's does).
            found = Some(i + run);
            break;
        }
    }
    let mut len = if let Some(end) = found {
        end
    } else {
        // The scan stopped at block 0: `run` is the run starting there (0 if
        // block 0 missed or was skipped), trimmed to the alignment.
        let mut len = run;
        while len > 0 && !aligned(len) {
            len -= 1;
        }
        len
    };
    if drop_eagle && len > 0 {
        len -= 1;
        while len > 0 && !aligned(len) {
            len -= 1;
        }
    }
    for list in out.iter_mut() {
        list.truncate(len);
    }
    len * bs
}

/// Which of the newly full blocks `[start, end)` a later hit can reach;
/// returns `false` when every block is worth caching (`mask` untouched),
/// else fills `mask` with one entry per block and returns `true`.
///
/// A hit ends on an aligned boundary and reads only the `need` blocks before
/// it. Dense caching (no retention interval) keeps the tail of every aligned
/// segment; `Some(r)` keeps the tail of every `r`-token segment; `Some(0)`
/// keeps none. With a retention interval the blocks before each reachable
/// boundary (rounded down to the alignment) are kept too.
///
/// `eagle`: an EAGLE group's hit matches one block past the boundary and
/// drops it, so every kept tail is one block longer and ends one block
/// later.
pub fn reachable_block_mask(
    start: usize,
    end: usize,
    block_size: usize,
    sliding_window: usize,
    eagle: bool,
    policy: &CachePolicy<'_>,
    mask: &mut Vec<bool>,
) -> bool {
    let alignment = policy.alignment;
    if alignment == 0 || alignment % block_size != 0 {
        return false;
    }
    let need = contiguous_blocks_needed(sliding_window, block_size, eagle);
    let shift = usize::from(eagle);
    let segment = match policy.retention {
        None => Some(alignment),
        Some(0) => None,
        Some(r) => Some(r),
    };
    mask.clear();
    mask.resize(end - start, false);
    if let Some(segment) = segment {
        let per_segment = segment / block_size;
        if need >= per_segment {
            return false;
        }
        for (i, m) in (start..end).zip(mask.iter_mut()) {
            *m = i >= shift && (i - shift) % per_segment >= per_segment - need;
        }
    }
    if policy.retention.is_some() {
        for &b in policy.reachable_boundaries {
            let last = (b / alignment * alignment) / block_size + shift;
            for i in last.saturating_sub(need).max(start)..last.min(end) {
                mask[i - start] = true;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::managers::test_util::{cache_block, h, hashes, ids, pool, table};
    use crate::managers::{GroupSpec, GroupTable, Manager};

    fn find(pattern: &str, max_blocks: usize) -> (Vec<u32>, usize) {
        find_with(pattern, max_blocks, 2, false)
    }

    fn find_with(
        pattern: &str,
        max_blocks: usize,
        alignment: usize,
        drop_eagle: bool,
    ) -> (Vec<u32>, usize) {
        // B = 2, W = 4; cached block i = pool block i + 10.
        let mut p = pool(40, 2);
        for (i, c) in pattern.chars().filter(|c| *c != ',').enumerate() {
            if c == 'T' {
                cache_block(&mut p, i as u32 + 10, &h(i as u32));
            }
        }
        let m = Manager::new(GroupSpec::sliding_window(2, 4), GroupId(0)).unwrap();
        let hs = hashes(max_blocks as u32);
        let mut out = vec![Vec::new()];
        let hit = m
            .find_longest_cache_hit(
                &p,
                &[GroupId(0)],
                &hs,
                2,
                max_blocks * 2,
                alignment,
                drop_eagle,
                &mut out,
            )
            .unwrap();
        assert_eq!(hit, out[0].len() * 2);
        (ids(&out[0]), out[0].len())
    }

    #[test]
    fn a_one_token_window_keeps_the_hit_block() {
        // Regression: W = 1 needs no block before a hit's end, yet the hit
        // ends after the cached block found (vLLM's search keeps it); the
        // finder used to end the hit one block early.
        let mut p = pool(40, 1);
        for i in [0u32, 2, 3] {
            cache_block(&mut p, i + 10, &h(i));
        }
        let m = Manager::new(GroupSpec::sliding_window(1, 1), GroupId(0)).unwrap();
        let hs = hashes(5);
        let mut out = vec![Vec::new()];
        let hit = m
            .find_longest_cache_hit(&p, &[GroupId(0)], &hs, 1, 5, 1, false, &mut out)
            .unwrap();
        assert_eq!((ids(&out[0]), hit), (vec![0, 0, 0, 13], 4));
    }

    #[test]
    fn eagle_drop_needs_one_more_block() {
        // W = 4, B = 2: a hit needs 2 blocks, 3 with EAGLE, then drops one.
        let eagle = |pattern, n| find_with(pattern, n, 2, true);
        assert_eq!(eagle("FFFF", 4).1, 0);
        assert_eq!(eagle("T", 1), (vec![], 0));
        assert_eq!(eagle("TT", 2), (vec![10], 1));
        // Two cached blocks after a miss are not enough any more ...
        assert_eq!(eagle("T,F,T,T", 4), (vec![], 0));
        assert_eq!(find("T,F,T,T", 4), (vec![0, 0, 12, 13], 4));
        // ... three are, and the last of them is dropped.
        assert_eq!(eagle("T,F,T,T,T", 5), (vec![0, 0, 12, 13], 4));
        assert_eq!(eagle("T,F,T,T,T,F", 6), (vec![0, 0, 12, 13], 4));
        // Alignment 4 (two blocks): the run must end aligned after the drop.
        assert_eq!(find_with("T,T,T,T,T", 5, 4, true), (vec![0, 0, 12, 13], 4));
        assert_eq!(
            find_with("F,T,T,T,T,T", 6, 4, true),
            (vec![0, 0, 12, 13], 4)
        );
        assert_eq!(find_with("T,T,T", 3, 4, true), (vec![10, 11], 2));
        // A run from block 0 too short for a window: aligned, dropped, aligned.
        assert_eq!(find_with("T,T,F", 3, 4, true), (vec![], 0));
        assert_eq!(find_with("T,T,T,F", 4, 4, true), (vec![10, 11], 2));
    }

    #[test]
    fn finder_table_35() {
        assert_eq!(find("FFFFFFFFFF", 10).1, 0);
        assert_eq!(find("T", 1), (vec![10], 1));
        assert_eq!(find("TF", 2), (vec![10], 1));
        assert_eq!(find("TT", 2), (vec![10, 11], 2));
        assert_eq!(find("TTF", 3).1, 2);
        assert_eq!(find("TTT", 3), (vec![0, 11, 12], 3));
        assert_eq!(find("TTTF", 4).1, 3);
        let (b, n) = find("T,T,F,T,F,F,T,T,F,T,T,T", 12);
        assert_eq!(n, 12);
        assert_eq!(b[10..], [20, 21]);
        assert!(b[..10].iter().all(|&x| x == 0));
        let (b, n) = find("T,T,F,T,F,F,T,T,F,F,F", 11);
        assert_eq!(n, 8);
        assert_eq!(b[6..], [16, 17]);
        assert!(b[..6].iter().all(|&x| x == 0));
        assert_eq!(find("T,T,F,T,F,F,T,T,F,F,F,T", 12).1, 8);
    }

    #[test]
    fn finer_hash_units_36() {
        // Hash unit 2, SWA B = 4, W = 8; block 10 under h1, block 11 under h3.
        let mut p = pool(20, 2);
        cache_block(&mut p, 10, &h(1));
        cache_block(&mut p, 11, &h(3));
        let m = Manager::new(GroupSpec::sliding_window(4, 8), GroupId(0)).unwrap();
        let mut out = vec![Vec::new()];
        let hit = m
            .find_longest_cache_hit(&p, &[GroupId(0)], &hashes(4), 2, 8, 2, false, &mut out)
            .unwrap();
        assert_eq!((hit, ids(&out[0])), (8, vec![10, 11]));
    }

    #[test]
    fn skipped_block_removal_38() {
        let m = Manager::new(GroupSpec::sliding_window(2, 4), GroupId(0)).unwrap();
        let mut p = pool(2000, 2);
        let mut t = GroupTable::default();
        let mut got = Vec::new();
        // Table of 11 real blocks 1001..=1011 (take 1..1000 first).
        p.get_new_blocks(1000, &mut got).unwrap();
        m.allocate_new_blocks(&mut p, &mut t, 22, &mut Vec::new())
            .unwrap();
        assert_eq!(t.blocks()[0], BlockId(1001));
        let mut scratch = Vec::new();
        let nulls = |t: &GroupTable| t.num_leading_nulls();
        for (processed, expect) in [(0, 0), (4, 0), (5, 1), (6, 1), (7, 2), (11, 4)] {
            m.remove_skipped_blocks(&mut p, &mut t, processed, None, &mut scratch)
                .unwrap();
            assert_eq!(nulls(&t), expect, "processed {processed}");
            t.check_invariants(false).unwrap();
        }
        // The last call freed 1004 then 1003 (backward walk); unhashed
        // blocks are prepended in the given order, ahead of 1002 and 1001.
        let front: Vec<u32> = p.free_block_ids().take(4).map(|b| b.0).collect();
        assert_eq!(front, vec![1004, 1003, 1002, 1001]);
        p.check_invariants().unwrap();
    }

    #[test]
    fn prediction_with_null_padded_hits_41() {
        let m = Manager::new(GroupSpec::sliding_window(2, 4), GroupId(0)).unwrap();
        let p = pool(100, 2);
        let real: Vec<BlockId> = (10..20).map(BlockId).collect();
        assert_eq!(m.num_blocks_to_allocate(&p, None, 40, &real, 0), 20);
        let mut padded = vec![BlockId::NULL; 5];
        padded.extend((10..15).map(BlockId));
        assert_eq!(m.num_blocks_to_allocate(&p, None, 40, &padded, 0), 15);
    }

    #[test]
    fn evictable_hit_counted_once_42() {
        let m = Manager::new(GroupSpec::sliding_window(2, 4), GroupId(0)).unwrap();
        let mut p = pool(10, 2);
        cache_block(&mut p, 1, &h(0));
        let hits = [BlockId(1)];
        assert_eq!(m.num_blocks_to_allocate(&p, None, 4, &hits, 2), 2);
        let mut t = GroupTable::default();
        m.add_local_computed_blocks(&mut p, &mut t, &hits, 2)
            .unwrap();
        let mut new = Vec::new();
        m.allocate_new_blocks(&mut p, &mut t, 4, &mut new).unwrap();
        assert_eq!(new.len(), 1);
        assert_eq!(t.blocks().len(), 2);
        assert_eq!(p.ref_count(BlockId(1)).unwrap(), 1);
        p.check_invariants().unwrap();
    }

    #[test]
    fn predictor_matches_allocator_43() {
        // SWA B = 2, W = 8, caching off (the admission cap is not modelled;
        // steps of 4 tokens never reach it).
        let m = Manager::new(GroupSpec::sliding_window(2, 8), GroupId(0)).unwrap();
        let mut p = crate::pool::BlockPool::new(crate::pool::PoolConfig {
            enable_caching: false,
            ..crate::pool::PoolConfig::new(64)
        })
        .unwrap();
        let mut t = GroupTable::default();
        let mut scratch = Vec::new();
        let mut tracked = false;
        for step in 1..=4 {
            let tokens = step * 4;
            m.remove_skipped_blocks(&mut p, &mut t, tokens - 4, None, &mut scratch)
                .unwrap();
            let predicted =
                m.num_blocks_to_allocate(&p, tracked.then_some(&t), tokens, &[], tokens - 4);
            let free = p.num_free_blocks();
            m.allocate_new_blocks(&mut p, &mut t, tokens, &mut Vec::new())
                .unwrap();
            let freed_then_taken = free - p.num_free_blocks();
            assert_eq!(predicted, 2);
            assert_eq!(freed_then_taken, 2);
            tracked = true;
        }
    }

    #[test]
    fn masks() {
        let policy = |retention, boundaries: &'static [usize]| CachePolicy {
            alignment: 32,
            retention,
            reachable_boundaries: boundaries,
        };
        let marked = |start, end, bs, w, p: &CachePolicy<'_>| {
            let mut m = Vec::new();
            if reachable_block_mask(start, end, bs, w, false, p, &mut m) {
                (start..end).filter(|i| m[i - start]).collect::<Vec<_>>()
            } else {
                (start..end).collect()
            }
        };
        // Hybrid full(32) + SWA(8, W = 8).
        assert_eq!(marked(0, 8, 8, 8, &policy(None, &[63])), vec![3, 7]);
        assert_eq!(
            marked(0, 16, 8, 8, &policy(Some(64), &[127])),
            vec![7, 11, 15]
        );
        assert_eq!(marked(0, 16, 8, 8, &policy(Some(0), &[127])), vec![11]);
        // Pure SWA (B = 16, W = 16, alignment 16), 256 tokens.
        let pure = |retention| CachePolicy {
            alignment: 16,
            retention,
            reachable_boundaries: &[255],
        };
        assert_eq!(
            marked(0, 16, 16, 16, &pure(Some(64))),
            vec![3, 7, 11, 14, 15]
        );
        assert_eq!(marked(0, 16, 16, 16, &pure(Some(0))), vec![14]);
        assert_eq!(
            marked(0, 16, 16, 16, &pure(None)),
            (0..16).collect::<Vec<_>>()
        );
        let _ = table(&[]);
    }

    #[test]
    fn eagle_masks_keep_one_block_more_one_block_later() {
        let marked = |bs, w, alignment, retention, boundaries: &'static [usize]| {
            let policy = CachePolicy {
                alignment,
                retention,
                reachable_boundaries: boundaries,
            };
            let mut m = Vec::new();
            if reachable_block_mask(0, 16, bs, w, true, &policy, &mut m) {
                (0..16).filter(|&i| m[i]).collect::<Vec<_>>()
            } else {
                (0..16).collect()
            }
        };
        // Pure SWA (B = 16, W = 16, alignment 16), 256 tokens.
        assert_eq!(
            marked(16, 16, 16, Some(64), &[255]),
            vec![3, 4, 7, 8, 11, 12, 14, 15]
        );
        assert_eq!(marked(16, 16, 16, Some(0), &[255]), vec![14, 15]);
        // One block per segment: every block is reachable.
        assert_eq!(
            marked(16, 16, 16, None, &[255]),
            (0..16).collect::<Vec<_>>()
        );
        // Hybrid full(32) + SWA(8, W = 8).
        assert_eq!(marked(8, 8, 32, None, &[63]), vec![3, 4, 7, 8, 11, 12, 15]);
        assert_eq!(marked(8, 8, 32, Some(64), &[127]), vec![7, 8, 11, 12, 15]);
        assert_eq!(marked(8, 8, 32, Some(0), &[127]), vec![11, 12]);
        assert_eq!(
            marked(8, 8, 32, Some(0), &[127, 64, 56]),
            vec![3, 4, 7, 8, 11, 12]
        );
    }
}
