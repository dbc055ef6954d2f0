//! Block pool hot paths at 1,000,000 blocks.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput};
use kvcoord_core::{BlockHash, BlockId, BlockPool, GroupId, PoolConfig};

const NUM_BLOCKS: usize = 1_000_000;
const BATCH: usize = 64;

fn hash(i: u64) -> BlockHash {
    let mut b = [0u8; 32];
    // A cheap deterministic spread (splitmix64) so keys look like digests.
    let mut x = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    for chunk in b.chunks_mut(8) {
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        chunk.copy_from_slice(&(x ^ (x >> 31)).to_le_bytes());
    }
    BlockHash::from_slice(&b).unwrap()
}

pub(crate) fn register(c: &mut Criterion) {
    let mut g = c.benchmark_group("pool");
    g.throughput(Throughput::Elements(BATCH as u64));

    g.bench_function("construct_1M", |b| {
        b.iter(|| black_box(BlockPool::new(PoolConfig::new(NUM_BLOCKS)).unwrap()));
    });

    let mut pool = BlockPool::new(PoolConfig::new(NUM_BLOCKS)).unwrap();
    let mut out = Vec::with_capacity(BATCH);
    g.bench_function("get_free_64", |b| {
        b.iter(|| {
            out.clear();
            pool.get_new_blocks(BATCH, &mut out).unwrap();
            out.reverse();
            pool.free_blocks(black_box(&out)).unwrap();
        });
    });

    let held: Vec<BlockId> = {
        let mut v = Vec::new();
        pool.get_new_blocks(BATCH, &mut v).unwrap();
        v
    };
    g.bench_function("touch_free_64", |b| {
        b.iter(|| {
            pool.touch(black_box(&held)).unwrap();
            pool.free_blocks(black_box(&held)).unwrap();
        });
    });

    let hashes: Vec<BlockHash> = (0..BATCH as u64).map(hash).collect();
    g.bench_function("cache_full_blocks_64", |b| {
        b.iter_batched(
            || {
                let mut p = BlockPool::new(PoolConfig::new(4 * BATCH)).unwrap();
                let mut ids = Vec::new();
                p.get_new_blocks(BATCH, &mut ids).unwrap();
                (p, ids)
            },
            |(mut p, ids)| {
                p.cache_full_blocks(&ids, &hashes, 0, BATCH, GroupId(0), None)
                    .unwrap();
                p
            },
            BatchSize::SmallInput,
        );
    });

    // A large cached population for lookups.
    let mut cached = BlockPool::new(PoolConfig::new(NUM_BLOCKS)).unwrap();
    let mut ids = Vec::new();
    cached.get_new_blocks(NUM_BLOCKS / 2, &mut ids).unwrap();
    let many: Vec<BlockHash> = (0..ids.len() as u64).map(hash).collect();
    cached
        .cache_full_blocks(&ids, &many, 0, ids.len(), GroupId(0), None)
        .unwrap();
    let mut hit_out = Vec::with_capacity(1);
    g.throughput(Throughput::Elements(1));
    g.bench_function("get_cached_block_hit", |b| {
        let mut i = 0usize;
        b.iter(|| {
            hit_out.clear();
            i = (i + 7919) % many.len();
            black_box(cached.get_cached_block(&many[i], &[GroupId(0)], &mut hit_out))
        });
    });
    let misses: Vec<BlockHash> = (0..1024u64).map(|i| hash(u64::MAX - i)).collect();
    g.bench_function("get_cached_block_miss", |b| {
        let mut i = 0usize;
        b.iter(|| {
            hit_out.clear();
            i = (i + 1) % misses.len();
            black_box(cached.get_cached_block(&misses[i], &[GroupId(0)], &mut hit_out))
        });
    });

    g.finish();
}

/// The replay's hot paths: allocation that evicts, token synthesis.
pub(crate) fn replay(c: &mut Criterion) {
    let mut g = c.benchmark_group("pool");
    g.throughput(Throughput::Elements(BATCH as u64));
    // The replay's steady state: every block handed out was cached, so each
    // allocation evicts (prefix index removal, residency metrics).
    for mode in ["off", "histograms", "records"] {
        let mut p = BlockPool::new(PoolConfig::new(4 * BATCH + 1)).unwrap();
        if mode != "off" {
            p.enable_residency_with(mode == "records").unwrap();
        }
        let mut next = 0u64;
        let mut ids = Vec::with_capacity(BATCH);
        let mut keys = Vec::with_capacity(BATCH);
        g.bench_function(format!("evict_cache_free_64/residency_{mode}"), |b| {
            b.iter(|| {
                ids.clear();
                p.get_new_blocks(BATCH, &mut ids).unwrap();
                keys.clear();
                keys.extend((next..next + BATCH as u64).map(hash));
                next += BATCH as u64;
                p.cache_full_blocks(&ids, &keys, 0, BATCH, GroupId(0), None)
                    .unwrap();
                p.free_blocks(black_box(&ids)).unwrap();
                if let Some(r) = p.residency_mut() {
                    black_box(r.drain_records());
                }
            });
        });
    }

    // The same at the replay's scale: 200k blocks, all cached, 512 (a
    // prefill chunk) evicted per call, so the index no longer fits in cache.
    {
        const BIG: usize = 200_000;
        const CHUNK: usize = 512;
        let mut p = BlockPool::new(PoolConfig::new(BIG + 1)).unwrap();
        p.enable_residency_with(false).unwrap();
        let mut next = 0u64;
        let mut ids = Vec::with_capacity(BIG);
        let mut keys = Vec::with_capacity(BIG);
        let mut cycle = |p: &mut BlockPool, n: usize| {
            ids.clear();
            p.get_new_blocks(n, &mut ids).unwrap();
            keys.clear();
            keys.extend((next..next + n as u64).map(hash));
            next += n as u64;
            p.cache_full_blocks(&ids, &keys, 0, n, GroupId(0), None)
                .unwrap();
            p.free_blocks(&ids).unwrap();
        };
        cycle(&mut p, BIG);
        g.throughput(Throughput::Elements(CHUNK as u64));
        g.bench_function("evict_cache_free_512_of_200k", |b| {
            b.iter(|| cycle(&mut p, CHUNK));
        });
    }

    // Mooncake token synthesis (`kvcoord replay`): 128 blocks of 512 tokens.
    let ids: Vec<u64> = (0..128u64).map(|i| i * 0x9E37_79B9).collect();
    let mut toks = Vec::new();
    g.throughput(Throughput::Elements(128 * 512));
    g.bench_function("mooncake_tokens_64k", |b| {
        b.iter(|| {
            toks.clear();
            kvcoord_core::trace_tokens::mooncake_prompt_tokens(
                black_box(&ids),
                128 * 512,
                &mut toks,
            )
            .unwrap();
            black_box(&toks);
        });
    });
    g.finish();
}
