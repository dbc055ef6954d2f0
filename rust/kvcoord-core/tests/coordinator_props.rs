//! Randomised scheduler workloads over `CoordinatorCore`: whatever the
//! layout and the pressure on the pool, `allocate_slots` never fails
//! mid-way (its prediction covers what it takes), the invariants hold after
//! every call, and freeing everything returns every block.
//!
//! Hybrid layouts adopt hits that every group's finder agrees on at the
//! first group's hit length (a valid hit, not necessarily vLLM's longest:
//! the fixed point is a Python policy, tested by pytest).

use std::collections::HashMap;

use kvcoord_core::{
    hashing, AllocateArgs, BlockHash, BlockId, CoordinatorConfig, CoordinatorCore, CoordinatorKind,
    ExtraKeys, GroupId, GroupSpec, HashAlgo, HashConfig, ReqId, RequestView,
};

fn extend_hashes(hashes: &mut Vec<BlockHash>, tokens: &[u32], unit: usize) {
    if tokens.len() / unit > hashes.len() {
        let config = HashConfig::new(HashAlgo::Native, unit, Some("props")).unwrap();
        *hashes = hashing::compute_block_hashes(config, ExtraKeys::default(), tokens);
    }
}

/// A hit all groups agree on: group 0's longest hit, if every other group's
/// finder returns the same length when asked for it; else no hit.
fn agreed_hit(
    c: &CoordinatorCore,
    specs: &[GroupSpec],
    hashes: &[BlockHash],
    max_len: usize,
    alignment: usize,
) -> (Vec<Vec<BlockId>>, usize) {
    let (first, len) = c
        .find_longest_cache_hit(&[GroupId(0)], hashes, max_len, alignment, false)
        .unwrap();
    let mut out = vec![first.into_iter().next().unwrap()];
    for g in 1..specs.len() {
        let id = GroupId(u32::try_from(g).unwrap());
        let (mut blocks, hit) = c
            .find_longest_cache_hit(&[id], hashes, len, alignment, false)
            .unwrap();
        if hit != len {
            return (vec![Vec::new(); specs.len()], 0);
        }
        out.push(blocks.swap_remove(0));
    }
    (out, len)
}
use proptest::prelude::*;

/// (groups, caching allowed, hash block size)
fn layouts() -> Vec<(Vec<GroupSpec>, bool, u32)> {
    vec![
        (vec![GroupSpec::full_attention(4)], true, 4),
        (vec![GroupSpec::sliding_window(4, 8)], true, 4),
        (
            vec![
                GroupSpec::full_attention(4),
                GroupSpec::sliding_window(4, 8),
            ],
            true,
            4,
        ),
        (
            vec![GroupSpec::full_attention(4), GroupSpec::chunked_local(4, 8)],
            true,
            4,
        ),
        (
            vec![
                GroupSpec::full_attention(4),
                GroupSpec::full_attention(4),
                GroupSpec::sliding_window(4, 12),
            ],
            true,
            4,
        ),
        (
            vec![
                GroupSpec::full_attention(8),
                GroupSpec::sliding_window(4, 8),
            ],
            true,
            4,
        ),
        (
            vec![GroupSpec::full_attention(4), GroupSpec::mamba(4, 1)],
            false,
            4,
        ),
    ]
}

struct Req {
    id: ReqId,
    tokens: Vec<u32>,
    computed: usize,
    hashes: Vec<BlockHash>,
}

#[derive(Debug, Clone)]
enum Op {
    Admit { req: u64, len: usize, variant: u32 },
    Step { req: u64 },
    Finish { req: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..5u64, 1..40usize, 0..3u32).prop_map(|(req, len, variant)| Op::Admit {
            req,
            len,
            variant
        }),
        (0..5u64).prop_map(|req| Op::Step { req }),
        (0..5u64).prop_map(|req| Op::Finish { req }),
    ]
}

