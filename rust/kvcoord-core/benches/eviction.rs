//! Eviction policies against vLLM's LRU, on a 1,000,000-block pool, 64
//! blocks per call (see `docs/eviction.md` for the figures).
//!
//! * `get_free_64/<policy>`: hand out 64 blocks and free them tail first
//!   (unhashed: the bare allocate/free path every policy shares).
//! * `cycle_64/<policy>`: a pool full of cached free blocks; each round
//!   evicts 64 of them (allocation), caches the new blocks as a 64-deep
//!   chain, hits its first 16 blocks again (touch) and frees everything
//!   tail first, so every cached block goes through the policy.
//! * `admit_step/<policy>`: a `CoordinatorCore` (one full-attention group,
//!   16-token blocks, 4096 blocks) admitting requests in steady state: a
//!   prefix lookup, `allocate_slots` for the prompt (hits adopted, full
//!   blocks cached), a priority for every fourth request, one clock tick,
//!   and the oldest of 48 running requests freed. Prompts are 8 shared
//!   blocks (one of 4 system prompts) and 0-23 private ones from 1024
//!   conversations that recur, so the pool evicts all the time.

use std::collections::VecDeque;
use std::hint::black_box;

use criterion::{Criterion, Throughput};
use kvcoord_core::{
    AllocateArgs, BlockHash, BlockId, BlockPool, CoordinatorConfig, CoordinatorCore,
    EvictionConfig, GroupId, GroupSpec, PoolConfig, ReqId, RequestView,
};

const NUM_BLOCKS: usize = 1_000_000;
const BATCH: usize = 64;

fn hash(i: u64) -> BlockHash {
    let mut b = [0u8; 32];
    let mut x = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    for chunk in b.chunks_mut(8) {
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        chunk.copy_from_slice(&(x ^ (x >> 31)).to_le_bytes());
    }
    BlockHash::from_slice(&b).unwrap()
}

const POLICIES: [&str; 4] = ["lru", "lfu", "prefix-depth", "priority"];

fn pool(spec: &str) -> BlockPool {
    let config: EvictionConfig = spec.parse().unwrap();
    BlockPool::with_eviction(PoolConfig::new(NUM_BLOCKS), config).unwrap()
}

pub(crate) fn register(c: &mut Criterion) {
    let mut g = c.benchmark_group("eviction");
    g.throughput(Throughput::Elements(BATCH as u64));
    for spec in POLICIES {
        let mut p = pool(spec);
        let mut out = Vec::with_capacity(BATCH);
        g.bench_function(format!("get_free_64/{spec}"), |b| {
            b.iter(|| {
                out.clear();
                p.get_new_blocks(BATCH, &mut out).unwrap();
                out.reverse();
                p.free_blocks(black_box(&out)).unwrap();
            });
        });
    }
    for spec in POLICIES {
        let mut p = pool(spec);
        // Fill the pool with cached free blocks, 64-deep chains.
        let mut ids = Vec::with_capacity(BATCH);
        let mut next = 0u64;
        let mut hashes: Vec<BlockHash> = Vec::with_capacity(BATCH);
        let mut round = |p: &mut BlockPool, ids: &mut Vec<BlockId>| {
            ids.clear();
            p.get_new_blocks(BATCH, ids).unwrap();
            hashes.clear();
            hashes.extend((next..next + BATCH as u64).map(hash));
            next += BATCH as u64;
            p.cache_full_blocks(ids, &hashes, 0, BATCH, GroupId(0), None)
                .unwrap();
            p.set_priority(&ids[..16], 3).unwrap();
            p.touch(&ids[..16]).unwrap();
            p.free_blocks(&ids[..16]).unwrap();
            ids.reverse();
            p.free_blocks(ids).unwrap();
            p.advance_clock(1).unwrap();
        };
        for _ in 0..(NUM_BLOCKS / BATCH) {
            round(&mut p, &mut ids);
        }
        g.bench_function(format!("cycle_64/{spec}"), |b| {
            b.iter(|| round(black_box(&mut p), &mut ids));
        });
    }
    for spec in POLICIES {
        let mut admit = Admissions::new(spec);
        for _ in 0..8192 {
            admit.step();
        }
        g.throughput(Throughput::Elements(1));
        g.bench_function(format!("admit_step/{spec}"), |b| b.iter(|| admit.step()));
    }
    g.finish();
}

/// The steady-state admission loop of `admit_step`.
struct Admissions {
    core: CoordinatorCore,
    /// (prompt length, block hashes) per conversation.
    prompts: Vec<(usize, Vec<BlockHash>)>,
    running: VecDeque<ReqId>,
    next: u64,
    hits: Vec<Vec<BlockId>>,
}

impl Admissions {
    fn new(spec: &str) -> Self {
        let mut cfg = CoordinatorConfig::new(vec![GroupSpec::full_attention(16)], 4096, true, 8192);
        cfg.hash_block_size = 16;
        let mut core = CoordinatorCore::new(cfg).unwrap();
        core.pool_mut().set_eviction(spec.parse().unwrap()).unwrap();
        let prompts = (0..1024u64)
            .map(|t| {
                let blocks = 8 + t % 24;
                let hashes = (0..blocks)
                    .map(|j| {
                        if j < 8 {
                            hash((t % 4) << 32 | j)
                        } else {
                            hash(1 << 40 | t << 8 | j)
                        }
                    })
                    .collect();
                (blocks as usize * 16 + 5, hashes)
            })
            .collect();
        Self {
            core,
            prompts,
            running: VecDeque::new(),
            next: 0,
            hits: vec![Vec::new()],
        }
    }

    fn step(&mut self) {
        let (len, hashes) = &self.prompts[(self.next % 1024) as usize];
        let c = &mut self.core;
        let hit = c
            .find_longest_cache_hit_into(&[GroupId(0)], hashes, len - 1, 16, false, &mut self.hits)
            .unwrap();
        let view = RequestView::new(0, *len, *len, hashes);
        let id = ReqId(self.next);
        let new = c
            .allocate_slots(
                id,
                &view,
                &AllocateArgs {
                    num_new_tokens: len - hit,
                    num_new_computed_tokens: hit,
                    num_lookahead_tokens: 0,
                    num_encoder_tokens: 0,
                    delay_cache_blocks: false,
                    num_external_computed_tokens: 0,
                },
                Some(&self.hits),
            )
            .unwrap();
        assert!(new.is_some(), "the pool holds 48 running requests");
        if self.next % 4 == 0 {
            let held = c.block_ids(id).unwrap()[0].to_vec();
            c.pool_mut().set_priority(&held, 3).unwrap();
        }
        c.pool_mut().advance_clock(1).unwrap();
        self.running.push_back(id);
        while self.running.len() > 48 {
            c.free(self.running.pop_front().unwrap()).unwrap();
        }
        self.next += 1;
    }
}
