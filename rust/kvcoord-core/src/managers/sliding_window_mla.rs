//! Sliding-window MLA (`SlidingWindowMLASpec`): managed exactly like
//! [`sliding_window`](super::sliding_window) (a hit needs the last
//! `cdiv(W - 1, bs)` blocks before its end; blocks wholly before the window
//! of the next token are released). A kind of its own so that hybrid lookups
//! bucket it apart from plain sliding-window groups, as vLLM does.

#[cfg(test)]
mod tests {
    use crate::ids::GroupId;
    use crate::managers::test_util::{cache_block, h, hashes, ids, pool};
    use crate::managers::{GroupSpec, Manager};

    #[test]
    fn behaves_like_sliding_window() {
        let mut p = pool(20, 2);
        for i in [0u32, 1, 3, 4] {
            cache_block(&mut p, i + 1, &h(i));
        }
        let hs = hashes(6);
        let specs = [
            GroupSpec::sliding_window_mla(2, 4),
            GroupSpec::sliding_window(2, 4),
        ];
        let got: Vec<(usize, Vec<u32>, usize)> = specs
            .iter()
            .map(|&s| {
                let m = Manager::new(s, GroupId(0)).unwrap();
                let mut out = [vec![]];
                let hit = m
                    .find_longest_cache_hit(&p, &[GroupId(0)], &hs, 2, 11, 2, false, &mut out)
                    .unwrap();
                (hit, ids(&out[0]), m.num_skipped_tokens(9))
            })
            .collect();
        assert_eq!(got[0], (10, vec![0, 0, 0, 4, 5], 6));
        assert_eq!(got[0], got[1]);
        assert!(GroupSpec::sliding_window_mla(2, 4).is_sparse());
        assert!(!GroupSpec::sliding_window_mla(2, 4).is_full_attention());
    }
}
