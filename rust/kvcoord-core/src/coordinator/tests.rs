//! The coordinator's unit tests: scenarios of vLLM's own tests and the
//! refusals of bad input, each checking the invariants after it.

use sha2::{Digest, Sha256};

use super::*;
use crate::block_hash::BlockHash;
use crate::error::KvError;
use crate::request::Request;
use crate::spec::GroupSpec;

/// Chained block hashes of `tokens` at `bs` tokens per block.
fn hashes(tokens: &[u32], bs: usize) -> Vec<BlockHash> {
    let mut parent = [0u8; 32];
    tokens
        .chunks_exact(bs)
        .map(|block| {
            let mut h = Sha256::new();
            h.update(parent);
            for t in block {
                h.update(t.to_le_bytes());
            }
            parent.copy_from_slice(&h.finalize());
            BlockHash::from_slice(&parent).unwrap()
        })
        .collect()
}

/// A request as the scheduler sees it.
struct Req {
    id: ReqId,
    tokens: Vec<u32>,
    computed: usize,
    hashes: Vec<BlockHash>,
}

impl Req {
    fn new(id: u64, tokens: Vec<u32>, bs: usize) -> Self {
        let hashes = hashes(&tokens, bs);
        Self {
            id: ReqId(id),
            tokens,
            computed: 0,
            hashes,
        }
    }

    fn view(&self) -> RequestView<'_> {
        RequestView::new(
            self.computed,
            self.tokens.len(),
            self.tokens.len(),
            &self.hashes,
        )
    }
}

fn ids(v: &[BlockId]) -> Vec<u32> {
    v.iter().map(|b| b.0).collect()
}

fn full(num_blocks: usize, bs: u32, caching: bool) -> CoordinatorCore {
    let cfg = CoordinatorConfig::new(
        vec![GroupSpec::full_attention(bs)],
        num_blocks,
        caching,
        1 << 20,
    );
    CoordinatorCore::new(cfg).unwrap()
}

/// Unitary admission: lookup (max = `num_tokens - 1`) then allocate the
/// rest. Returns (hit blocks, new blocks) or None.
fn admit(c: &mut CoordinatorCore, r: &mut Req) -> Option<(Vec<u32>, Vec<u32>)> {
    let bs = c.managers()[0].block_size();
    let (hits, hit) = c
        .find_longest_cache_hit(&[GroupId(0)], &r.hashes, r.tokens.len() - 1, bs, false)
        .unwrap();
    let new = c
        .allocate_slots(
            r.id,
            &r.view(),
            &AllocateArgs {
                num_new_tokens: r.tokens.len() - hit,
                num_new_computed_tokens: hit,
                num_lookahead_tokens: 0,
                num_encoder_tokens: 0,
                delay_cache_blocks: false,
                num_external_computed_tokens: 0,
            },
            Some(&hits),
        )
        .unwrap()?;
    r.computed = r.tokens.len();
    c.check_invariants().unwrap();
    Some((ids(&hits[0]), ids(&new[0])))
}

fn queue(c: &CoordinatorCore) -> Vec<u32> {
    c.pool().free_block_ids().map(|b| b.0).collect()
}

fn refs(c: &CoordinatorCore, blocks: &[u32]) -> Vec<u32> {
    blocks
        .iter()
        .map(|&b| c.pool().ref_count(BlockId(b)).unwrap())
        .collect()
}

#[test]
fn prefill_share_free_order_20() {
    let mut c = full(11, 16, true);
    let shared: Vec<u32> = (0..48).collect();
    let mut r0 = Req::new(0, [&shared[..], &[100; 7]].concat(), 16);
    assert_eq!(admit(&mut c, &mut r0), Some((vec![], vec![1, 2, 3, 4])));
    assert_eq!(
        c.pool().cached_mask().take(5).collect::<Vec<_>>(),
        [false, true, true, true, false]
    );
    let mut r1 = Req::new(1, [&shared[..], &[200; 5]].concat(), 16);
    assert_eq!(admit(&mut c, &mut r1), Some((vec![1, 2, 3], vec![5])));
    assert_eq!(refs(&c, &[1, 2, 3, 5]), [2, 2, 2, 1]);
    c.free(r0.id).unwrap();
    c.free(r1.id).unwrap();
    assert_eq!(queue(&c), [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]);
    let mut r2 = Req::new(2, [&shared[..], &[300; 6]].concat(), 16);
    assert_eq!(admit(&mut c, &mut r2), Some((vec![1, 2, 3], vec![5])));
    assert_eq!(c.pool().num_free_blocks(), 6);
    assert_eq!(c.get_num_common_prefix_blocks(r2.id, 1).unwrap(), [4]);
    c.free(r2.id).unwrap();
    let mut r3 = Req::new(3, (1000..1160).collect(), 16);
    assert_eq!(
        admit(&mut c, &mut r3),
        Some((vec![], vec![5, 4, 6, 7, 8, 9, 10, 3, 2, 1]))
    );
    assert_eq!(c.pool().num_free_blocks(), 0);
    assert!(!c.free(ReqId(99)).unwrap());
}

#[test]
fn decode_growth_21() {
    let mut c = full(11, 16, true);
    let mut r = Req::new(0, (0..55).collect(), 16);
    assert_eq!(admit(&mut c, &mut r), Some((vec![], vec![1, 2, 3, 4])));
    r.tokens.extend(1000..1004);
    r.hashes = hashes(&r.tokens, 16);
    let new = c
        .allocate_slots(
            r.id,
            &r.view(),
            &AllocateArgs {
                num_new_tokens: 4,
                num_new_computed_tokens: 0,
                num_lookahead_tokens: 0,
                num_encoder_tokens: 0,
                delay_cache_blocks: false,
                num_external_computed_tokens: 0,
            },
            None,
        )
        .unwrap()
        .unwrap();
    assert!(new[0].is_empty());
    r.computed += 4;
    assert!(!c.pool().is_cached(BlockId(4)).unwrap());
    r.tokens.extend(2000..2019);
    r.hashes = hashes(&r.tokens, 16);
    let new = c
        .allocate_slots(
            r.id,
            &r.view(),
            &AllocateArgs {
                num_new_tokens: 19,
                num_new_computed_tokens: 0,
                num_lookahead_tokens: 0,
                num_encoder_tokens: 0,
                delay_cache_blocks: false,
                num_external_computed_tokens: 0,
            },
            None,
        )
        .unwrap()
        .unwrap();
    assert_eq!(ids(&new[0]), [5]);
    assert!(c.pool().is_cached(BlockId(4)).unwrap());
    assert!(!c.pool().is_cached(BlockId(5)).unwrap());
    assert_eq!(ids(c.block_ids(r.id).unwrap()[0]), [1, 2, 3, 4, 5]);
    c.check_invariants().unwrap();
}

