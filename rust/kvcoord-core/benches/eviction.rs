//! Eviction policies against vLLM's LRU, on a 1,000,000-block pool, 64
//! blocks per call (see `docs/eviction.md` for the figures).
//!
//! * `get_free_64/<policy>`: hand out 64 blocks and free them tail first
//!   (unhashed: the bare allocate/free path every policy shares).
//! * `cycle_64/<policy>`: a pool full of cached free blocks; each round
//!   evicts 64 of them (allocation), caches the new blocks as a 64-deep
//!   chain, hits its first 16 blocks again (touch) and frees everything
//!   tail first, so every cached block goes through the policy.

use std::hint::black_box;

use criterion::{Criterion, Throughput};
use kvcoord_core::{BlockHash, BlockId, BlockPool, EvictionConfig, GroupId, PoolConfig};

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
    g.finish();
}
