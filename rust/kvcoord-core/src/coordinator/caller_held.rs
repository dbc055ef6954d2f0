//! Blocks the caller holds outside every request table, and cache keys set
//! or removed by hand.
//!
//! vLLM's pool interface lets code outside the manager take blocks from the
//! shared pool (`get_new_blocks`), register them in the prefix index
//! (`cache_full_blocks`) and free them again, and lets it edit the index
//! directly. On a coordinator those operations go through here: the
//! coordinator counts the caller's references per block, so that its
//! invariant (each reference is held by a table or by the caller) still
//! holds and a release of a block the caller does not hold is refused
//! instead of corrupting a request's table.

use hashbrown::HashMap;

use super::CoordinatorCore;
use crate::block_hash::BlockHash;
use crate::error::{KvError, KvResult};
use crate::ids::{BlockId, GroupId};
use crate::managers::hisparse;
use crate::spec::SpecKind;

impl CoordinatorCore {
    /// Hand a request's references over to the caller (vLLM's
    /// `pop_blocks_for_free`): the request is forgotten, and each block its
    /// tables referenced becomes a caller reference, released later with
    /// [`free_caller_blocks`](Self::free_caller_blocks) in whatever order
    /// the caller frees them (vLLM frees the popped blocks of every group
    /// in one call, last group first). Per group, the blocks in allocation
    /// order with leading nulls trimmed (a `HiSparse` resident group's row
    /// with its overlay applied, as vLLM pops it); interior nulls stay (a
    /// free skips them). No reference count changes. `None` for an unknown
    /// id.
    pub fn pop_request_to_caller(&mut self, id: &str) -> KvResult<Option<Vec<Vec<BlockId>>>> {
        let Some(req) = self.registry.remove(id) else {
            return Ok(None);
        };
        let Some(mut tables) = self.requests.remove(&req) else {
            return Ok(None);
        };
        if !self.boundary_offloads.is_empty() {
            self.boundary_offloads.retain(|o| o.req != req);
        }
        self.hisparse.forget(req);
        let mut out = Vec::with_capacity(tables.len());
        for (m, t) in self.managers.iter().zip(tables.iter_mut()) {
            let mut row = Vec::new();
            if let SpecKind::HiSparseResident = m.spec().kind {
                hisparse::residency_row(t, 0, &mut row);
                let held: Vec<BlockId> = hisparse::referenced(t).collect();
                for b in held {
                    *self.caller_held.entry(b).or_insert(0) += 1;
                }
            } else {
                row.extend_from_slice(&t.blocks);
                for &b in row.iter().filter(|b| !b.is_null()) {
                    *self.caller_held.entry(b).or_insert(0) += 1;
                }
            }
            let nulls = row.iter().take_while(|b| b.is_null()).count();
            row.drain(..nulls);
            t.blocks.clear();
            t.num_cached = 0;
            t.align.clear();
            t.hisparse.clear();
            out.push(row);
        }
        self.spare.push(tables);
        Ok(Some(out))
    }

    /// Take `n` blocks from the front of the free queue for the caller (one
    /// reference each, held outside every table), appended to `out`.
    pub fn get_caller_blocks(&mut self, n: usize, out: &mut Vec<BlockId>) -> KvResult<()> {
        let start = out.len();
        self.pool.get_new_blocks(n, out)?;
        for &b in &out[start..] {
            *self.caller_held.entry(b).or_insert(0) += 1;
        }
        Ok(())
    }

    /// References the caller holds outside every table, over all blocks.
    pub fn num_caller_references(&self) -> usize {
        self.caller_held.values().map(|&n| n as usize).sum()
    }

    /// Release one caller reference of each block, in eviction-priority order
    /// (the pool's [`free_blocks`](crate::pool::BlockPool::free_blocks)). The
    /// null block is skipped. Refused, with nothing released, when a block is
    /// listed more often than the caller holds it.
    pub fn free_caller_blocks(&mut self, blocks: &[BlockId]) -> KvResult<()> {
        let mut wanted: HashMap<BlockId, u32> = HashMap::new();
        for &b in blocks.iter().filter(|b| !b.is_null()) {
            *wanted.entry(b).or_insert(0) += 1;
        }
        for (&b, &n) in &wanted {
            if self.caller_held.get(&b).copied().unwrap_or(0) < n {
                return Err(KvError::NotHeldByCaller(b));
            }
        }
        self.pool.free_blocks(blocks)?;
        for (b, n) in wanted {
            if let Some(held) = self.caller_held.get_mut(&b) {
                *held -= n;
                if *held == 0 {
                    self.caller_held.remove(&b);
                }
            }
        }
        Ok(())
    }

