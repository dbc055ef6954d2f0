//! The pool's unit tests: vLLM's order rules, the keys, the events and
//! the refusals, each checking the invariants after it.

use super::*;
use crate::block_hash::BlockHash;
use crate::ids::GroupId;
use crate::prefix_index::CacheKey;

fn pool(n: usize) -> BlockPool {
    BlockPool::new(PoolConfig::new(n)).unwrap()
}

fn h(n: u8) -> BlockHash {
    BlockHash::from_slice(&[n; 32]).unwrap()
}

fn get(p: &mut BlockPool, n: usize) -> Vec<u32> {
    let mut out = Vec::new();
    p.get_new_blocks(n, &mut out).unwrap();
    p.check_invariants().unwrap();
    out.into_iter().map(|b| b.0).collect()
}

fn queue(p: &BlockPool) -> Vec<u32> {
    p.free_block_ids().map(|b| b.0).collect()
}

fn ids(v: &[u32]) -> Vec<BlockId> {
    v.iter().map(|&b| BlockId(b)).collect()
}

#[test]
fn fresh_pool() {
    let mut p = pool(10);
    assert_eq!(p.num_free_blocks(), 9);
    assert_eq!(get(&mut p, 2), vec![1, 2]);
    assert!((p.usage() - 2.0 / 9.0).abs() < 1e-12);
    let err = p.get_new_blocks(8, &mut Vec::new()).unwrap_err();
    assert_eq!(
        err,
        KvError::OutOfBlocks {
            requested: 8,
            available: 7
        }
    );
    assert_eq!(p.num_free_blocks(), 7);
    assert!(BlockPool::new(PoolConfig::new(0)).is_err());
    assert!(pool(1).usage().abs() < f64::EPSILON);
}

/// Walking `free_neighbours` from the front gives `free_block_ids`, both
/// ways, under LRU (links) and a ranked policy (a walk).
#[test]
fn free_neighbours_walk_the_queue() {
    for policy in ["lru", "lfu"] {
        let mut p = pool(8);
        p.set_eviction(policy.parse().unwrap()).unwrap();
        let b = ids(&get(&mut p, 4));
        p.cache_full_blocks(&b[..2], &[h(1), h(2)], 0, 2, GroupId(0), None)
            .unwrap();
        p.free_blocks(&[b[3], b[0], b[2], b[1]]).unwrap();
        let order = queue(&p);
        let n = |x: u32| p.free_neighbours(BlockId(x)).unwrap();
        let mut walked = Vec::new();
        let mut cur = order.first().copied();
        let mut prev = None;
        while let Some(x) = cur {
            let (before, after) = n(x).unwrap();
            assert_eq!(before.map(|b| b.0), prev, "{policy}");
            walked.push(x);
            prev = Some(x);
            cur = after.map(|b| b.0);
        }
        assert_eq!(walked, order, "{policy}");
        let held = ids(&get(&mut p, 1))[0];
        assert_eq!(p.free_neighbours(held).unwrap(), None);
        assert_eq!(p.free_neighbours(BlockId(0)).unwrap(), None); // null block
        assert!(p.free_neighbours(BlockId(8)).is_err());
    }
}

#[test]
fn residency_clock_and_records_through_the_pool() {
    let mut p = pool(3);
    p.set_residency_clock(5); // metrics off: nothing to move
    assert!(p.drain_eviction_records().is_empty());
    p.enable_residency().unwrap();
    p.set_residency_clock(10);
    let b = ids(&get(&mut p, 2));
    p.cache_full_blocks(&b[..1], &[h(1)], 0, 1, GroupId(0), None)
        .unwrap();
    p.free_blocks(&b).unwrap();
    p.set_residency_clock(30);
    get(&mut p, 2); // reuses both; the cached one is evicted
    let records = p.drain_eviction_records();
    assert_eq!(records.len(), 1);
    assert_eq!((records[0].block, records[0].lifetime), (b[0], 20));
    assert!(p.drain_eviction_records().is_empty());
}

