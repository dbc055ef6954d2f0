//! A router's index of which engine caches which block, built from the
//! engines' KV events alone (never from a pool).
//!
//! A cluster router in front of vLLM-style engines learns what each engine
//! caches only from the events it publishes ([`crate::events`]). Per engine
//! the index counts how many of its blocks hold each key (an engine reports
//! one `BlockRemoved` per block, and two blocks may hold one key); one map
//! from key to the set of engines holding it answers the routing question:
//! per engine, how many leading blocks of a prompt it caches. Only the
//! events of one KV-cache group are indexed. Keys are vLLM's integer form
//! of a block hash ([`BlockHash::external`](crate::BlockHash::external)),
//! the form a router sees on the wire.

use foldhash::fast::RandomState;
use hashbrown::HashMap;
use smallvec::SmallVec;

use crate::error::{KvError, KvResult};
use crate::events::KvEvent;
use crate::ids::GroupId;

/// One bit per engine (engine `k`: bit `k % 64` of word `k / 64`).
type EngineSet = SmallVec<[u64; 1]>;

/// `engine` no longer holds `key`.
fn drop_holder(holders: &mut HashMap<u64, EngineSet, RandomState>, key: u64, engine: usize) {
    if let Some(set) = holders.get_mut(&key) {
        set[engine / 64] &= !(1u64 << (engine % 64));
        if set.iter().all(|&w| w == 0) {
            holders.remove(&key);
        }
    }
}

/// Which engine caches which block, from KV events only.
#[derive(Debug)]
pub struct RouterIndex {
    group: GroupId,
    num_engines: usize,
    /// Key -> the engines holding at least one block with it (never empty).
    holders: HashMap<u64, EngineSet, RandomState>,
    /// Per engine: key -> how many of its blocks hold it (never 0).
    counts: Vec<HashMap<u64, u32, RandomState>>,
    events_seen: u64,
}

/// The most engines one index holds: each costs a map up front, and a
/// cluster far larger than any deployment must not be one allocation away.
pub const MAX_ENGINES: usize = 1 << 16;

impl RouterIndex {
    /// An empty index of `num_engines` engines (1 to [`MAX_ENGINES`]) for the
    /// events of `group`.
    pub fn new(num_engines: usize, group: GroupId) -> KvResult<Self> {
        if !(1..=MAX_ENGINES).contains(&num_engines) {
            return Err(KvError::InvalidArgument {
                name: "num_engines",
                detail: format!("1 to {MAX_ENGINES}, not {num_engines}"),
            });
        }
        Ok(Self {
            group,
            num_engines,
            holders: HashMap::default(),
            counts: (0..num_engines).map(|_| HashMap::default()).collect(),
            events_seen: 0,
        })
    }

    /// Engines indexed.
    pub const fn num_engines(&self) -> usize {
        self.num_engines
    }

    /// The KV-cache group whose events are indexed.
    pub const fn group(&self) -> GroupId {
        self.group
    }

    /// Events applied so far (every group's).
    pub const fn events_seen(&self) -> u64 {
        self.events_seen
    }

    fn check_engine(&self, engine: usize) -> KvResult<()> {
        if engine < self.num_engines {
            Ok(())
        } else {
            Err(KvError::InvalidArgument {
                name: "engine",
                detail: format!("below {}, not {engine}", self.num_engines),
            })
        }
    }

    fn words(&self) -> usize {
        self.num_engines.div_ceil(64)
    }