#[allow(clippy::too_many_lines)]
fn run(layout: usize, num_blocks: usize, caching: bool, retention: Option<i64>, ops: &[Op]) {
    let (specs, cacheable, unit) = layouts().swap_remove(layout);
    let caching = caching && cacheable;
    let mut cfg = CoordinatorConfig::new(specs.clone(), num_blocks, caching, 256);
    cfg.hash_block_size = unit;
    if specs.iter().any(GroupSpec::is_sparse) && caching {
        cfg.retention_interval = retention.map(|r| r * i64::from(cfg.scheduler_block_size));
    }
    let kind = cfg.kind;
    let sched = cfg.scheduler_block_size as usize;
    let mut c = CoordinatorCore::new(cfg).unwrap();
    let mut running: HashMap<u64, Req> = HashMap::new();
    for op in ops {
        match *op {
            Op::Admit { req, len, variant } => {
                if running.contains_key(&req) {
                    continue;
                }
                // Prompts share prefixes: a common stem, then a variant.
                let tokens: Vec<u32> = (0..len as u32)
                    .map(|i| if i < 12 { i } else { i + 1000 * variant })
                    .collect();
                let mut hashes = Vec::new();
                extend_hashes(&mut hashes, &tokens, unit as usize);
                let max_len = len - 1;
                let (hits, hit) = match kind {
                    CoordinatorKind::NoPrefixCache => (vec![Vec::new(); specs.len()], 0),
                    CoordinatorKind::Unitary => {
                        let bs = specs[0].block_size as usize;
                        c.find_longest_cache_hit(&[GroupId(0)], &hashes, max_len, bs, false)
                            .unwrap()
                    }
                    CoordinatorKind::Hybrid => agreed_hit(&c, &specs, &hashes, max_len, sched),
                };
                let r = Req {
                    id: ReqId(req),
                    tokens,
                    computed: 0,
                    hashes,
                };
                let view = RequestView::new(0, len, len, &r.hashes);
                let got = c
                    .allocate_slots(
                        r.id,
                        &view,
                        &AllocateArgs {
                            num_new_tokens: len - hit,
                            num_new_computed_tokens: hit,
                            num_lookahead_tokens: 0,
                            num_encoder_tokens: 0,
                            delay_cache_blocks: false,
                            num_external_computed_tokens: 0,
                        },
                        Some(&hits),
                    )
                    .unwrap();
                if got.is_some() {
                    running.insert(req, Req { computed: len, ..r });
                } else {
                    assert!(!c.contains(r.id));
                }
            }
            Op::Step { req } => {
                let Some(r) = running.get_mut(&req) else {
                    continue;
                };
                if r.tokens.len() >= 250 {
                    continue;
                }
                r.tokens.push(7 + r.tokens.len() as u32);
                extend_hashes(&mut r.hashes, &r.tokens, unit as usize);
                let view = RequestView::new(r.computed, r.tokens.len(), r.tokens.len(), &r.hashes);
                let got = c
                    .allocate_slots(
                        r.id,
                        &view,
                        &AllocateArgs {
                            num_new_tokens: 1,
                            num_new_computed_tokens: 0,
                            num_lookahead_tokens: 0,
                            num_encoder_tokens: 0,
                            delay_cache_blocks: false,
                            num_external_computed_tokens: 0,
                        },
                        None,
                    )
                    .unwrap();
                if got.is_some() {
                    r.computed += 1;
                } else {
                    // Preempt.
                    assert!(c.free(r.id).unwrap());
                    running.remove(&req);
                }
            }
            Op::Finish { req } => {
                if let Some(r) = running.remove(&req) {
                    assert!(c.free(r.id).unwrap());
                }
            }
        }
        c.check_invariants().unwrap();
        for r in running.values() {
            // Tables cover every computed token (null entries included).
            for (t, s) in c.block_ids(r.id).unwrap().iter().zip(&specs) {
                assert!(t.len() * s.block_size as usize >= r.computed.min(256));
            }
        }
    }
    for r in running.values() {
        c.free(r.id).unwrap();
    }
    assert_eq!(c.pool().num_free_blocks(), num_blocks - 1);
    assert!(c.pool().free_block_ids().all(|b| b != BlockId::NULL));
    c.check_invariants().unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn random_workloads(
        layout in 0..7usize,
        num_blocks in 4..48usize,
        caching in any::<bool>(),
        retention in prop_oneof![Just(None), Just(Some(0i64)), Just(Some(2i64))],
        ops in prop::collection::vec(op(), 1..60),
    ) {
        run(layout, num_blocks, caching, retention, &ops);
    }
}