#[test]
fn sampled_lives_follow_vllms_pool_calls() {
    let mut p = pool(4);
    assert!(p.drain_life_samples().is_empty()); // off
    assert!(p.enable_sampled_lives(0.0, 1).is_err());
    p.enable_sampled_lives(1.0, 1).unwrap();
    let b = ids(&get(&mut p, 2));
    p.cache_full_blocks(&b[..1], &[h(1)], 0, 1, GroupId(0), None)
        .unwrap();
    p.free_blocks(&b).unwrap();
    p.touch(&[b[0], BlockId::NULL]).unwrap(); // a hit on the cached block
    p.free_blocks(&b[..1]).unwrap();
    assert!(p.drain_life_samples().is_empty(), "no life has ended");
    // Handing out every free block ends both lives, the uncached one too
    // (vLLM ends a sampled life at every reallocation when caching is on).
    let again = ids(&get(&mut p, 3));
    assert_eq!(p.drain_life_samples().len(), 2);
    p.evict_blocks(&again[..1]).unwrap();
    assert_eq!(p.drain_life_samples().len(), 1);
    p.free_blocks(&again).unwrap();
    p.check_invariants().unwrap();
    // A reset forgets the remaining lives.
    p.evict_blocks(&again[1..2]).unwrap();
    assert!(p.reset_prefix_cache());
    assert!(p.drain_life_samples().is_empty());
    p.evict_blocks(&again).unwrap();
    assert!(p.drain_life_samples().is_empty());
}

#[test]
fn free_order_split() {
    // Unhashed blocks to the front in order, hashed ones to the back.
    let mut p = pool(5);
    let b = ids(&get(&mut p, 4));
    p.cache_full_blocks(&b, &[h(1), h(2)], 0, 2, GroupId(7), None)
        .unwrap();
    p.free_blocks(&b).unwrap();
    assert_eq!(queue(&p), vec![3, 4, 1, 2]);
    p.check_invariants().unwrap();
}

#[test]
fn double_free_is_refused_and_changes_nothing() {
    let mut p = pool(4);
    let b = ids(&get(&mut p, 2));
    let before = queue(&p);
    assert_eq!(
        p.free_blocks(&[b[0], b[1], b[0]]),
        Err(KvError::RefCountUnderflow(b[0]))
    );
    assert_eq!(queue(&p), before);
    assert_eq!(p.ref_count(b[0]).unwrap(), 1);
    p.free_blocks(&[b[0]]).unwrap();
    assert_eq!(
        p.free_blocks(&[b[0]]),
        Err(KvError::RefCountUnderflow(b[0]))
    );
    p.check_invariants().unwrap();
}

#[test]
fn rejected_free_unstages_blocks_bound_for_both_ends() {
    // Regression guard for the one-pass free: blocks already staged for
    // the front and the back when a bad id turns up must be unstaged.
    for extra_free in [false, true] {
        let mut p = pool(8);
        let b = ids(&get(&mut p, 4));
        p.cache_full_blocks(&b, &[h(1), h(2)], 0, 2, GroupId(0), None)
            .unwrap();
        if extra_free {
            // Leave a cached block on the back so the queue is non-empty
            // at both ends.
            p.touch(&b[3..]).unwrap();
            p.free_blocks(&b[3..]).unwrap();
        }
        let (queue_before, refs_before) = (queue(&p), p.ref_counts().collect::<Vec<_>>());
        // b0 and b1 are cached (staged for the back), b2 is not (front);
        // then an out-of-range id, or a second release of b2.
        for bad in [BlockId(99), b[2]] {
            let call = [b[0], b[2], b[1], bad];
            assert!(p.free_blocks(&call).is_err(), "{call:?}");
            assert_eq!(queue(&p), queue_before);
            assert_eq!(p.ref_counts().collect::<Vec<_>>(), refs_before);
            p.check_invariants().unwrap();
        }
        p.free_blocks(&b[..3]).unwrap();
        let tail: Vec<u32> = queue(&p).into_iter().rev().take(2).collect();
        assert_eq!(
            tail,
            vec![b[1].0, b[0].0],
            "cached blocks at the back, in order"
        );
        p.check_invariants().unwrap();
    }
}