    /// Register the caller's blocks `block_ids[num_cached_blocks..num_full_blocks]`
    /// in the prefix index of `group` under `block_hashes[i]` (the pool's
    /// [`cache_full_blocks`](crate::pool::BlockPool::cache_full_blocks)).
    /// `block_size` must be the group's and the hash unit: one hash per block.
    /// Every non-null block of the range must be held by the caller (a
    /// request's blocks are cached through the request).
    pub fn cache_caller_blocks(
        &mut self,
        block_ids: &[BlockId],
        block_hashes: &[BlockHash],
        num_cached_blocks: usize,
        num_full_blocks: usize,
        group: GroupId,
        block_size: usize,
    ) -> KvResult<()> {
        let manager = self
            .managers
            .get(group.0 as usize)
            .ok_or(KvError::UnknownGroup(group))?;
        let unit = self.config.hash_block_size as usize;
        if block_size != manager.block_size() || block_size != unit {
            return Err(KvError::InvalidArgument {
                name: "block_size",
                detail: format!(
                    "{block_size} tokens: group {group} has {}-token blocks and the hash unit \
                     is {unit} tokens; only blocks of one hash unit are cached by hand",
                    manager.block_size()
                ),
            });
        }
        if num_cached_blocks < num_full_blocks && num_full_blocks <= block_ids.len() {
            let range = &block_ids[num_cached_blocks..num_full_blocks];
            if let Some(&b) = range
                .iter()
                .find(|b| !b.is_null() && !self.caller_held.contains_key(*b))
            {
                return Err(KvError::NotHeldByCaller(b));
            }
        }
        self.pool.cache_full_blocks(
            block_ids,
            block_hashes,
            num_cached_blocks,
            num_full_blocks,
            group,
            None,
        )
    }

