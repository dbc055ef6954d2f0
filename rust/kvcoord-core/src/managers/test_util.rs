//! Helpers of the managers' tests: hashes, pools, cached blocks, tables.

use super::GroupTable;
use crate::block_hash::BlockHash;
use crate::ids::{BlockId, GroupId};
use crate::pool::{BlockPool, PoolConfig};

/// Hash number `n`.
pub(crate) fn h(n: u32) -> BlockHash {
    let mut bytes = [0u8; 32];
    bytes[..4].copy_from_slice(&n.to_le_bytes());
    bytes[31] = 1;
    BlockHash::from_slice(&bytes).unwrap()
}

/// Hashes `0..n`.
pub(crate) fn hashes(n: u32) -> Vec<BlockHash> {
    (0..n).map(h).collect()
}

pub(crate) fn pool(n: usize, hash_block_size: u32) -> BlockPool {
    BlockPool::new(PoolConfig {
        hash_block_size,
        ..PoolConfig::new(n)
    })
    .unwrap()
}

/// Cache pool block `id` under hash `hash` for group 0 (the block is
/// allocated, cached and freed again so it is an evictable cached block).
pub(crate) fn cache_block(pool: &mut BlockPool, id: u32, hash: &BlockHash) {
    let b = BlockId(id);
    pool.touch(&[b]).unwrap();
    pool.cache_full_blocks(&[b], std::slice::from_ref(hash), 0, 1, GroupId(0), None)
        .unwrap();
    pool.free_blocks(&[b]).unwrap();
}

pub(crate) fn ids(v: &[BlockId]) -> Vec<u32> {
    v.iter().map(|b| b.0).collect()
}

pub(crate) fn table(blocks: &[u32]) -> GroupTable {
    GroupTable {
        blocks: blocks.iter().map(|&b| BlockId(b)).collect(),
        ..GroupTable::default()
    }
}