#[test]
fn touch_pins_a_free_cached_block() {
    let mut p = pool(4);
    let b = ids(&get(&mut p, 1));
    p.cache_full_blocks(&b, &[h(9)], 0, 1, GroupId(0), None)
        .unwrap();
    p.free_blocks(&b).unwrap();
    assert_eq!(queue(&p), vec![2, 3, 1]);
    let mut hit = Vec::new();
    assert!(p.get_cached_block(&h(9), &[GroupId(0)], &mut hit));
    p.touch(&hit).unwrap();
    assert_eq!(queue(&p), vec![2, 3]);
    // The pinned hit is not evicted by allocation pressure.
    assert_eq!(get(&mut p, 2), vec![2, 3]);
    assert!(p.is_cached(BlockId(1)).unwrap());
    p.check_invariants().unwrap();
}

fn removed(n: u8, g: u32) -> KvEvent {
    KvEvent::BlockRemoved {
        block_hash: h(n),
        group: GroupId(g),
        medium: Medium::Gpu,
    }
}

fn partial_pool(n: usize) -> BlockPool {
    BlockPool::new(PoolConfig {
        enable_events: true,
        hash_block_size: 4,
        ..PoolConfig::new(n)
    })
    .unwrap()
}

#[test]
fn partial_primary_key_is_promoted_when_the_block_fills() {
    let mut p = partial_pool(4);
    let b = ids(&get(&mut p, 2));
    let units = [h(1), h(2), h(3), h(4)];
    // Two hash units per block: block 1 (tokens 8..16) keyed at 12.
    let k = p.cache_partial_block(b[1], &units, 12, 16, GroupId(0), false);
    assert_eq!(k.unwrap().map(|k| k.hash), Some(h(3)));
    assert_eq!(p.primary_key_tokens(b[1]).unwrap(), Some(12));
    assert_eq!(p.lookup(&h(3), GroupId(0)), Some(b[1]));
    // Repeating it changes nothing and records nothing.
    p.take_events();
    p.cache_partial_block(b[1], &units, 12, 16, GroupId(0), false)
        .unwrap();
    assert!(p.take_events().is_empty());
    p.check_invariants().unwrap();
    // A partially keyed block is cached: freed to the back.
    // Full: the partial key is removed (reported), then the full keys.
    p.cache_full_blocks_scaled(&b, &units, 2, 0, 2, GroupId(0), None)
        .unwrap();
    let ev = p.take_events();
    assert_eq!(ev[0], removed(3, 0));
    assert!(matches!(&ev[1], KvEvent::BlockStored(s) if s.block_hashes == [h(2), h(4)]));
    assert_eq!(p.primary_key_tokens(b[1]).unwrap(), None);
    assert_eq!(p.lookup(&h(3), GroupId(0)), None);
    assert_eq!(p.num_partial_blocks(), 0);
    p.check_invariants().unwrap();
    // A full key is never promoted again.
    assert_eq!(
        p.cache_full_blocks_scaled(&b, &units, 2, 1, 2, GroupId(0), None),
        Err(KvError::AlreadyCached(b[1]))
    );
}

#[test]
fn key_num_tokens_follow_the_primary_key() {
    // vLLM's block_hash_num_tokens: a full key covers its block's end,
    // a partial key its own count; moved keys keep theirs.
    let mut p = partial_pool(6);
    let b = ids(&get(&mut p, 4));
    let units = [h(1), h(2), h(3), h(4)];
    assert_eq!(p.key_num_tokens(b[0]).unwrap(), None);
    p.cache_full_blocks_scaled(&b, &units, 2, 0, 2, GroupId(0), None)
        .unwrap();
    assert_eq!(p.key_num_tokens(b[0]).unwrap(), Some(8));
    assert_eq!(p.key_num_tokens(b[1]).unwrap(), Some(16));
    assert_eq!(p.primary_key_tokens(b[1]).unwrap(), None);
    // A key replaced by one at 12 (a checkpoint inside its block).
    p.cache_partial_block(b[1], &units, 12, 16, GroupId(0), true)
        .unwrap();
    assert_eq!(p.key_num_tokens(b[1]).unwrap(), Some(12));
    p.move_block_keys(b[1], b[2]).unwrap();
    assert_eq!(p.key_num_tokens(b[1]).unwrap(), None);
    assert_eq!(p.key_num_tokens(b[2]).unwrap(), Some(12));
    p.move_block_keys(b[0], b[3]).unwrap();
    assert_eq!(p.key_num_tokens(b[3]).unwrap(), Some(8));
    p.check_invariants().unwrap();
    p.evict_blocks(&[b[3]]).unwrap();
    assert_eq!(p.key_num_tokens(b[3]).unwrap(), None);
    assert!(p.key_num_tokens(BlockId(99)).is_err());
}