    /// Put `blocks`, in order, in the prefix index under `(hash, group)`,
    /// which is how an entry removed by hand is restored. Each block must be
    /// allocated or free but not cached (held by a request, by the caller, or
    /// in the free queue: reference counts and queue positions do not
    /// change), listed once, and not the null block.
    pub fn insert_cache_key(
        &mut self,
        hash: BlockHash,
        group: GroupId,
        blocks: &[BlockId],
    ) -> KvResult<()> {
        if group.0 as usize >= self.managers.len() {
            return Err(KvError::UnknownGroup(group));
        }
        for (i, &b) in blocks.iter().enumerate() {
            if b.is_null() {
                return Err(KvError::InvalidArgument {
                    name: "block_ids",
                    detail: "the null block is never cached".into(),
                });
            }
            if self.pool.is_cached(b)? || blocks[..i].contains(&b) {
                return Err(KvError::AlreadyCached(b));
            }
        }
        if !self.pool.caching_enabled() {
            return Ok(());
        }
        for &b in blocks {
            self.pool
                .cache_full_blocks(&[b], std::slice::from_ref(&hash), 0, 1, group, None)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::coordinator::{CoordinatorConfig, CoordinatorCore};
    use crate::error::KvError;
    use crate::ids::{BlockId, GroupId};
    use crate::managers::test_util::hashes;
    use crate::managers::GroupSpec;

    fn core(num_blocks: usize) -> CoordinatorCore {
        let cfg = CoordinatorConfig::new(
            vec![
                GroupSpec::full_attention(4),
                GroupSpec::sliding_window(4, 8),
            ],
            num_blocks,
            true,
            1 << 20,
        );
        let mut cfg = cfg;
        cfg.hash_block_size = 4;
        CoordinatorCore::new(cfg).unwrap()
    }

    fn ids(v: &[BlockId]) -> Vec<u32> {
        v.iter().map(|b| b.0).collect()
    }

    #[test]
    fn popped_request_blocks_become_the_callers() {
        use crate::coordinator::{AllocateArgs, NewBlocks};
        use crate::hashing::{ExtraKeys, HashAlgo, HashConfig, RequestHasher};
        use crate::request::Request;
        let groups = vec![
            GroupSpec::full_attention(16),
            GroupSpec::hisparse_resident(16),
            GroupSpec::hisparse_hot(16, 2),
        ];
        let mut c = CoordinatorCore::new(CoordinatorConfig::new(groups, 16, false, 1024)).unwrap();
        let config = HashConfig::new(HashAlgo::Native, 16, Some("t")).unwrap();
        let request = Request::new(
            "r".into(),
            (0..32).collect(),
            RequestHasher::new(config, ExtraKeys::default()),
        );
        let mut out = NewBlocks::new();
        assert!(c
            .allocate_request(&request, &AllocateArgs::new(32), None, &mut out)
            .unwrap());
        let r = c.request_id("r").unwrap();
        c.require_hot(r, GroupId(2)).unwrap();
        c.allocate_hot(r, GroupId(2)).unwrap();
        let free = c.pool().num_free_blocks();
        let got = c.pop_request_to_caller("r").unwrap().unwrap();
        assert_eq!(got.iter().map(Vec::len).collect::<Vec<_>>(), vec![2, 2, 2]);
        assert_eq!(c.pool().num_free_blocks(), free);
        assert_eq!(c.num_requests(), 0);
        assert_eq!(c.num_caller_references(), 6);
        c.check_invariants().unwrap();
        assert!(c.pop_request_to_caller("r").unwrap().is_none());
        let all: Vec<BlockId> = got
            .iter()
            .rev()
            .flat_map(|g| g.iter().rev().copied())
            .collect();
        c.free_caller_blocks(&all).unwrap();
        assert_eq!(c.pool().num_free_blocks(), free + 6);
        assert_eq!(c.num_caller_references(), 0);
        c.check_invariants().unwrap();
    }

    #[test]
    fn caller_blocks_are_counted_cached_and_freed() {
        let mut c = core(6);
        let mut got = Vec::new();
        c.get_caller_blocks(3, &mut got).unwrap();
        assert_eq!(ids(&got), [1, 2, 3]);
        assert_eq!(c.num_caller_references(), 3);
        c.check_invariants().unwrap();
        c.cache_caller_blocks(&got, &hashes(3), 0, 2, GroupId(1), 4)
            .unwrap();
        assert!(c.pool().is_cached(BlockId(2)).unwrap());
        assert!(!c.pool().is_cached(BlockId(3)).unwrap());
        c.check_invariants().unwrap();
        // Freed in the order given; cached blocks go to the back.
        c.free_caller_blocks(&got).unwrap();
        assert_eq!(c.num_caller_references(), 0);
        assert_eq!(
            c.pool().free_block_ids().map(|b| b.0).collect::<Vec<_>>(),
            [3, 4, 5, 1, 2]
        );
        c.check_invariants().unwrap();
    }

    #[test]
    fn refusals_change_nothing() {
        let mut c = core(6);
        let mut got = Vec::new();
        c.get_caller_blocks(2, &mut got).unwrap();
        // Listed twice but held once: nothing is released.
        let err = c.free_caller_blocks(&[got[0], got[1], got[0]]);
        assert_eq!(err, Err(KvError::NotHeldByCaller(got[0])));
        assert_eq!(c.num_caller_references(), 2);
        assert_eq!(c.pool().num_free_blocks(), 3);
        // A block nobody took.
        let err = c.free_caller_blocks(&[BlockId(4)]);
        assert_eq!(err, Err(KvError::NotHeldByCaller(BlockId(4))));
        let err = c.cache_caller_blocks(&[BlockId(4)], &hashes(1), 0, 1, GroupId(0), 4);
        assert_eq!(err, Err(KvError::NotHeldByCaller(BlockId(4))));
        assert!(matches!(
            c.cache_caller_blocks(&got, &hashes(2), 0, 2, GroupId(2), 4),
            Err(KvError::UnknownGroup(_))
        ));
        assert!(matches!(
            c.cache_caller_blocks(&got, &hashes(2), 0, 2, GroupId(0), 8),
            Err(KvError::InvalidArgument { .. })
        ));
        assert_eq!(c.pool().num_cached_keys(), 0);
        c.check_invariants().unwrap();
        c.free_caller_blocks(&got).unwrap();
        c.check_invariants().unwrap();
    }

    #[test]
    fn a_removed_key_is_restored_in_place() {
        let mut c = core(6);
        let mut got = Vec::new();
        c.get_caller_blocks(2, &mut got).unwrap();
        c.cache_caller_blocks(&got, &hashes(2), 0, 2, GroupId(0), 4)
            .unwrap();
        c.free_caller_blocks(&got).unwrap();
        let queue: Vec<u32> = c.pool().free_block_ids().map(|b| b.0).collect();
        let key = c.pool().cache_key(BlockId(2)).unwrap().unwrap();
        c.pool_mut().evict_blocks(&[BlockId(2)]).unwrap();
        assert_eq!(c.pool().lookup(&key.hash, key.group), None);
        // A cached block, a repeated block and the null block are refused.
        assert_eq!(
            c.insert_cache_key(key.hash, key.group, &[BlockId(1)]),
            Err(KvError::AlreadyCached(BlockId(1)))
        );
        assert_eq!(
            c.insert_cache_key(key.hash, key.group, &[BlockId(2), BlockId(2)]),
            Err(KvError::AlreadyCached(BlockId(2)))
        );
        assert!(c
            .insert_cache_key(key.hash, key.group, &[BlockId(0)])
            .is_err());
        assert!(c
            .insert_cache_key(key.hash, GroupId(5), &[BlockId(2)])
            .is_err());
        c.insert_cache_key(key.hash, key.group, &[BlockId(2)])
            .unwrap();
        assert_eq!(c.pool().lookup(&key.hash, key.group), Some(BlockId(2)));
        let after: Vec<u32> = c.pool().free_block_ids().map(|b| b.0).collect();
        assert_eq!(after, queue);
        c.check_invariants().unwrap();
    }
}
