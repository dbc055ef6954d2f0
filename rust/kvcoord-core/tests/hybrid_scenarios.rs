//! Hybrid-coordinator scenarios of the spec (§8.7: 48, 50, 51, 52) through
//! `CoordinatorCore` and the test-only fixed point of `common`.

mod common;

use common::{buckets, extend_hashes, hybrid_find_with_longest};
use kvcoord_core::{
    BlockHash, BlockId, CoordinatorConfig, CoordinatorCore, GroupSpec, ReqId, RequestView,
};

fn hashes(tokens: &[u32], unit: usize) -> Vec<BlockHash> {
    let mut h = Vec::new();
    extend_hashes(&mut h, tokens, unit, None);
    h
}

fn coordinator(specs: &[GroupSpec], num_blocks: usize, unit: u32) -> CoordinatorCore {
    let mut cfg = CoordinatorConfig::new(specs.to_vec(), num_blocks, true, 4096);
    cfg.hash_block_size = unit;
    CoordinatorCore::new(cfg).unwrap()
}

fn ids(v: &[Vec<BlockId>]) -> Vec<Vec<u32>> {
    v.iter().map(|l| l.iter().map(|b| b.0).collect()).collect()
}

/// Lookup (max = `len - 1`) with the fixed point: (blocks, hit, longest).
fn lookup(
    c: &CoordinatorCore,
    specs: &[GroupSpec],
    tokens: &[u32],
    unit: usize,
) -> (Vec<Vec<u32>>, usize, usize) {
    let sched = c.config().scheduler_block_size as usize;
    let (b, hit, longest) = hybrid_find_with_longest(
        c,
        specs,
        &buckets(specs),
        &hashes(tokens, unit),
        tokens.len() - 1,
        sched,
    );
    (ids(&b), hit, longest)
}

/// Admit `tokens` as request `id` (lookup, then allocate the rest).
fn admit(
    c: &mut CoordinatorCore,
    specs: &[GroupSpec],
    id: u64,
    tokens: &[u32],
    unit: usize,
) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let h = hashes(tokens, unit);
    let sched = c.config().scheduler_block_size as usize;
    let (hits, hit, _) =
        hybrid_find_with_longest(c, specs, &buckets(specs), &h, tokens.len() - 1, sched);
    let view = RequestView::new(0, tokens.len(), tokens.len(), &h);
    let new = c
        .allocate_slots(
            ReqId(id),
            &view,
            tokens.len() - hit,
            hit,
            Some(&hits),
            0,
            0,
            false,
        )
        .unwrap()
        .unwrap();
    c.check_invariants().unwrap();
    (ids(&hits), ids(&new))
}

#[test]
fn full_plus_two_swa_48() {
    let specs = [
        GroupSpec::full_attention(16),
        GroupSpec::sliding_window(16, 32),
        GroupSpec::sliding_window(16, 32),
    ];
    let shared: Vec<u32> = (0..48).collect();
    let t0 = [&shared[..], &[900; 7]].concat();
    let t1 = [&shared[..], &[901; 5]].concat();
    let setup = || {
        let mut c = coordinator(&specs, 21, 16);
        let (_, new) = admit(&mut c, &specs, 0, &t0, 16);
        assert_eq!(
            new,
            [vec![1, 2, 3, 4], vec![5, 6, 7, 8], vec![9, 10, 11, 12]]
        );
        let (hits, new) = admit(&mut c, &specs, 1, &t1, 16);
        assert_eq!(hits, [vec![1, 2, 3], vec![0, 6, 7], vec![0, 10, 11]]);
        assert_eq!(new, [vec![13], vec![14], vec![15]]);
        for b in [1, 2, 3, 6, 7, 10, 11] {
            assert_eq!(c.pool().ref_count(BlockId(b)).unwrap(), 2);
        }
        c.free(ReqId(0)).unwrap();
        c.free(ReqId(1)).unwrap();
        c
    };
    setup();
    // Block k of the full group is id k+1, of SWA-a 5+k, of SWA-b 9+k.
    let cases: [(&[u32], usize); 7] = [
        (&[5, 9], 3),
        (&[1], 0),
        (&[3, 7, 11], 2),
        (&[3], 2),
        (&[7], 2),
        (&[11], 2),
        (&[3, 5, 9], 0),
    ];
    for (evict, blocks) in cases {
        let mut c = setup();
        let ev: Vec<BlockId> = evict.iter().map(|&b| BlockId(b)).collect();
        c.pool_mut().evict_blocks(&ev).unwrap();
        let (_, hit, _) = lookup(&c, &specs, &t1, 16);
        assert_eq!(hit, blocks * 16, "evicting {evict:?}");
    }
}

