//! Fuzzing the core API with random, often invalid calls (issue 11): after
//! every call the invariants hold, a refused call changed nothing (free
//! queue order, reference counts, cached flags, every request's tables),
//! and no block is shared by two requests unless it is a cached prefix
//! block (two requests never write one block).
//!
//! `cargo test` runs a bounded number of cases; set `KVCOORD_FUZZ_CASES`
//! for a longer run (see the README's development section).

use kvcoord_core::{
    hashing, AllocateArgs, BlockHash, BlockId, CoordinatorConfig, CoordinatorCore, ExtraKeys,
    GroupId, GroupSpec, HashAlgo, HashConfig, ReqId, RequestView,
};
use proptest::prelude::*;

const BS: usize = 4;

fn layouts() -> Vec<(Vec<GroupSpec>, bool)> {
    vec![
        (vec![GroupSpec::full_attention(4)], true),
        (
            vec![
                GroupSpec::full_attention(4),
                GroupSpec::sliding_window(4, 8),
            ],
            true,
        ),
        (
            vec![GroupSpec::full_attention(4), GroupSpec::chunked_local(4, 8)],
            true,
        ),
        (
            vec![
                GroupSpec::full_attention(4),
                GroupSpec::cross_attention(1),
                GroupSpec::mamba(4, 1),
            ],
            false,
        ),
    ]
}

#[derive(Clone, Debug)]
enum Hits {
    /// What the lookup returned.
    Honest,
    /// Arbitrary ids (often other requests' blocks, free or out of range).
    Random(Vec<u32>),
    /// The honest hits with two entries swapped or one nulled.
    Tampered(usize, bool),
}

#[derive(Clone, Debug)]
enum Op {
    Admit {
        prefix: usize,
        tail: Vec<u32>,
        hits: Hits,
        huge: Option<(usize, usize)>,
    },
    Decode {
        req: usize,
        lookahead: usize,
    },
    Cache {
        req: usize,
        n: usize,
    },
    Free {
        req: usize,
    },
    Stale {
        req: usize,
    },
}

fn counts() -> impl Strategy<Value = usize> {
    prop_oneof![
        0usize..40,
        Just(usize::MAX),
        Just(1usize << 48),
        Just(6_148_914_691_236_517_206usize),
        any::<usize>(),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let hits = prop_oneof![
        4 => Just(Hits::Honest),
        1 => proptest::collection::vec(0u32..40, 0..6).prop_map(Hits::Random),
        1 => (0usize..6, any::<bool>()).prop_map(|(i, n)| Hits::Tampered(i, n)),
    ];
    prop_oneof![
        4 => (0usize..3, proptest::collection::vec(0u32..50, 1..14), hits,
              proptest::option::weighted(0.15, (0usize..4, counts())))
            .prop_map(|(prefix, tail, hits, huge)| Op::Admit { prefix, tail, hits, huge }),
        3 => (0usize..8, prop_oneof![Just(0usize), 0usize..6, counts()])
            .prop_map(|(req, lookahead)| Op::Decode { req, lookahead }),
        1 => (0usize..8, counts()).prop_map(|(req, n)| Op::Cache { req, n }),
        2 => (0usize..8).prop_map(|req| Op::Free { req }),
        1 => (0usize..8).prop_map(|req| Op::Stale { req }),
    ]
}

struct Req {
    id: ReqId,
    tokens: Vec<u32>,
    computed: usize,
    hashes: Vec<BlockHash>,
}

impl Req {
    fn view(&self) -> RequestView<'_> {
        RequestView::new(
            self.computed,
            self.tokens.len(),
            self.tokens.len(),
            &self.hashes,
        )
    }

    fn rehash(&mut self) {
        let config = HashConfig::new(HashAlgo::Native, BS, Some("fuzz")).unwrap();
        self.hashes = hashing::compute_block_hashes(config, ExtraKeys::default(), &self.tokens);
    }
}

type Snapshot = (Vec<u32>, Vec<u32>, Vec<bool>, Vec<(u64, Vec<Vec<u32>>)>);

