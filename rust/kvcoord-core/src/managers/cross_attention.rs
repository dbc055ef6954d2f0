//! Cross-attention: the decoder reads the encoder output, so a request gets
//! one static allocation sized by its encoder tokens (the coordinator passes
//! those instead of the decoder tokens). Never prefix-cached, never skipped;
//! the generic rules in [`Manager`](super::Manager) cover it.

#[cfg(test)]
mod tests {
    use crate::error::KvError;
    use crate::ids::GroupId;
    use crate::managers::test_util::{hashes, pool};
    use crate::managers::{CachePolicy, GroupSpec, GroupTable, Manager};

    #[test]
    fn static_allocation() {
        let m = Manager::new(GroupSpec::cross_attention(4), GroupId(0)).unwrap();
        let mut p = pool(20, 4);
        assert_eq!(m.num_blocks_to_allocate(&p, None, 10, &[], 0), 3);
        let mut t = GroupTable::default();
        m.allocate_new_blocks(&mut p, &mut t, 10, &mut Vec::new())
            .unwrap();
        assert_eq!(m.num_blocks_to_allocate(&p, Some(&t), 10, &[], 0), 0);
        let policy = CachePolicy {
            alignment: 4,
            retention: None,
            reachable_boundaries: &[],
        };
        m.cache_blocks(&mut p, &mut t, &hashes(3), 4, 12, &policy, &mut Vec::new())
            .unwrap();
        assert_eq!(p.num_cached_keys(), 0);
        let mut out = vec![Vec::new()];
        let err = m.find_longest_cache_hit(&p, &[GroupId(0)], &hashes(2), 4, 8, 4, false, &mut out);
        assert!(matches!(err, Err(KvError::Unsupported { .. })));
    }
}