#[test]
fn lru_across_requests_22() {
    let mut c = full(11, 16, true);
    let mut r0 = Req::new(0, (0..87).collect(), 16);
    let mut r1 = Req::new(1, (87..135).collect(), 16);
    admit(&mut c, &mut r0).unwrap();
    admit(&mut c, &mut r1).unwrap();
    assert_eq!(c.pool().num_free_blocks(), 1);
    c.free(r0.id).unwrap();
    assert_eq!(queue(&c), [6, 10, 5, 4, 3, 2, 1]);
    c.free(r1.id).unwrap();
    assert_eq!(queue(&c), [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]);
    let mut r2 = Req::new(2, (0..35).collect(), 16);
    assert_eq!(admit(&mut c, &mut r2), Some((vec![1, 2], vec![6])));
    assert_eq!(c.pool().num_free_blocks(), 7);
}

#[test]
fn reused_cached_block_loses_key_23() {
    let mut c = full(2, 16, true);
    let mut r0 = Req::new(0, (0..16).collect(), 16);
    admit(&mut c, &mut r0).unwrap();
    assert!(c.pool().is_cached(BlockId(1)).unwrap());
    c.free(r0.id).unwrap();
    let mut r1 = Req::new(1, (100..115).collect(), 16);
    assert_eq!(admit(&mut c, &mut r1), Some((vec![], vec![1])));
    assert!(!c.pool().is_cached(BlockId(1)).unwrap());
}

#[test]
fn hit_blocks_protected_24() {
    let mut c = full(3, 16, true);
    let mut r0 = Req::new(0, (0..16).collect(), 16);
    let mut r1 = Req::new(1, (16..32).collect(), 16);
    admit(&mut c, &mut r0).unwrap();
    c.free(r0.id).unwrap();
    admit(&mut c, &mut r1).unwrap();
    c.free(r1.id).unwrap();
    // r1's tokens chained after r0's: block 1 hits, block 2's key differs.
    let mut r2 = Req::new(2, (0..32).collect(), 16);
    assert_eq!(admit(&mut c, &mut r2), Some((vec![1], vec![2])));
}

#[test]
fn caching_disabled_25() {
    let mut c = full(5, 4, false);
    let mut r0 = Req::new(0, (0..10).collect(), 4);
    assert_eq!(admit(&mut c, &mut r0), Some((vec![], vec![1, 2, 3])));
    c.free(r0.id).unwrap();
    let mut r1 = Req::new(1, (0..16).collect(), 4);
    assert_eq!(admit(&mut c, &mut r1).unwrap().0, Vec::<u32>::new());
    assert_eq!(c.block_ids(r1.id).unwrap()[0].len(), 4);
    let mut r2 = Req::new(2, (50..54).collect(), 4);
    assert_eq!(admit(&mut c, &mut r2), None);
    assert!(!c.contains(r2.id));
    assert_eq!(c.pool().num_cached_keys(), 0);
}

#[test]
fn failed_allocation_leaves_hits_untouched_26() {
    let mut c = full(11, 16, true);
    let base: Vec<u32> = (0..48).collect();
    let mut r0 = Req::new(0, base.clone(), 16);
    admit(&mut c, &mut r0).unwrap();
    let mut r1 = Req::new(1, base.repeat(2), 16);
    assert_eq!(admit(&mut c, &mut r1).unwrap().0, [1, 2, 3]);
    c.free(r1.id).unwrap();
    let mut r2 = Req::new(2, (500..532).collect(), 16);
    admit(&mut c, &mut r2).unwrap();
    assert_eq!(c.pool().num_free_blocks(), 5);
    let r3 = Req::new(3, base.repeat(3), 16);
    let (hits, hit) = c
        .find_longest_cache_hit(&[GroupId(0)], &r3.hashes, 143, 16, false)
        .unwrap();
    assert_eq!(hit, 96);
    let res = c
        .allocate_slots(
            r3.id,
            &r3.view(),
            &AllocateArgs {
                num_new_tokens: 48,
                num_new_computed_tokens: 96,
                num_lookahead_tokens: 0,
                num_encoder_tokens: 0,
                delay_cache_blocks: false,
                num_external_computed_tokens: 0,
            },
            Some(&hits),
        )
        .unwrap();
    assert_eq!(res, None);
    assert_eq!(refs(&c, &ids(&hits[0])), [1, 1, 1, 0, 0, 0]);
    assert!(!c.contains(r3.id));
    c.check_invariants().unwrap();
}

#[test]
fn reset_27() {
    let mut c = full(11, 16, true);
    let mut r0 = Req::new(0, (0..40).collect(), 16);
    let mut r1 = Req::new(1, (100..140).collect(), 16);
    admit(&mut c, &mut r0).unwrap();
    admit(&mut c, &mut r1).unwrap();
    assert!(!c.reset_prefix_cache());
    assert_eq!(c.pool().num_cached_keys(), 4);
    c.free(r0.id).unwrap();
    c.free(r1.id).unwrap();
    assert!(c.reset_prefix_cache());
    assert_eq!(c.pool().num_cached_keys(), 0);
    assert!(c.pool().cached_mask().all(|k| !k));
    c.check_invariants().unwrap();
}

#[test]
fn admission_arguments_29() {
    let cfg = CoordinatorConfig::new(vec![GroupSpec::full_attention(16)], 11, true, 40);
    let mut c = CoordinatorCore::new(cfg).unwrap();
    let r = Req::new(0, (0..40).collect(), 16);
    let err = c
        .allocate_slots(
            r.id,
            &r.view(),
            &AllocateArgs {
                num_new_tokens: 0,
                num_new_computed_tokens: 0,
                num_lookahead_tokens: 0,
                num_encoder_tokens: 0,
                delay_cache_blocks: false,
                num_external_computed_tokens: 0,
            },
            None,
        )
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("num_new_tokens must be greater than 0"),
        "{err}"
    );
    let new = c
        .allocate_slots(
            r.id,
            &r.view(),
            &AllocateArgs {
                num_new_tokens: 40,
                num_new_computed_tokens: 0,
                num_lookahead_tokens: 20,
                num_encoder_tokens: 0,
                delay_cache_blocks: false,
                num_external_computed_tokens: 0,
            },
            None,
        )
        .unwrap()
        .unwrap();
    assert_eq!(new[0].len(), 3);
    let err = c
        .allocate_slots(
            r.id,
            &r.view(),
            &AllocateArgs {
                num_new_tokens: 41,
                num_new_computed_tokens: 0,
                num_lookahead_tokens: 0,
                num_encoder_tokens: 0,
                delay_cache_blocks: false,
                num_external_computed_tokens: 0,
            },
            None,
        )
        .unwrap_err();
    assert!(matches!(err, KvError::InvalidArgument { .. }));
    c.check_invariants().unwrap();
}