#[test]
fn different_block_sizes_50() {
    let specs = [
        GroupSpec::full_attention(32),
        GroupSpec::sliding_window(16, 32),
    ];
    let mut c = coordinator(&specs, 100, 16);
    let tokens: Vec<u32> = (0..160).collect();
    let h = hashes(&tokens, 16);
    let new = c
        .allocate_slots(
            ReqId(0),
            &RequestView::new(0, 160, 160, &h),
            112,
            0,
            None,
            0,
            0,
            false,
        )
        .unwrap()
        .unwrap();
    assert_eq!(ids(&new), [vec![1, 2, 3, 4], (5..12).collect::<Vec<_>>()]);
    for len in [113, 97] {
        let (b, hit, _) = lookup(&c, &specs, &tokens[..len], 16);
        assert_eq!((hit, b[0].len(), b[1].len()), (96, 3, 6), "prefix {len}");
    }
    c.pool_mut()
        .evict_blocks(&[BlockId(10), BlockId(11)])
        .unwrap();
    let (b, hit, _) = lookup(&c, &specs, &tokens[..113], 16);
    assert_eq!((hit, b[0].len(), b[1].len()), (64, 2, 4));
}

#[test]
fn fixed_point_convergence_51() {
    let specs = [
        GroupSpec::full_attention(4),
        GroupSpec::sliding_window(4, 8),
        GroupSpec::sliding_window(4, 16),
    ];
    let mut c = coordinator(&specs, 40, 4);
    let tokens: Vec<u32> = (0..25).collect();
    let (_, new) = admit(&mut c, &specs, 0, &tokens, 4);
    assert_eq!(
        new,
        [
            (1..8).collect::<Vec<_>>(),
            (8..15).collect(),
            (15..22).collect()
        ]
    );
    c.free(ReqId(0)).unwrap();
    // SWA-a blocks 2-3 (ids 10, 11), SWA-b block 4 (id 19).
    c.pool_mut()
        .evict_blocks(&[BlockId(10), BlockId(11), BlockId(19)])
        .unwrap();
    let h = hashes(&tokens, 4);
    let per = |g: u32| {
        c.find_longest_cache_hit(&[kvcoord_core::GroupId(g)], &h, 24, 4)
            .unwrap()
            .1
    };
    assert_eq!((per(0), per(1), per(2)), (24, 24, 16));
    let (b, hit, longest) = lookup(&c, &specs, &tokens, 4);
    assert_eq!(hit, 8);
    assert_eq!(b, [vec![1, 2], vec![8, 9], vec![15, 16]]);
    assert_eq!(longest, 24);
}

#[test]
fn several_sliding_windows_52() {
    let specs = [
        GroupSpec::full_attention(16),
        GroupSpec::sliding_window(16, 512),
        GroupSpec::sliding_window(16, 256),
    ];
    let mut c = coordinator(&specs, 40, 16);
    let tokens: Vec<u32> = (0..96).collect();
    admit(&mut c, &specs, 0, &tokens, 16);
    c.free(ReqId(0)).unwrap();
    let (b, hit, _) = lookup(&c, &specs, &tokens, 16);
    assert_eq!(hit, 80);
    assert!(b.iter().all(|l| l.len() == 5));

    let specs = [
        GroupSpec::full_attention(16),
        GroupSpec::sliding_window(16, 64),
        GroupSpec::sliding_window(16, 32),
    ];
    let mut c = coordinator(&specs, 40, 16);
    let tokens: Vec<u32> = (0..80).collect();
    admit(&mut c, &specs, 0, &tokens, 16);
    c.free(ReqId(0)).unwrap();
    let (b, hit, _) = lookup(&c, &specs, &tokens, 16);
    assert_eq!(hit, 64);
    assert!(b.iter().all(|l| l.len() == 4));
    c.pool_mut().evict_blocks(&[BlockId(13)]).unwrap();
    let (b, hit, _) = lookup(&c, &specs, &tokens, 16);
    assert_eq!(hit, 32);
    assert_eq!(b, [vec![1, 2], vec![6, 7], vec![11, 12]]);
}