    /// Apply `engine`'s events in the order it published them.
    pub fn apply<'a>(
        &mut self,
        engine: usize,
        events: impl IntoIterator<Item = &'a KvEvent>,
    ) -> KvResult<()> {
        self.check_engine(engine)?;
        for ev in events {
            match ev {
                KvEvent::BlockStored(s) => self.stored(engine, s.group, s.external_hashes())?,
                KvEvent::BlockRemoved {
                    block_hash, group, ..
                } => self.removed(engine, *group, block_hash.external())?,
                KvEvent::AllBlocksCleared => self.cleared(engine)?,
            }
        }
        Ok(())
    }

    /// One `BlockStored` event of `engine`: blocks of `group` with these keys.
    pub fn stored(
        &mut self,
        engine: usize,
        group: GroupId,
        keys: impl IntoIterator<Item = u64>,
    ) -> KvResult<()> {
        self.check_engine(engine)?;
        self.events_seen += 1;
        if group != self.group {
            return Ok(());
        }
        let (word, bit) = (engine / 64, 1u64 << (engine % 64));
        let words = self.words();
        let counts = &mut self.counts[engine];
        for h in keys {
            let c = counts.entry(h).or_insert(0);
            *c += 1;
            if *c == 1 {
                self.holders
                    .entry(h)
                    .or_insert_with(|| SmallVec::from_elem(0, words))[word] |= bit;
            }
        }
        Ok(())
    }

    /// One `BlockRemoved` event of `engine`: a block of `group` lost `key`.
    pub fn removed(&mut self, engine: usize, group: GroupId, key: u64) -> KvResult<()> {
        self.check_engine(engine)?;
        self.events_seen += 1;
        if group != self.group {
            return Ok(());
        }
        let counts = &mut self.counts[engine];
        match counts.get_mut(&key) {
            Some(c) if *c > 1 => *c -= 1,
            Some(_) => {
                counts.remove(&key);
                drop_holder(&mut self.holders, key, engine);
            }
            None => {}
        }
        Ok(())
    }

    /// One `AllBlocksCleared` event of `engine`: it caches nothing now.
    pub fn cleared(&mut self, engine: usize) -> KvResult<()> {
        self.check_engine(engine)?;
        self.events_seen += 1;
        for (h, _) in self.counts[engine].drain() {
            drop_holder(&mut self.holders, h, engine);
        }
        Ok(())
    }

    /// Per engine, the longest run of leading blocks of `block_hashes` it
    /// caches (one pass over the hashes, stopping at the first block no
    /// engine still matching holds).
    pub fn matched_blocks(&self, block_hashes: &[u64]) -> Vec<usize> {
        let n = self.num_engines;
        let mut matched = vec![0; n];
        let mut alive: EngineSet = SmallVec::from_elem(u64::MAX, self.words());
        if n % 64 != 0 {
            alive[n / 64] = (1u64 << (n % 64)) - 1;
        }
        let empty: EngineSet = SmallVec::from_elem(0, self.words());
        for (i, h) in block_hashes.iter().enumerate() {
            let held = self.holders.get(h).unwrap_or(&empty);
            let mut any = false;
            for (w, (a, &m)) in alive.iter_mut().zip(held.iter()).enumerate() {
                let mut dropped = *a & !m;
                while dropped != 0 {
                    matched[w * 64 + dropped.trailing_zeros() as usize] = i;
                    dropped &= dropped - 1;
                }
                *a &= m;
                any |= *a != 0;
            }
            if !any {
                return matched;
            }
        }
        for (w, &a) in alive.iter().enumerate() {
            let mut left = a;
            while left != 0 {
                matched[w * 64 + left.trailing_zeros() as usize] = block_hashes.len();
                left &= left - 1;
            }
        }
        matched
    }

    /// The keys the index says `engine` caches (in no order).
    pub fn keys(&self, engine: usize) -> KvResult<impl Iterator<Item = u64> + '_> {
        self.check_engine(engine)?;
        Ok(self.counts[engine].keys().copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{Medium, StoredBlocks};
    use crate::BlockHash;

    fn hash(x: u8) -> BlockHash {
        BlockHash::from_slice(&[x; 32]).unwrap()
    }

    fn stored(group: u32, xs: &[u8]) -> KvEvent {
        let mut s = StoredBlocks::new(GroupId(group), 4, Medium::Gpu);
        s.block_hashes = xs.iter().map(|&x| hash(x)).collect();
        KvEvent::BlockStored(Box::new(s))
    }

    fn removed(x: u8) -> KvEvent {
        KvEvent::BlockRemoved {
            block_hash: hash(x),
            group: GroupId(0),
            medium: Medium::Gpu,
        }
    }

    fn keys_of(ix: &RouterIndex, k: usize) -> Vec<u64> {
        let mut v: Vec<u64> = ix.keys(k).unwrap().collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn longest_leading_run_per_engine() {
        let mut ix = RouterIndex::new(3, GroupId(0)).unwrap();
        ix.apply(1, &[stored(0, &[1, 2, 3])]).unwrap();
        ix.apply(2, &[stored(0, &[1, 2]), stored(1, &[3])]).unwrap();
        let q: Vec<u64> = [1, 2, 3, 4].iter().map(|&x| hash(x).external()).collect();
        assert_eq!(ix.matched_blocks(&q), vec![0, 3, 2]);
        assert_eq!(ix.matched_blocks(&[]), vec![0, 0, 0]);
        let gap: Vec<u64> = [9, 1, 2].iter().map(|&x| hash(x).external()).collect();
        assert_eq!(
            ix.matched_blocks(&gap),
            vec![0, 0, 0],
            "leading blocks only"
        );
        assert_eq!(ix.matched_blocks(&q[1..]), vec![0, 2, 1]);
        assert_eq!(
            ix.events_seen(),
            3,
            "other groups' events are seen, not indexed"
        );
    }

    #[test]
    fn a_key_held_twice_stays_until_both_blocks_go() {
        let mut ix = RouterIndex::new(2, GroupId(0)).unwrap();
        ix.apply(0, &[stored(0, &[5]), stored(0, &[5])]).unwrap();
        let q = [hash(5).external()];
        ix.apply(0, &[removed(5)]).unwrap();
        assert_eq!(ix.matched_blocks(&q), vec![1, 0]);
        ix.apply(0, &[removed(5), removed(5)]).unwrap();
        assert_eq!(ix.matched_blocks(&q), vec![0, 0]);
        assert!(ix.holders.is_empty());
    }

    #[test]
    fn clearing_one_engine_keeps_the_others() {
        let mut ix = RouterIndex::new(2, GroupId(0)).unwrap();
        ix.apply(0, &[stored(0, &[1, 2])]).unwrap();
        ix.apply(1, &[stored(0, &[1])]).unwrap();
        ix.apply(0, &[KvEvent::AllBlocksCleared]).unwrap();
        assert!(keys_of(&ix, 0).is_empty());
        assert_eq!(keys_of(&ix, 1), vec![hash(1).external()]);
        let q = [hash(1).external(), hash(2).external()];
        assert_eq!(ix.matched_blocks(&q), vec![0, 1]);
    }

    #[test]
    fn more_than_64_engines() {
        let mut ix = RouterIndex::new(130, GroupId(0)).unwrap();
        ix.apply(129, &[stored(0, &[1, 2])]).unwrap();
        ix.apply(64, &[stored(0, &[1])]).unwrap();
        let q = [hash(1).external(), hash(2).external()];
        let m = ix.matched_blocks(&q);
        assert_eq!((m[129], m[64], m[0], m[63]), (2, 1, 0, 0));
    }

    #[test]
    fn bad_engines_are_refused() {
        assert!(RouterIndex::new(0, GroupId(0)).is_err());
        let mut ix = RouterIndex::new(2, GroupId(0)).unwrap();
        assert!(ix.apply(2, &[removed(1)]).is_err());
        assert!(ix.keys(2).is_err());
        assert_eq!(ix.events_seen(), 0, "nothing applied");
    }
}