#[test]
fn bad_input_is_refused_before_mutation() {
    let mut c = full(11, 16, true);
    let mut r0 = Req::new(0, (0..40).collect(), 16);
    admit(&mut c, &mut r0).unwrap();
    let r1 = Req::new(1, (0..40).collect(), 16);
    let before = queue(&c);
    // Wrong number of hit lists, out-of-range id, hits for a running request.
    assert!(c
        .allocate_slots(
            r1.id,
            &r1.view(),
            &AllocateArgs {
                num_new_tokens: 8,
                num_new_computed_tokens: 32,
                num_lookahead_tokens: 0,
                num_encoder_tokens: 0,
                delay_cache_blocks: false,
                num_external_computed_tokens: 0
            },
            Some(&[])
        )
        .is_err());
    let far = vec![vec![BlockId(99)]];
    assert!(c
        .allocate_slots(
            r1.id,
            &r1.view(),
            &AllocateArgs {
                num_new_tokens: 24,
                num_new_computed_tokens: 16,
                num_lookahead_tokens: 0,
                num_encoder_tokens: 0,
                delay_cache_blocks: false,
                num_external_computed_tokens: 0
            },
            Some(&far)
        )
        .is_err());
    let hit = vec![vec![BlockId(1)]];
    assert!(c
        .allocate_slots(
            r0.id,
            &r0.view(),
            &AllocateArgs {
                num_new_tokens: 1,
                num_new_computed_tokens: 16,
                num_lookahead_tokens: 0,
                num_encoder_tokens: 0,
                delay_cache_blocks: false,
                num_external_computed_tokens: 0
            },
            Some(&hit)
        )
        .is_err());
    // A partial-block hit.
    assert!(matches!(
        c.allocate_slots(
            r1.id,
            &r1.view(),
            &AllocateArgs {
                num_new_tokens: 24,
                num_new_computed_tokens: 8,
                num_lookahead_tokens: 0,
                num_encoder_tokens: 0,
                delay_cache_blocks: false,
                num_external_computed_tokens: 0
            },
            Some(&hit)
        ),
        Err(KvError::Unsupported { .. })
    ));
    assert_eq!(queue(&c), before);
    assert!(matches!(
        c.block_ids(r1.id),
        Err(KvError::RequestWithoutBlocks(_))
    ));
    assert!(matches!(
        c.cache_blocks(r1.id, &r1.view(), 16),
        Err(KvError::RequestWithoutBlocks(_))
    ));
    assert!(matches!(
        c.find_longest_cache_hit(&[GroupId(3)], &r1.hashes, 39, 16, false),
        Err(KvError::UnknownGroup(_))
    ));
    c.check_invariants().unwrap();
}

#[test]
fn config_validation() {
    let mk = |groups: Vec<GroupSpec>, caching: bool| {
        CoordinatorCore::new(CoordinatorConfig::new(groups, 10, caching, 100))
    };
    assert!(mk(vec![], false).is_ok());
    assert!(mk(vec![], true).is_err());
    assert!(mk(
        vec![GroupSpec::full_attention(16), GroupSpec::mamba(16, 0)],
        true
    )
    .is_err());
    assert!(mk(
        vec![GroupSpec::full_attention(16), GroupSpec::mamba(16, 0)],
        false
    )
    .is_ok());
    assert!(mk(vec![GroupSpec::cross_attention(16)], true).is_err());
    assert!(mk(vec![GroupSpec::sliding_window(16, 0)], true).is_err());
    let mut cfg = CoordinatorConfig::new(vec![GroupSpec::full_attention(32)], 10, true, 100);
    cfg.hash_block_size = 16;
    assert!(CoordinatorCore::new(cfg.clone()).is_err());
    cfg.kind = CoordinatorKind::Hybrid;
    assert!(CoordinatorCore::new(cfg.clone()).is_ok());
    cfg.retention_interval = Some(32);
    assert!(CoordinatorCore::new(cfg).is_err());
    let mut cfg = CoordinatorConfig::new(
        vec![
            GroupSpec::full_attention(32),
            GroupSpec::sliding_window(16, 32),
        ],
        10,
        true,
        100,
    );
    assert_eq!(
        (cfg.scheduler_block_size, cfg.kind, cfg.hash_block_size),
        (32, CoordinatorKind::Hybrid, 16)
    );
    cfg.retention_interval = Some(33);
    assert!(CoordinatorCore::new(cfg.clone()).is_err());
    cfg.retention_interval = Some(64);
    assert!(CoordinatorCore::new(cfg).is_ok());
}

fn live_request(id: &str, len: u32, unit: usize) -> Request {
    use crate::hashing::{ExtraKeys, HashAlgo, HashConfig, RequestHasher};
    let config = HashConfig::new(HashAlgo::Native, unit, Some("t")).unwrap();
    Request::new(
        id.into(),
        (0..len).collect(),
        RequestHasher::new(config, ExtraKeys::default()),
    )
}

#[test]
fn predictions_take_the_callers_prefill_end_under_sparse_retention() {
    // Full + Mamba "align" with a prefill checkpoint, retention 0: a
    // chunk reserves the checkpoint only when it reaches the prefill's
    // end. A 100-token prompt's first 32 tokens do not reach its own end
    // (100); they reach an end the caller puts at 32 (vLLM's coordinator
    // takes prefill_end from its caller).
    let specs = vec![
        GroupSpec::full_attention(16),
        GroupSpec::mamba_align(16, true, Some(16)),
    ];
    let predict = |retention, prefill_end| {
        let mut cfg = CoordinatorConfig::new(specs.clone(), 100, true, 1000);
        cfg.retention_interval = retention;
        let c = CoordinatorCore::new(cfg).unwrap();
        let r = live_request("a", 100, 16);
        let args = PredictArgs {
            prefill_end,
            ..PredictArgs::new(32)
        };
        c.num_blocks_to_allocate(&r, &[], &args).unwrap()
    };
    let own = predict(Some(0), None);
    assert_eq!(predict(Some(0), Some(100)), own);
    assert_eq!(predict(Some(0), Some(32)), own + 1);
    assert_eq!(predict(Some(0), Some(0)), own + 1);
    // Dense and interval retention never read it (as in vLLM).
    for retention in [None, Some(64)] {
        let dense = predict(retention, None);
        assert_eq!(predict(retention, Some(32)), dense);
    }
}

