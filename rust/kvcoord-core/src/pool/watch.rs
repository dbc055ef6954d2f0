//! Blocks released but still read (vLLM's `unpin_blocks`, `HiSparse`):
//! free for the pool, watched until it hands them out again.

use super::order::Order;
use super::BlockPool;
use crate::error::{KvError, KvResult};
use crate::ids::BlockId;

impl BlockPool {
    /// Release one reference of each block while its contents stay readable
    /// until the pool reuses it (vLLM's `BlockPool.unpin_blocks`). A block
    /// reaching zero joins the back of the free queue whether or not it is
    /// cached (the last to be reused), and counts as free; every listed block
    /// is watched: when [`Self::get_new_blocks`] hands it out, or a
    /// successful [`Self::reset_prefix_cache`] forgets the pool's contents,
    /// it is reported once by [`Self::take_reused_watched`].
    ///
    /// Refused (nothing changed) for an out-of-range id, the null block, a
    /// block listed more often than it has references, and on a pool with a
    /// ranked eviction policy (vLLM's rule is a single LRU queue).
    pub fn unpin_blocks(&mut self, blocks: &[BlockId]) -> KvResult<()> {
        self.check_ids(blocks)?;
        let Order::Lru(q) = &mut self.free else {
            return Err(KvError::Unsupported {
                what: "unpin_blocks on a pool with a ranked eviction policy".into(),
            });
        };
        let mut counts: std::collections::HashMap<BlockId, u32> = std::collections::HashMap::new();
        counts
            .try_reserve(blocks.len())
            .map_err(|_| crate::limits::out_of_memory("a count per block id", blocks.len()))?;
        // The watch list is pool-sized: reserved before anything changes.
        self.watch.reserve(self.meta.len())?;
        for &b in blocks {
            if b.is_null() {
                return Err(KvError::InvalidArgument {
                    name: "blocks",
                    detail: "the null block cannot be unpinned".into(),
                });
            }
            let n = counts.entry(b).or_insert(0);
            *n += 1;
            if *n > self.meta[b.index()].ref_cnt {
                return Err(KvError::RefCountUnderflow(b));
            }
        }
        let mut batch = q.begin_enqueue();
        for &b in blocks {
            let m = &mut self.meta[b.index()];
            m.ref_cnt -= 1;
            if m.ref_cnt == 0 {
                batch.push(b, true);
            }
        }
        batch.commit();
        self.watch.watch(self.meta.len(), blocks);
        Ok(())
    }

    /// The watched blocks ([`Self::unpin_blocks`]) handed out or forgotten
    /// since the last call, in that order; each is reported once and is no
    /// longer watched.
    pub fn take_reused_watched(&mut self) -> Vec<BlockId> {
        self.watch.take_reused()
    }

    /// Number of blocks watched by [`Self::unpin_blocks`] and not reused yet.
    pub fn num_watched(&self) -> usize {
        self.watch.len()
    }
}
