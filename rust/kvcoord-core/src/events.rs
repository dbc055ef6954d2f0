//! KV-cache events: what a router needs to know about the prefix index.
//!
//! Recording is off by default; when on, the pool appends events as it
//! mutates the index and the caller drains them with `take_events`.

use crate::block_hash::BlockHash;
use crate::ids::{BlockId, GroupId};

/// One change to the prefix index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// One `cache_full_blocks` call registered these blocks.
    BlockStored {
        /// Hashes of the blocks that were cached, in table order.
        block_hashes: Vec<BlockHash>,
        /// Ids of those blocks, aligned with `block_hashes`.
        block_ids: Vec<BlockId>,
        /// Hash of the block logically before the first one (the chain
        /// parent), or `None` when caching started at block 0.
        parent_block_hash: Option<BlockHash>,
        /// Group the blocks were cached for.
        group: GroupId,
    },
    /// A key left the index (its last block was evicted or reused).
    BlockRemoved {
        /// The removed key's hash.
        block_hash: BlockHash,
        /// The removed key's group.
        group: GroupId,
    },
    /// `reset_prefix_cache` dropped every key.
    AllBlocksCleared,
}