#[test]
fn deferred_publication_caches_up_to_each_token_count() {
    // kvcoord.vllm's HiSparse host core: allocation never caches; the
    // coordinator publishes the durable prefix later, growing.
    use crate::events::KvEvent;
    let mut cfg = CoordinatorConfig::new(vec![GroupSpec::full_attention(4)], 8, true, 64);
    cfg.hash_block_size = 4;
    cfg.enable_events = true;
    let mut c = CoordinatorCore::new(cfg).unwrap();
    let r = live_request("a", 13, 4);
    let mut out = NewBlocks::new();
    let args = AllocateArgs {
        delay_cache_blocks: true,
        ..AllocateArgs::new(13)
    };
    assert!(c.allocate_request(&r, &args, None, &mut out).unwrap());
    assert!(
        c.pool_mut().take_events().is_empty(),
        "nothing published yet"
    );
    let hit = |c: &CoordinatorCore| {
        c.find_longest_cache_hit(&[GroupId(0)], r.block_hashes(), 12, 4, false)
            .unwrap()
            .1
    };
    assert_eq!(hit(&c), 0);
    c.cache_request(&r, 4).unwrap();
    assert_eq!(hit(&c), 4);
    c.cache_request(&r, 12).unwrap();
    assert_eq!(hit(&c), 12);
    c.cache_request(&r, 12).unwrap(); // again: nothing new
    let stored: Vec<(usize, usize)> = c
        .pool_mut()
        .take_events()
        .iter()
        .map(|e| match e {
            KvEvent::BlockStored(s) => (s.first_block, s.num_blocks),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(stored, vec![(0, 1), (1, 2)]);
    c.check_invariants().unwrap();
}

#[test]
fn group_id_base_and_medium_are_what_events_report() {
    use crate::events::{KvEvent, Medium};
    let mut cfg = CoordinatorConfig::new(vec![GroupSpec::full_attention(4)], 8, true, 64);
    cfg.hash_block_size = 4;
    cfg.enable_events = true;
    cfg.group_id_base = 1;
    cfg.event_medium = Medium::Cpu;
    let mut c = CoordinatorCore::new(cfg).unwrap();
    let r = live_request("a", 9, 4);
    let mut out = NewBlocks::new();
    assert!(c
        .allocate_request(&r, &AllocateArgs::new(9), None, &mut out)
        .unwrap());
    c.cache_request(&r, 8).unwrap();
    let events = c.pool_mut().take_events();
    let KvEvent::BlockStored(stored) = &events[0] else {
        panic!("{events:?}");
    };
    assert_eq!((stored.group, stored.medium), (GroupId(1), Medium::Cpu));
    // Keys inside the core keep the core's own group ids: lookups hit.
    let (_, hit) = c
        .find_longest_cache_hit(&[GroupId(0)], r.block_hashes(), 8, 4, false)
        .unwrap();
    assert_eq!(hit, 8);
    let first = out.group(0)[0];
    let key = c.pool().cache_key(first).unwrap().unwrap();
    assert_eq!(c.pool().reported_group(key.group), GroupId(1));
    assert!(c.free_request("a").unwrap());
    c.pool_mut().evict_blocks(&[first]).unwrap();
    let events = c.pool_mut().take_events();
    assert!(matches!(
        events.as_slice(),
        [KvEvent::BlockRemoved {
            group: GroupId(1),
            medium: Medium::Cpu,
            ..
        }]
    ));
    c.check_invariants().unwrap();
}

#[test]
fn sub_block_mamba_states_are_keyed_copied_and_hit() {
    // Full B = 4 beside Mamba "align" B = 16, hash unit 4: partial hits.
    let mut cfg = CoordinatorConfig::new(
        vec![
            GroupSpec::full_attention(4),
            GroupSpec::mamba_align(16, false, None),
        ],
        40,
        true,
        1000,
    );
    cfg.hash_block_size = 4;
    assert!(!cfg.partial_hits(), "off unless allowed");
    cfg.allow_partial_hits = true;
    assert!(cfg.partial_hits());
    assert_eq!(cfg.hit_alignment(), 4);
    // Caching is not rounded to the scheduler block (16).
    assert_eq!(cfg.num_cacheable_tokens(GroupId(1), 20), 20);
    let mut c = CoordinatorCore::new(cfg).unwrap();
    // A 25-token prompt: its last hash boundary (24) is inside block 1.
    let mut r = live_request("a", 25, 4);
    let mut out = NewBlocks::new();
    assert!(c
        .allocate_request(&r, &AllocateArgs::new(24), None, &mut out)
        .unwrap());
    let state = *out.group(1).last().unwrap();
    let key = c.pool().cache_key(state).unwrap().unwrap();
    assert_eq!(key.hash, r.block_hashes()[5]);
    assert_eq!(c.pool().primary_key_tokens(state).unwrap(), Some(24));
    r.set_num_computed_tokens(24).unwrap();
    c.new_step_starts();
    // The next step copies the state out; the keys move to the copy.
    let free_before = c.pool().num_free_blocks();
    assert!(c
        .allocate_request(&r, &AllocateArgs::new(1), None, &mut out)
        .unwrap());
    assert!(out.group(1).is_empty(), "the copy is not in the table");
    let copies = c.take_block_copies();
    assert_eq!(copies.len(), 1);
    let (src, dst) = copies[0];
    assert_eq!(src, state);
    assert_eq!(c.pool().cache_key(src).unwrap(), None);
    assert_eq!(c.pool().cache_key(dst).unwrap(), Some(key));
    assert_eq!(
        c.pool().num_free_blocks(),
        free_before - 2,
        "the copy and a full block"
    );
    assert_eq!(c.num_caller_references(), 2, "both ends held for the copy");
    let offloads = c.take_boundary_state_offloads();
    assert_eq!(
        offloads.last().map(|o| (o.block, o.num_tokens)),
        Some((dst, 24))
    );
    c.check_invariants().unwrap();
    r.set_num_computed_tokens(25).unwrap();
    assert!(c
        .finalize_partial_tail_offloads("a", 25, 0)
        .unwrap()
        .is_empty());
    c.free_caller_blocks(&[src, dst]).unwrap();
    assert!(c.free_request("a").unwrap());
    c.new_step_starts();
    // The same prompt again hits the copy at 24 tokens, inside its block.
    let r2 = live_request("b", 25, 4);
    let (hits, n) = c
        .find_longest_cache_hit(&[GroupId(1)], r2.block_hashes(), 24, 4, false)
        .unwrap();
    assert_eq!((n, hits[0].clone()), (24, vec![BlockId::NULL, dst]));
    let (full_hits, m) = c
        .find_longest_cache_hit(&[GroupId(0)], r2.block_hashes(), 24, 4, false)
        .unwrap();
    assert_eq!(m, 24);
    let lists = vec![full_hits[0].clone(), hits[0].clone()];
    assert!(c
        .allocate_request(
            &r2,
            &AllocateArgs::with_hit(1, 24),
            Some(lists.as_slice()),
            &mut out
        )
        .unwrap());
    // The new request's table takes a private copy of the hit state.
    let copies = c.take_block_copies();
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].0, dst);
    assert_eq!(out.group(1)[0], copies[0].1);
    assert_eq!(c.request_block_ids("b").unwrap()[1][1], copies[0].1);
    c.check_invariants().unwrap();
}