#[test]
fn keys_inserted_by_hand() {
    let mut p = partial_pool(5);
    let key = |n: u8, g: u32| CacheKey {
        hash: h(n),
        group: GroupId(g),
    };
    let queue_before = queue(&p);
    // A free block and the null block are keyed where they stand.
    assert!(p.insert_key(BlockId(2), key(1, 0), None).unwrap());
    assert_eq!(p.key_num_tokens(BlockId(2)).unwrap(), None);
    assert!(p.insert_key(BlockId::NULL, key(1, 0), None).unwrap());
    assert_eq!(queue(&p), queue_before);
    assert_eq!(p.ref_count(BlockId::NULL).unwrap(), 0);
    // Both under one key, in insertion order; a repeat is a no-op.
    assert_eq!(p.lookup(&h(1), GroupId(0)), Some(BlockId(2)));
    assert!(!p.insert_key(BlockId(2), key(1, 0), None).unwrap());
    // A second key of a keyed block is a secondary one, whole-block.
    assert!(p.insert_key(BlockId(2), key(2, 1), None).unwrap());
    assert_eq!(
        p.cache_keys(BlockId(2)).unwrap(),
        vec![(key(1, 0), None), (key(2, 1), None)]
    );
    assert_eq!(p.num_cached_keys(), 2);
    assert!(p.take_events().is_empty());
    p.check_invariants().unwrap();
    // Removal reports every key; the null block's key goes the same way.
    p.evict_blocks(&[BlockId(2)]).unwrap();
    assert_eq!(p.take_events(), vec![removed(1, 0), removed(2, 1)]);
    assert_eq!(p.lookup(&h(1), GroupId(0)), Some(BlockId::NULL));
    p.check_invariants().unwrap();
    // Handing blocks out, freeing and touching never count the null block.
    let got = get(&mut p, 4);
    assert!(!got.contains(&0));
    p.touch(&[BlockId::NULL]).unwrap();
    p.free_blocks(&ids(&got)).unwrap();
    p.check_invariants().unwrap();
    assert!(p.reset_prefix_cache());
    assert_eq!(p.num_cached_keys(), 0);
    assert!(!p.is_cached(BlockId::NULL).unwrap());
    p.check_invariants().unwrap();
    // Refused: out of range, and under a ranked policy.
    assert!(p.insert_key(BlockId(9), key(1, 0), None).is_err());
    let mut ranked =
        BlockPool::with_eviction(PoolConfig::new(4), "lfu".parse::<EvictionConfig>().unwrap())
            .unwrap();
    assert!(ranked.insert_key(BlockId(1), key(1, 0), None).is_err());
    assert_eq!(ranked.num_cached_keys(), 0);
}