fn snapshot(c: &CoordinatorCore, running: &[Req]) -> Snapshot {
    let p = c.pool();
    let mut tables: Vec<_> = running
        .iter()
        .filter(|r| c.contains(r.id))
        .map(|r| {
            let t = c.block_ids(r.id).unwrap();
            (
                r.id.0,
                t.iter().map(|g| g.iter().map(|b| b.0).collect()).collect(),
            )
        })
        .collect();
    tables.sort();
    (
        p.free_block_ids().map(|b| b.0).collect(),
        p.ref_counts().collect(),
        p.cached_mask().collect(),
        tables,
    )
}

/// Two requests may share a block only through the prefix cache.
fn check_no_shared_writes(c: &CoordinatorCore) -> Result<(), String> {
    let p = c.pool();
    for (i, (refs, cached)) in p.ref_counts().zip(p.cached_mask()).enumerate() {
        if i > 0 && refs > 1 && !cached {
            return Err(format!("block {i} has {refs} owners but is not cached"));
        }
    }
    Ok(())
}

/// `verify_hits` off: hits are adopted whatever they hold (vLLM's rule), so
/// tampered hits may be accepted and share unkeyed blocks; everything else
/// must hold as with verification.
fn run(
    layout: usize,
    num_blocks: usize,
    ops: Vec<Op>,
    verify_hits: bool,
) -> Result<(), TestCaseError> {
    let (groups, caching) = layouts()[layout].clone();
    let n_groups = groups.len();
    let mut cfg = CoordinatorConfig::new(groups, num_blocks, caching, 256);
    cfg.hash_block_size = BS as u32;
    cfg.verify_hits = verify_hits;
    let mut core = CoordinatorCore::new(cfg).unwrap();
    let c = &mut core;
    let prefixes: [Vec<u32>; 3] = [(100..108).collect(), vec![7; 4], vec![]];
    let mut running: Vec<Req> = Vec::new();
    let mut next = 0u64;
    for op in ops {
        let before = snapshot(c, &running);
        let mut new_request = false;
        let result: Result<(), String> = match op {
            Op::Admit {
                prefix,
                tail,
                hits,
                huge,
            } => {
                next += 1;
                let mut r = Req {
                    id: ReqId(next),
                    tokens: [prefixes[prefix].clone(), tail].concat(),
                    computed: 0,
                    hashes: Vec::new(),
                };
                r.rehash();
                let (mut list, hit) = lookup(c, &r, n_groups, caching);
                tamper(&mut list[0], hits);
                let mut counts = [r.tokens.len() - hit, hit, 0, 2];
                if let Some((k, v)) = huge {
                    counts[k] = v;
                }
                new_request = true;
                let res = alloc(
                    c,
                    r.id,
                    &r.view(),
                    counts[0],
                    counts[1],
                    Some(&list),
                    counts[2],
                    counts[3],
                );
                match res {
                    Ok(Some(_)) => {
                        r.computed = r.tokens.len();
                        running.push(r);
                        Ok(())
                    }
                    Ok(None) => Ok(()),
                    Err(e) => Err(e.to_string()),
                }
            }
            Op::Decode { req, lookahead } => match running.get_mut(req) {
                None => Ok(()),
                Some(r) => decode(c, r, lookahead),
            },
            Op::Cache { req, n } => match running.get(req) {
                None => Ok(()),
                Some(r) => c
                    .cache_blocks(r.id, &r.view(), n)
                    .map_err(|e| e.to_string()),
            },
            Op::Free { req } => {
                if req < running.len() {
                    let r = running.remove(req);
                    c.free(r.id).unwrap();
                }
                Ok(())
            }
            Op::Stale { req } => {
                stale(c, &mut running, req)?;
                Ok(())
            }
        };
        if result.is_err() || new_request && !c.contains(ReqId(next)) {
            prop_assert_eq!(
                snapshot(c, &running),
                before,
                "refused call changed state: {:?}",
                result
            );
        }
        c.check_invariants().map_err(TestCaseError::fail)?;
        if verify_hits {
            check_no_shared_writes(c).map_err(TestCaseError::fail)?;
        }
    }
    for r in running.drain(..) {
        c.free(r.id).unwrap();
    }
    prop_assert_eq!(c.pool().num_free_blocks(), num_blocks - 1);
    Ok(())
}