#[test]
fn sub_block_checkpoint_is_rekeyed_at_its_boundary() {
    // Full B = 4 beside Mamba "align" B = 16 with a prefill checkpoint
    // (alignment 4), hash unit 4: a 30-token prompt in one chunk
    // exports the state at 28 into the block before the running one
    // (column 0), whose full key at 16 is replaced by the key at 28, as
    // vLLM's _cache_partial_tail_block; the hand-off covers 28 tokens.
    let mut cfg = CoordinatorConfig::new(
        vec![
            GroupSpec::full_attention(4),
            GroupSpec::mamba_align(16, true, Some(4)),
        ],
        40,
        true,
        1000,
    );
    cfg.hash_block_size = 4;
    cfg.allow_partial_hits = true;
    let mut c = CoordinatorCore::new(cfg).unwrap();
    let r = live_request("a", 30, 4);
    let mut out = NewBlocks::new();
    assert!(c
        .allocate_request(&r, &AllocateArgs::new(30), None, &mut out)
        .unwrap());
    let table = c.request_block_ids("a").unwrap()[1].to_vec();
    assert_eq!(table.len(), 2, "checkpoint block, running state");
    let checkpoint = table[0];
    let key = c.pool().cache_key(checkpoint).unwrap().unwrap();
    assert_eq!(key.hash, r.block_hashes()[6]);
    assert_eq!(c.pool().key_num_tokens(checkpoint).unwrap(), Some(28));
    assert_eq!(c.pool().lookup(&r.block_hashes()[3], GroupId(1)), None);
    let offloads: Vec<_> = c
        .take_boundary_state_offloads()
        .into_iter()
        .map(|o| (o.block, o.num_tokens))
        .collect();
    assert_eq!(offloads, vec![(checkpoint, 28)]);
    c.new_step_starts();
    // The same prompt again: the hit is the checkpoint, at 28 tokens
    // (in the entry of the block holding token 28).
    let r2 = live_request("b", 30, 4);
    let (hits, n) = c
        .find_longest_cache_hit(&[GroupId(1)], r2.block_hashes(), 29, 4, false)
        .unwrap();
    assert_eq!((n, hits[0].clone()), (28, vec![BlockId::NULL, checkpoint]));
    c.check_invariants().unwrap();
}

#[test]
fn mamba_boundary_offloads() {
    // Full B = 16 beside Mamba "align" B = 16: each chunk that ends on a
    // block boundary commits the Mamba state there, handed off once.
    let cfg = CoordinatorConfig::new(
        vec![
            GroupSpec::full_attention(16),
            GroupSpec::mamba_align(16, false, None),
        ],
        40,
        true,
        1000,
    );
    let mut c = CoordinatorCore::new(cfg).unwrap();
    let mut r = live_request("a", 64, 16);
    let mut out = NewBlocks::new();
    let mut states = Vec::new();
    for end in [16, 32, 48] {
        assert!(c
            .allocate_request(&r, &AllocateArgs::new(16), None, &mut out)
            .unwrap());
        states.push(*out.group(1).last().unwrap());
        r.set_num_computed_tokens(end).unwrap();
        let taken = c.take_boundary_state_offloads();
        assert_eq!(taken.len(), 1, "one state per chunk");
        let o = taken[0];
        assert_eq!(c.request_name(o.req), Some("a"));
        assert_eq!(
            (o.group, o.block, o.num_tokens),
            (GroupId(1), states[states.len() - 1], end)
        );
        // Drained: a second take is empty.
        assert!(c.take_boundary_state_offloads().is_empty());
        c.new_step_starts();
    }
    // A freed request's hand-offs not yet taken are dropped.
    let r2 = live_request("b", 40, 16);
    assert!(c
        .allocate_request(&r2, &AllocateArgs::new(32), None, &mut out)
        .unwrap());
    assert!(c.free_request("b").unwrap());
    assert!(c.take_boundary_state_offloads().is_empty());
    // Caching off: nothing is handed off.
    let cfg = CoordinatorConfig::new(
        vec![GroupSpec::mamba_align(16, false, None)],
        40,
        false,
        1000,
    );
    let mut c = CoordinatorCore::new(cfg).unwrap();
    let r = live_request("c", 64, 16);
    assert!(c
        .allocate_request(&r, &AllocateArgs::new(32), None, &mut out)
        .unwrap());
    assert!(c.take_boundary_state_offloads().is_empty());
    c.check_invariants().unwrap();
}

#[test]
fn external_tokens_allocate_like_vllm() {
    // Full B = 4 + SWA B = 4 (W = 8); a new request with 24 external
    // tokens and 8 new ones: every group's external blocks come before
    // any group's new blocks; SWA skips the 4 blocks before its window.
    let cfg = CoordinatorConfig::new(
        vec![
            GroupSpec::full_attention(4),
            GroupSpec::sliding_window(4, 8),
        ],
        100,
        true,
        1000,
    );
    let mut c = CoordinatorCore::new(cfg).unwrap();
    let r = live_request("a", 40, 4);
    let args = AllocateArgs {
        num_external_computed_tokens: 24,
        ..AllocateArgs::new(8)
    };
    let mut out = NewBlocks::new();
    assert!(c.allocate_request(&r, &args, None, &mut out).unwrap());
    // Returned: the new blocks only (vLLM's result).
    assert_eq!(
        (ids(out.group(0)), ids(out.group(1))),
        (vec![9, 10], vec![11, 12])
    );
    let tables = c.request_block_ids("a").unwrap();
    assert_eq!(ids(tables[0]), (1..=6).chain(9..=10).collect::<Vec<_>>());
    assert_eq!(ids(tables[1]), vec![0, 0, 0, 0, 7, 8, 11, 12]);
    // Mamba groups refuse external tokens before any change.
    let cfg = CoordinatorConfig::new(
        vec![GroupSpec::full_attention(4), GroupSpec::mamba(4, 0)],
        100,
        false,
        1000,
    );
    let mut c = CoordinatorCore::new(cfg).unwrap();
    let free = c.pool().num_free_blocks();
    assert!(c.allocate_request(&r, &args, None, &mut out).is_err());
    assert_eq!((c.pool().num_free_blocks(), c.num_requests()), (free, 0));
}

#[test]
fn mamba_align_external_tokens_after_a_lagging_hit() {
    // Full B = 4 beside Mamba "align" B = 4. A 9-token prompt caches two
    // full-attention blocks and no state (its chunk ends mid-block).
    let cfg = CoordinatorConfig::new(
        vec![
            GroupSpec::full_attention(4),
            GroupSpec::mamba_align(4, false, None),
        ],
        30,
        true,
        1000,
    );
    let mut c = CoordinatorCore::new(cfg).unwrap();
    let mut out = NewBlocks::new();
    let r0 = live_request("a", 9, 4);
    assert!(c
        .allocate_request(&r0, &AllocateArgs::new(9), None, &mut out)
        .unwrap());
    assert!(c.free_request("a").unwrap());
    let r1 = live_request("b", 14, 4);
    let (fa, hit) = c
        .find_longest_cache_hit(&[GroupId(0)], r1.block_hashes(), 13, 4, false)
        .unwrap();
    assert_eq!(hit, 8);
    let hits = vec![fa[0].clone(), Vec::new()];
    // Without external tokens the Mamba group must hit too.
    let local = AllocateArgs {
        num_new_computed_tokens: 8,
        ..AllocateArgs::new(6)
    };
    let free = c.pool().num_free_blocks();
    assert!(c
        .allocate_request(&r1, &local, Some(&hits), &mut out)
        .is_err());
    assert_eq!((c.pool().num_free_blocks(), c.num_requests()), (free, 0));
    // With 4 external tokens (a connector supplies the state at 12):
    // Mamba nulls the 2 blocks below the last computed token's, then
    // one block for the external tokens and one for the new ones.
    let external = AllocateArgs {
        num_external_computed_tokens: 4,
        ..AllocateArgs::new(2)
    };
    let args = AllocateArgs {
        num_new_computed_tokens: 8,
        ..external
    };
    assert!(c
        .allocate_request(&r1, &args, Some(&hits), &mut out)
        .unwrap());
    let tables = c.request_block_ids("b").unwrap();
    assert_eq!(&tables[0][..2], &hits[0][..]);
    assert_eq!(tables[0].len(), 4);
    let nulls: Vec<bool> = tables[1].iter().map(|b| b.is_null()).collect();
    assert_eq!(nulls, [true, true, false, false]);
    c.check_invariants().unwrap();
}