#[test]
fn secondary_keys_leave_with_the_block() {
    let mut p = partial_pool(4);
    let b = ids(&get(&mut p, 2));
    let units = [h(1), h(2), h(3), h(4)];
    p.cache_full_blocks_scaled(&b, &units, 2, 0, 2, GroupId(0), None)
        .unwrap();
    // Block 1 covers 16 tokens, so a key at 12 becomes a secondary key.
    p.cache_partial_block(b[1], &units, 12, 16, GroupId(0), false)
        .unwrap();
    let ev = p.take_events();
    assert!(matches!(&ev[1], KvEvent::BlockStored(s)
        if s.block_hashes == [h(3)] && s.parent_block_hash == Some(h(2))
            && s.first_block == 2 && s.num_blocks == 1 && s.block_size == 4));
    assert_eq!(
        p.cache_keys(b[1]).unwrap(),
        vec![
            (
                CacheKey {
                    hash: h(4),
                    group: GroupId(0)
                },
                None
            ),
            (
                CacheKey {
                    hash: h(3),
                    group: GroupId(0)
                },
                Some(12)
            ),
        ]
    );
    assert_eq!(p.num_cached_keys(), 3);
    p.check_invariants().unwrap();
    p.free_blocks(&[b[1], b[0]]).unwrap();
    assert_eq!(
        queue(&p),
        [3, 2, 1],
        "cached blocks go to the back in order"
    );
    // Reused: the primary key is reported first, then the secondary one.
    get(&mut p, 2);
    let ev = p.take_events();
    assert_eq!(ev, [removed(4, 0), removed(3, 0)]);
    assert_eq!(p.num_cached_keys(), 1);
    p.check_invariants().unwrap();
}

#[test]
fn replacing_drops_every_key_first() {
    let mut p = partial_pool(4);
    let b = ids(&get(&mut p, 1));
    let units = [h(1), h(2)];
    p.cache_partial_block(b[0], &units, 4, 8, GroupId(1), false)
        .unwrap();
    // A longer prefix of the same block supersedes a shorter primary.
    p.cache_partial_block(b[0], &units, 8, 8, GroupId(1), false)
        .unwrap();
    assert_eq!(p.take_events()[1], removed(1, 1));
    assert_eq!(p.primary_key_tokens(b[0]).unwrap(), Some(8));
    // Contents replaced: even the same key is dropped and stored again.
    p.cache_partial_block(b[0], &units, 8, 8, GroupId(1), true)
        .unwrap();
    let ev = p.take_events();
    assert_eq!(ev[0], removed(2, 1));
    assert!(matches!(&ev[1], KvEvent::BlockStored(_)));
    p.check_invariants().unwrap();
    // Refusals change nothing.
    for bad in [0, 3, 12] {
        assert!(p
            .cache_partial_block(b[0], &units, bad, 8, GroupId(1), false)
            .is_err());
    }
    assert!(p
        .cache_partial_block(BlockId(9), &units, 4, 8, GroupId(1), false)
        .is_err());
    assert_eq!(
        p.cache_partial_block(BlockId::NULL, &units, 4, 8, GroupId(1), false),
        Ok(None)
    );
    assert!(p.take_events().is_empty());
    p.check_invariants().unwrap();
}

#[test]
fn moved_keys_follow_the_copy() {
    let mut p = partial_pool(6);
    let units = [h(1), h(2)];
    let a = ids(&get(&mut p, 2));
    // Two blocks under the same key; the first keeps a secondary key.
    p.cache_partial_block(a[0], &units, 8, 8, GroupId(0), false)
        .unwrap();
    p.cache_partial_block(a[0], &units, 4, 8, GroupId(0), false)
        .unwrap();
    p.cache_partial_block(a[1], &units, 8, 8, GroupId(0), false)
        .unwrap();
    p.take_events();
    let c = ids(&get(&mut p, 1))[0];
    p.move_block_keys(a[0], c).unwrap();
    assert!(p.take_events().is_empty(), "the keys stay live");
    assert_eq!(p.cache_key(a[0]).unwrap(), None);
    assert_eq!(p.primary_key_tokens(c).unwrap(), Some(8));
    assert_eq!(p.cache_keys(c).unwrap().len(), 2);
    // The copy now comes after the other block under the shared key.
    assert_eq!(p.lookup(&h(2), GroupId(0)), Some(a[1]));
    assert_eq!(p.lookup(&h(1), GroupId(0)), Some(c));
    p.check_invariants().unwrap();
    // Refused: a cached destination, the null block, itself.
    assert_eq!(p.move_block_keys(a[1], c), Err(KvError::AlreadyCached(c)));
    assert!(p.move_block_keys(BlockId::NULL, a[0]).is_err());
    assert!(p.move_block_keys(c, c).is_err());
    // An uncached source moves nothing.
    p.move_block_keys(a[0], BlockId(5)).unwrap();
    p.check_invariants().unwrap();
    assert!(!p.reset_prefix_cache());
    p.free_blocks(&[a[0], a[1], c]).unwrap();
    assert!(p.reset_prefix_cache());
    assert_eq!((p.num_cached_keys(), p.num_partial_blocks()), (0, 0));
    p.check_invariants().unwrap();
}

