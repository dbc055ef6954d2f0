//! Multi-head latent attention (`MLAAttentionSpec`): one latent vector per
//! token instead of per-head keys and values. Block management is exactly
//! full attention's (see [`full_attention`](super::full_attention)); the kind
//! exists so that a hybrid model buckets MLA groups apart from plain
//! full-attention groups, as vLLM does.

#[cfg(test)]
mod tests {
    use crate::ids::GroupId;
    use crate::managers::test_util::{cache_block, h, hashes, ids, pool};
    use crate::managers::{GroupSpec, Manager};

    #[test]
    fn hits_like_full_attention() {
        let mut p = pool(20, 2);
        for i in [0u32, 1, 3] {
            cache_block(&mut p, i + 1, &h(i));
        }
        let hs = hashes(4);
        let mut out = [vec![], vec![]];
        let mla = Manager::new(GroupSpec::mla_attention(2), GroupId(0)).unwrap();
        let full = Manager::new(GroupSpec::full_attention(2), GroupId(0)).unwrap();
        let a = mla
            .find_longest_cache_hit(&p, &[GroupId(0)], &hs, 2, 8, 2, false, &mut out[..1])
            .unwrap();
        let b = full
            .find_longest_cache_hit(&p, &[GroupId(0)], &hs, 2, 8, 2, false, &mut out[1..])
            .unwrap();
        assert_eq!((a, ids(&out[0])), (4, vec![1, 2]));
        assert_eq!((b, ids(&out[1])), (a, ids(&out[0])));
        assert!(GroupSpec::mla_attention(2).is_full_attention());
        assert_ne!(GroupSpec::mla_attention(2), GroupSpec::full_attention(2));
        assert_eq!(mla.num_skipped_tokens(1000), 0);
    }
}
