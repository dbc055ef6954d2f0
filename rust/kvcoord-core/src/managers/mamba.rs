//! Mamba, mode "none": the state after the last computed token is all that
//! matters, there is no prefix caching, and speculative decoding needs
//! `num_speculative_blocks` scratch blocks on top.

/// Every computed token but the last is skipped (its state is superseded).
#[inline]
pub fn num_skipped_tokens(n: usize) -> usize {
    n.saturating_sub(1)
}

/// Slots to allocate for `num_tokens`: the speculative scratch blocks add
/// `num_speculative_blocks * block_size` tokens. Saturating: a sum past
/// 2^64 slots is more than any pool holds, so the allocation is refused
/// as too large rather than wrapped to a small one.
#[inline]
pub fn tokens_to_allocate(
    num_tokens: usize,
    num_speculative_blocks: u32,
    block_size: usize,
) -> usize {
    num_tokens.saturating_add((num_speculative_blocks as usize).saturating_mul(block_size))
}

#[cfg(test)]
mod tests {
    use crate::error::KvError;
    use crate::ids::GroupId;
    use crate::managers::test_util::{hashes, pool};
    use crate::managers::{GroupSpec, GroupTable, Manager};

    #[test]
    fn keeps_only_the_last_state_and_reserves_scratch() {
        let m = Manager::new(GroupSpec::mamba(4, 1), GroupId(0)).unwrap();
        let mut p = pool(40, 4);
        assert_eq!(m.num_blocks_to_allocate(&p, None, 10, &[], 0), 4);
        let mut t = GroupTable::default();
        let mut new = Vec::new();
        m.allocate_new_blocks(&mut p, &mut t, 10, &mut new).unwrap();
        assert_eq!(new.len(), 4);
        let mut scratch = Vec::new();
        m.remove_skipped_blocks(&mut p, &mut t, 10, None, &mut scratch)
            .unwrap();
        // 9 skipped tokens: the first two blocks go.
        assert_eq!(t.num_leading_nulls(), 2);
        m.remove_skipped_blocks(&mut p, &mut t, 0, None, &mut scratch)
            .unwrap();
        assert_eq!(t.num_leading_nulls(), 2);
        let mut out = vec![Vec::new()];
        let err = m.find_longest_cache_hit(&p, &[GroupId(0)], &hashes(2), 4, 8, 4, false, &mut out);
        assert!(matches!(err, Err(KvError::Unsupported { .. })));
        p.check_invariants().unwrap();
    }
}