#[test]
fn reuse_evicts_and_records_events() {
    let mut p = BlockPool::new(PoolConfig {
        enable_events: true,
        ..PoolConfig::new(3)
    })
    .unwrap();
    let b = ids(&get(&mut p, 2));
    p.cache_full_blocks(&b, &[h(1), h(2)], 0, 2, GroupId(3), None)
        .unwrap();
    p.free_blocks(&b).unwrap();
    get(&mut p, 2);
    assert_eq!(p.num_evictions(), 2);
    let ev = p.take_events();
    assert_eq!(ev.len(), 3);
    assert!(
        matches!(&ev[0], KvEvent::BlockStored(s) if s.block_hashes.len() == 2 && s.parent_block_hash.is_none() && s.block_size == 16 && s.token_ids.is_empty())
    );
    assert_eq!(
        ev[1],
        KvEvent::BlockRemoved {
            block_hash: h(1),
            group: GroupId(3),
            medium: Medium::Gpu,
        }
    );
    assert_eq!(p.num_cached_keys(), 0);
    assert!(p.take_events().is_empty());
}

#[test]
fn every_block_losing_a_key_is_reported_and_skips_recorded() {
    let mut p = BlockPool::new(PoolConfig {
        enable_events: true,
        ..PoolConfig::new(6)
    })
    .unwrap();
    let b = ids(&get(&mut p, 3));
    // Two blocks under the same key (two requests computed one prefix).
    p.cache_full_blocks(&b[..1], &[h(1)], 0, 1, GroupId(0), None)
        .unwrap();
    p.cache_full_blocks(&b[1..2], &[h(1)], 0, 1, GroupId(0), None)
        .unwrap();
    let masked = [b[2], BlockId(0), b[2]];
    p.cache_full_blocks(
        &masked,
        &[h(7), h(8), h(9)],
        1,
        3,
        GroupId(0),
        Some(&[false, true]),
    )
    .unwrap();
    p.evict_blocks(&b[..2]).unwrap();
    let ev = p.take_events();
    assert_eq!(ev.len(), 5);
    match &ev[2] {
        KvEvent::BlockStored(s) => {
            assert_eq!((s.first_block, s.num_blocks), (1, 2));
            assert_eq!(s.skipped, vec![1]);
            assert_eq!(s.block_hashes, vec![h(9)]);
            assert_eq!(s.parent_block_hash, Some(h(7)));
            assert_eq!(s.positions().collect::<Vec<_>>(), vec![2]);
        }
        other => panic!("{other:?}"),
    }
    assert!(ev[3..]
        .iter()
        .all(|e| matches!(e, KvEvent::BlockRemoved { block_hash, .. } if *block_hash == h(1))));
}

#[test]
fn cache_validation_is_atomic() {
    let mut p = pool(6);
    let b = ids(&get(&mut p, 3));
    let dup = [b[0], b[1], b[0]];
    let hashes = [h(1), h(2), h(3)];
    assert_eq!(
        p.cache_full_blocks(&dup, &hashes, 0, 3, GroupId(0), None),
        Err(KvError::AlreadyCached(b[0]))
    );
    assert_eq!(p.num_cached_keys(), 0);
    assert!(p
        .cache_full_blocks(&b, &hashes[..2], 0, 3, GroupId(0), None)
        .is_err());
    assert!(p
        .cache_full_blocks(&b, &hashes, 0, 3, GroupId(0), Some(&[true]))
        .is_err());
    assert!(p
        .cache_full_blocks(&b, &hashes, 0, 4, GroupId(0), None)
        .is_err());
    p.cache_full_blocks(&b, &hashes, 0, 3, GroupId(0), Some(&[true, false, true]))
        .unwrap();
    assert_eq!(p.num_cached_keys(), 2);
    assert!(!p.is_cached(b[1]).unwrap());
    p.check_invariants().unwrap();
}

