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
    for algo in HashAlgo::ALL {
        let config = HashConfig::new(algo, 16, Some("bench")).unwrap();
        g.bench_function(algo.name(), |b| {
            b.iter(|| compute_block_hashes(config, ExtraKeys::default(), black_box(&tokens)));
        });
    }
    g.finish();
}
