//! Blocks released but still read until the pool reuses them.
//!
//! vLLM 0.33.0's `HiSparse` releases a device page's reference once its host
//! copy is durable (`BlockPool.unpin_blocks`): the block counts as free and
//! sits at the back of the free queue, but its owner keeps reading it until
//! the pool hands it out again, and must then be told. [`ReuseWatch`] is the
//! pool's record of those blocks: [`BlockPool::unpin_blocks`] adds them,
//! [`BlockPool::get_new_blocks`] and a successful
//! [`BlockPool::reset_prefix_cache`] move the ones they hand out (or forget)
//! to the reused list, which the owner drains with
//! [`BlockPool::take_reused_watched`].
//!
//! [`BlockPool::unpin_blocks`]: crate::pool::BlockPool::unpin_blocks
//! [`BlockPool::get_new_blocks`]: crate::pool::BlockPool::get_new_blocks
//! [`BlockPool::reset_prefix_cache`]: crate::pool::BlockPool::reset_prefix_cache
//! [`BlockPool::take_reused_watched`]: crate::pool::BlockPool::take_reused_watched

use crate::ids::BlockId;

/// The watched blocks of one pool, in the order they were first watched.
#[derive(Clone, Debug, Default)]
pub struct ReuseWatch {
    /// Per block: 0 when not watched, else the sequence number of the call
    /// that started watching it (a block watched again keeps its first one,
    /// as vLLM's watcher dict keeps a key's first position). Empty until the
    /// first watch, so pools that never unpin pay nothing.
    since: Vec<u64>,
    /// Next sequence number (starts at 1).
    next: u64,
    /// Number of non-zero entries of `since`.
    len: usize,
    /// Watched blocks handed out or forgotten since the last drain, in that
    /// order.
    reused: Vec<BlockId>,
}

impl ReuseWatch {
    /// Whether no block is watched (the allocation fast path checks this).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of watched blocks.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether `block` is watched.
    pub fn contains(&self, block: BlockId) -> bool {
        self.since.get(block.index()).is_some_and(|&s| s != 0)
    }

    /// Make room to watch the blocks of a pool of `num_blocks` (pool-sized,
    /// so reserved fallibly, before a caller changes anything).
    pub fn reserve(&mut self, num_blocks: usize) -> crate::KvResult<()> {
        if self.since.len() < num_blocks {
            let more = num_blocks - self.since.len();
            crate::limits::try_reserve(&mut self.since, more, "the watched blocks")?;
            self.since.resize(num_blocks, 0);
        }
        Ok(())
    }

    /// Start watching `blocks` (a pool of `num_blocks`; ids already checked).
    pub fn watch(&mut self, num_blocks: usize, blocks: &[BlockId]) {
        if self.since.is_empty() {
            self.since = vec![0; num_blocks];
        }
        for &b in blocks {
            let s = &mut self.since[b.index()];
            if *s == 0 {
                self.next += 1;
                *s = self.next;
                self.len += 1;
            }
        }
    }

    /// The pool handed `blocks` out: the watched ones are reused.
    pub fn on_handed_out(&mut self, blocks: &[BlockId]) {
        for &b in blocks {
            if let Some(s) = self.since.get_mut(b.index()) {
                if *s != 0 {
                    *s = 0;
                    self.len -= 1;
                    self.reused.push(b);
                }
            }
        }
    }

    /// The pool forgot every cached block's contents: all watched blocks
    /// are reused, in the order they were first watched.
    pub fn on_reset(&mut self) {
        let mut all: Vec<(u64, BlockId)> = self
            .since
            .iter()
            .enumerate()
            .filter(|(_, &s)| s != 0)
            .map(|(i, &s)| (s, BlockId(i as u32)))
            .collect();
        all.sort_unstable();
        self.reused.extend(all.into_iter().map(|(_, b)| b));
        self.since.iter_mut().for_each(|s| *s = 0);
        self.len = 0;
    }

    /// Drain the reused blocks, in the order they were reused.
    pub fn take_reused(&mut self) -> Vec<BlockId> {
        std::mem::take(&mut self.reused)
    }

    /// `len` matches the table.
    pub fn check_invariants(&self) -> Result<(), String> {
        let n = self.since.iter().filter(|&&s| s != 0).count();
        if n != self.len {
            return Err(format!("reuse watch counts {} blocks, holds {n}", self.len));
        }
        Ok(())
    }
}