#[test]
fn reset_only_when_idle() {
    let mut p = pool(4);
    let b = ids(&get(&mut p, 1));
    p.cache_full_blocks(&b, &[h(1)], 0, 1, GroupId(0), None)
        .unwrap();
    assert!(!p.reset_prefix_cache());
    p.free_blocks(&b).unwrap();
    assert!(p.reset_prefix_cache());
    assert_eq!(p.num_cached_keys(), 0);
    assert!(!p.is_cached(b[0]).unwrap());
    p.check_invariants().unwrap();
}

#[test]
fn caching_disabled_caches_nothing() {
    let mut p = BlockPool::new(PoolConfig {
        enable_caching: false,
        ..PoolConfig::new(4)
    })
    .unwrap();
    let b = ids(&get(&mut p, 2));
    p.cache_full_blocks(&b, &[h(1), h(2)], 0, 2, GroupId(0), None)
        .unwrap();
    assert_eq!(p.num_cached_keys(), 0);
    p.free_blocks(&b).unwrap();
    assert_eq!(queue(&p), vec![1, 2, 3]);
}

#[test]
fn null_block_is_skipped() {
    let mut p = pool(4);
    let b = ids(&get(&mut p, 1));
    p.touch(&[BlockId::NULL, b[0]]).unwrap();
    p.free_blocks(&[BlockId::NULL, b[0], b[0]]).unwrap();
    assert_eq!(p.ref_count(BlockId::NULL).unwrap(), 0);
    assert!(!p.free_block_ids().any(super::super::ids::BlockId::is_null));
    assert!(p.free_blocks(&[BlockId(4)]).is_err());
    p.check_invariants().unwrap();
}

#[test]
fn metadata_is_small() {
    let p = pool(1_000_000);
    let per_block = p.metadata_bytes() as f64 / 1e6;
    assert!(per_block <= 16.1, "{per_block} bytes per block");
}

#[test]
fn set_eviction_keeps_the_free_order_and_is_refused_in_use() {
    let mut p = pool(6);
    let b = ids(&get(&mut p, 3));
    p.cache_full_blocks(&b, &[h(1), h(2)], 0, 2, GroupId(0), None)
        .unwrap();
    let err = p.set_eviction(EvictionConfig::Lfu { half_life: 0 });
    assert!(matches!(err, Err(KvError::Unsupported { .. })), "{err:?}");
    assert_eq!(p.eviction_policy(), "lru");
    p.free_blocks(&[b[2], b[1], b[0]]).unwrap();
    let before = queue(&p);
    for spec in ["prefix-depth", "priority:retention=3", "lru", "lfu"] {
        p.set_eviction(spec.parse().unwrap()).unwrap();
        assert_eq!(p.eviction_policy(), spec);
        assert_eq!(queue(&p), before, "{spec}");
        assert!(p.is_cached(b[0]).unwrap());
        p.check_invariants().unwrap();
    }
    // The new policy orders what is released from now on.
    let mut hit = Vec::new();
    assert!(p.get_cached_block(&h(1), &[GroupId(0)], &mut hit));
    p.touch(&hit).unwrap();
    p.touch(&hit).unwrap();
    p.free_blocks(&hit).unwrap();
    p.free_blocks(&hit).unwrap();
    assert_eq!(queue(&p).last(), Some(&b[0].0));
    p.check_invariants().unwrap();
}

#[test]
fn policy_metadata_is_a_few_bytes_per_block() {
    // 16 bytes of metadata and links, plus the policy's slabs.
    for (spec, extra) in [
        ("lfu", 4.0),
        ("prefix-depth", 1.0),
        ("priority:retention=1000", 5.0),
    ] {
        let config = spec.parse().unwrap();
        let p = BlockPool::with_eviction(PoolConfig::new(1_000_000), config).unwrap();
        assert_eq!(p.eviction_policy(), spec);
        let per_block = p.metadata_bytes() as f64 / 1e6;
        assert!(
            per_block <= 16.1 + extra,
            "{spec}: {per_block} bytes per block"
        );
        p.check_invariants().unwrap();
    }
}

