//! Criterion benchmarks of the core, one harness composed from modules.
//!
//! Dimensions: pool size (1M blocks), batch size (64 blocks per call), hit
//! vs miss lookups, hashing algorithm. Inputs are generated deterministically.

use criterion::{criterion_group, criterion_main};

mod eviction;
mod hashing;
mod pool;

criterion_group!(
    benches,
    pool::register,
    pool::replay,
    eviction::register,
    hashing::register,
    hashing::primitives
);
criterion_main!(benches);