#[test]
fn external_tokens_keep_a_longer_full_attention_hit() {
    // Full attention B = 4: a 16-token prompt caches 4 blocks. A request
    // with no local hit whose connector imports 10 tokens keeps the
    // first cdiv(10, 4) = 3 blocks of its pool's longer hit (vLLM's
    // retained hit: those blocks hold the imported tokens) and takes
    // new blocks only past them; more than the import covers is refused.
    let cfg = CoordinatorConfig::new(vec![GroupSpec::full_attention(4)], 30, true, 1000);
    let mut c = CoordinatorCore::new(cfg).unwrap();
    let mut out = NewBlocks::new();
    let r0 = live_request("a", 16, 4);
    assert!(c
        .allocate_request(&r0, &AllocateArgs::new(16), None, &mut out)
        .unwrap());
    assert!(c.free_request("a").unwrap());
    let r1 = live_request("b", 16, 4);
    let (found, hit) = c
        .find_longest_cache_hit(&[GroupId(0)], r1.block_hashes(), 15, 4, false)
        .unwrap();
    assert_eq!((found[0].len(), hit), (3, 12));
    let args = AllocateArgs {
        num_external_computed_tokens: 10,
        ..AllocateArgs::new(2)
    };
    let free = c.pool().num_free_blocks();
    let too_long = vec![found[0].iter().copied().chain([found[0][0]]).collect()];
    assert!(c
        .allocate_request(&r1, &args, Some(&too_long), &mut out)
        .is_err());
    assert_eq!((c.pool().num_free_blocks(), c.num_requests()), (free, 0));
    let hits = vec![found[0].clone()];
    assert!(c
        .allocate_request(&r1, &args, Some(&hits), &mut out)
        .unwrap());
    let tables = c.request_block_ids("b").unwrap();
    assert_eq!(&tables[0][..3], &hits[0][..]);
    assert_eq!(tables[0].len(), 3);
    // Without external tokens the hit must match the local tokens.
    assert!(c.free_request("b").unwrap());
    let r2 = live_request("c", 16, 4);
    assert!(c
        .allocate_request(&r2, &AllocateArgs::new(2), Some(&hits), &mut out)
        .is_err());
    c.check_invariants().unwrap();
}

#[test]
fn admission_capped_prediction() {
    // Full B = 4, SWA B = 4 (W = 8), chunked local B = 4 (chunk 8),
    // max_model_len 1000; a 100-token request needs 25 blocks per group.
    let cfg = CoordinatorConfig::new(
        vec![
            GroupSpec::full_attention(4),
            GroupSpec::sliding_window(4, 8),
            GroupSpec::chunked_local(4, 8),
        ],
        200,
        true,
        1000,
    );
    let mut c = CoordinatorCore::new(cfg).unwrap();
    let r = live_request("a", 100, 4);
    // A prediction under vLLM's admission check, 16 tokens in flight.
    let capped = |num_tokens, total_computed_tokens| PredictArgs {
        total_computed_tokens,
        max_in_flight_tokens: Some(16),
        ..PredictArgs::new(num_tokens)
    };
    assert_eq!(
        c.num_blocks_to_allocate(&r, &[], &PredictArgs::new(100))
            .unwrap(),
        75
    );
    // 16 tokens in flight: SWA holds cdiv(7 + 16, 4) + 1 = 7 blocks at
    // most, chunked local cdiv(8 + 16, 4) = 6; full attention is not capped.
    assert_eq!(
        c.num_blocks_to_allocate(&r, &[], &capped(100, 0)).unwrap(),
        25 + 7 + 6
    );
    // The cap never exceeds what max_model_len allows.
    let m = &c.managers()[1];
    assert_eq!(m.max_admission_blocks(10_000, 1000), Some(251));
    assert_eq!(
        c.managers()[2].max_admission_blocks(10_000, 1000),
        Some(250)
    );
    assert_eq!(c.managers()[0].max_admission_blocks(16, 1000), None);
    // Below the cap the prediction is the uncapped one.
    assert_eq!(c.num_blocks_to_allocate(&r, &[], &capped(8, 0)).unwrap(), 6);
    // A running request: only the blocks past its table (capped likewise);
    // nothing changed by the predictions.
    let free = c.pool().num_free_blocks();
    let mut out = NewBlocks::new();
    assert!(c
        .allocate_request(&r, &AllocateArgs::new(24), None, &mut out)
        .unwrap());
    assert_eq!(c.pool().num_free_blocks(), free - 18);
    assert_eq!(
        c.num_blocks_to_allocate(&r, &[], &capped(100, 24)).unwrap(),
        19 + 1
    );
    assert_eq!(c.pool().num_free_blocks(), free - 18);
    // Bad hit lists are refused.
    assert!(c
        .num_blocks_to_allocate(&r, &[vec![BlockId(1)]], &PredictArgs::new(8))
        .is_err());
    assert!(c
        .num_blocks_to_allocate(
            &r,
            &[vec![], vec![], vec![BlockId(9999)]],
            &PredictArgs::new(8)
        )
        .is_err());
    // Released blocks: an unknown id holds nothing; a known one drops
    // the SWA and chunked-local blocks before the window.
    assert!(!c.remove_skipped_request("nobody", 24, None).unwrap());
    assert!(c.remove_skipped_request("a", 24, None).unwrap());
    assert_eq!(c.pool().num_free_blocks(), free - 18 + 4 + 6);
}

