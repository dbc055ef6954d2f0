//! Block hashing throughput: 16-token blocks over a 32k-token prompt.

use std::hint::black_box;

use criterion::{Criterion, Throughput};
use kvcoord_core::hashing::compute_block_hashes;
use kvcoord_core::{ExtraKeys, HashAlgo, HashConfig};

/// 16-token blocks over a 32k-token prompt, each algorithm (the hashing
/// alone, no Python conversion).
pub(crate) fn register(c: &mut Criterion) {
    let tokens: Vec<u32> = (0..32_768u32)
        .map(|i| i.wrapping_mul(2_654_435_761) % 200_000)
        .collect();
    let mut g = c.benchmark_group("hash_32k_prompt_bs16");
    g.throughput(Throughput::Elements(tokens.len() as u64));
    for algo in HashAlgo::COMPUTED {
        let config = HashConfig::new(algo, 16, Some("bench")).unwrap();
        g.bench_function(algo.name(), |b| {
            b.iter(|| compute_block_hashes(config, ExtraKeys::default(), black_box(&tokens)));
        });
    }
    g.finish();
}

/// The primitives alone (SHA-256 and XXH3-128 of a block-sized payload, CBOR
/// encoding of the tokens), to compare with the per-block cost above.
pub(crate) fn primitives(c: &mut Criterion) {
    use sha2::{Digest, Sha256};
    let data = [7u8; 117];
    let mut g = c.benchmark_group("hash_primitive");
    g.bench_function("sha256_117B", |b| {
        b.iter(|| Sha256::digest(black_box(&data[..])));
    });
    g.bench_function("xxh3_128_84B", |b| {
        b.iter(|| xxhash_rust::xxh3::xxh3_128(black_box(&data[..84])));
    });
    let tokens: Vec<u32> = (0..32_768u32)
        .map(|i| i.wrapping_mul(2_654_435_761) % 200_000)
        .collect();
    let mut buf = kvcoord_core::cbor::CborBuf::with_capacity(256);
    g.bench_function("cbor_encode_32k_tokens_bs16", |b| {
        b.iter(|| {
            let mut total = 0;
            for blk in black_box(&tokens).chunks_exact(16) {
                buf.clear();
                buf.u32_array(blk);
                total += buf.as_bytes().len();
            }
            total
        });
    });
    g.finish();
}