fn cases() -> u32 {
    std::env::var("KVCOORD_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn random_calls_never_corrupt_the_coordinator(
        layout in 0usize..4,
        num_blocks in 6usize..40,
        ops in proptest::collection::vec(op(), 1..60),
        verify_hits in any::<bool>(),
    ) {
        run(layout, num_blocks, ops, verify_hits)?;
    }
}

/// `allocate_slots` with the counts spelled out.
#[allow(clippy::too_many_arguments)]
fn alloc(
    c: &mut CoordinatorCore,
    req: ReqId,
    view: &RequestView<'_>,
    num_new_tokens: usize,
    num_new_computed_tokens: usize,
    hits: Option<&[Vec<BlockId>]>,
    num_lookahead_tokens: usize,
    num_encoder_tokens: usize,
) -> kvcoord_core::KvResult<Option<Vec<Vec<BlockId>>>> {
    let args = AllocateArgs {
        num_new_tokens,
        num_new_computed_tokens,
        num_lookahead_tokens,
        num_encoder_tokens,
        delay_cache_blocks: false,
        num_external_computed_tokens: 0,
    };
    c.allocate_slots(req, view, &args, hits)
}

/// The hits a scheduler would pass: group 0's longest hit, every other
/// group's hit at that length.
fn lookup(
    core: &CoordinatorCore,
    r: &Req,
    n_groups: usize,
    caching: bool,
) -> (Vec<Vec<BlockId>>, usize) {
    if !caching {
        return (vec![Vec::new(); n_groups], 0);
    }
    let max = r.tokens.len() - 1;
    let (mut all, len) = core
        .find_longest_cache_hit(&[GroupId(0)], &r.hashes, max, BS, false)
        .unwrap();
    for g in 1..n_groups {
        let id = GroupId(u32::try_from(g).unwrap());
        all.extend(
            core.find_longest_cache_hit(&[id], &r.hashes, len, BS, false)
                .unwrap()
                .0,
        );
    }
    (all, len)
}

/// Apply the adversarial change `hits` to group 0's hit list.
fn tamper(list: &mut Vec<BlockId>, hits: Hits) {
    match hits {
        Hits::Honest => {}
        Hits::Random(ids) => *list = ids.into_iter().map(BlockId).collect(),
        Hits::Tampered(_, _) if list.is_empty() => {}
        Hits::Tampered(pos, null) => {
            let pos = pos % list.len();
            if null {
                list[pos] = BlockId::NULL;
            } else {
                let next = (pos + 1) % list.len();
                list.swap(pos, next);
            }
        }
    }
}

/// One decode step of `r` (its token is taken back if refused).
fn decode(c: &mut CoordinatorCore, r: &mut Req, lookahead: usize) -> Result<(), String> {
    r.tokens.push(1);
    r.rehash();
    match alloc(c, r.id, &r.view(), 1, 0, None, lookahead, 2) {
        Ok(Some(_)) => {
            r.computed += 1;
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(e) => {
            r.tokens.pop();
            r.rehash();
            Err(e.to_string())
        }
    }
}

/// Free request `req`, then pass it back with its progress still set: with
/// hits verified it must be refused, nothing changed; unverified, its
/// computed tokens are taken as given (vLLM's scheduler does) and get
/// fresh blocks, if they fit.
fn stale(c: &mut CoordinatorCore, running: &mut Vec<Req>, req: usize) -> Result<(), TestCaseError> {
    if running.get(req).is_none_or(|r| r.computed == 0) {
        return Ok(());
    }
    let r = running.remove(req);
    c.free(r.id).unwrap();
    let before = snapshot(c, running);
    let res = alloc(c, r.id, &r.view(), 1, 0, None, 0, 0);
    if c.config().verify_hits {
        prop_assert!(res.is_err(), "stale request accepted");
        prop_assert_eq!(snapshot(c, running), before);
    } else {
        // Fresh blocks for all of them, or no fit (windows may count fewer
        // in the prediction than the fresh blocks take): never an error.
        match res {
            Ok(Some(_)) => {
                c.free(r.id).unwrap();
            }
            Ok(None) => prop_assert_eq!(snapshot(c, running), before),
            Err(e) => prop_assert!(false, "unverified computed tokens refused: {}", e),
        }
    }
    Ok(())
}