// ---- unpin_blocks (HiSparse's released-but-read pages) ---------------

#[test]
fn unpinned_blocks_go_to_the_back_and_fire_once_when_reused() {
    // Pool of 6: free queue 1..=5. Take 1, 2, 3; unpin 1 and 2 (uncached,
    // yet they join the back, unlike free_blocks which puts them first).
    let mut p = pool(6);
    let mut b = Vec::new();
    p.get_new_blocks(3, &mut b).unwrap();
    assert_eq!(b, ids(&[1, 2, 3]));
    p.unpin_blocks(&ids(&[2, 1])).unwrap();
    assert_eq!(queue(&p), vec![4, 5, 2, 1]);
    assert_eq!(p.num_free_blocks(), 4);
    assert_eq!(p.num_watched(), 2);
    p.check_invariants().unwrap();
    // Handing out 4, 5, 2 reports 2 only; 1 stays watched.
    let mut c = Vec::new();
    p.get_new_blocks(3, &mut c).unwrap();
    assert_eq!(c, ids(&[4, 5, 2]));
    assert_eq!(p.take_reused_watched(), ids(&[2]));
    assert!(p.take_reused_watched().is_empty());
    assert_eq!(p.num_watched(), 1);
    p.check_invariants().unwrap();
}

#[test]
fn unpin_keeps_a_shared_block_allocated_but_watched() {
    let mut p = pool(4);
    let mut b = Vec::new();
    p.get_new_blocks(1, &mut b).unwrap();
    p.touch(&b).unwrap(); // two owners
    p.unpin_blocks(&b).unwrap();
    assert_eq!(p.ref_count(b[0]).unwrap(), 1);
    assert_eq!(queue(&p), vec![2, 3]);
    assert_eq!(p.num_watched(), 1);
    // Its last owner frees it normally: front of the queue (uncached).
    p.free_blocks(&b).unwrap();
    assert_eq!(queue(&p), vec![1, 2, 3]);
    let mut c = Vec::new();
    p.get_new_blocks(1, &mut c).unwrap();
    assert_eq!(p.take_reused_watched(), b);
    p.check_invariants().unwrap();
}

#[test]
fn unpin_refuses_bad_input_without_change() {
    let mut p = pool(4);
    let mut b = Vec::new();
    p.get_new_blocks(1, &mut b).unwrap();
    let before = (queue(&p), p.ref_count(b[0]).unwrap());
    for bad in [ids(&[0]), ids(&[9]), ids(&[1, 1]), ids(&[2])] {
        assert!(p.unpin_blocks(&bad).is_err(), "{bad:?}");
        assert_eq!((queue(&p), p.ref_count(b[0]).unwrap()), before);
        assert_eq!(p.num_watched(), 0);
    }
    let mut ranked = BlockPool::with_eviction(PoolConfig::new(4), "lfu".parse().unwrap()).unwrap();
    let mut r = Vec::new();
    ranked.get_new_blocks(1, &mut r).unwrap();
    assert!(matches!(
        ranked.unpin_blocks(&r),
        Err(KvError::Unsupported { .. })
    ));
    assert_eq!(ranked.ref_count(r[0]).unwrap(), 1);
    p.check_invariants().unwrap();
}

#[test]
fn reset_reports_every_watched_block_in_first_watch_order() {
    let mut p = pool(5);
    let mut b = Vec::new();
    p.get_new_blocks(3, &mut b).unwrap();
    p.unpin_blocks(&ids(&[3])).unwrap();
    p.unpin_blocks(&ids(&[1, 2])).unwrap();
    assert!(p.reset_prefix_cache());
    assert_eq!(p.take_reused_watched(), ids(&[3, 1, 2]));
    assert_eq!(p.num_watched(), 0);
    p.check_invariants().unwrap();
}