#[test]
fn hybrid_swa_cacheable_clamp_53_and_masks_54() {
    // Full B = 32 + SWA B = 16 (W = 32), hash unit 16: a 112-token prompt
    // caches full blocks 0-2 and SWA blocks 0-5 (dense masks keep all of
    // them: need = 2 blocks = one 32-token segment).
    let mut cfg = CoordinatorConfig::new(
        vec![
            GroupSpec::full_attention(32),
            GroupSpec::sliding_window(16, 32),
        ],
        100,
        true,
        1000,
    );
    cfg.hash_block_size = 16;
    let mut c = CoordinatorCore::new(cfg).unwrap();
    let r = Req::new(0, (0..112).collect(), 16);
    let new = c
        .allocate_slots(
            r.id,
            &r.view(),
            &AllocateArgs {
                num_new_tokens: 112,
                num_new_computed_tokens: 0,
                num_lookahead_tokens: 0,
                num_encoder_tokens: 0,
                delay_cache_blocks: false,
                num_external_computed_tokens: 0,
            },
            None,
        )
        .unwrap()
        .unwrap();
    assert_eq!((new[0].len(), new[1].len()), (4, 7));
    let cached = |b: &[BlockId]| {
        b.iter()
            .map(|&x| c.pool().is_cached(x).unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(cached(&new[0]), [true, true, true, false]);
    assert_eq!(cached(&new[1]), [true, true, true, true, true, true, false]);
    // Lookups: 96 tokens in each bucket.
    let (hits, hit) = c
        .find_longest_cache_hit(&[GroupId(0)], &r.hashes, 111, 32, false)
        .unwrap();
    assert_eq!((hit, hits[0].len()), (96, 3));
    let (hits, hit) = c
        .find_longest_cache_hit(&[GroupId(1)], &r.hashes, 96, 32, false)
        .unwrap();
    assert_eq!((hit, hits[0].len()), (96, 6));
    assert!(hits[0][..4].iter().all(|b| b.is_null()));
    c.check_invariants().unwrap();

    // Full B = 32 + SWA B = 8 (W = 8), hash unit 8: dense caching keeps
    // SWA blocks {3, 7} of a 64-token prompt; retention 0 keeps {11}
    // of a 128-token prompt.
    for (retention, len, expect) in [
        (None, 64usize, vec![3usize, 7]),
        (Some(0), 128, vec![11]),
        (Some(64), 128, vec![7, 11, 15]),
    ] {
        let mut cfg = CoordinatorConfig::new(
            vec![
                GroupSpec::full_attention(32),
                GroupSpec::sliding_window(8, 8),
            ],
            100,
            true,
            1000,
        );
        cfg.hash_block_size = 8;
        cfg.retention_interval = retention;
        let mut c = CoordinatorCore::new(cfg).unwrap();
        let r = Req::new(0, (0..len as u32).collect(), 8);
        let new = c
            .allocate_slots(
                r.id,
                &r.view(),
                &AllocateArgs {
                    num_new_tokens: len,
                    num_new_computed_tokens: 0,
                    num_lookahead_tokens: 0,
                    num_encoder_tokens: 0,
                    delay_cache_blocks: false,
                    num_external_computed_tokens: 0,
                },
                None,
            )
            .unwrap()
            .unwrap();
        let keyed: Vec<usize> = (0..new[1].len())
            .filter(|&i| c.pool().is_cached(new[1][i]).unwrap())
            .collect();
        assert_eq!(keyed, expect, "retention {retention:?}");
        c.check_invariants().unwrap();
    }
}

#[test]
fn mamba_and_cross_attention_without_caching() {
    let cfg = CoordinatorConfig::new(
        vec![
            GroupSpec::full_attention(4),
            GroupSpec::mamba(4, 1),
            GroupSpec::cross_attention(4),
        ],
        40,
        false,
        1000,
    );
    assert_eq!(cfg.kind, CoordinatorKind::NoPrefixCache);
    let mut c = CoordinatorCore::new(cfg).unwrap();
    let mut r = Req::new(0, (0..10).collect(), 4);
    let new = c
        .allocate_slots(
            r.id,
            &r.view(),
            &AllocateArgs {
                num_new_tokens: 10,
                num_new_computed_tokens: 0,
                num_lookahead_tokens: 0,
                num_encoder_tokens: 6,
                delay_cache_blocks: false,
                num_external_computed_tokens: 0,
            },
            None,
        )
        .unwrap()
        .unwrap();
    assert_eq!(new.iter().map(Vec::len).collect::<Vec<_>>(), [3, 4, 2]);
    r.computed = 10;
    r.tokens.push(7);
    let new = c
        .allocate_slots(
            r.id,
            &r.view(),
            &AllocateArgs {
                num_new_tokens: 1,
                num_new_computed_tokens: 0,
                num_lookahead_tokens: 0,
                num_encoder_tokens: 6,
                delay_cache_blocks: false,
                num_external_computed_tokens: 0,
            },
            None,
        )
        .unwrap()
        .unwrap();
    assert_eq!(new.iter().map(Vec::len).collect::<Vec<_>>(), [0, 0, 0]);
    // Mamba kept only the block of the last computed token (+ scratch).
    assert_eq!(c.tables(r.id).unwrap()[1].num_leading_nulls(), 2);
    c.remove_skipped_blocks(r.id, 13, None).unwrap();
    assert_eq!(c.tables(r.id).unwrap()[1].num_leading_nulls(), 3);
    assert!(c.remove_skipped_blocks(ReqId(9), 13, None).is_err());
    c.check_invariants().unwrap();
    c.free(r.id).unwrap();
    assert_eq!(c.pool().num_free_blocks(), 39);
    assert_eq!(c.num_requests(), 0);
}

#[test]
fn eagle_replay_boundaries() {
    let mut out = [0usize; 4];
    let n = replay_boundaries(50, 16, false, &mut out);
    assert_eq!(&out[..n], &[49]);
    // Unaligned prompt: the resend and a longer sibling agree.
    let n = replay_boundaries(50, 16, true, &mut out);
    assert_eq!(&out[..n], &[32]);
    // Aligned prompt: the resend stops a block below the sibling.
    let n = replay_boundaries(48, 16, true, &mut out);
    assert_eq!(&out[..n], &[16, 32]);
    let n = replay_boundaries(10, 16, true, &mut out);
    assert_eq!(&out[..n], &[0]);
    assert_eq!(replay_boundaries(0, 16, false, &mut out), 0);
}

#[test]
fn eagle_groups_join_by_spec_and_are_checked() {
    let specs = vec![
        GroupSpec::full_attention(16),
        GroupSpec::sliding_window(16, 32),
        GroupSpec::sliding_window(16, 32),
    ];
    let mut config = CoordinatorConfig::new(specs, 64, true, 1024);
    config.eagle_groups = vec![GroupId(2)];
    let c = CoordinatorCore::new(config.clone()).unwrap();
    let flags: Vec<bool> = c.managers().iter().map(Manager::eagle).collect();
    assert_eq!(flags, vec![false, true, true]);
    // Only EAGLE groups may drop.
    let err = c.find_longest_cache_hit(&[GroupId(0)], &[], 32, 16, true);
    assert!(err.is_err());
    assert!(c
        .find_longest_cache_hit(&[GroupId(1), GroupId(2)], &[], 32, 16, true)
        .is_ok());
    config.eagle_groups = vec![GroupId(3)];
    let err = CoordinatorCore::new(config).unwrap_err();
    assert!(err.to_string().contains("eagle_group_ids"), "{err}");
}

#[test]
fn reprefillable_tail_held_back_per_group() {
    // Unitary, B = 4, R = 2: all but the tail.
    let mut cfg = CoordinatorConfig::new(vec![GroupSpec::full_attention(4)], 10, true, 100);
    cfg.num_reprefillable_tokens = 2;
    let g0 = GroupId(0);
    assert_eq!(cfg.num_cacheable_tokens(g0, 11), 9);
    assert_eq!(cfg.num_cacheable_tokens(g0, 1), 0);
    assert_eq!(cfg.num_held_back_tokens(g0), 2);
    // Hybrid full 4 + full 8 (scheduler block 8), R = 3: no EAGLE group
    // caches the aligned prefix, tail included.
    let mut cfg = CoordinatorConfig::new(
        vec![GroupSpec::full_attention(4), GroupSpec::full_attention(8)],
        10,
        true,
        100,
    );
    cfg.hash_block_size = 4;
    cfg.num_reprefillable_tokens = 3;
    for g in [GroupId(0), GroupId(1)] {
        assert_eq!(cfg.num_cacheable_tokens(g, 17), 16);
        assert_eq!(cfg.num_cacheable_tokens(g, 7), 0);
        assert_eq!(cfg.num_held_back_tokens(g), 0);
    }
    // Group 0 an EAGLE group: final tokens (17 - 3 = 14) up to one of its
    // blocks past their aligned prefix (8 + 4 = 12); nothing while the
    // aligned prefix of all tokens is empty.
    cfg.eagle_groups = vec![GroupId(0)];
    assert_eq!(cfg.num_cacheable_tokens(GroupId(0), 17), 12);
    assert_eq!(cfg.num_cacheable_tokens(GroupId(0), 13), 10);
    assert_eq!(cfg.num_cacheable_tokens(GroupId(0), 7), 0);
    // 9 tokens: 6 final ones, one block past their empty aligned prefix.
    assert_eq!(cfg.num_cacheable_tokens(GroupId(0), 9), 4);
    assert_eq!(cfg.num_cacheable_tokens(GroupId(1), 17), 16);
    assert_eq!(cfg.num_held_back_tokens(GroupId(0)), 3);
    assert_eq!(cfg.eagle_group_ids().collect::<Vec<_>>(), vec![GroupId(0)]);
    assert_eq!(cfg.held_back_tokens().collect::<Vec<_>>(), vec![3, 0]);
    assert_eq!(cfg.checked_cacheable_tokens(GroupId(1), 17), Ok(16));
    assert_eq!(
        cfg.checked_cacheable_tokens(GroupId(2), 17),
        Err(KvError::UnknownGroup(GroupId(2)))
    );
    // Caching off: nothing is held back.
    cfg.kind = CoordinatorKind::NoPrefixCache;
    assert_eq!(cfg.num_held_back_tokens(GroupId(0)), 0);
    // Out-of-range EAGLE groups and huge tails are refused.
    cfg.kind = CoordinatorKind::Hybrid;
    cfg.eagle_groups = vec![GroupId(2)];
    assert!(matches!(
        cfg.validate(),
        Err(KvError::InvalidConfig {
            name: "eagle_group_ids",
            ..
        })
    ));
    cfg.eagle_groups.clear();
    cfg.num_reprefillable_tokens = crate::limits::MAX_TOKENS;
    assert!(cfg.validate().is_err());
}

#[test]
fn caching_holds_back_the_tail_group_by_group() {
    // An EAGLE full group of B = 4 beside a full group of B = 8
    // (scheduler block 8), R = 2, an 18-token prompt. After 16 tokens
    // the plain group caches the aligned 16 whatever the tail (2
    // blocks; holding the tail back would leave 1), the EAGLE group the
    // 14 final tokens (3 blocks).
    let mut cfg = CoordinatorConfig::new(
        vec![GroupSpec::full_attention(4), GroupSpec::full_attention(8)],
        20,
        true,
        100,
    );
    cfg.hash_block_size = 4;
    cfg.num_reprefillable_tokens = 2;
    cfg.eagle_groups = vec![GroupId(0)];
    let mut c = CoordinatorCore::new(cfg).unwrap();
    let mut r = Req::new(0, (0..18).collect(), 4);
    let cached = |c: &CoordinatorCore| {
        let tables = c.block_ids(ReqId(0)).unwrap();
        tables
            .iter()
            .map(|t| {
                t.iter()
                    .filter(|&&x| c.pool().is_cached(x).unwrap())
                    .count()
            })
            .collect::<Vec<_>>()
    };
    c.allocate_slots(r.id, &r.view(), &AllocateArgs::new(16), None)
        .unwrap()
        .unwrap();
    assert_eq!(cached(&c), [3, 2]);
    // The rest of the prompt: 16 final tokens, 4 blocks of the EAGLE group.
    r.computed = 16;
    c.allocate_slots(r.id, &r.view(), &AllocateArgs::new(2), None)
        .unwrap()
        .unwrap();
    assert_eq!(cached(&c), [4, 2]);
    c.check_invariants().unwrap();
}

#[test]
fn entry_points_refuse_counts_past_the_token_range() {
    use crate::hashing::{ExtraKeys, HashAlgo, HashConfig, RequestHasher};
    use crate::managers::GroupSpec;
    use crate::request::Request;

    let mut config = CoordinatorConfig::new(vec![GroupSpec::full_attention(4)], 64, true, 1024);
    config.hash_block_size = 4;
    let mut c = CoordinatorCore::new(config).unwrap();
    let hash = HashConfig::new(HashAlgo::Native, 4, Some("t")).unwrap();
    let r = Request::new(
        "a".into(),
        (0..9).collect(),
        RequestHasher::new(hash, ExtraKeys::default()),
    );
    let mut out = NewBlocks::new();
    assert!(c
        .allocate_request(&r, &AllocateArgs::new(9), None, &mut out)
        .unwrap());
    let before = c.clone();
    for bad in [crate::limits::MAX_TOKENS, usize::MAX] {
        assert!(c.cache_request(&r, bad).is_err());
        assert!(c
            .num_blocks_to_allocate(&r, &[], &PredictArgs::new(bad))
            .is_err());
        let past = PredictArgs {
            prefill_end: Some(bad),
            ..PredictArgs::new(1)
        };
        assert!(c.num_blocks_to_allocate(&r, &[], &past).is_err());
        assert!(c.remove_skipped_request("a", bad, None).is_err());
        assert!(c.remove_skipped_request("a", 1, Some(bad)).is_err());
        assert!(c.finalize_partial_tail_offloads("a", bad, 0).is_err());
        assert!(c.finalize_partial_tail_offloads("a", 0, bad).is_err());
        assert!(c
            .config()
            .checked_cacheable_tokens(crate::GroupId(0), bad)
            .is_err());
        let hashes = r.block_hashes();
        assert!(c
            .find_longest_cache_hit(&[crate::GroupId(0)], hashes, bad, 4, false)
            .is_err());
        assert!(c
            .find_longest_cache_hit(&[crate::GroupId(0)], hashes, 8, bad, false)
            .is_err());
    }
    assert_eq!(c.pool().num_free_blocks(), before.pool().num_free_blocks());
    c.check_invariants().unwrap();
    let last = crate::limits::MAX_TOKENS - 1;
    assert!(c
        .num_blocks_to_allocate(&r, &[], &PredictArgs::new(last))
        .is_ok());
    assert_eq!(
        c.config().checked_cacheable_tokens(crate::GroupId(0), last),
        Ok(last)
    );
}
